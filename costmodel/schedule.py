"""Pipeline schedules (GPipe, 1F1B, interleaved 1F1B), simulated with heterogeneous stage times.

Each device runs a fixed sequence of operations (forward or backward of one micro-batch on one of
its model chunks), in the order Megatron-LM and torch.distributed.pipelining use. An operation starts
when the device is free and its input has arrived: the forward of virtual stage ``k`` needs the
forward of ``k-1`` plus the point-to-point transfer ``p2p[k-1]``; the backward of ``k`` needs the
backward of ``k+1`` plus ``p2p[k]`` (and its own forward, earlier on the same device). Transfers do
not occupy the device (separate streams). With equal stages this reproduces the textbook bubble
``(pp-1)/(m v)``; with unequal stages the closed forms are wrong, so we simulate.

Two implementations give the same numbers:

* :func:`simulate_pipeline_events` -- the reference: a discrete-event simulation, one operation at a
  time, with a heap of completion events;
* :func:`pipeline_timing` / :func:`pipeline_step_time_s` / :func:`pipeline_summary` -- the fast path:
  the longest paths of the operation graph in ONE pass over a cached topological order
  (``end = max(end of the device's previous op, end of the input's op + p2p) + duration``); a scalar
  loop for pipelines of a few devices, numpy over each wavefront of independent operations (one per
  device at most) for deep pipelines. Exact, and linear in the number of operations. (An earlier
  version swept vectorized per-device max-plus scans to a fixed point; heterogeneous stages can make
  the critical path zigzag between devices every micro-batch, so sweeps grew with ``M``.)

Shapes:
    fwd, bwd: ``[K, M]`` seconds per virtual stage and micro-batch (``K = pp * interleave``; virtual
    stage ``k`` runs on device ``k mod pp``); p2p: ``[K-1]`` seconds from virtual stage ``k`` to ``k+1``.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from hetpart.errors import PlanError
from hetpart.vocabulary import SCHEDULES

__all__ = ["PipelineOp", "PipelineTiming", "device_op_order", "pipeline_timing", "pipeline_step_time_s",
           "pipeline_summary", "simulate_pipeline_events",
           "SharedPipeline", "simulate_shared_cores"]

FWD, BWD = 0, 1


@dataclass(frozen=True)
class PipelineOp:
    """One executed operation."""

    device: int
    """Pipeline device (``0..pp-1``)."""
    stage: int
    """Virtual stage (``0..K-1``)."""
    microbatch: int
    kind: str
    """``fwd`` or ``bwd``."""
    start_s: float
    end_s: float


@dataclass(frozen=True)
class PipelineTiming:
    """When every operation of one pipeline ran.

    Shapes:
        end_s, start_s: ``[pp, 2 M v]`` in each device's execution order; ``kind``, ``stage``,
        ``microbatch`` index the same cells.
    """

    makespan_s: float
    start_s: np.ndarray
    end_s: np.ndarray
    kind: np.ndarray
    stage: np.ndarray
    microbatch: np.ndarray

    def last_backward_end_s(self, num_stages: int) -> np.ndarray:
        """``[K]``: when each virtual stage finished its last backward."""
        out = np.zeros(num_stages)
        mask = self.kind == BWD
        np.maximum.at(out, self.stage[mask], self.end_s[mask])
        return out

    def busy_s(self) -> np.ndarray:
        """``[pp]``: compute time of each device."""
        return (self.end_s - self.start_s).sum(axis=1)

    def ops(self) -> list[PipelineOp]:
        """Every operation, device by device, in execution order."""
        pp, n = self.end_s.shape
        return [PipelineOp(d, int(self.stage[d, j]), int(self.microbatch[d, j]), "fwd" if self.kind[d, j] == FWD
                           else "bwd", float(self.start_s[d, j]), float(self.end_s[d, j]))
                for d in range(pp) for j in range(n)]


# --------------------------------------------------------------------------------------------- op order


def _check(schedule: str, pp: int, m: int, v: int) -> None:
    if schedule not in SCHEDULES:
        raise PlanError(f"schedule: unknown schedule {schedule!r}; use gpipe, 1f1b or interleaved")
    if pp < 1 or m < 1 or v < 1:
        raise PlanError(f"schedule: need pp, micro-batches and interleave >= 1, got {pp}, {m}, {v}")
    if schedule != "interleaved" and v != 1:
        raise PlanError(f"interleave: {v} needs schedule 'interleaved'")
    if schedule == "interleaved" and v > 1 and m % pp:
        raise PlanError(f"schedule: interleaved 1F1B needs the micro-batches per replica ({m}) to be a multiple "
                        f"of the pipeline depth ({pp}), as in Megatron-LM; change micro_batch or the batch shares")


def _interleaved_chunk(i: int, pp: int, v: int, forward: bool) -> tuple[int, int]:
    """(chunk, micro-batch) of a device's ``i``-th forward or backward in Megatron's interleaved order."""
    chunk = (i // pp) % v
    mb = (i // (pp * v)) * pp + i % pp
    return (chunk if forward else v - 1 - chunk), mb


@lru_cache(maxsize=256)
def device_op_order(schedule: str, pp: int, m: int, v: int = 1) -> tuple[tuple[tuple[int, int, int], ...], ...]:
    """For each device, its operations ``(kind, virtual_stage, microbatch)`` in execution order."""
    _check(schedule, pp, m, v)
    out = []
    for d in range(pp):
        if schedule == "gpipe":
            ops = [(FWD, d, j) for j in range(m)] + [(BWD, d, j) for j in range(m)]
        else:
            total = m * v
            if schedule == "1f1b" and v == 1:
                warm = min(pp - d - 1, m)
            else:
                warm = min(2 * (pp - d - 1) + (v - 1) * pp, total)

            def f(i, d=d):
                c, mb = _interleaved_chunk(i, pp, v, True)
                return (FWD, c * pp + d, mb)

            def b(i, d=d):
                c, mb = _interleaved_chunk(i, pp, v, False)
                return (BWD, c * pp + d, mb)

            ops = [f(i) for i in range(warm)]
            for i in range(total - warm):
                ops += [f(warm + i), b(i)]
            ops += [b(i) for i in range(total - warm, total)]
        out.append(tuple(ops))
    return tuple(out)


# --------------------------------------------------------------------------------------------- fast path


@dataclass(frozen=True)
class _Layout:
    kind: np.ndarray
    stage: np.ndarray
    mb: np.ndarray
    dep: np.ndarray
    """Flat index of the cross-device predecessor (0 where none; masked by has_dep)."""
    has_dep: np.ndarray
    p2p_index: np.ndarray
    """Index into p2p of the transfer before this op (0 where none)."""


@lru_cache(maxsize=256)
def _layout(schedule: str, pp: int, m: int, v: int) -> _Layout:
    order = device_op_order(schedule, pp, m, v)
    n = len(order[0])
    kind = np.array([[op[0] for op in ops] for ops in order], dtype=np.int64)
    stage = np.array([[op[1] for op in ops] for ops in order], dtype=np.int64)
    mb = np.array([[op[2] for op in ops] for ops in order], dtype=np.int64)
    where = {op: d * n + j for d, ops in enumerate(order) for j, op in enumerate(ops)}
    k_total = pp * v
    dep = np.zeros((pp, n), dtype=np.int64)
    has = np.zeros((pp, n), dtype=bool)
    p2p = np.zeros((pp, n), dtype=np.int64)
    for d, ops in enumerate(order):
        for j, (kd, k, b) in enumerate(ops):
            if kd == FWD and k > 0:
                dep[d, j], has[d, j], p2p[d, j] = where[(FWD, k - 1, b)], True, k - 1
            elif kd == BWD and k < k_total - 1:
                dep[d, j], has[d, j], p2p[d, j] = where[(BWD, k + 1, b)], True, k
    for a in (kind, stage, mb, dep, has, p2p):
        a.setflags(write=False)
    return _Layout(kind, stage, mb, dep, has, p2p)


def _as_arrays(fwd, bwd, p2p, interleave: int):
    fwd = np.asarray(fwd, dtype=float)
    bwd = np.asarray(bwd, dtype=float)
    if fwd.ndim != 2 or fwd.shape != bwd.shape:
        raise ValueError(f"fwd and bwd must both be [stages, microbatches], got {fwd.shape} and {bwd.shape}")
    k_total, m = fwd.shape
    if k_total % interleave:
        raise ValueError(f"{k_total} virtual stages is not a multiple of interleave {interleave}")
    p2p = np.zeros(max(k_total - 1, 1)) if p2p is None else np.asarray(p2p, dtype=float).reshape(-1)
    if p2p.size < k_total - 1:
        raise ValueError(f"p2p needs {k_total - 1} entries (one per stage boundary), got {p2p.size}")
    return fwd, bwd, (p2p if p2p.size else np.zeros(1)), k_total // interleave, m


_VECTOR_MIN_DEVICES = 64
"""From this many devices per pipeline, numpy over each wavefront beats one scalar loop (measured:
2x faster at 64 devices x 512 micro-batches, slower below ~64 devices)."""


@lru_cache(maxsize=256)
def _topological(schedule: str, pp: int, m: int, v: int) -> tuple[tuple[int, int, int, int, int], ...]:
    """``(op, previous op on the device, cross-device predecessor, duration slot, p2p slot)`` in a
    topological order of the operation graph (``-1`` = none; flat op ids ``device * n + j``)."""
    lay = _layout(schedule, pp, m, v)
    n = lay.kind.shape[1]
    total = pp * n
    prev = [-1 if j == 0 else i - 1 for i in range(total) for j in (i % n,)]
    dep = [int(x) if h else -1 for x, h in zip(lay.dep.ravel().tolist(), lay.has_dep.ravel().tolist())]
    slot = (lay.kind * (pp * v) + lay.stage).ravel().tolist()
    p2p = lay.p2p_index.ravel().tolist()
    waiting = [(a >= 0) + (b >= 0) for a, b in zip(prev, dep)]
    succ: list[list[int]] = [[] for _ in range(total)]
    for i in range(total):
        for p in (prev[i], dep[i]):
            if p >= 0:
                succ[p].append(i)
    stack = [i for i in range(total) if waiting[i] == 0]
    out = []
    while stack:
        i = stack.pop()
        out.append((i, prev[i], dep[i], slot[i], p2p[i]))
        for s in succ[i]:
            waiting[s] -= 1
            if waiting[s] == 0:
                stack.append(s)
    if len(out) != total:
        raise RuntimeError("pipeline schedule has a dependency cycle; the op order is inconsistent")
    return tuple(out)


@lru_cache(maxsize=64)
def _levels(schedule: str, pp: int, m: int, v: int) -> tuple[tuple[np.ndarray, ...], ...]:
    """The operations grouped into wavefronts: an operation's level is one more than its predecessors'
    highest, so each level only reads earlier ones. Per level ``(op, prev, dep, has_dep)`` flat ids
    (``pp * n`` stands for "no predecessor")."""
    ops = _topological(schedule, pp, m, v)
    none = len(ops)
    level = [0] * len(ops)
    groups: dict[int, list[tuple[int, int, int]]] = {}
    for i, prev, dep, _, _ in ops:
        lv = 1 + max(level[prev] if prev >= 0 else 0, level[dep] if dep >= 0 else 0)
        level[i] = lv
        groups.setdefault(lv, []).append((i, prev if prev >= 0 else none, dep if dep >= 0 else none))
    out = []
    for lv in sorted(groups):
        ids, prev, dep = (np.array(x, dtype=np.int64) for x in zip(*groups[lv]))
        out.append((ids, prev, dep))
    return tuple(out)


def _wavefront_pass(dur: np.ndarray, delay: np.ndarray, schedule: str, pp: int, m: int, v: int) -> np.ndarray:
    """End times ``[pp, n]``: one pass over the wavefronts, vectorized over the operations of each."""
    end = np.zeros(dur.size + 1)  # the last cell stays 0: "no predecessor"
    flat_dur, flat_delay = dur.ravel(), delay.ravel()
    for ids, prev, dep in _levels(schedule, pp, m, v):
        end[ids] = np.maximum(end[prev], end[dep] + flat_delay[ids]) + flat_dur[ids]
    return end[:-1].reshape(dur.shape)


def _scalar_pass(dur: np.ndarray, delay: np.ndarray, schedule: str, pp: int, m: int, v: int) -> np.ndarray:
    """End times ``[pp, n]``: one scalar pass over the operations in topological order."""
    end = [0.0] * (dur.size + 1)  # end[-1] stays 0: "no predecessor"
    flat_dur, flat_delay = dur.ravel().tolist(), delay.ravel().tolist()
    for i, prev, dep, _, _ in _topological(schedule, pp, m, v):
        t = end[prev]
        if dep >= 0:
            r = end[dep] + flat_delay[i]
            if r > t:
                t = r
        end[i] = t + flat_dur[i]
    return np.array(end[:-1]).reshape(dur.shape)


def pipeline_timing(fwd, bwd, p2p, schedule: str, interleave: int = 1) -> PipelineTiming:
    """Exact start and end of every operation (the fast path). Shapes: see the module doc.

    One pass over the operations in topological order: a scalar loop for pipelines of a few devices,
    numpy over each wavefront of independent operations for deep ones.
    """
    fwd, bwd, p2p, pp, m = _as_arrays(fwd, bwd, p2p, interleave)
    lay = _layout(schedule, pp, m, interleave)
    dur = np.where(lay.kind == FWD, fwd[lay.stage, lay.mb], bwd[lay.stage, lay.mb])
    delay = np.where(lay.has_dep, p2p[lay.p2p_index], 0.0)
    run = _wavefront_pass if pp >= _VECTOR_MIN_DEVICES else _scalar_pass
    end = run(dur, delay, schedule, pp, m, interleave)
    return PipelineTiming(float(end.max()), end - dur, end, lay.kind, lay.stage, lay.mb)


@lru_cache(maxsize=256)
def _compiled(schedule: str, pp: int, m: int, v: int) -> tuple:
    """The operation graph renumbered in topological order, 1-based (0 = "no predecessor"):
    ``(prev, dep, slot, p2p, last_backward_position[K], last_op_position[pp])``."""
    if v == 1 and schedule in ("1f1b", "gpipe"):
        return _compiled_flat(schedule, pp, m)
    ops = _topological(schedule, pp, m, v)
    pos = {op[0]: j + 1 for j, op in enumerate(ops)}
    prev = tuple(pos[o[1]] if o[1] >= 0 else 0 for o in ops)
    dep = tuple(pos[o[2]] if o[2] >= 0 else 0 for o in ops)
    slot = tuple(o[3] for o in ops)
    p2p = tuple(o[4] for o in ops)
    lay = _layout(schedule, pp, m, v)
    n = lay.kind.shape[1]
    last_bwd = [0] * (pp * v)
    for d in range(pp):
        for j in range(n):
            if lay.kind[d, j] == BWD:
                last_bwd[int(lay.stage[d, j])] = pos[d * n + j]  # later ops overwrite earlier ones
    return prev, dep, slot, p2p, tuple(last_bwd), tuple(pos[d * n + n - 1] for d in range(pp))


def _forward_position(b: np.ndarray, warm: np.ndarray) -> np.ndarray:
    """Where a device with ``warm`` warm-up forwards runs the forward of micro-batch ``b``."""
    return np.where(b < warm, b, 2 * b - warm)


def _backward_position(b: np.ndarray, warm: np.ndarray, m: int) -> np.ndarray:
    """Where it runs the backward of ``b``: one-forward-one-backward, then the cool-down backwards."""
    return np.where(b < m - warm, warm + 2 * b + 1, m + b)


def _compiled_flat(schedule: str, pp: int, m: int) -> tuple:
    """:func:`_compiled` for GPipe and 1F1B without interleaving, in closed form (numpy).

    Device ``d`` warms up with ``w_d`` forwards (``m`` for GPipe, ``min(pp - d - 1, m)`` for 1F1B),
    then alternates forward and backward, then cools down; so forward ``b`` runs at position
    ``b`` (``b < w``) or ``2b - w``, backward ``b`` at ``w + 2b + 1`` (``b < m - w``) or ``m + b``. Both
    positions fall as ``w`` grows and ``w_d`` falls with ``d``, so a forward's predecessor (device
    ``d - 1``) and a backward's (device ``d + 1``) never run at a later position: ordering operations by
    position, forwards by ascending and backwards by descending device, is topological.
    """
    _check(schedule, pp, m, 1)
    n = 2 * m
    d = np.arange(pp)[:, None]
    warm = np.full((pp, 1), m) if schedule == "gpipe" else np.minimum(pp - d - 1, m)
    j = np.arange(n)[None, :]
    steady = (j >= warm) & (j < 2 * m - warm)
    is_bwd = np.where(j < warm, False, np.where(steady, (j - warm) % 2 == 1, True))
    mb = np.where(j < warm, j, np.where(steady, np.where(is_bwd, (j - warm) // 2, warm + (j - warm) // 2), j - m))
    dev = np.broadcast_to(d, (pp, n))
    order = np.lexsort(((np.where(is_bwd, -dev, dev)).ravel(), is_bwd.ravel(), np.broadcast_to(j, (pp, n)).ravel()))
    pos = np.empty(pp * n, dtype=np.int64)
    pos[order] = np.arange(1, pp * n + 1)
    flat = (d * n + j)
    prev = np.where(j > 0, flat - 1, -1)
    up = np.maximum(d - 1, 0)  # forward's predecessor device, backward's is d + 1
    down = np.minimum(d + 1, pp - 1)
    dep_fwd = up * n + _forward_position(mb, np.minimum(warm[up[:, 0]], m) if schedule == "gpipe"
                                         else np.minimum(pp - up - 1, m))
    dep_bwd = down * n + _backward_position(mb, np.full((pp, 1), m)[down[:, 0]] if schedule == "gpipe"
                                            else np.minimum(pp - down - 1, m), m)
    dep = np.where(is_bwd, np.where(d < pp - 1, dep_bwd, -1), np.where(d > 0, dep_fwd, -1))
    with_pos = np.concatenate(([0], pos))  # index -1 + 1 = 0: "no predecessor"
    prev_p = with_pos[(prev + 1).ravel()[order]]
    dep_p = with_pos[(dep + 1).ravel()[order]]
    slot = (is_bwd * pp + dev).ravel()[order]
    p2p = np.where(is_bwd, np.where(d < pp - 1, d, 0), np.where(d > 0, d - 1, 0)).ravel()[order]
    last = pos[(np.arange(pp) * n + n - 1)]  # every device ends with its last backward
    return (tuple(prev_p.tolist()), tuple(dep_p.tolist()), tuple(slot.tolist()), tuple(p2p.tolist()),
            tuple(last.tolist()), tuple(last.tolist()))


def pipeline_summary(fwd_s: list[float], bwd_s: list[float], p2p_s: list[float], schedule: str, num_microbatches: int,
                     interleave: int = 1) -> tuple[float, list[float]]:
    """``(makespan_s, last_backward_end_s[K])`` for equal micro-batches (the simulator's fast path).

    Args:
        fwd_s, bwd_s: ``[K]`` seconds of one micro-batch per virtual stage.
        p2p_s: ``[K-1]`` seconds per stage boundary.
    """
    k_total, m, v = len(fwd_s), num_microbatches, interleave
    pp = k_total // v
    if pp >= _VECTOR_MIN_DEVICES:
        fwd = np.repeat(np.asarray(fwd_s, dtype=float)[:, None], m, axis=1)
        bwd = np.repeat(np.asarray(bwd_s, dtype=float)[:, None], m, axis=1)
        timing = pipeline_timing(fwd, bwd, p2p_s, schedule, v)
        return timing.makespan_s, timing.last_backward_end_s(k_total).tolist()
    _check(schedule, pp, m, v)
    prev, dep, slot, link, last_bwd, last_op = _compiled(schedule, pp, m, v)
    durations = list(fwd_s) + list(bwd_s)
    p2p = list(p2p_s) or [0.0]
    end = [0.0]
    push = end.append
    if any(p2p):
        for p, d, s, q in zip(prev, dep, slot, link):
            t = end[p]
            if d:
                r = end[d] + p2p[q]
                if r > t:
                    t = r
            push(t + durations[s])
    else:  # no transfer delays (blocking sends): the same loop without them; end[0] = 0 stands for "no input"
        for p, d, s in zip(prev, dep, slot):
            t, r = end[p], end[d]
            push((r if r > t else t) + durations[s])
    return max(end[i] for i in last_op), [end[i] for i in last_bwd]


def pipeline_step_time_s(fwd, bwd, p2p, schedule: str, interleave: int = 1) -> float:
    """Time from the first forward to the last backward of one pipeline (the fast path).

    Args:
        fwd, bwd: ``[K, M]`` seconds per virtual stage and micro-batch (backward includes recompute).
        p2p: ``[K-1]`` seconds to move one micro-batch's activations (or gradients) across each boundary.
        schedule: ``gpipe``, ``1f1b`` or ``interleaved``.
        interleave: model chunks per device (``K = pp * interleave``).
    """
    return pipeline_timing(fwd, bwd, p2p, schedule, interleave).makespan_s


# --------------------------------------------------------------------------------------------- reference


def simulate_pipeline_events(fwd, bwd, p2p, schedule: str, interleave: int = 1) -> PipelineTiming:
    """The event-by-event reference: devices take their next operation when it is ready."""
    fwd, bwd, p2p, pp, m = _as_arrays(fwd, bwd, p2p, interleave)
    order = device_op_order(schedule, pp, m, interleave)
    k_total = pp * interleave
    n = len(order[0])
    done: dict[tuple[int, int, int], float] = {}
    start = np.zeros((pp, n))
    end = np.zeros((pp, n))
    nxt = [0] * pp
    free = [0.0] * pp
    running = [False] * pp
    events: list[tuple[float, int]] = []

    def arrival(op):
        kind, k, b = op
        if kind == FWD:
            return 0.0 if k == 0 else (done.get((FWD, k - 1, b), None), p2p[k - 1])
        if k == k_total - 1:
            return 0.0 if (FWD, k, b) in done else (None, 0.0)
        return done.get((BWD, k + 1, b), None), p2p[k]

    def try_start(d):
        if nxt[d] >= n:
            return
        op = order[d][nxt[d]]
        got = arrival(op)
        if isinstance(got, tuple):
            if got[0] is None:
                return
            ready = got[0] + got[1]
        else:
            ready = got
        kind, k, b = op
        t0 = max(free[d], ready)
        t1 = t0 + (fwd[k, b] if kind == FWD else bwd[k, b])
        start[d, nxt[d]], end[d, nxt[d]] = t0, t1
        free[d] = t1
        running[d] = True
        heapq.heappush(events, (t1, d))

    for d in range(pp):
        try_start(d)
    while events:
        t, d = heapq.heappop(events)
        done[order[d][nxt[d]]] = t
        nxt[d] += 1
        running[d] = False
        for other in range(pp):  # any idle device may have been waiting for this op
            if not running[other]:
                try_start(other)
    if any(i < n for i in nxt):
        raise RuntimeError("pipeline schedule deadlocked; the op order is inconsistent")
    lay = _layout(schedule, pp, m, interleave)
    return PipelineTiming(float(end.max()), start, end, lay.kind, lay.stage, lay.mb)


# --------------------------------------------------------------------------------------------- shared cores


@dataclass(frozen=True)
class SharedPipeline:
    """One pipeline of :func:`simulate_shared_cores`: its operations' times with a core to each process."""

    fwd: np.ndarray
    """``[K, M]`` seconds per virtual stage and micro-batch (as :func:`simulate_pipeline_events`)."""
    bwd: np.ndarray
    p2p: np.ndarray
    """``[K-1]`` seconds from virtual stage ``k`` to ``k+1``, waited for without computing."""
    schedule: str
    interleave: int = 1
    processes: tuple[int, ...] = ()
    """Per device (``pp``): how many processes compute its operations at once (its tensor-parallel
    ranks); one each when empty."""


def simulate_shared_cores(pipelines: list[SharedPipeline], capacity: float) -> list[PipelineTiming]:
    """Pipelines whose processes share ``capacity`` cores: processor sharing, event by event.

    Every device of every pipeline runs its operations in its schedule's order (as
    :func:`simulate_pipeline_events`); an operation's time is its work with a core to itself. While ``n``
    processes compute at once on ``capacity`` cores, each advances at ``min(1, capacity / n)`` of a core,
    the operating system's fair time-slicing of busy processes; a process waiting for its input (a
    pipeline's fill and drain, a transfer) takes no core. So data-parallel replicas that all compute
    stretch by ``n / capacity``, and a pipeline's fill and drain run at full speed where few stages are
    busy. With ``capacity`` at least the processes, every operation runs at full speed and the result is
    :func:`simulate_pipeline_events`'s, pipeline by pipeline.

    Returns:
        One :class:`PipelineTiming` per pipeline, all on one clock from the step's start.
    """
    if not capacity > 0:
        raise ValueError(f"capacity must be a positive number of cores, got {capacity!r}")
    pipes, owner, local, weight = [], [], [], []
    for i, p in enumerate(pipelines):
        fwd, bwd, p2p, pp, m = _as_arrays(p.fwd, p.bwd, p.p2p, p.interleave)
        weights = tuple(p.processes) or (1,) * pp
        if len(weights) != pp or min(weights) < 1:
            raise ValueError(f"pipeline {i}: processes needs {pp} entries of at least 1, got {weights}")
        lay = _layout(p.schedule, pp, m, p.interleave)
        dur = np.where(lay.kind == FWD, fwd[lay.stage, lay.mb], bwd[lay.stage, lay.mb])
        delay = np.where(lay.has_dep, p2p[lay.p2p_index], 0.0)
        pipes.append((lay, dur, delay, np.full(dur.shape, np.nan), np.full(dur.shape, np.nan)))
        owner += [i] * pp
        local += list(range(pp))
        weight += weights
    n_dev = len(owner)
    ops = [pipes[i][1].shape[1] for i in owner]
    nxt = [0] * n_dev
    remaining = [0.0] * n_dev
    running = [False] * n_dev
    now = 0.0
    while True:
        waiting = math.inf
        for g in range(n_dev):  # start what can start; note when the others' inputs arrive
            if running[g] or nxt[g] >= ops[g]:
                continue
            lay, dur, delay, start, end = pipes[owner[g]]
            d, j = local[g], nxt[g]
            ready = now
            if lay.has_dep[d, j]:
                got = end.flat[lay.dep[d, j]]
                if got != got:  # its input's operation has not finished: wait for that event
                    continue
                ready = max(now, got + delay[d, j])
            if ready > now:
                waiting = min(waiting, ready)
                continue
            running[g], remaining[g], start[d, j] = True, float(dur[d, j]), now
        busy = [g for g in range(n_dev) if running[g]]
        if not busy:
            if waiting == math.inf:
                break
            now = waiting
            continue
        load = sum(weight[g] for g in busy)
        rate = min(1.0, capacity / load)
        step = min(min(remaining[g] for g in busy) / rate, waiting - now)
        now += step
        for g in busy:
            remaining[g] -= step * rate
            if remaining[g] <= 1e-12 * max(1.0, now):
                lay, dur, delay, start, end = pipes[owner[g]]
                end[local[g], nxt[g]] = now
                running[g], nxt[g] = False, nxt[g] + 1
    if any(nxt[g] < ops[g] for g in range(n_dev)):
        raise RuntimeError("pipeline schedule deadlocked; the op order is inconsistent")
    return [PipelineTiming(float(end.max()), start, end, lay.kind, lay.stage, lay.mb) for lay, _, _, start, end in pipes]
