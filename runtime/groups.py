"""Process groups of a plan: who talks to whom, and over which backend.

Rank ``r`` runs device ``plan.devices[r]`` (:func:`device_ranks`). From the plan alone, every process
derives the same :class:`CommLayout` (no communication needed):

* the tensor-parallel group of each stage (its devices);
* the pipeline *lanes* of each replica: lane ``t`` links the ``t``-th device of every stage, so that
  each TP rank sends its (replicated) activations to its counterpart in the next stage;
* where the stages of a replica have different TP degrees, the activation is resharded at the
  boundary (as Megatron-style heterogeneous systems do): every TP rank holds the whole, replicated
  activation, and rank ``u`` of a stage of degree ``t'`` receives it from rank ``u mod t`` of the
  previous stage of degree ``t`` (which thus sends to every ``u`` with ``u mod t`` equal to its index),
  and its gradient back from rank ``u mod t'`` of the next one (:class:`FanOut`). Such a replica's
  pipeline sends go through one group of all its ranks instead of per-lane groups;
* the gradient buckets: one per unit and set of ranks holding the same piece of it (the same TP
  shard) in any replica, also when replicas cut the model at different places. Tied weights (GPT-2's
  embedding and LM head) form their own bucket among every rank holding either copy. When replicas
  hold a unit with different TP degrees, the bucket spans all holders and exchanges full-size
  gradients (each rank adds its shard in place, or its replicated copy divided by its TP degree).
  :func:`fuse_buckets` then joins the buckets of one rank set into all-reduces of up to
  ``cap`` elements (DDP's 25 MB buckets): one latency per group of ranks instead of one per unit.

:class:`ProcessGroups` then creates the groups collectively, in one global order, with a backend per
group: ``nccl`` only when every member has a GPU of its own and all are of one vendor, ``gloo``
otherwise (HETHUB's unified communicator: the fast library inside each homogeneous set, gloo
across vendors and for CPU ranks).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Literal, Sequence


if TYPE_CHECKING:  # pragma: no cover
    from hetpart.plan import Plan
    from hetpart.runtime.models import UnitInfo

__all__ = ["RankRole", "GradBucket", "FusedBucket", "FanOut", "CommLayout", "fuse_buckets", "ProcessGroups",
           "device_ranks", "rank_roles", "comm_layout", "backend_for"]

Backend = Literal["gloo", "nccl"]


@dataclass(frozen=True)
class RankRole:
    """What one rank does in the plan."""

    rank: int
    device: str
    """Device id ``g/n/i`` of the plan that this rank runs."""
    replica: int
    stages: tuple[int, ...]
    """Indices of the replica's stages this rank runs (several for the interleaved schedule)."""
    tp: int
    """Tensor-parallel degree of those stages."""
    tp_index: int
    """Position of this rank in its TP group (its shard and its pipeline lane)."""
    units: tuple[int, ...]
    """Every unit this rank holds, in order."""
    splits: tuple = ()
    """The ``tp_split`` of each of its stages (None where even): ranks whose splits differ hold shards
    of different sizes and exchange gradients at full size."""


@dataclass(frozen=True)
class GradBucket:
    """Gradients all-reduced together: parameters of one unit held by the same group of ranks."""

    ranks: tuple[int, ...]
    """Members, sorted."""
    keys: tuple[str, ...]
    """Canonical parameter keys, in model order."""
    full: bool
    """True when members hold the unit with different TP degrees (full-size exchange)."""
    unit: int
    """The unit the keys belong to (the owner unit for tied weights)."""


@dataclass(frozen=True)
class FusedBucket:
    """Gradients of several units all-reduced as one flat tensor (same members, same ``full``)."""

    ranks: tuple[int, ...]
    keys: tuple[str, ...]
    full: bool
    units: tuple[int, ...]
    """The units whose buckets it joins, in the global bucket order."""


DEFAULT_BUCKET_CAP = 25 * 2**20 // 4
"""Elements per fused all-reduce: DDP's default 25 MiB of fp32 gradients."""


def fuse_buckets(buckets: Sequence[GradBucket], numel: Callable[[str], int],
                 cap: int = DEFAULT_BUCKET_CAP) -> tuple[FusedBucket, ...]:
    """Join the per-unit ``buckets`` that share members and ``full`` into all-reduces of at most ``cap``
    elements (a single larger parameter gets one of its own).

    Every rank derives the same list, largest first (then by first per-unit bucket): a rank that runs
    the ones it belongs to in that order cannot deadlock with another rank (the pending all-reduce
    that comes first globally always has all its members waiting on it), and the large all-reduces of
    disjoint rank sets (replicas cut at different places) run at the same time, before the small ones
    that join them, instead of one after another.

    Args:
        buckets: the per-unit buckets in global order (:attr:`CommLayout.buckets`).
        numel: elements of the all-reduced tensor of a parameter key (full size for ``full`` buckets).
        cap: the most elements per fused all-reduce (``>= 1``).
    """
    if cap < 1:
        raise ValueError(f"cap must be >= 1 element, got {cap!r}")
    open_: dict[tuple[tuple[int, ...], bool], list] = {}
    out: list[tuple[int, list]] = []  # (first bucket index, [ranks, full, keys, units, size])
    for n, b in enumerate(buckets):
        size = sum(numel(k) for k in b.keys)
        cur = open_.get((b.ranks, b.full))
        if cur is None or (cur[4] + size > cap and cur[4] > 0):
            cur = [b.ranks, b.full, [], [], 0]
            open_[(b.ranks, b.full)] = cur
            out.append((n, cur))
        cur[2].extend(b.keys)
        if b.unit not in cur[3]:
            cur[3].append(b.unit)
        cur[4] += size
    out.sort(key=lambda nc: (-nc[1][4], nc[0]))
    return tuple(FusedBucket(ranks=c[0], keys=tuple(c[2]), full=c[1], units=tuple(c[3])) for _, c in out)


@dataclass(frozen=True)
class FanOut:
    """Where one rank of a replica whose stages differ in TP degree sends (global ranks)."""

    forward: tuple[int, ...]
    """Ranks of the next stage that receive this rank's activation (empty: another rank sends it)."""
    backward: tuple[int, ...]
    """Ranks of the previous stage that receive this rank's input gradient."""


@dataclass(frozen=True)
class CommLayout:
    """Every group a plan needs, derived identically on every rank."""

    roles: tuple[RankRole, ...]
    tp_groups: dict[tuple[int, int], tuple[int, ...]]
    """``(replica, stage % pp)`` -> ranks of the stage's TP group, in TP order."""
    lanes: dict[tuple[int, int], tuple[int, ...]]
    """``(replica, tp_index)`` -> ranks of the pipeline lane, in stage order (replicas whose stages all
    have one TP degree; the others are in ``paths``)."""
    buckets: tuple[GradBucket, ...]
    """Gradient buckets in the global order every rank follows."""
    paths: dict[int, tuple[int, ...]] = field(default_factory=dict)
    """rank -> for each device group (stage ``% pp``) of its replica, the rank it receives activations
    or gradients from on its way there (itself at its own stages); its lane when TP degrees agree."""
    p2p_groups: dict[int, tuple[int, ...]] = field(default_factory=dict)
    """rank -> the sorted ranks of the group its pipeline sends and receives go through."""
    fanouts: dict[int, FanOut] = field(default_factory=dict)
    """rank -> its sends, for ranks of replicas whose stages differ in TP degree."""
    hybrid_sets: tuple[tuple[int, ...], ...] = ()
    """Hybrid sharding (``plan.shard_group``): per gradient bucket, its members inside one shard group
    and its members at one position across the groups (the two dimensions of FSDP's HSDP mesh)."""

    def all_rank_sets(self) -> list[tuple[int, ...]]:
        """Distinct sorted rank sets to create: pipeline groups (even of one rank: a pipeline stage
        needs a group), TP groups of two or more ranks, gradient buckets."""
        sets = {tuple(sorted(r)) for r in self.lanes.values()}
        sets |= set(self.p2p_groups.values())
        sets |= {(rank,) for rank in self.fanouts}  # a stage is built on one, then given its replica's group
        sets |= {tuple(sorted(r)) for r in self.tp_groups.values() if len(r) > 1}
        sets |= {b.ranks for b in self.buckets}
        sets |= {s for s in self.hybrid_sets if len(s) > 1}
        return sorted(sets, key=lambda s: (len(s), s))


def device_ranks(plan: "Plan") -> dict[str, int]:
    """Device id -> rank: ranks follow ``plan.devices`` (replica by replica, stage by stage)."""
    return {d: i for i, d in enumerate(plan.devices)}


def _pp(plan: "Plan", replica: int) -> int:
    return plan.pipeline_devices(replica)


def rank_roles(plan: "Plan") -> tuple[RankRole, ...]:
    """The role of every rank, indexed by rank."""
    ranks = device_ranks(plan)
    found: dict[int, dict] = {}
    for i, r in enumerate(plan.replicas):
        for j, s in enumerate(r.stages):
            for t, d in enumerate(s.devices):
                role = found.setdefault(ranks[d], {"replica": i, "stages": [], "tp": s.tp, "tp_index": t, "units": [],
                                                   "splits": []})
                role["stages"].append(j)
                role["splits"].append(s.tp_split)
                role["units"].extend(range(*s.layers))
    return tuple(RankRole(rank=k, device=d, replica=found[k]["replica"], stages=tuple(found[k]["stages"]),
                          tp=found[k]["tp"], tp_index=found[k]["tp_index"], units=tuple(found[k]["units"]),
                          splits=tuple(found[k]["splits"]))
                 for d, k in ranks.items())


def comm_layout(plan: "Plan", units: Sequence["UnitInfo"]) -> CommLayout:
    """The groups of ``plan`` for a model whose units are described by ``units``."""
    roles = rank_roles(plan)
    ranks = device_ranks(plan)
    tp_groups: dict[tuple[int, int], tuple[int, ...]] = {}
    lanes: dict[tuple[int, int], tuple[int, ...]] = {}
    paths: dict[int, tuple[int, ...]] = {}
    p2p: dict[int, tuple[int, ...]] = {}
    fanouts: dict[int, FanOut] = {}
    for i, r in enumerate(plan.replicas):
        pp = _pp(plan, i)
        groups = [tuple(ranks[d] for d in r.stages[j].devices) for j in range(pp)]
        for j in range(pp):
            tp_groups[(i, j)] = groups[j]
        if len({len(g) for g in groups}) == 1:
            for t in range(len(groups[0])):
                lanes[(i, t)] = tuple(g[t] for g in groups)
                for rank in lanes[(i, t)]:
                    paths[rank], p2p[rank] = lanes[(i, t)], tuple(sorted(lanes[(i, t)]))
            continue
        everyone = tuple(sorted(k for g in groups for k in g))
        for k, group in enumerate(groups):
            for t, rank in enumerate(group):
                paths[rank], p2p[rank] = _path(groups, k, t), everyone
        for k, group in enumerate(groups):
            for rank in group:
                fwd = tuple(u for u in groups[k + 1] if paths[u][k] == rank) if k + 1 < pp else ()
                bwd = tuple(u for u in groups[k - 1] if paths[u][k] == rank) if k > 0 else ()
                fanouts[rank] = FanOut(forward=fwd, backward=bwd)
    buckets = _buckets(roles, units)
    return CommLayout(roles=roles, tp_groups=tp_groups, lanes=lanes, buckets=buckets, paths=paths,
                      p2p_groups=p2p, fanouts=fanouts, hybrid_sets=_hybrid_sets(plan, roles, buckets))


def hybrid_mesh(plan: "Plan", roles: Sequence[RankRole], ranks: Sequence[int]) -> list[list[int]] | None:
    """The ``[groups, shard size]`` rank grid of a bucket's members under hybrid sharding (row: one shard
    group; column: one position across the groups), or None when the plan shards over all replicas or
    the members do not fill the grid (one member per replica)."""
    size = plan.shard_group
    if not plan.zero or not size or size >= plan.dp:
        return None
    by_replica = {roles[r].replica: r for r in ranks}
    if len(by_replica) != len(ranks) or len(by_replica) != plan.dp:
        return None
    return [[by_replica[g * size + s] for s in range(size)] for g in range(plan.dp // size)]


def _hybrid_sets(plan: "Plan", roles: Sequence[RankRole], buckets: Sequence[GradBucket]) -> tuple[tuple[int, ...], ...]:
    out: set[tuple[int, ...]] = set()
    for b in buckets:
        grid = hybrid_mesh(plan, roles, b.ranks)
        if grid is None:
            continue
        out |= {tuple(sorted(row)) for row in grid}
        out |= {tuple(sorted(col)) for col in zip(*grid)}
    return tuple(sorted(out))


def _path(groups: Sequence[tuple[int, ...]], k: int, t: int) -> tuple[int, ...]:
    """The ranks rank ``t`` of stage ``k`` exchanges with at every stage: its index modulo each
    neighbour's TP degree, stage by stage outwards (activations come from ``t mod tp`` of the stage
    before, gradients from ``t mod tp`` of the stage after)."""
    index = [0] * len(groups)
    index[k] = t
    for j in range(k - 1, -1, -1):
        index[j] = index[j + 1] % len(groups[j])
    for j in range(k + 1, len(groups)):
        index[j] = index[j - 1] % len(groups[j])
    return tuple(g[x] for g, x in zip(groups, index))


def _buckets(roles: Sequence[RankRole], units: Sequence["UnitInfo"]) -> tuple[GradBucket, ...]:
    owner = {p.key: u.index for u in units for p in u.params if p.key.startswith(u.name + ".")}
    holders: dict[str, dict[int, RankRole]] = defaultdict(dict)
    for role in roles:
        for u in role.units:
            for p in units[u].params:
                holders[p.key][role.rank] = role
    grouped: dict[tuple[tuple[int, ...], bool, int], list[str]] = defaultdict(list)
    order = {p.key: n for n, p in enumerate(p for u in units for p in u.params)}
    for key in sorted(holders, key=order.__getitem__):
        held = holders[key]
        tps = {(role.tp, role.splits if any(role.splits) else ()) for role in held.values()}
        if len(tps) == 1:
            for t in range(tps.pop()[0]):
                group = tuple(sorted(k for k, role in held.items() if role.tp_index == t))
                if len(group) > 1:
                    grouped[(group, False, owner.get(key, 0))].append(key)
        elif len(held) > 1:
            grouped[(tuple(sorted(held)), True, owner.get(key, 0))].append(key)
    return tuple(GradBucket(ranks=g, keys=tuple(keys), full=full, unit=u)
                 for (g, full, u), keys in sorted(grouped.items(), key=lambda kv: (kv[0][2], kv[0][0], kv[0][1])))


def backend_for(ranks: Sequence[int], cuda_ids: Sequence[str | None]) -> Backend:
    """``nccl`` only when every member has a GPU of its own and all are of one vendor, else ``gloo``.

    Args:
        ranks: the group's members.
        cuda_ids: for every rank, ``"vendor|host:index"`` of its GPU (vendor ``nvidia``, or ``amd`` on
            ROCm, where the ``nccl`` backend is RCCL), or None when it runs on CPU. NCCL refuses two
            members on one GPU, and NCCL and RCCL do not talk to each other: such groups use gloo.
    """
    ids = [cuda_ids[r] for r in ranks]
    if not all(ids) or len(set(ids)) != len(ids):
        return "gloo"
    return "nccl" if len({i.partition("|")[0] for i in ids}) == 1 else "gloo"


class ProcessGroups:
    """The torch process groups of a :class:`CommLayout`, created collectively by every rank.

    Args:
        layout: the plan's groups.
        cuda_ids: for every rank, ``"vendor|host:index"`` or None (all-gathered by the caller).
        timeout_s: how long a collective or transfer in these groups may wait for a peer before it
            fails (a dead or hung rank then surfaces as an error instead of a hang).
    """

    def __init__(self, layout: CommLayout, cuda_ids: Sequence[str | None], timeout_s: float = 600.0):
        self.layout = layout
        self.backends: dict[tuple[int, ...], Backend] = {}
        self._groups: dict[tuple[int, ...], object] = {}
        self._created: set[tuple[int, ...]] = set()
        self._cuda_ids, self._timeout_s = list(cuda_ids), timeout_s
        self.add(layout.all_rank_sets())

    def add(self, rank_sets: Sequence[Sequence[int]]) -> None:
        """Create the groups of ``rank_sets`` not created yet (collective: every rank calls it with the
        same sets, in the same order; new_group is collective over the world)."""
        from datetime import timedelta

        import torch.distributed as dist

        me = dist.get_rank()
        for ranks in dict.fromkeys(tuple(sorted(r)) for r in rank_sets):
            if ranks in self._created:
                continue
            self._created.add(ranks)
            backend = backend_for(ranks, self._cuda_ids)
            group = dist.new_group(list(ranks), backend=backend, timeout=timedelta(seconds=self._timeout_s))
            if me in ranks:
                self._groups[ranks] = group
                self.backends[ranks] = backend

    def group(self, ranks: Sequence[int]):
        """The process group of exactly these ranks (this rank must be a member)."""
        return self._groups[tuple(sorted(ranks))]
