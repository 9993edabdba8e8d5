"""A distributed optimizer with uneven shards: sharding levels 1 and 2 for replicas holding unequal fractions.

FSDP2 cuts every parameter into equal ``torch.chunk`` pieces, so a replica cannot hold a chosen
fraction of the states there (:mod:`hetpart.runtime.sharded`). This optimizer does what Megatron-LM's
distributed optimizer does, with uneven ranges: the parameters of one unit held by one set of ranks
(a gradient bucket of :mod:`hetpart.runtime.groups`) form one flat index space, and member ``j`` owns
the contiguous range ``[start_j, start_j + length_j)`` of it, ``length_j`` in proportion to its
replica's ``shard_fractions`` entry (normalised over the bucket's members). Each rank's owned ranges,
unit after unit, are its shard: the optimizer's fp32 states (Adam's two moments, and the fp32 master
copy where the parameters are 16-bit) exist only for it.

What each level runs:

* 1 (optimizer states): gradients accumulate whole over the micro-batches; after the last backward
  they are reduce-scattered into the uneven ranges, the buckets that share their ranks fused into one
  collective of at most ``bucket_cap`` elements (as the unsharded all-reduce fuses them, and as
  Megatron's distributed optimizer reduce-scatters buckets, not layers; the simulator prices one
  collective per run of units with one holder set: per unit, the emulated links' latency was paid
  once per unit);
* 2 (+ gradients): each unit's gradient is reduce-scattered as soon as a micro-batch's backward has
  produced it (a post-accumulate-grad hook on its parameters) and added to the rank's gradient shard;
  the whole gradient is freed at once, so one unit's full gradient is alive at a time.

Then every rank steps its shard with Adam (torch's own functional ``adam``, so the arithmetic is the
reference's, element by element) and the updated ranges are all-gathered back into every member's
parameters.

Uneven pieces: gloo's ``reduce_scatter``/``all_gather`` of lists refuse unequal sizes. ``padded`` pads
every piece to the largest (``reduce_scatter_tensor`` / ``all_gather_into_tensor`` on ``n * max(length)``
elements, what the simulator prices, :func:`hetpart.costmodel.sharding.collective_pad`; the default on
NCCL); ``all_to_all`` sends each member exactly its piece with ``all_to_all_single`` (the default on gloo,
where it measured cheapest: ``experiments/bench_dist_optimizer.py``); ``all_reduce`` all-reduces the whole
bucket.

Buckets are processed in the layout's global order (unit, then ranks), so ranks that share several
buckets issue their collectives in one order.

Uneven tensor parallelism (``tp_split``): each rank holds a slice of every split parameter. Where the
replicas of a unit are split alike, every data-parallel peer holds the same slice and the flat space is
that of the local slices. Where they are split differently (one replica 11:11:11:7 heads, the other
even), the layout gives one bucket of every holder (``full``); here each key is cut at every holder's
slice boundary along its TP dimension, and the pieces held by the same ranks (one per replica) form one
bucket. Its flat space is then that of the piece, and each holder owns its fraction of it, so a rank's
states are its replica's fraction of its own slice, and a gradient crosses only its data-parallel peers
of that piece (no full-size exchange). A copy held by a whole TP group (norms, a stage split evenly by
DTensor holding what another replica slices) counts ``1 / tp`` from each of its holders.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.distributed as dist

if TYPE_CHECKING:  # pragma: no cover
    from hetpart.runtime.engine import Executor

__all__ = ["uneven_ranges", "ShardedAdam", "uses_sharded_adam"]

Method = Literal["padded", "all_to_all", "all_reduce"]


def uses_sharded_adam(plan) -> bool:
    """Whether ``plan`` runs on this optimizer: levels 1-2 with uneven shard fractions, or with an uneven
    tensor-parallel split (``tp_split``: local slices, which FSDP2's DTensor shards cannot hold). Other
    sharded plans run on FSDP2 (:mod:`hetpart.runtime.sharded`)."""
    if plan.zero not in (1, 2):
        return False
    uneven = plan.shard_fractions is not None and len(set(plan.shard_fractions)) > 1
    return uneven or any(s.tp_split is not None for r in plan.replicas for s in r.stages)


def uneven_ranges(numel: int, fractions: list[float]) -> list[tuple[int, int]]:
    """``(start, length)`` of each member's contiguous range of ``numel`` elements, in proportion to
    ``fractions`` (normalised; boundaries rounded from the cumulative sums, so they add up exactly).

    Example:
        >>> uneven_ranges(10, [0.5, 0.3, 0.2])
        [(0, 5), (5, 3), (8, 2)]
    """
    total = sum(fractions)
    bounds, acc = [0], 0.0
    for f in fractions[:-1]:
        acc += f / total
        bounds.append(min(numel, max(bounds[-1], round(numel * acc))))
    bounds.append(numel)
    return [(a, b - a) for a, b in zip(bounds, bounds[1:])]


@dataclass(frozen=True)
class _Segment:
    """One piece of a bucket's flat space: this rank's parameter ``param`` whole (``dim`` None), or its
    elements ``[start, start + length)`` along ``dim`` (its slice of an uneven split, cut where the other
    replicas' slices start and end)."""

    param: torch.nn.Parameter
    key: str
    dim: int | None = None
    start: int = 0
    length: int = 0
    scale: float = 1.0
    """What this rank's gradient counts for: ``1 / tp`` where the rank holds a copy that its whole TP
    group holds too (the group adds up to one replica's gradient), else 1."""

    def view(self, t: torch.Tensor) -> torch.Tensor:
        """The segment's part of ``t`` (a tensor shaped as the parameter is held here)."""
        return t if self.dim is None else t.narrow(self.dim, self.start, self.length)

    @property
    def shape(self) -> torch.Size:
        return self.view(_local(self.param)).shape

    @property
    def numel(self) -> int:
        return self.shape.numel()


@dataclass
class _Bucket:
    """Segments held by one set of ranks, and this rank's range of their flat space."""

    ranks: tuple[int, ...]
    segments: list[_Segment]
    ranges: list[tuple[int, int]]
    """Per member (in ``ranks`` order): ``(start, length)`` in the bucket's flat space."""
    me: int
    shard_at: int
    """Where this rank's range starts in its shard (the owned ranges of its buckets, one after another)."""
    group: Any

    @property
    def numels(self) -> list[int]:
        return [s.numel for s in self.segments]

    @property
    def numel(self) -> int:
        return sum(self.numels)

    @property
    def mine(self) -> tuple[int, int]:
        return self.ranges[self.me]

    def flat(self, tensors: dict[str, torch.Tensor], scaled: bool = False) -> torch.Tensor:
        """The bucket's flat space cut from ``tensors`` (key -> this rank's tensor of that parameter)."""
        parts = []
        for s in self.segments:
            t = s.view(tensors[s.key]).reshape(-1)
            parts.append(t * s.scale if scaled and s.scale != 1.0 else t)
        return torch.cat(parts)

    def scatter(self, flat: torch.Tensor, tensors: dict[str, torch.Tensor]) -> None:
        """Copy the bucket's flat space back into ``tensors`` (key -> this rank's tensor)."""
        for s, piece in zip(self.segments, torch.split(flat, self.numels)):
            s.view(tensors[s.key]).copy_(piece.view(s.shape))


@dataclass
class _Unit:
    """The parameters of one layout bucket (one unit's keys held by one set of ranks) and the buckets its
    flat space is cut into: one where the holders' slices match, one per holder set where replicas are
    split differently (:func:`_pieces`)."""

    params: list[torch.nn.Parameter]
    keys: list[str]
    buckets: list[_Bucket]
    pending: int = 0
    """Level 2: parameters whose gradient this micro-batch's backward has produced so far."""


@dataclass
class _Fused:
    """Buckets sharing their ranks, reduce-scattered as one (level 1). Their flat spaces are laid out
    member-major: member ``j``'s range of every bucket, one after another, forms ``j``'s one contiguous
    range of the fused space, so the fused space is reduce-scattered as a bucket's is."""

    buckets: list[_Bucket]

    @property
    def ranks(self) -> tuple[int, ...]:
        return self.buckets[0].ranks

    @property
    def group(self) -> Any:
        return self.buckets[0].group

    @property
    def me(self) -> int:
        return self.buckets[0].me

    @property
    def ranges(self) -> list[tuple[int, int]]:
        lengths = [sum(b.ranges[j][1] for b in self.buckets) for j in range(len(self.ranks))]
        starts = [sum(lengths[:j]) for j in range(len(lengths))]
        return list(zip(starts, lengths))

    @property
    def mine(self) -> tuple[int, int]:
        return self.ranges[self.me]


def fuse_level1(buckets: list[_Bucket], cap: int) -> list[_Fused]:
    """The buckets (in the layout's global order) joined per rank set into runs of at most ``cap``
    elements (a larger bucket alone), in the order of their first bucket: every member of a rank set
    holds the same buckets, so every rank issues the fused collectives in one global order."""
    open_: dict[tuple[int, ...], _Fused] = {}
    out: list[_Fused] = []
    for b in buckets:
        cur = open_.get(b.ranks)
        if cur is None or sum(x.numel for x in cur.buckets) + b.numel > cap:
            cur = open_[b.ranks] = _Fused([])
            out.append(cur)
        cur.buckets.append(b)
    return out


def _local(t: torch.Tensor) -> torch.Tensor:
    from hetpart._torch_compat import local_tensor

    return local_tensor(t)


def _slice_table(ex: "Executor") -> dict[str, tuple[int | None, int, int, int]]:
    """Key -> ``(dim, offset, length, tp)`` of what this rank holds of each of its parameters: its slice
    along ``dim`` (the TP dimension) at ``offset``, or the whole tensor (``dim`` None), and its TP degree."""
    out = {}
    for key, p in ex.params.items():
        local = _local(p)
        dim = ex._shard(key).tp_dim
        if dim is None:
            out[key] = (None, 0, 0, ex.role.tp)
        else:
            out[key] = (dim, ex._offset(key, local, dim), local.shape[dim], ex.role.tp)
    return out


def _pieces(key: str, ranks: tuple[int, ...], tables: list[dict], size: dict[str, tuple[int, ...]]
            ) -> list[tuple[tuple[int, ...], int | None, int, int]]:
    """Where replicas are split differently, the pieces of ``key``: ``(holders, dim, start, end)`` for each
    run of its TP dimension between two consecutive slice boundaries of any holder, with the ranks whose
    slice covers it (one per replica whose stage splits the key; a replica holding it whole counts every
    rank of its TP group). A key no holder splits is one piece held by all."""
    dims = {tables[r][key][0] for r in ranks} - {None}
    if not dims:
        return [(ranks, None, 0, 0)]
    if len(dims) > 1:
        raise RuntimeError(f"dist_optimizer: {key} is split along different dimensions by its holders")
    dim = dims.pop()
    extent = size[key][dim]
    spans = {}
    for r in ranks:
        d, off, length, _ = tables[r][key]
        spans[r] = (0, extent) if d is None else (off, off + length)
    cuts = sorted({0, extent} | {x for span in spans.values() for x in span})
    return [(tuple(r for r in ranks if spans[r][0] <= a and b <= spans[r][1]), dim, a, b)
            for a, b in zip(cuts, cuts[1:]) if b > a]


def _cuts(ex: "Executor", tables) -> list:
    """Every layout bucket of two or more ranks (tied keys aside, every rank cuts every bucket, so that all
    create the same groups): ``(bucket, keys, [(holders, [(key, dim, start, end), ...]), ...])``, one
    entry of the list per set of holders (the bucket's ranks where they hold alike slices)."""
    from hetpart.runtime.sharded import _tied_keys

    sizes = {k: tuple(info.shape) for k, info in ex._param_info.items()}
    tied = _tied_keys(ex)
    out = []
    for b in ex.layout.buckets:
        held = tuple(k for k in b.keys if k not in tied)
        if len(b.ranks) < 2 or not held:
            continue
        if not b.full:
            out.append((b, held, [(b.ranks, [(k, None, 0, 0) for k in held])]))
            continue
        groups: dict[tuple[int, ...], list] = {}
        for key in held:
            for holders, dim, a, z in _pieces(key, b.ranks, tables, sizes):
                groups.setdefault(holders, []).append((key, dim, a, z))
        out.append((b, held, list(groups.items())))
    return out


def _copy_scale(entry: tuple[int | None, int, int, int]) -> float:
    """``1 / tp`` for a rank that holds a whole copy its TP group holds too (slice table ``entry``), else 1."""
    dim, _, _, tp = entry
    return 1.0 / tp if dim is None and tp > 1 else 1.0


def _segment(ex: "Executor", full: bool, key: str, dim: int | None, a: int, z: int, tables) -> _Segment:
    """This rank's segment of the piece ``[a, z)`` along ``dim`` of ``key`` (the whole tensor when ``dim``
    is None); in a ``full`` bucket a copy that the whole TP group holds counts ``1 / tp``."""
    p = ex.params[key]
    if not full:
        return _Segment(p, key)
    mine = tables[ex.rank][key]
    scale = _copy_scale(mine)
    if dim is None:
        return _Segment(p, key, scale=scale)
    offset = 0 if mine[0] is None else mine[1]
    return _Segment(p, key, dim, a - offset, z - a, scale)


class ShardedAdam:
    """Adam over uneven shards of the parameters ``keys`` of ``ex`` (see the module docstring).

    Args:
        ex: the executor (its plan, layout, process groups and parameters).
        keys: the canonical keys this optimizer owns (sharded among two or more holders, not tied).
        lr, betas, eps: Adam's (torch's defaults, as the executor's unsharded Adam).
        method: how uneven pieces cross the backend: ``all_to_all`` (default on gloo, the cheapest there:
            ``experiments/bench_dist_optimizer.py``), ``padded`` (default on NCCL, whose reduce-scatter and
            all-gather are native) or ``all_reduce``.
        bucket_cap: the most elements per fused level-1 reduce-scatter (default the runtime's gradient
            bucket cap, :data:`hetpart.runtime.groups.DEFAULT_BUCKET_CAP`).
    """

    def __init__(self, ex: "Executor", keys: set[str], *, lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, method: Method | None = None, bucket_cap: int | None = None):
        if method is None:
            method = "padded" if ex.device.type == "cuda" else "all_to_all"
        self.ex, self.lr, self.betas, self.eps, self.method = ex, lr, betas, eps, method
        self.level = ex.plan.zero
        self.units = self._units(ex, keys)
        self.buckets: list[_Bucket] = [b for u in self.units for b in u.buckets]
        at = 0
        for bucket in self.buckets:
            bucket.shard_at = at
            at += bucket.mine[1]
        self.numel = at
        """Elements of this rank's shard."""
        if bucket_cap is None:
            from hetpart.runtime.groups import DEFAULT_BUCKET_CAP as bucket_cap
        self.fused = fuse_level1(self.buckets, bucket_cap) if self.level == 1 else []
        """Level 1: the buckets reduce-scattered together after the last backward."""
        dtype = self.units[0].params[0].dtype if self.units else torch.float32
        self.keeps_master = dtype != torch.float32
        device = ex.device
        self.exp_avg = torch.zeros(at, dtype=torch.float32, device=device)
        self.exp_avg_sq = torch.zeros(at, dtype=torch.float32, device=device)
        self.step_count = torch.tensor(0.0, dtype=torch.float32)
        self.master = self._owned_params() if self.keeps_master else None
        """fp32 master copy of the shard (16-bit parameters only; fp32 parameters are their own master)."""
        self.grad_shard: torch.Tensor | None = None
        self.comm_s = 0.0
        self._hooks = []
        if self.level == 2:
            for unit in self.units:
                for p in unit.params:
                    self._hooks.append(p.register_post_accumulate_grad_hook(self._hook_for(unit)))

    @staticmethod
    def _units(ex: "Executor", keys: set[str]) -> list[_Unit]:
        """The layout's buckets this rank holds keys of, each cut into the buckets that move its flat space.

        Where every holder holds the same slice (replicas split alike), a unit is one bucket of whole
        local tensors. Where replicas are split differently (a ``full`` layout bucket), each key is cut at
        every holder's slice boundaries (:func:`_pieces`) and the pieces with the same holders form one
        bucket, so each rank's states are its fraction of its own slice. Pieces need every holder's
        slices (one all-gather of the tables over the world, where the plan has such buckets) and the
        groups of their holder sets (created collectively)."""
        plan, roles = ex.plan, ex.layout.roles
        tables = None
        if any(b.full for b in ex.layout.buckets):
            tables = [None] * dist.get_world_size()
            dist.all_gather_object(tables, _slice_table(ex))
        cuts = _cuts(ex, tables)
        if tables is not None:
            ex.groups.add([h for _, _, subs in cuts for h, _ in subs])
        units = []
        for b, held, subs in cuts:
            mine = [k for k in held if k in keys]
            if ex.rank not in b.ranks or not mine:
                continue
            buckets = []
            for holders, pieces in subs:
                pieces = [piece for piece in pieces if piece[0] in keys]
                if ex.rank not in holders or not pieces:
                    continue
                segments = [_segment(ex, b.full, key, dim, a, z, tables) for key, dim, a, z in pieces]
                weights = [plan.shard_fraction(roles[r].replica) * (_copy_scale(tables[r][pieces[0][0]]) if b.full
                                                                   else 1.0) for r in holders]
                buckets.append(_Bucket(holders, segments, uneven_ranges(sum(s.numel for s in segments), weights),
                                       holders.index(ex.rank), 0, ex.groups.group(holders)))
            units.append(_Unit([ex.params[k] for k in mine], mine, buckets))
        return units

    # --------------------------------------------------------------------------- gradients
    def start_step(self) -> None:
        """Before a step's first forward: no gradient shard yet (level 2 accumulates into a fresh one)."""
        self.grad_shard = torch.zeros(self.numel, dtype=torch.float32, device=self.ex.device) if self.level == 2 else None
        for unit in self.units:
            unit.pending = 0

    def _hook_for(self, unit: _Unit):
        def hook(_param: torch.Tensor) -> None:
            unit.pending += 1
            if unit.pending == len(unit.params):
                self._reduce_into_shard(unit)
        return hook

    def finish_backward(self) -> None:
        """After the last backward: level 1 reduce-scatters every unit's accumulated gradient; level 2
        reduces what no hook has (a parameter that got no gradient this micro-batch), in unit order."""
        if self.level == 1:
            self.grad_shard = torch.zeros(self.numel, dtype=torch.float32, device=self.ex.device)
            owners = {k: p for unit in self.units for k, p in zip(unit.keys, unit.params)}
            grads = {k: _local(p.grad) if p.grad is not None else torch.zeros_like(_local(p)) for k, p in owners.items()}
            left = Counter(seg.key for fused in self.fused for bucket in fused.buckets for seg in bucket.segments)
            for fused in self.fused:
                self._reduce_fused_into_shard(fused, grads, owners, left)
            for unit in self.units:
                for p in unit.params:
                    p.grad = None  # freed: the shard holds what this rank owns of it
        else:
            for unit in self.units:
                if unit.pending:
                    self._reduce_into_shard(unit)

    def _reduce_into_shard(self, unit: _Unit) -> None:
        grads = {k: _local(p.grad) if p.grad is not None else torch.zeros_like(_local(p))
                 for k, p in zip(unit.keys, unit.params)}
        flats = [bucket.flat(grads, scaled=True) for bucket in unit.buckets]
        for p in unit.params:
            p.grad = None  # freed: the shard holds what this rank owns of it
        for bucket, flat in zip(unit.buckets, flats):
            piece = self._reduce_scatter(bucket, flat)
            _, length = bucket.mine
            self.grad_shard[bucket.shard_at: bucket.shard_at + length] += piece.float()
        unit.pending = 0

    def _reduce_fused_into_shard(self, fused: _Fused, grads: dict[str, torch.Tensor],
                                 owners: dict[str, torch.nn.Parameter], left: Counter) -> None:
        """Level 1: the fused buckets' gradients (``grads``: key -> this rank's gradient) laid out
        member-major (:class:`_Fused`), reduce-scattered in one collective, each bucket's piece added to its
        place in the shard. A gradient is freed as soon as the last of its segments (``left``: segments per
        key not yet copied) is in the fused buffer, so the buffer fills as the gradients go and the step's
        peak does not hold both (it did: +16 MB on a rank holding 0.75 of the shards, measured)."""
        ranges = fused.ranges
        send = None
        for i, bucket in enumerate(fused.buckets):
            flat = bucket.flat(grads, scaled=True)  # one bucket's flat at a time beside the fused buffer
            if send is None:
                send = torch.empty(sum(length for _, length in ranges), dtype=flat.dtype, device=flat.device)
            for j, (start, length) in enumerate(bucket.ranges):
                at = ranges[j][0] + sum(b.ranges[j][1] for b in fused.buckets[:i])
                send[at: at + length] = flat[start: start + length]
            del flat
            for seg in bucket.segments:
                left[seg.key] -= 1
                if left[seg.key] == 0:
                    grads.pop(seg.key, None)
                    owners[seg.key].grad = None
        piece = self._reduce_scatter(fused, send)
        at = 0
        for bucket in fused.buckets:
            _, length = bucket.mine
            self.grad_shard[bucket.shard_at: bucket.shard_at + length] += piece[at: at + length].float()
            at += length

    def _reduce_scatter(self, bucket: _Bucket, flat: torch.Tensor) -> torch.Tensor:
        begin = time.perf_counter()
        n, (start, mine) = len(bucket.ranks), bucket.mine
        if self.method == "all_reduce":
            flat = flat.clone()
            dist.all_reduce(flat, group=bucket.group)
            piece = flat[start: start + mine]
        elif self.method == "all_to_all":
            out = torch.empty(n * mine, dtype=flat.dtype, device=flat.device)
            dist.all_to_all_single(out, flat, output_split_sizes=[mine] * n,
                                   input_split_sizes=[length for _, length in bucket.ranges], group=bucket.group)
            piece = out.view(n, mine).sum(0) if mine else out[:0]
        else:
            most = max(length for _, length in bucket.ranges)
            send = torch.zeros(n * most, dtype=flat.dtype, device=flat.device)
            for j, (start, length) in enumerate(bucket.ranges):
                send[j * most: j * most + length] = flat[start: start + length]
            out = torch.empty(most, dtype=flat.dtype, device=flat.device)
            dist.reduce_scatter_tensor(out, send, group=bucket.group)
            piece = out[:mine]
        self._report("reduce_scatter", flat, bucket, begin)
        return piece

    def _all_gather(self, bucket: _Bucket, piece: torch.Tensor) -> torch.Tensor:
        begin = time.perf_counter()
        n = len(bucket.ranks)
        if self.method == "all_reduce":
            start, mine = bucket.mine
            flat = torch.zeros(bucket.numel, dtype=piece.dtype, device=piece.device)
            flat[start: start + mine] = piece
            dist.all_reduce(flat, group=bucket.group)
        elif self.method == "all_to_all":
            flat = torch.empty(bucket.numel, dtype=piece.dtype, device=piece.device)
            dist.all_to_all_single(flat, piece.repeat(n), output_split_sizes=[length for _, length in bucket.ranges],
                                   input_split_sizes=[piece.numel()] * n, group=bucket.group)
        else:
            most = max(length for _, length in bucket.ranges)
            send = torch.zeros(most, dtype=piece.dtype, device=piece.device)
            send[: piece.numel()] = piece
            out = torch.empty(n * most, dtype=piece.dtype, device=piece.device)
            dist.all_gather_into_tensor(out, send, group=bucket.group)
            flat = torch.cat([out[j * most: j * most + length] for j, (_, length) in enumerate(bucket.ranges)])
        self._report("all_gather", flat, bucket, begin)
        return flat

    def _report(self, kind: str, flat: torch.Tensor, bucket: _Bucket, begin: float) -> None:
        # what the simulator prices: the bucket padded to n x the largest range (an emulated run pays that)
        padded = len(bucket.ranks) * max(length for _, length in bucket.ranges)
        self.ex.hooks.on_collective(kind, padded * flat.element_size(), bucket.ranks)
        elapsed = time.perf_counter() - begin
        self.comm_s += elapsed
        # level 2 runs from the backward's hooks, inside a compute chunk: this is not compute (an emulated
        # slow device would otherwise stretch the collective and its emulated link time by its slowdown)
        self.ex.clock.communicated(elapsed)

    # --------------------------------------------------------------------------- the step
    def _tensors(self) -> dict[str, torch.Tensor]:
        """Key -> this rank's (local) tensor of each parameter the optimizer owns a range of."""
        return {k: _local(p) for u in self.units for k, p in zip(u.keys, u.params)}

    def _cut(self, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        """This rank's ranges of ``tensors`` (key -> a tensor shaped as the parameter is held here), in
        fp32, one bucket after another (a new tensor)."""
        pieces = []
        for bucket in self.buckets:
            start, length = bucket.mine
            pieces.append(bucket.flat(tensors)[start: start + length].float())
        return torch.cat(pieces) if pieces else torch.zeros(0, device=self.ex.device)

    def _gathered(self, shard: torch.Tensor, into: dict[str, torch.Tensor]) -> None:
        """All-gather every bucket's ranges of ``shard`` (this rank's) into ``into`` (key -> a tensor shaped
        as the parameter is held here), in ``into``'s dtypes."""
        for bucket in self.buckets:
            _, length = bucket.mine
            dtype = into[bucket.segments[0].key].dtype
            flat = self._all_gather(bucket, shard[bucket.shard_at: bucket.shard_at + length].to(dtype))
            bucket.scatter(flat, into)

    def _owned_params(self) -> torch.Tensor:
        """This rank's ranges of the parameters, in fp32 (a new tensor)."""
        with torch.no_grad():
            return self._cut({k: t.detach() for k, t in self._tensors().items()})

    def step(self) -> None:
        """Adam on the shard, then the updated ranges all-gathered into every member's parameters."""
        from torch.optim.adam import adam

        if self.grad_shard is None:
            raise RuntimeError("ShardedAdam.step before finish_backward")
        shard = self.master if self.keeps_master else self._owned_params()
        adam([shard], [self.grad_shard], [self.exp_avg], [self.exp_avg_sq], [], [self.step_count], foreach=False,
             amsgrad=False, beta1=self.betas[0], beta2=self.betas[1], lr=self.lr, weight_decay=0.0, eps=self.eps,
             maximize=False)
        self.grad_shard = None
        with torch.no_grad():
            self._gathered(shard, self._tensors())

    # --------------------------------------------------------------------------- inspection, checkpoints
    def full_gradients(self) -> dict[str, torch.Tensor]:
        """The summed gradient of every owned key, shaped as this rank holds the parameter (its whole local
        tensor or slice; all-gathered from the shards: a collective)."""
        if self.grad_shard is None:
            raise RuntimeError("ShardedAdam.full_gradients before finish_backward")
        out = {k: torch.zeros_like(t) for k, t in self._tensors().items()}
        self._gathered(self.grad_shard, out)
        return out

    def whole_states(self) -> dict[str, torch.Tensor]:
        """Adam's states of every owned key as whole tensors, shaped as the parameter this rank holds
        (``optim.<key>.exp_avg`` / ``.exp_avg_sq`` / ``.step``), all-gathered from the shards: a checkpoint
        written so does not depend on the fractions (a collective; every holder gets the same values)."""
        out: dict[str, torch.Tensor] = {}
        params = dict((k, p) for u in self.units for k, p in zip(u.keys, u.params))
        for name, shard in (("exp_avg", self.exp_avg), ("exp_avg_sq", self.exp_avg_sq)):
            states = {k: torch.zeros_like(t, dtype=torch.float32) for k, t in self._tensors().items()}
            self._gathered(shard, states)
            out.update({f"optim.{k}.{name}": _like_param(t, params[k]) for k, t in states.items()})
        out.update({f"optim.{k}.step": self.step_count.clone() for k in params})
        return out

    def load_whole_states(self, states: dict[str, torch.Tensor]) -> None:
        """Cut this rank's ranges out of :meth:`whole_states`' tensors (as loaded from a checkpoint)."""
        keys = list(self._tensors())
        with torch.no_grad():
            for name, shard in (("exp_avg", self.exp_avg), ("exp_avg_sq", self.exp_avg_sq)):
                shard.copy_(self._cut({k: _local(states[f"optim.{k}.{name}"]) for k in keys}))
            if keys:
                self.step_count.copy_(states[f"optim.{keys[0]}.step"])
            if self.master is not None:
                self.master = self._owned_params()


def _like_param(t: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """``t`` (this rank's local shape) as the parameter is held: a DTensor on its mesh under TP."""
    from torch.distributed.tensor import DTensor

    if isinstance(param, DTensor):
        return DTensor.from_local(t, param.device_mesh, param.placements, run_check=False)
    return t
