"""Uneven tensor parallelism (HAP, EuroSys'24): each device's share of a stage, and the split an LP picks.

A stage whose tensor-parallel group mixes unlike devices (two GPU types in one node, or a card with
a measured speed factor) runs at the pace of its slowest member when split evenly. Splitting the
attention heads, feed-forward columns and vocabulary rows in proportion to what each device does
removes most of that wait; Megatron's column-then-row all-reduces keep their full size whatever the
split (each rank contributes a full-width partial sum).

* :func:`unit_shares` turns a :class:`~hetpart.plan.TPSplit` into each device's fraction of every
  unit's split work (what the simulator divides by);
* :func:`lp_split` minimises the stage's compute time subject to each device's memory with scipy's
  HiGHS (``scipy.optimize.linprog``), rounds to whole units by largest remainder (whole key/value
  groups of heads, feed-forward columns in multiples of 64), re-solves the feed-forward split with the
  heads fixed, and returns the split (None where the group is alike: an even split is then optimal).

Example:
    >>> from hetpart import load_cluster, load_model
    >>> from hetpart.plan import Stage
    >>> model = load_model("gpt2-medium", seq_len=1024)
    >>> cluster = load_cluster("a100-8")
    >>> lp_split(model, cluster, Stage((0, 26), ("0/0/0", "0/0/1"), 2), 4, "bf16", "none") is None
    True
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from hetpart.rules import split_granularity, split_sizes

if TYPE_CHECKING:  # pragma: no cover
    from hetpart.cluster import Cluster
    from hetpart.graph.model_graph import ModelGraph
    from hetpart.plan import Stage, TPSplit

__all__ = ["devices_alike", "block_weights", "unit_shares", "param_shares", "largest_remainder", "lp_split", "fill_tp_splits"]


def devices_alike(cluster: "Cluster", devices: Sequence[str]) -> bool:
    """Whether ``devices`` are one type at full speed (then an even split is optimal)."""
    first = cluster.device(devices[0])
    return all((d := cluster.device(x)).gpu == first.gpu and d.speed == 1.0 for x in devices) and first.speed == 1.0


def block_weights(model: "ModelGraph") -> tuple[float, float]:
    """``(attention, feed-forward)`` shares of a block's FLOPs (they add up to 1): the attention part
    (q/k/v/o projections and the attention core) splits with the heads, the MLP with its columns."""
    cfg = model.config
    h, q, kv, f, s = cfg.hidden_size, cfg.q_dim, cfg.kv_dim, cfg.ffn, model.seq_len
    n_mlp = 3 if cfg.activation == "swiglu" else 2
    attn = 2 * s * h * (q + 2 * kv) + 4 * s * s * q + 2 * s * q * h
    mlp = 2 * s * h * f * n_mlp
    return attn / (attn + mlp), mlp / (attn + mlp)


def _param_weights(model: "ModelGraph") -> tuple[float, float]:
    cfg = model.config
    h, q, kv, f = cfg.hidden_size, cfg.q_dim, cfg.kv_dim, cfg.ffn
    attn = 2 * h * q + 2 * h * kv
    mlp = (3 if cfg.activation == "swiglu" else 2) * h * f
    return attn / (attn + mlp), mlp / (attn + mlp)


def _fractions(split: "TPSplit | None", dim: str, tp: int) -> np.ndarray:
    parts = getattr(split, dim) if split is not None else ()
    if not parts:
        return np.full(tp, 1.0 / tp)
    a = np.asarray(parts, dtype=float)
    return a / a.sum()


def unit_shares(model: "ModelGraph", tp: int, split: "TPSplit | None") -> np.ndarray:
    """``[tp, units]``: each device's fraction of each unit's split work (``1/tp`` everywhere when even).

    Blocks weigh the heads' and the columns' fractions by :func:`block_weights`; the embedding and the
    head follow the vocabulary split. Units that are not split (``tp_shardable`` false) read 1/tp here
    and are run whole by every rank (the simulator ignores their share)."""
    n = model.num_units
    out = np.full((tp, n), 1.0 / tp)
    if split is None or split.empty or model.config is None:
        return out
    wa, wm = block_weights(model)
    block = wa * _fractions(split, "heads", tp) + wm * _fractions(split, "ffn", tp)
    vocab = _fractions(split, "vocab", tp)
    for i, u in enumerate(model.units):
        if u.kind == "block":
            out[:, i] = block
        elif u.kind in ("embedding", "head"):
            out[:, i] = vocab
    return out


def param_shares(model: "ModelGraph", tp: int, split: "TPSplit | None") -> np.ndarray:
    """``[tp]``: each device's fraction of a block's split parameters (memory follows it)."""
    if split is None or split.empty or model.config is None:
        return np.full(tp, 1.0 / tp)
    pa, pm = _param_weights(model)
    return pa * _fractions(split, "heads", tp) + pm * _fractions(split, "ffn", tp)


def largest_remainder(shares: Sequence[float], units: int) -> list[int] | None:
    """``units`` whole units handed out in proportion to ``shares``, each device at least one (Hamilton's
    method); None when there are fewer units than devices."""
    k = len(shares)
    if units < k:
        return None
    w = np.maximum(np.asarray(shares, dtype=float), 0.0)
    w = w / w.sum() if w.sum() > 0 else np.full(k, 1.0 / k)
    exact = w * units
    out = np.maximum(np.floor(exact).astype(int), 1)
    rest = exact - np.floor(exact)
    while out.sum() < units:
        i = int(np.argmax(np.where(out < exact + 1, rest, -1.0)))
        out[i] += 1
        rest[i] = -1.0
        if (rest < 0).all():
            rest = exact - out
    while out.sum() > units:
        candidates = np.where(out > 1, exact - out, np.inf)
        out[int(np.argmin(candidates))] -= 1
    return out.tolist()


def _device_rates(model, cluster, stage, micro_batch, precision, recompute, curve_of=None, widths=None):
    """Per device: seconds of the stage's whole split work (at the even split's local width, or at
    ``widths[i]``: the device's share of the block as ``1 / share``) and of the rest (units every rank
    runs whole, the embedding/head at their even share, and every operator's fixed host cost, which a
    rank pays whatever its share)."""
    from dataclasses import replace

    from hetpart.costmodel.compute import unit_compute_s
    from hetpart.costmodel.efficiency import curve_for

    a, z = stage.layers
    tp = stage.tp
    blocks = np.array([u.kind == "block" for u in model.units[a:z]])
    full, rest = [], []
    for i, d in enumerate(stage.devices):
        dev = cluster.device(d)
        curve = curve_of(dev.gpu) if curve_of else curve_for(dev.gpu)
        fwd, bwd = unit_compute_s(model, dev.gpu, tp, micro_batch, precision, recompute, curve)
        work_f, work_b = unit_compute_s(model, dev.gpu, tp, micro_batch, precision, recompute,
                                        replace(curve, host_us_per_op=0.0))
        t = (work_f + work_b)[a:z] / dev.speed
        host = float((fwd + bwd - work_f - work_b)[a:z].sum())  # host time does not scale with the device
        width = tp if widths is None else float(widths[i])
        if widths is not None:  # the split work at this device's own local width (its matrix efficiency)
            wf, wb = unit_compute_s(model, dev.gpu, width, micro_batch, precision, recompute,
                                    replace(curve, host_us_per_op=0.0))
            t = np.where(blocks, (wf + wb)[a:z] / dev.speed, t)
        full.append(float(t[blocks].sum()) * width)  # the whole split work at that local width
        rest.append(float(t[~blocks].sum()) + host)
    return np.array(full), np.array(rest)


def _memory_rows(model, cluster, stage, micro_batch, in_flight, recompute, chunks=None, precision="bf16", zero=0,
                 fraction=1.0):
    """Per device ``(replicated GB, GB of the whole split part, capacity GB)`` of the device group holding
    ``stage``: every model chunk it hosts (``chunks``, layer ranges; default the stage's alone), each split
    like this one, and the working set once, the largest of the chunks' (one unit runs at a time). With
    sharded data parallelism (``zero`` 1-2, this replica's ``fraction`` of the shards) each part's model
    states are its shards (levels 1-2 shard in proportion to the parameters a device holds)."""
    from hetpart.costmodel.memory import PrefixTables, memory_capacity_gb
    from hetpart.costmodel.sharding import sharded_delta_gb

    tables = PrefixTables(model)
    ranges = [tuple(c) for c in chunks] if chunks else [stage.layers]
    whole = tables.device_memory_gb([(a, z, 1) for a, z in ranges], micro_batch, in_flight, recompute,
                                    precision=precision)
    rep = tables.device_memory_gb([(a, z, 10**9) for a, z in ranges], micro_batch, in_flight, recompute,
                                  precision=precision)
    if zero in (1, 2):
        shards = [sharded_delta_gb(sum(tables.params_per_device(a, z, tp) for a, z in ranges), 0.0, precision, zero,
                                   fraction) for tp in (1, 10**9)]
        whole, rep = whole + shards[0], rep + shards[1]
    caps = np.array([memory_capacity_gb(cluster.device(d).gpu) for d in stage.devices])
    return rep, whole - rep, caps


def _solve(time_a, time_m, rest, mem, fixed_heads=None):
    """The LP: minimise ``T`` subject to every device's time ``<= T`` and memory ``<= capacity``.

    Without ``fixed_heads`` one share ``z_i`` per device splits heads and columns alike (the LP with
    separate head and column shares is degenerate: trading one for the other along equal time makes
    every vertex optimal, 39:1 heads among them); with the heads fixed (rounded), it solves for the
    columns ``y_i`` alone, which then make up for the heads' rounding.
    Returns the ``(heads, columns)`` shares, or None when HiGHS finds no solution.
    """
    from scipy.optimize import linprog

    k = len(rest)
    rep, split_gb, caps, pa, pm = mem
    fixed = np.zeros(k) if fixed_heads is None else np.asarray(fixed_heads, dtype=float)
    coef_t = (time_a + time_m) if fixed_heads is None else time_m
    coef_m = split_gb * ((pa + pm) if fixed_heads is None else pm)
    const_t = rest + time_a * fixed
    const_m = rep + split_gb * pa * fixed
    eye = np.eye(k)
    a_time = np.hstack([eye * coef_t, -np.ones((k, 1))])
    a_mem = np.hstack([eye * coef_m, np.zeros((k, 1))])
    c = np.r_[np.zeros(k), 1.0]
    a_eq, b_eq = np.r_[np.ones(k), 0.0][None, :], np.array([1.0])
    bounds = [(0, 1)] * k + [(0, None)]
    res = linprog(c, A_ub=np.vstack([a_time, a_mem]), b_ub=np.r_[-const_t, caps - const_m], A_eq=a_eq, b_eq=b_eq,
                  bounds=bounds, method="highs")
    if res.status == 2:  # no split fits in memory: minimise time alone (the plan will not fit anyway)
        res = linprog(c, A_ub=a_time, b_ub=-const_t, A_eq=a_eq, b_eq=b_eq, bounds=bounds, method="highs")
    if not res.success:
        return None
    z = res.x[:k]
    return (z, z) if fixed_heads is None else (fixed, z)


class _BlockTimes:
    """Seconds each device of a stage spends on its share of the blocks, priced as the simulator prices
    them (its time at the local width ``1 / share``, over its speed; cached by share)."""

    def __init__(self, model, cluster, stage, micro_batch, precision, recompute, curve_of=None):
        from hetpart.costmodel.efficiency import curve_for

        self.model, self.args = model, (micro_batch, precision, recompute)
        a, z = stage.layers
        self.span = slice(a, z)
        self.blocks = np.array([u.kind == "block" for u in model.units[a:z]])
        devs = [cluster.device(d) for d in stage.devices]
        self.devices = [(d.gpu, d.speed, curve_of(d.gpu) if curve_of else curve_for(d.gpu)) for d in devs]
        self.weights = block_weights(model)
        sizes = split_sizes(model)
        self.totals = (sizes["heads"], sizes["ffn"])
        self._cache: dict[tuple[int, int, int], float] = {}

    def share(self, heads: int, ffn: int) -> float:
        return self.weights[0] * heads / self.totals[0] + self.weights[1] * ffn / self.totals[1]

    def __call__(self, i: int, heads: int, ffn: int) -> float:
        key = (i, heads, ffn)
        if key not in self._cache:
            from hetpart.costmodel.compute import unit_compute_s

            gpu, speed, curve = self.devices[i]
            f, b = unit_compute_s(self.model, gpu, 1.0 / self.share(heads, ffn), *self.args, curve, speed=speed)
            self._cache[key] = float((f + b)[self.span][self.blocks].sum())
        return self._cache[key]


def _polish(times: _BlockTimes, heads: list[int], ffn: list[int], units: tuple[int, int], mem,
            max_moves: int = 64) -> tuple[list[int], list[int]]:
    """The rounded split improved under the simulator's own per-device prices. The LP's rates are linear
    in each share around one width (the simulator takes the longer of device work and host dispatch, and slows
    only the device work by a speed factor), and rounding heads first leaves the columns to make up; on
    the throttled A100 of the acceptance scenario the slow device came out 4% behind the others
    (1.94 s against 1.86 s of blocks per micro-batch at 2,112 of 13,824 columns; 1.85 s against 1.87 s
    after 192 columns moved). Moves of whole units (8, 4, 2 and 1 of them) from the slowest device to
    another, while the slowest time falls and every device's memory holds."""
    rep, split_gb, caps, pa, pm = mem
    k = len(heads)

    def fits(h, f) -> bool:
        return all(rep + split_gb * (pa * h[i] / times.totals[0] + pm * f[i] / times.totals[1]) <= caps[i]
                   for i in range(k))

    def worst(h, f) -> tuple[float, list[float]]:
        t = [times(i, h[i], f[i]) for i in range(k)]
        return max(t), t

    best, t = worst(heads, ffn)
    check_memory = fits(heads, ffn)  # a split the LP could not fit in memory is only made faster
    moves = 0
    for step in (8, 4, 2, 1):
        improved = True
        while improved and moves < max_moves:
            improved = False
            slow = int(np.argmax(t))
            for j in sorted(range(k), key=t.__getitem__):
                if j == slow:
                    continue
                for dim in (1, 0):
                    h, f = list(heads), list(ffn)
                    part, n = (f, step * units[1]) if dim else (h, step * units[0])
                    if part[slow] - n <= 0:
                        continue
                    part[slow] -= n
                    part[j] += n
                    if check_memory and not fits(h, f):
                        continue
                    moves += 1
                    cost, times_now = worst(h, f)
                    if cost < best * (1 - 1e-9):
                        heads, ffn, best, t, improved = h, f, cost, times_now, True
                        break
                if improved:
                    break
    return heads, ffn


def lp_split(model: "ModelGraph", cluster: "Cluster", stage: "Stage", micro_batch: int, precision: str,
             recompute: str, in_flight: "float | tuple[float, ...]" = 1.0, curve_of=None, chunks=None, zero: int = 0,
             fraction: float = 1.0) -> "TPSplit | None":
    """The uneven split of ``stage`` that an LP finds fastest within each device's memory, in whole units.

    Args:
        in_flight: micro-batches whose activations the stage holds at once (its pipeline position), or one
            such count per chunk of ``chunks`` (:func:`~hetpart.costmodel.memory.chunk_flights`).
        curve_of: efficiency curve per device type (calibration), as the simulator takes it.
        chunks: layer ranges of every model chunk the stage's devices host (interleaved schedules),
            which share their memory; default the stage's alone.
        zero, fraction: the plan's sharding level and this replica's fraction of the shards (levels 1-2
            shrink each device's model states in proportion to the slice it holds).

    Returns:
        A :class:`~hetpart.plan.TPSplit` of heads and feed-forward columns, or None where the group is
        alike (even is optimal), holds no transformer block, or has fewer head groups than devices.
    """
    from hetpart.plan import TPSplit

    sizes = split_sizes(model)
    a, z = stage.layers
    if (stage.tp < 2 or sizes is None or model.traced or devices_alike(cluster, stage.devices)
            or not any(u.kind == "block" for u in model.units[a:z])):
        return None
    full, rest = _device_rates(model, cluster, stage, micro_batch, precision, recompute, curve_of)
    wa, wm = block_weights(model)
    rep, split_gb, caps = _memory_rows(model, cluster, stage, micro_batch, in_flight, recompute, chunks, precision,
                                       zero, fraction)
    mem = (rep, split_gb, caps, *_param_weights(model))
    first = _solve(full * wa, full * wm, rest, mem)
    if first is None:
        return None
    # The rates were taken at the even split's width; a device's matrices run at its own share's width
    # (wider ones more efficiently), as the simulator prices them: take the rates again there and re-solve.
    full, rest = _device_rates(model, cluster, stage, micro_batch, precision, recompute, curve_of,
                               widths=1.0 / np.maximum(first[0], 1e-3))
    first = _solve(full * wa, full * wm, rest, mem) or first
    g_heads = split_granularity(model, "heads")
    heads = largest_remainder(first[0], sizes["heads"] // g_heads)
    if heads is None:
        return None
    heads = [h * g_heads for h in heads]
    second = _solve(full * wa, full * wm, rest, mem, fixed_heads=np.array(heads) / sizes["heads"])
    y = second[1] if second is not None else first[1]
    g_ffn = split_granularity(model, "ffn")
    ffn = largest_remainder(y, sizes["ffn"] // g_ffn)
    if ffn is None:
        return None
    ffn = [f * g_ffn for f in ffn]
    ffn[-1] += sizes["ffn"] - sum(ffn)  # a width that is no multiple of the granularity: the rest to the last
    heads, ffn = _polish(_BlockTimes(model, cluster, stage, micro_batch, precision, recompute, curve_of), heads, ffn,
                         (g_heads, g_ffn), mem)
    even_h = sizes["heads"] % stage.tp == 0 and len(set(heads)) == 1
    even_f = sizes["ffn"] % stage.tp == 0 and len(set(ffn)) == 1
    if even_h and even_f:
        return None
    return TPSplit(heads=() if even_h else tuple(heads), ffn=() if even_f else tuple(ffn))


def fill_tp_splits(plan, model: "ModelGraph", cluster: "Cluster", curve_of=None):
    """``plan`` with :func:`lp_split` filled into every stage of unlike devices that has no split yet
    (the same plan object when nothing changes: alike groups cost one cached check)."""
    from dataclasses import replace

    from hetpart.costmodel.memory import PrefixTables, chunk_flights
    from hetpart.costmodel.sharding import memory_zero

    replicas, changed = [], False
    v = plan.chunks_per_device
    zero = memory_zero(plan)  # as the simulator
    for r, rep in enumerate(plan.replicas):
        stages = list(rep.stages)
        pp, m = rep.pp // v, plan.num_microbatches(r)
        for k, s in enumerate(stages):
            if s.tp < 2 or s.tp_split is not None or devices_alike(cluster, s.devices):
                continue
            chunks = rep.stages[k % pp::pp]
            flight = chunk_flights(PrefixTables(model), plan.schedule, k % pp, pp, m, v,
                                   [(*c.layers, c.tp) for c in chunks], plan.recompute, plan.attention)
            split = lp_split(model, cluster, s, plan.micro_batch, plan.precision, plan.recompute, flight, curve_of,
                             chunks=[c.layers for c in rep.stages[k % pp::pp]], zero=zero,
                             fraction=plan.shard_fraction(r))
            if split is not None:
                stages[k] = replace(s, tp_split=split)
                changed = True
        replicas.append(replace(rep, stages=tuple(stages)))
    return replace(plan, replicas=tuple(replicas)) if changed else plan
