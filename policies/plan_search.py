"""The ``search`` planner: exact search over a structured plan space (Metis / AMP / Sailor style).

The space (what "optimum of its own space" means in ``tests/test_search.py``):

* **mixed pipelines** (Metis, Sailor): ``dp`` identical replicas; each is one pipeline that takes
  ``G_p // dp`` tensor-parallel groups of degree ``tp_p`` from every pool ``p`` of a chosen subset of
  pools (a pool is all nodes of one node type; the ``G_p % dp`` groups left over sit out:
  :func:`replica_counts`), pools in a chosen order (pools of one zone kept
  together, so a pipeline crosses each zone boundary once), layers split unevenly between stages,
  batch split evenly;
* **typed replicas** (HAP, Sailor's mixed data parallelism): each pool of a chosen subset runs its
  own ``dp_p = G_p // pp_p`` replicas of a ``pp_p``-stage, ``tp_p``-wide pipeline (the rest sit out:
  :func:`pipeline_depths`); the data-parallel members of a
  unit may then be of different device types; the batch is split unevenly between replicas;

for every micro-batch size (up to 16) and every allowed recompute mode, schedule 1F1B, and the
sharding levels of data parallelism (``zero``): the workload's when it names one, else levels 0 and 1
(level 1, Megatron's distributed optimizer, moves the same bytes as level 0 and frees the optimizer
states, which can buy a larger micro-batch or no recompute; with a second core the two are searched side
by side; beyond ``LEVEL_ONE_MAX_DEVICES`` devices level 1 only where level 0 has nothing that fits), then
higher levels only while nothing fits (levels 2 and 3 add communication). When the best
plan splits a tensor-parallel group unevenly (its fast devices then hold more than their even share and
bind memory first), the next level is searched too. The faster plan of all the levels searched is kept.

Each point is scored by a cost estimate built from the simulator's primitives
(:mod:`hetpart.policies.search_costs`): ``(m - 1) * slowest stage + sum of stages`` per pipeline, each
stage paying its blocking pipeline sends every micro-batch, plus the gradient sync of the slowest
stage's ring, as the simulator prices them: transfers and rings that leave a node at once share its
NICs, TCP sends block even where the engine overlaps sends, level 1 reduce-scatters, a typed
replica holding a throttled device (``slow:``) gets fewer micro-batches, and the stage of a one-replica
pipeline whose group holds one is priced at the group's pace (:func:`_pace`), so it gets fewer units. For a structure,
:func:`~hetpart.policies.partition.split_layers` finds the layer split exactly (dynamic program over boundaries, memory as a mask, bounded scan of
bottleneck values) and :func:`~hetpart.policies.partition.allocate_microbatches` the batch shares
exactly (integer form of HAP's LP). Structures are visited in order of a lower bound and skipped once
the bound can beat neither the ``top_k``-th best estimate nor the best estimate of its group (family
and set of pools used) nor, up to 256 devices, the best estimate of its basin (a mixed pipeline's pools in
order and their tensor-parallel degrees, which the hill-climb cannot change) while that comes within 5% of the
best estimate. The ``top_k`` best structures, every group's best and those basins' bests (both device placements
of mixed pipelines) are then simulated; the best of each kind of candidate and of every basin within 2% of
the level's best (:func:`_near_basins`) are refined by hill-climbing their layer
boundaries and batch shares under the simulator (and interleaved), and the ``uniform`` and ``proportional`` planners'
plans join as candidates, so ``search`` is never slower than either.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
import bisect
from collections import Counter, defaultdict
from dataclasses import dataclass, field, fields, replace
from functools import partial
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Callable, Iterator

import numpy as np

from hetpart.costmodel.evaluator import Evaluated, Evaluator, best_of
from hetpart.costmodel.memory import GRAD_BYTES
from hetpart.costmodel.pools import (Pool, check_zones_connected, device_pools, divisors, tp_groups, tp_options, zone_path_ok,
                                     zones_linked)
from hetpart.errors import PlanError, WorkloadError
from hetpart.plan import Plan
from hetpart.policies.common import FunctionPlanner, microbatch_options, no_plan_error, recompute_modes, sharding_levels
from hetpart.policies.layout import assemble
from hetpart.policies.partition import Split, _minimax, allocate_microbatches, split_layers
from hetpart.policies.refine import refine
from hetpart.policies.search_costs import CostTable, StageCosts

if TYPE_CHECKING:  # pragma: no cover
    from hetpart.cluster import Cluster
    from hetpart.graph.model_graph import ModelGraph
    from hetpart.workload import Workload

__all__ = ["SearchOptions", "Scored", "plan_search", "search_space", "mixed_structures", "typed_structures", "SEARCH",
           "replica_counts", "pipeline_depths"]


@dataclass(frozen=True)
class SearchOptions:
    """Knobs of the search (defaults are what ``hetpart plan`` uses)."""

    top_k: int = 16
    """Structures simulated after the estimate ranks them."""
    time_limit_s: float = 600.0
    """Seconds within which the search answers: it stops listing and visiting points at :data:`SEARCH_SHARE` of
    them and finishes with the best it has priced (points are visited in order of their lower bound, so the most
    promising first; the climb from the best stops at the limit, the policy's walk runs whole); the result says so
    (``complete: false``). 0: no limit. Clusters of many device types have millions of points: eight types of
    eight GPUs did not answer in 15 minutes."""
    deadline: float = math.inf
    """``time.monotonic()`` at which listing and visiting points stop: :data:`SEARCH_SHARE` of :attr:`time_limit_s`,
    set by :func:`plan_search` (the searches of its views and levels share it)."""
    finish_by: float = math.inf
    """``time.monotonic()`` at which :attr:`time_limit_s` runs out: the climb from the best plans and the policy's
    walk that finish a cut-short search stop there."""
    max_micro_batch: int = 16
    """Largest micro-batch size tried."""
    refine_steps: int = 40
    """Simulations the hill-climb may spend on the best candidate."""
    include_baselines: bool = True
    """Add the uniform and proportional planners' plans as candidates."""
    ignore_memory: bool = False
    """Lift memory limits (the upper bound uses this for types that cannot hold the model alone)."""
    configs_per_pool: int = 4
    """Typed replicas: best (tp, pp) configurations kept per pool before combining pools."""
    uneven_shards: bool = True
    """Sharded typed replicas (data-parallel groups of unlike devices) hold uneven shard fractions,
    water-filled to each device's memory (:mod:`hetpart.policies.shard_fractions`), at the levels the
    runtime runs them (1-2, no hybrid sharding: :func:`hetpart.rules.uneven_shard_problems`; they run on
    :mod:`hetpart.runtime.dist_optimizer`). ``False``: even shards only."""
    fewer_nodes: bool = True
    """Also search the cluster on fewer nodes (:func:`~hetpart.costmodel.pools.fewer_nodes`: every node group
    halved, and halved again while that beats every plan found so far, or while nothing fits yet), the
    nodes left out idling: a small global batch cannot keep every device busy, and past some size another
    replica costs more in gradient sync than it adds (Sailor likewise chooses how many GPUs of each type to
    use). The plans found there are priced on the whole cluster."""
    single_types: bool = True
    """On a cluster of several device types whose search skips sharding level 1 (more than
    :data:`LEVEL_ONE_MAX_DEVICES` devices), also search each type alone (:func:`single_types_best`): a type
    alone may be searched at level 1 there, and the fastest type alone can beat every plan that must
    carry the slower ones (gpt3-6.7b on 256 H100 + 256 A100 + 256 V100 + 256 L4: 2.83 M tokens/s on all,
    3.01 M on the H100s alone). The plans found there are priced on the whole cluster."""
    walk: bool = True
    """Also walk the policy's structure neighbourhood (without its network) from the best plans found, and climb
    from the walk's best and from every basin of structures the hill-climb cannot leave (pool order, TP degrees)
    that comes near it (:func:`~hetpart.policies.policy_planner.walk_starts`): this search's estimate may rank such
    a basin behind another (opt-6.7b as config.json on 2 x 8 A100 + 2 x 8 V100: 81,490 tokens/s without the walk,
    87,271 through A100-V100 pipelines at TP 1)."""
    speed_types: bool = True
    """On a cluster with throttled devices (``slow:``), also search its :func:`~hetpart.costmodel.pools.speed_typed`
    view, where each throttled device is a device type of its own (pools are per type, so only there can a
    structure give it a smaller batch share, fewer layers, or leave it out); the best plan found there joins
    the candidates on the real devices."""
    views: dict | None = field(default=None, compare=False, repr=False)
    """The searches of views of the cluster run so far under one :func:`plan_search` (set by it, shared by the
    searches of its views, :func:`_view_search`): a view met twice is searched once. Views nest, and two paths
    can reach one view: the speed-typed view on fewer nodes and fewer nodes' speed-typed view are the same 28
    GPUs of llama2-13b's ``four-types.yaml`` (heldout-11-29), searched twice before."""


@dataclass(frozen=True, order=True)
class Scored:
    """One point of the search space with its estimate."""

    estimate_s: float
    """Estimated step time, seconds."""
    key: tuple = field(compare=False)
    """What the point is (family and choices), for tests and reports."""
    build: Callable[[], list[Plan]] = field(compare=False, repr=False)
    """Makes the plans of this point (mixed pipelines give two device placements)."""


@dataclass
class _Context:
    model: "ModelGraph"
    cluster: "Cluster"
    workload: "Workload"
    options: SearchOptions
    pools: list[Pool]
    table: CostTable
    sync_cache: dict = field(default_factory=dict)
    bound_cache: dict = field(default_factory=dict)
    zero: int = 0
    """Sharding level of every plan with more than one replica (memory masks and plans)."""
    uniform_speed: bool = True
    """No device carries a speed factor (``Cluster.uniform_speed``)."""
    device_index: dict[str, int] = field(default_factory=dict)
    """Each device's index in the cluster's order."""
    places: np.ndarray = field(default_factory=lambda: np.zeros((0, 3), dtype=np.int64))
    """Per device (in the cluster's order): its flat node number, node group and place in its node."""
    node_group: list[int] = field(default_factory=list)
    """Per flat node number: its node group."""
    node_device: list[str] = field(default_factory=list)
    """Per flat node number: its first device."""
    out_bytes: float = 0.0
    """Bytes one sequence's activations take at a stage boundary (the largest unit output)."""
    overlap_p2p: bool = False
    """The priced engine overlaps pipeline sends with compute over RDMA (the simulator's ``overlap_p2p``);
    otherwise every send blocks its sender, as Megatron-LM's 1F1B does (:func:`_sends`)."""

    @property
    def n(self) -> int:
        return self.model.num_units


# --------------------------------------------------------------------------------------------- mixed pipelines


def _zone_contiguous(ctx: _Context, order: tuple[Pool, ...]) -> bool:
    return zone_path_ok(ctx.cluster, [p.zone for p in order], ctx.model.tied_owner_index >= 0)


def _mixed_shapes(ctx: _Context) -> Iterator[tuple[tuple[Pool, ...], tuple[int, ...], int]]:
    """``(pools in pipeline order, tp per pool, dp)`` of every mixed-pipeline shape."""
    for subset, tps, dp in _mixed_multisets(ctx):
        by_pool = dict(zip(subset, tps))
        for order in _orders(ctx, subset):
            yield order, tuple(by_pool[p] for p in order), dp


def _mixed_multisets(ctx: _Context) -> Iterator[tuple[tuple[Pool, ...], tuple[int, ...], int]]:
    """``(subset of pools, tp per pool, dp)`` of every mixed pipeline, before the pools' order; only subsets
    that some order keeps to the zones' links."""
    pools = ctx.pools
    for size in range(1, len(pools) + 1):
        for subset in itertools.combinations(pools, size):
            if not _orders(ctx, subset):
                continue
            for tps in itertools.product(*(tp_options(p, ctx.model) for p in subset)):
                groups = [p.num_devices // t for p, t in zip(subset, tps)]
                for dp in replica_counts(groups, ctx.workload.global_batch):
                    if sum(g // dp for g in groups) > _most_stages(ctx):
                        continue
                    yield subset, tps, dp


def replica_counts(groups: list[int], global_batch: int) -> list[int]:
    """The replica counts ``dp`` of a mixed pipeline over pools of ``groups`` tensor-parallel groups, increasing: each
    replica takes ``groups[p] // dp`` groups of pool ``p`` and the ``groups[p] % dp`` left over sit out (fewer than
    one more group per replica); ``dp`` divides the batch and is at most ``min(groups)``; of counts whose replicas
    take the same groups per pool, the largest only (the smaller leaves whole replicas idle). Every divisor of the
    pools' common divisor is one. Whole pools only missed plans: gpt3-6.7b on 960 A100s (480 TP-2 groups, batch
    2,048; heldout-12-01b) runs 64 replicas of 7 stages 8.0% faster than the best plan of whole pools, and no
    divisor of 480 is near 64 x 7.

    >>> replica_counts([480], 2048)
    [1, 2, 4, 8, 16, 32, 64, 128, 256]
    >>> replica_counts([6, 4], 8)
    [1, 2, 4]
    """
    by_share: dict[tuple[int, ...], int] = {}
    least = min(groups)
    for dp in divisors(global_batch):
        if dp > least:
            break
        by_share[tuple(g // dp for g in groups)] = dp  # increasing: the largest count of each share stays
    return sorted(by_share.values())


def pipeline_depths(groups: int, most: int) -> list[int]:
    """The pipeline depths ``pp`` a pool of ``groups`` tensor-parallel groups runs typed replicas at, increasing,
    each with the most replicas that fit (``groups // pp``; the ``groups % pp`` left over sit out): every depth up
    to ``most`` that is the deepest its replica count fits (``groups // (groups // pp) == pp``; a shallower one
    leaves a whole stage of every replica idle), the divisors of ``groups`` among them (:func:`replica_counts`
    says why whole pools are not enough).

    >>> pipeline_depths(12, 12)
    [1, 2, 3, 4, 6, 12]
    >>> pipeline_depths(14, 8)
    [1, 2, 3, 4, 7]
    """
    return [pp for pp in range(1, min(groups, most) + 1) if groups // (groups // pp) == pp]


MASKS_MAX_BYTES = 2 << 30
"""Most bytes of one pipeline's stage matrices (one ``[n + 1, n + 1]`` per stage, its memory mask applied): a
model of 1,000 layers takes 8 MB per matrix, and a 1,000-stage pipeline of it 8 GB (the kernel killed the
search on this 24 GB machine)."""


def _most_stages(ctx: _Context) -> int:
    """The deepest pipeline the search prices: one unit per stage, and its matrices within :data:`MASKS_MAX_BYTES`."""
    return min(ctx.n, max(1, MASKS_MAX_BYTES // (8 * (ctx.n + 1) ** 2)))


def _orders(ctx: _Context, subset: tuple[Pool, ...]) -> list[tuple[Pool, ...]]:
    """The pipeline orders of ``subset`` that keep to the zones' links (:func:`_zone_contiguous`)."""
    key = ("orders", subset)
    hit = ctx.sync_cache.get(key)
    if hit is None:
        hit = ctx.sync_cache[key] = [o for o in itertools.permutations(subset) if _zone_contiguous(ctx, o)]
    return hit


def _mixed_groups(order, tps, dp: int, placement: str) -> list[list[tuple[str, ...]]]:
    """Stage device groups per replica: ``pp`` placement keeps a replica's stages on adjacent GPUs,
    ``dp`` placement puts the data-parallel peers of a stage on adjacent GPUs."""
    replicas: list[list[tuple[str, ...]]] = [[] for _ in range(dp)]
    for pool, tp in zip(order, tps):
        groups = tp_groups(pool, tp)
        s = len(groups) // dp
        groups = groups[:s * dp]  # the pool's last groups sit out where dp does not divide them (whole nodes first)
        for r in range(dp):
            replicas[r] += groups[r * s:(r + 1) * s] if placement == "pp" else groups[r::dp]
    return replicas


def _sends(ctx: _Context, replicas: list[list[tuple[str, ...]]], micro_batch: int, layout: tuple | None = None
           ) -> tuple[tuple[float, ...], tuple[bool, ...]]:
    """Per stage boundary of these replicas' pipelines (alike in depth): one transfer's seconds (the
    slowest replica's) and whether it blocks its sender, as the simulator prices them
    (:meth:`~hetpart.costmodel.simulator.Simulator._pipeline_flows`): replicas run in step, so every
    boundary that crosses a node's NICs at once shares them (each of a stage's ``tp`` ranks sends its
    ``1/tp`` shard: shards count as flows); a send blocks its sender unless the engine overlaps sends and
    both nodes' NICs are RDMA (inside a node: never). Every block sends the same bytes (the largest
    unit output; only a boundary right after the head would send fewer). ``layout``: a key that names
    these replicas' devices (default: the devices themselves)."""
    from hetpart.costmodel.collectives import p2p_time_s

    key = ("sends", micro_batch, layout if layout is not None else _layout(replicas))
    hit = ctx.sync_cache.get(key)
    if hit is None:
        links, blocks = _send_links(ctx, replicas, key[2])
        out_bytes = ctx.out_bytes * micro_batch
        times = tuple(max((p2p_time_s(out_bytes / tp, link) for link, tp in boundary), default=0.0)
                      for boundary in links)
        hit = ctx.sync_cache[key] = (times, blocks)
    return hit


def _layout(replicas: list[list[tuple[str, ...]]]) -> tuple:
    return tuple(tuple((s[0], len(s)) for s in stages) for stages in replicas)


def _send_links(ctx: _Context, replicas: list[list[tuple[str, ...]]], layout: tuple
                ) -> tuple[list[set[tuple]], tuple[bool, ...]]:
    """:func:`_sends` before the bytes: per boundary, the distinct ``(link as shared, tp)`` of its replicas,
    and whether the boundary blocks its sender (``layout``: the key of ``replicas``). Inside a node a link
    depends on the node group and the two GPUs' places (a cube-mesh wires some pairs only); between nodes
    on the two node groups and the flows on each node. Replicas are counted in numpy: a 1,024-GPU
    pipeline has hundreds of boundaries and few kinds of them."""
    key = ("send links", layout)
    hit = ctx.sync_cache.get(key)
    if hit is not None:
        return hit
    shape = (len(replicas), len(replicas[0]))
    groups = list(itertools.chain.from_iterable(replicas))  # C-level maps below: hundreds of groups per call
    first = np.fromiter(map(ctx.device_index.__getitem__, map(itemgetter(0), groups)), np.int64, len(groups))
    width = np.fromiter(map(len, groups), np.int64, len(groups)).reshape(shape)
    places = ctx.places[first].reshape(shape + (3,))
    node, group, local = places[..., 0], places[..., 1], places[..., 2]
    tp = np.maximum(width[:, :-1], width[:, 1:])
    src, dst = node[:, :-1], node[:, 1:]
    cross = src != dst
    size = int(node.max()) + 1
    flows = np.maximum(np.bincount(src[cross], weights=tp[cross], minlength=size),
                       np.bincount(dst[cross], weights=tp[cross], minlength=size)).astype(np.int64)
    wan = _zone_flows(ctx, group, tp, cross)
    depth = tp.shape[1]
    boundary = np.broadcast_to(np.arange(depth), tp.shape)
    links: list[set[tuple]] = [set() for _ in range(depth)]
    blocks = [not ctx.overlap_p2p] * depth
    if not cross.all():
        inside = np.stack([boundary, group[:, :-1], local[:, :-1], local[:, 1:], tp], axis=-1)[~cross]
        for k, g, la, lb, t in set(map(tuple, inside.tolist())):
            links[k].add((_inside_link(ctx, g, la, lb), t))
    if cross.any():
        # one link per kind: boundary, node groups, flows and tp (the nodes themselves do not matter)
        across = np.stack([boundary, group[:, :-1], group[:, 1:], flows[src], flows[dst], wan, tp, src, dst],
                          axis=-1)[cross].tolist()
        kinds = {tuple(row[:7]): row for row in across}
        for k, _, _, fa, fb, fz, t, a, b in kinds.values():
            link, tcp = _across_link(ctx, a, b, fa, fb, fz)
            links[k].add((link, t))
            blocks[k] = blocks[k] or tcp
    hit = ctx.sync_cache[key] = (links, tuple(blocks))
    return hit


def _zone_flows(ctx: _Context, group: np.ndarray, tp: np.ndarray, cross: np.ndarray) -> np.ndarray:
    """Per boundary of the replicas (``[replica, boundary]``; ``group``: each stage's node group): how many
    transfers share the link between the zones it crosses (the simulator's ``_pipeline_flows``): the shards
    crossing that link one way or the other, the larger; 0 inside a zone."""
    if not ctx.cluster.zone_links:
        return np.zeros(tp.shape, dtype=np.int64)
    names = ctx.cluster.zones
    zone = np.array([names.index(g.zone) for g in ctx.cluster.groups], dtype=np.int64)[group]
    za, zb = zone[:, :-1], zone[:, 1:]
    size = len(names)
    moved = cross & (za != zb)
    count = np.bincount((za * size + zb)[moved], weights=tp[moved], minlength=size * size).reshape(size, size)
    count = np.maximum(count, count.T).astype(np.int64)
    return np.where(za != zb, count[za, zb], 0)


def _inside_link(ctx: _Context, group: int, a: int, b: int):
    """The link between GPUs ``a`` and ``b`` of one node of node group ``group``."""
    from hetpart.costmodel.links import achieved_link

    key = ("inside", group, a, b)
    link = ctx.sync_cache.get(key)
    if link is None:
        link = ctx.sync_cache[key] = achieved_link(ctx.cluster, f"{group}/0/{a}", f"{group}/0/{b}")
    return link


def _across_link(ctx: _Context, na: int, nb: int, flows_a: int, flows_b: int, flows_zone: int = 0):
    """``(link, over TCP)`` between nodes ``na`` and ``nb`` (flat node numbers) when ``flows_a`` and
    ``flows_b`` transfers share each node's NICs and ``flows_zone`` the link between their zones (0: one
    zone) (the simulator's ``_p2p_link``)."""
    from hetpart.cluster import PathLink
    from hetpart.costmodel.links import achieved_link, node_nic_gbyte_s, zone_gbyte_s

    ga, gb = ctx.node_group[na], ctx.node_group[nb]
    key = ("across", ga, gb, flows_a, flows_b, flows_zone)
    hit = ctx.sync_cache.get(key)
    if hit is None:
        cluster = ctx.cluster
        link = achieved_link(cluster, ctx.node_device[na], ctx.node_device[nb])
        if link is not None:
            share = min(node_nic_gbyte_s(cluster.groups[g]) / f for g, f in ((ga, flows_a), (gb, flows_b)))
            if flows_zone:
                share = min(share, zone_gbyte_s(cluster, cluster.groups[ga].zone, cluster.groups[gb].zone) / flows_zone)
            if share < link.bandwidth_gbyte_s:
                link = PathLink(share, link.latency_us, link.kind)
        # TCP: the socket transport's sends do not run beside compute
        tcp = not (cluster.groups[ga].nic.rdma and cluster.groups[gb].nic.rdma)
        hit = ctx.sync_cache[key] = (link, tcp)
    return hit


def _speed(ctx: _Context, group: tuple[str, ...]) -> float:
    """The speed factor of a device group (``slow:`` in the cluster file): its slowest device's, the pace of an
    even split. Typed replicas are paced by it (their batch shares; the evaluator then shares the batch by the
    replicas' real speeds): pacing them by :func:`_pace` instead lost 0.6% on gpt3-13b on 8 A100, one at 0.6x
    (15,910 against 16,005 tokens/s)."""
    if ctx.uniform_speed:
        return 1.0
    return min(ctx.cluster.device(d).speed for d in group)


def _pace(ctx: _Context, group: tuple[str, ...]) -> float:
    """The pace of a device group against its type's figures: one device's speed factor; a tensor-parallel
    group's mean, since the evaluator gives a group of unlike speeds the uneven split an LP picks
    (:func:`~hetpart.costmodel.tp_split.fill_tp_splits`, HAP), which shares the work by speed (memory
    permitting). A mixed pipeline's layer split prices each stage at it: at its slowest member's pace the search
    gave llama2-13b on 3 x 4 V100, one at 0.7x, 11 of 42 units on that stage where 13 were best (5,506 against
    5,760 tokens/s)."""
    if ctx.uniform_speed:
        return 1.0
    return sum(ctx.cluster.device(d).speed for d in group) / len(group)


def _stage_speeds(ctx: _Context, replicas: list[list[tuple[str, ...]]]) -> list[float] | None:
    """Per stage of a mixed pipeline of one replica, its group's pace (:func:`_pace`); None where no device is
    throttled, or where there are several replicas: the evaluator then shares the batch by the replicas' speeds,
    which pricing every replica at the slowest one's pace hid (gpt3-13b on 8 A100, one at 0.6x: four TP-2
    replicas at level 1 reach 16,005 tokens/s with shares 17/13/17/17; so paced, they left the search's top
    structures and a pipeline of 15,910 won)."""
    if ctx.uniform_speed or len(replicas) > 1:
        return None
    return [_pace(ctx, group) for group in replicas[0]]


def _paced(ctx: _Context, order, tps, dp: int, mb: int, rc: str, costs: list[StageCosts], speeds: list[float]
           ) -> list[StageCosts]:
    """``costs`` (per stage of a mixed pipeline, pools in ``order``) with each throttled stage's priced at its
    speed factor ``speeds[j]`` (:meth:`CostTable.get`: device work slows, host dispatch and TP collectives not)."""
    pools = [(p, t) for p, t in zip(order, tps) for _ in range(len(tp_groups(p, t)) // dp)]
    return [c if v == 1.0 else ctx.table.get(p, t, mb, rc, v) for c, (p, t), v in zip(costs, pools, speeds)]


def _send_offsets(ctx: _Context, replicas: list[list[tuple[str, ...]]], micro_batch: int,
                  layout: tuple | None = None) -> tuple[tuple[float, ...], float]:
    """Per stage of these replicas' pipelines: the seconds its blocking sends add to each micro-batch
    (the activations it sends on, the gradients it sends back: the simulator adds both to the stage's
    forward and backward); and the seconds the sends which do not block add to the pipeline's fill (each
    delays its receiver once per direction)."""
    if len(replicas[0]) < 2:
        return (0.0,), 0.0
    key = ("offsets", micro_batch, layout if layout is not None else _layout(replicas))
    hit = ctx.sync_cache.get(key)
    if hit is None:
        times, blocks = _sends(ctx, replicas, micro_batch, key[2])
        fill = sum(2 * t for t, b in zip(times, blocks) if not b)
        pp = len(times) + 1
        hit = ctx.sync_cache[key] = (tuple((times[j] if j < pp - 1 and blocks[j] else 0.0)
                                           + (times[j - 1] if j > 0 and blocks[j - 1] else 0.0) for j in range(pp)),
                                     fill)
    return hit


def _split_with_sends(ctx: _Context, splitter: Callable[..., Split | None], masks: list[np.ndarray],
                      replicas: list[list[tuple[str, ...]]], micro_batch: int, m: int, layout: tuple | None = None,
                      give_up_above: float = math.inf) -> tuple[Split | None, float]:
    """``splitter`` over ``masks`` (per stage, the time of every unit range) with each stage's blocking
    sends added to every range (the activations it sends on, the gradients it sends back: the simulator
    adds both to the stage's forward and backward), and the seconds that the sends which do not block
    add to the pipeline's fill (each delays its receiver once per direction). The split's objective and
    bottleneck include the sends. The most common per-stage send time ``u`` is left out of the matrices
    and added back exactly (it adds ``u`` to every stage, so ``(m - 1) u`` to the bottleneck term and
    ``pp u`` to the sum; the best split does not move): only stages whose sends differ get a matrix of
    their own."""
    pp = len(masks)
    if pp < 2:
        split = splitter(masks, m, give_up_above=give_up_above)
        return split, 0.0
    offsets, fill = _send_offsets(ctx, replicas, micro_batch, layout)
    common = Counter(offsets).most_common(1)[0][0]
    shift = (m - 1 + pp) * common
    adjusted = [c + (o - common) if o != common else c for c, o in zip(masks, offsets)]
    split = splitter(adjusted, m, give_up_above=give_up_above - fill - shift)
    if split is None:
        return None, fill
    return Split(split.bounds, split.objective_s + shift, split.bottleneck_s + common), fill


def _sync_s(ctx: _Context, peer_sets: list[list[str]], grad_bytes: list[float], tps: list[int] | None = None,
            flows: Callable[[], dict[int, float]] | None = None, layout: tuple | None = None,
            ahead: list[float] | None = None) -> float:
    """Gradient all-reduce: the slowest of the stages' rings (``peer_sets[j]``: the first device of stage
    ``j``'s group in every replica; ``grad_bytes[j]``: per device), after the backward. As the simulator
    counts them (:func:`~hetpart.costmodel.collectives.nic_flows`), rings that leave a node share its NICs
    with every device group there whose ring leaves it too, each group's ``tp`` shards counted (a stage's
    ``tp`` ranks run ``tp`` rings at once). ``flows``: the NIC sharing per node when the rings are not one
    per stage of replicas cut alike (called when the lines are not cached yet). ``layout``: a key that
    names these rings (their NCCL lines are kept under it; default: the arguments). ``ahead``: per stage,
    how long before the pipeline's end its last backward ends (the drain behind it), which its ring runs
    in: the result is then what sticks out past the end."""
    if not grad_bytes:
        return 0.0
    key = ("sync lines", layout if layout is not None else
           (tuple(map(tuple, peer_sets)), tuple(tps or ()), flows is not None))
    lines = ctx.sync_cache.get(key)
    if lines is None:
        lines = ctx.sync_cache[key] = _sync_lines(ctx, peer_sets, tps or [1] * len(peer_sets),
                                                  flows() if flows is not None else None)
    times = [min((fixed + per_byte * nbytes for fixed, per_byte in ring), default=0.0) if nbytes > 0 else 0.0
             for ring, nbytes in zip(lines, grad_bytes)]
    if ahead is None:
        return max(times)
    return max(0.0, max(t - a for t, a in zip(times, ahead)))


def _sync_lines(ctx: _Context, peer_sets: list[list[str]], tps: list[int], flows: dict[int, float] | None,
                collective: str | None = None) -> list[tuple[tuple[float, float], ...]]:
    """:func:`_sync_s` before the bytes: each stage's ring as NCCL's ``(fixed_s, per_byte_s)`` lines. Level 1
    reduce-scatters the gradients once per step (the updated parameters' all-gather after the step:
    :func:`_gather_s`); levels 2-3 reduce-scatter every micro-batch, priced here as one all-reduce.
    ``collective``: the lines of another collective on the same rings."""
    from hetpart.costmodel.collectives import allreduce_lines, zone_concurrency

    collective = collective or ("reduce_scatter" if ctx.zero == 1 else "allreduce")
    rings = [_ring_facts(ctx, peers) for peers in peer_sets]
    nodes = [ring[0] for ring in rings]
    crossing = [ring[2] for ring in rings]
    zoned = bool(ctx.cluster.zone_links)
    zones = [ring[4] for ring in rings] if zoned else None
    if flows is None:  # one ring per stage, each device group in one: every crossing group counts whole
        flows = defaultdict(int)
        for ns, tp, out in zip(nodes, tps, crossing):
            for n in ns if out else ():
                flows[n] += tp
        for zs, tp in zip(zones or (), tps):  # and per zone, the groups of the rings crossing a zone link
            for z in zs if len(set(zs)) > 1 else ():
                flows[z] += tp
    out = []
    for j, (peers, (_, counts, leaves, kind, _), tp) in enumerate(zip(peer_sets, rings, tps)):
        concurrent = max([tp] + [flows.get(n, 0) / c for n, c in counts]) if leaves else tp
        zone = zone_concurrency(zones[j], tp, flows) if zoned else None
        key = ("lines", kind, concurrent, zone, collective)
        ring = ctx.sync_cache.get(key)
        if ring is None:
            ring = ctx.sync_cache[key] = tuple((line.fixed_s, line.per_byte_s) for line in
                                               allreduce_lines(peers, ctx.cluster, concurrent, collective=collective,
                                                               zone_concurrent=zone))
        out.append(ring)
    return out


def _ring_facts(ctx: _Context, peers: list[str]) -> tuple[list[int], list[tuple[int, int]], bool, tuple, list | None]:
    """What :func:`_sync_lines` reads of one ring before the NIC sharing: its members' nodes, each node with its
    count of members (in order of first appearance), whether it leaves a node, its :func:`_ring_kind` and its
    members' zones (``("zone", z)``; None in a cluster without zone links). Kept per ring: the walk's neighbouring
    layouts share many of their stages' rings (on the 1,024-GPU entry 1,219 rings, 697 of them distinct)."""
    key = ("ring", tuple(peers))
    hit = ctx.sync_cache.get(key)
    if hit is None:
        rows, index = _place_rows(ctx), ctx.device_index
        nodes = [rows[index[d]][0] for d in peers]
        zones = [("zone", z) for z in _node_zones(ctx)[nodes].tolist()] if ctx.cluster.zone_links else None
        hit = ctx.sync_cache[key] = (nodes, list(Counter(nodes).items()), len(set(nodes)) > 1,
                                     _ring_kind(rows, index, peers), zones)
    return hit


def _place_rows(ctx: _Context) -> list[list[int]]:
    """:attr:`_Context.places` as lists (a ring's members are looked up one by one)."""
    rows = ctx.sync_cache.get(("place rows",))
    if rows is None:
        rows = ctx.sync_cache[("place rows",)] = ctx.places.tolist()
    return rows


def _ring_kind(rows: list[list[int]], index: dict[str, int], peers: list[str]) -> tuple:
    """What a ring's lines (:func:`~hetpart.costmodel.collectives.allreduce_lines`) depend on: its members once
    each, in the cluster's order, as ``(node group, node numbered by first appearance, place in the node)``. A hop
    between nodes depends on the two node groups only, one inside a node on the group and the two places, and
    the lines on the members' count per node; so the rings of a pipeline's stages, the same places on other
    nodes, share one computation (the 1,024-GPU public entry's walk computes 119 rings' lines, not 824)."""
    nodes: dict[int, int] = {}
    return tuple((group, nodes.setdefault(node, len(nodes)), local)
                 for node, group, local in (rows[i] for i in sorted({index[d] for d in peers})))


def _replica_comm_s(ctx: _Context, stages: list[list[tuple[str, ...]]], costs: list[StageCosts], split: Split,
                    grads: list[float], layout: tuple, micro_batch: int) -> float:
    """What a mixed pipeline's replicas pay together once a step in this placement: every stage's gradient ring,
    the tied copies' rings and, at levels 1-2, the parameter all-gather's exposed rest (hidden behind each stage's
    forward and the send that blocks it, :func:`_forward_sends`)."""
    dp, pp = len(stages), len(stages[0])
    peers = [[stages[r][j][0] for r in range(dp)] for j in range(pp)]
    tps = [len(g) for g in stages[0]]
    # 1F1B drains from the last stage to the first: stage j's last backward ends the backwards of the stages
    # before it ahead of the pipeline's end, and its ring starts then (after it, over TCP; earlier over RDMA)
    backward = [float(c.time_s[a, b] - c.forward_s[a, b]) for c, (a, b) in zip(costs, split.ranges)]
    ahead = [sum(backward[:j]) for j in range(pp)]
    out = _sync_s(ctx, peers, grads, tps, layout=layout, ahead=ahead) + _tied_s(ctx, stages)
    if ctx.zero in (1, 2) and dp > 1:
        sends = _forward_sends(ctx, stages, micro_batch, layout)
        out += _gather_s(ctx, peers, tps, layout, [(j, c, r, sends[j])
                                                   for j, (c, r) in enumerate(zip(costs, split.ranges))])
    return out


def _forward_sends(ctx: _Context, replicas: list[list[tuple[str, ...]]], micro_batch: int,
                   layout: tuple | None = None) -> tuple[float, ...]:
    """Per stage of these replicas' pipelines: the seconds a blocking send of its activations adds to each of its
    forwards (:func:`_sends`; 0 for the last stage and where the send overlaps compute), as the simulator adds it
    to the stage's forward (``_Pipe.fwd_send``)."""
    if len(replicas[0]) < 2:
        return (0.0,)
    times, blocks = _sends(ctx, replicas, micro_batch, layout)
    return tuple(t if b else 0.0 for t, b in zip(times, blocks)) + (0.0,)


def _gather_s(ctx: _Context, peers: list[list[str]], tps: list[int], layout: tuple,
              pieces: list[tuple[int, StageCosts, tuple[int, int], float]],
              flows: Callable[[], dict[int, float]] | None = None) -> float:
    """Levels 1-2: the all-gather of the updated 16-bit parameters after the optimizer step, on the rings of
    ``peers`` (NCCL's reduce-scatter lines, the same bytes), hidden behind the device's first forward of the
    next step up to that forward's length (``Simulator._add_param_gather``): the largest exposed rest over
    ``pieces``, each ``(ring, costs, range, send_s)``, a stage's units ``[a, b)`` gathered on ring
    ``peers[ring]``, whose forward a blocking send lengthens by ``send_s`` (:func:`_forward_sends`). As
    ``Simulator._shard_comm`` runs it: one collective per unit, each paying the ring's latency, a head's tied copy
    among the units (:meth:`~hetpart.policies.search_costs.StageCosts.gather_s`)."""
    key = ("gather lines", layout)
    lines = ctx.sync_cache.get(key)
    if lines is None:
        lines = ctx.sync_cache[key] = _sync_lines(ctx, peers, tps, flows() if flows is not None else None,
                                                  "reduce_scatter")
    exposed = 0.0
    for ring, costs, (a, b), send_s in pieces:
        gather = costs.gather_s(a, b, lines[ring])
        if gather > 0:
            exposed = max(exposed, gather - float(costs.forward_s[a, b]) - send_s)
    return exposed


def _typed_flows(ctx: _Context, groups: list[list[tuple[str, ...]]], bounds: list[tuple[int, ...]]
                 ) -> dict[int, float]:
    """The NIC sharing of typed replicas' gradient rings as the simulator counts it
    (:func:`~hetpart.costmodel.collectives.nic_flows`): one ring per span of units between any replica's
    cuts, holding the stage of every replica that holds the span (replicas cut unlike take turns).

    :func:`~hetpart.costmodel.collectives.nic_flows` over those rings, in numpy and bit for bit (its sums taken in
    its order; :func:`~hetpart.policies.search_reference.typed_flows_reference` builds the rings it takes, one member
    at a time): a ring holds a stage of every replica, and the 1,024-GPU public entry's rings were dozens of
    spans of a hundred replicas each, walked member by member twice (7% of the policy's plan)."""
    stage, node, width = _typed_stages(ctx, groups, bounds)
    flows = _place_flows(stage, node, width, len(groups))
    if ctx.cluster.zone_links:  # per zone the same over the rings that cross a zone link (nic_flows by zone)
        zones = _node_zones(ctx)[node]
        flows.update({("zone", z): c for z, c in _place_flows(stage, zones, width, len(groups)).items()})
    return flows


def _node_zones(ctx: _Context) -> np.ndarray:
    """Per flat node number, its zone's index in the cluster's zones."""
    hit = ctx.sync_cache.get(("node zones",))
    if hit is None:
        names = ctx.cluster.zones
        hit = ctx.sync_cache[("node zones",)] = np.array([names.index(ctx.cluster.groups[g].zone)
                                                          for g in ctx.node_group], dtype=np.int64)
    return hit


def _place_flows(stage: np.ndarray, node: np.ndarray, width: np.ndarray, replicas: int) -> dict:
    """:func:`_typed_flows` by place: ``node``, per replica and stage, its node (or zone)."""
    rings = node[np.arange(replicas), stage]  # [span, replica]: the node of each ring's members
    stage = stage[(rings != rings[:, :1]).any(axis=1)]  # the rings that leave a node
    if not len(stage):
        return {}
    member = np.arange(replicas) * node.shape[1] + stage  # [ring, replica]: the device group, numbered
    busy = np.bincount(member.ravel(), minlength=node.size)
    duty = 1.0 / busy[member].max(axis=1)
    # bincount sums each group's duties ring by ring, from 0.0, as nic_flows does
    active = np.bincount(member.ravel(), np.repeat(duty, member.shape[1]), minlength=node.size)
    first = np.ones(member.shape, dtype=bool)  # where each group first appears, in nic_flows' order (ring, replica)
    first[1:] = member[1:] != member[:-1]  # a replica's stage rises with the span
    order = member[first]
    share = width.ravel()[order] * np.minimum(1.0, active[order])
    nodes = node.ravel()[order]
    totals = np.bincount(nodes, share)  # each node's sum in nic_flows' order
    present = np.unique(nodes)
    return dict(zip(present.tolist(), totals[present].tolist()))


def _typed_stages(ctx: _Context, groups: list[list[tuple[str, ...]]], bounds: list[tuple[int, ...]]
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Typed replicas' rings as arrays: per span of units between any replica's cuts (in order) the stage each
    replica holds it in (``[span, replica]``), and per replica and stage its first device's flat node number and
    its width (``[replica, deepest]``, padded with 0)."""
    flat, index = ctx.places[:, 0], ctx.device_index
    deepest = max(len(stages) for stages in groups)
    node = np.zeros((len(groups), deepest), dtype=np.int64)
    width = np.zeros((len(groups), deepest), dtype=np.int64)
    for r, stages in enumerate(groups):
        node[r, :len(stages)] = flat[[index[s[0]] for s in stages]]
        width[r, :len(stages)] = [len(s) for s in stages]
    spans = np.array(sorted({b for cuts in bounds for b in cuts[:-1]}))
    column: dict[tuple[int, ...], np.ndarray] = {}  # replicas of one configuration share their cuts
    for cuts in bounds:
        if cuts not in column:
            column[cuts] = np.searchsorted(np.asarray(cuts), spans, side="right") - 1
    return np.stack([column[cuts] for cuts in bounds], axis=1), node, width


def _tied_s(ctx: _Context, replicas: list[list[tuple[str, ...]]]) -> float:
    """All-reduce of tied embedding gradients between the first and last stage of every replica that
    splits the model (the head's copy and the embedding are on different devices), as the simulator syncs
    them (``Simulator._tied_pairs``): under Megatron's kernels one 2-member all-reduce per pipeline, all at
    once, sharing the NICs they leave (each copy was reduced in its stage's ring before, ``grad_bytes``);
    under hetpart's runtime one ring over every replica's first and last stage."""
    from hetpart.costmodel.collectives import allreduce_time_s

    shared = sum(u.shared_params for u in ctx.model.units)
    split = [r for r in replicas if len(r) > 1]
    if not shared or not split:
        return 0.0
    if ctx.table.kernels == "fused":
        return _tied_pairs_s(ctx, split, shared)
    members = tuple(dict.fromkeys(d for r in split for d in (r[0][0], r[-1][0])))
    widths = [len(g) for r in split for g in (r[0], r[-1])]
    # what the simulator's reduction moves: the narrower copy's slice, in one ring per rank of the wider
    num_bytes = shared * GRAD_BYTES[ctx.workload.precision] / min(widths)
    key = ("tied", num_bytes, members, max(widths))
    if key not in ctx.sync_cache:
        ctx.sync_cache[key] = allreduce_time_s(num_bytes, members, ctx.cluster, max(widths))
    return ctx.sync_cache[key]


def _tied_pairs_s(ctx: _Context, split: list[list[tuple[str, ...]]], shared: float) -> float:
    """:func:`_tied_s` under Megatron's kernels: the slowest pipeline's pair all-reduce, each pair's ``tp``
    shards sharing its nodes' NICs with the other pairs that leave them
    (:func:`~hetpart.costmodel.collectives.nic_flows`)."""
    from hetpart.costmodel.collectives import allreduce_lines, nic_flows, zone_concurrency

    index = ctx.device_index
    node = ctx.places[:, 0]
    pairs = [(r[0], r[-1]) for r in split]
    rings = [[(int(node[index[g[0]]]), g[0], len(g)) for g in pair] for pair in pairs]
    flows = nic_flows(rings)
    zoned = bool(ctx.cluster.zone_links)
    if zoned:  # the pairs that cross a zone link share it, as the simulator counts them
        zone_of = _node_zones(ctx)
        flows.update({("zone", z): c for z, c in
                      nic_flows([[(int(zone_of[n]), g, tp) for n, g, tp in ring] for ring in rings]).items()})
    out = 0.0
    for (first, last), members in zip(pairs, rings):
        num_bytes = shared * GRAD_BYTES[ctx.workload.precision] / min(len(first), len(last))
        tp = max(len(first), len(last))
        here = {n for n, _, _ in members}
        concurrent = max([tp] + [flows.get(n, 0.0) for n in here]) if len(here) > 1 else tp
        zone = zone_concurrency([("zone", int(zone_of[n])) for n, _, _ in members], tp, flows) if zoned else None
        key = ("tied pair", num_bytes, first[0], last[0], concurrent, zone)
        if key not in ctx.sync_cache:
            lines = allreduce_lines((first[0], last[0]), ctx.cluster, concurrent, zone_concurrent=zone)
            ctx.sync_cache[key] = min((line.time_s(num_bytes) for line in lines), default=0.0)
        out = max(out, ctx.sync_cache[key])
    return out


def _lower_bound_s(ctx: _Context, costs: list[StageCosts], m: int, sends: tuple[float, ...] = (),
                   fill: float = 0.0) -> float:
    """A bound no split beats: with ``r_j = min_u c_j(u) / ref(u)``, stage ``j`` costs at least
    ``r_j * ref(range)``, so the slowest stage takes at least ``ref(all) / sum_j (1 / r_j)``; the
    sum of stages is at least ``sum_u min_j c_j(u)``.

    Any positive ``ref`` gives a bound; each kind of stage is tried as ``ref`` and the largest bound
    kept. With the first stage's kind alone, the same stages in two orders were bounded 5.4x apart
    (llama2-70b on A100 + MI250X, MI250X first: 41 s; A100 first: 224 s; estimate 238 s), which
    misordered the policy's walk (:mod:`hetpart.policies.neighbourhood`) and weakened pruning.

    ``sends``: each stage's blocking sends per micro-batch and ``fill`` the sends that do not block
    (:func:`_send_offsets`): stage ``j`` then takes ``c_j + sends_j``, so the slowest stage at least the
    larger of ``slowest + min(sends)`` and ``max(sends)``, the sum ``sum(sends)`` more."""
    return _bound_s(ctx, _bound_parts(ctx, costs), m, sends, fill)


def _bound_parts(ctx: _Context, costs: list[StageCosts]) -> tuple[float, float]:
    """``(least slowest stage, least sum of stages)`` of :func:`_lower_bound_s`, per micro-batch."""
    counts = Counter(costs)
    # the bound does not depend on the stages' order: one entry per multiset of stage kinds, so the orders of
    # the same pools share it (five pools have up to 120; computing it per order took 58 of a search's 82 s)
    kinds = tuple(sorted(counts, key=id))
    key = (kinds, tuple(counts[k] for k in kinds))
    if key not in ctx.bound_cache:
        slowest = max(_slowest_stage_bound_s(ref.unit_time_s, kinds, key[1]) for ref in kinds)
        floor = float(np.min(np.stack([k.unit_time_s for k in kinds]), axis=0).sum())
        ctx.bound_cache[key] = (slowest, floor)
    return ctx.bound_cache[key]


def _bound_s(ctx: _Context, parts: tuple[float, float], m: int, sends: tuple[float, ...] = (),
             fill: float = 0.0) -> float:
    """:func:`_lower_bound_s` from its :func:`_bound_parts`."""
    slowest, floor = parts
    if sends:
        slowest, floor = max(slowest + min(sends), max(sends)), floor + sum(sends) + fill
    return (m - 1) * slowest + floor


def _slowest_stage_bound_s(ref: np.ndarray, kinds: tuple[StageCosts, ...], counts: tuple[int, ...]) -> float:
    """The least time of the slowest stage, measured against the per-unit times ``ref``
    (:func:`_lower_bound_s`); ``counts[i]`` stages are of kind ``kinds[i]``."""
    ratio = [max(float((k.unit_time_s / np.maximum(ref, 1e-30)).min()), 1e-30) for k in kinds]
    return float(ref.sum()) / sum(n / r for n, r in zip(counts, ratio))


@dataclass(frozen=True, eq=False)
class _Family:
    """The mixed pipelines of one multiset of stages: a subset of pools, each with its ``tp``, ``dp`` replicas,
    one micro-batch size and recompute mode. Its pipeline orders share the lower bound (:func:`_bound_parts`
    does not depend on the order), so they are enumerated only when the search reaches it
    (:func:`_top_scored`)."""

    subset: tuple[Pool, ...]
    tps: tuple[int, ...]
    """Per pool of :attr:`subset`."""
    dp: int
    mb: int
    rc: str
    m: int
    """Micro-batches per replica and step."""
    kinds: tuple[StageCosts, ...]
    """Per pool of :attr:`subset`: its stages' costs."""
    counts: tuple[int, ...]
    """Per pool of :attr:`subset`: its stages per replica."""
    parts: tuple[float, float]
    """:func:`_bound_parts` of the stages."""

    @property
    def group(self) -> tuple:
        return "mixed", frozenset(p.key for p in self.subset)


def _mixed_families(ctx: _Context) -> Iterator[tuple[float, _Family]]:
    """Every :class:`_Family` with its lower bound (sends left out)."""
    wl = ctx.workload
    for subset, tps, dp in _mixed_multisets(ctx):
        counts = tuple((p.num_devices // t) // dp for p, t in zip(subset, tps))
        for mb in microbatch_options(wl.global_batch // dp, ctx.options.max_micro_batch):
            m = wl.global_batch // (dp * mb)
            for rc in recompute_modes(wl):
                kinds = tuple(ctx.table.get(p, t, mb, rc) for p, t in zip(subset, tps))
                parts = _bound_parts(ctx, [k for k, c in zip(kinds, counts) for _ in range(c)])
                yield _bound_s(ctx, parts, m), _Family(subset, tps, dp, mb, rc, m, kinds, counts, parts)


def _family_points(ctx: _Context, family: _Family, bound: float = 0.0
                   ) -> Iterator[tuple[tuple, Callable[[float], Scored | None]]]:
    """``(key, scorer)`` of each pipeline order of ``family``; ``bound``: a lower bound of all of them, sends left
    out (each order adds its own)."""
    by_pool = {p: (t, k, c) for p, t, k, c in zip(family.subset, family.tps, family.kinds, family.counts)}
    for order in _orders(ctx, family.subset):
        tps = tuple(by_pool[p][0] for p in order)
        costs = [by_pool[p][1] for p in order for _ in range(by_pool[p][2])]
        key = ("mixed", tuple(p.key for p in order), tps, family.dp, family.mb, family.rc)
        yield key, _mixed_scorer(ctx, order, tps, family.dp, family.mb, family.rc, costs, family.m, key,
                                 parts=family.parts, floor_s=bound)


ORDER_FREE_WORTH = 200
""":func:`_order_free_bound_s` runs where a family's orders times this reach the steps of its dynamic program
(``2^(pools - 1)`` subsets times its stages; subsets are shared between families, so most steps are found
made). Measured in CPU seconds of one level's search: llama2-7b on 96 GPUs of five node groups in three zones,
54.5 s never raising, 39.8 s at 50, 29.8 s at 200 (every family but 29 of 45,030); on 2 GPUs each of six types,
18.2 s, 5.8 s, 6.1 s; on the public scenarios within 0.2 s of each other."""


def _order_free_bound_s(ctx: _Context, family: _Family) -> float:
    """A lower bound of every pipeline order and layer split of ``family``, in whole units: the least
    bottleneck over all orders of its pools and all splits, times ``m - 1``, plus the least sum of stage
    times over all of them (each stage's memory with one micro-batch in flight, the least any position
    holds; sends and the zones' links left out). 0.0 where it would cost more than it saves
    (:data:`ORDER_FREE_WORTH`).

    :func:`_bound_parts` divides units freely among stages, so when stages are few and units uneven (an
    embedding, a head) it sits well below what any split reaches: on six device types (llama2-7b, one pool
    each) the split's own bound was 1.24x it at the median, and 97% of the splits run were ruled out only by
    that.

    A dynamic program over the subsets ``S`` of the family's pools placed first and the units ``[0, a)`` they
    hold: placing pool ``k`` next runs its stages one after another, ``sum(b) = min_a sum(a) + t_k(a, b)``,
    and the same with ``max`` for the bottleneck. Subsets are shared by every family of the same micro-batch,
    recompute mode and ``dp`` (kept in the context)."""
    pools = len(family.subset)
    steps = 2 ** (pools - 1) * sum(family.counts)
    if len(_orders(ctx, family.subset)) * ORDER_FREE_WORTH < steps:
        return 0.0
    ids = [(p.key, t) for p, t in zip(family.subset, family.tps)]
    mats = [k.masked(1, ctx.options.ignore_memory, ctx.zero, 1.0 / family.dp) for k in family.kinds]
    scope = ("order free", family.dp, family.mb, family.rc)

    def state(placed: frozenset[int]) -> tuple[np.ndarray, np.ndarray]:
        key = scope + tuple(sorted(ids[i] for i in placed))
        hit = ctx.bound_cache.get(key)
        if hit is not None:
            return hit
        if not placed:
            start = np.full(mats[0].shape[0], math.inf)
            start[0] = 0.0
            hit = (start, start)
        else:
            sums, tops = [], []
            for i in placed:
                s, t = state(placed - {i})
                for _ in range(family.counts[i]):
                    s = (s[:, None] + mats[i]).min(axis=0)
                    t = np.maximum(t[:, None], mats[i]).min(axis=0)
                sums.append(s)
                tops.append(t)
            hit = (np.min(sums, axis=0), np.min(tops, axis=0))
        ctx.bound_cache[key] = hit
        return hit

    sums, tops = state(frozenset(range(pools)))
    return (family.m - 1) * float(tops[-1]) + float(sums[-1])


def mixed_structures(ctx: _Context) -> Iterator[tuple[float, tuple, Callable[[float], Scored | None]]]:
    """Every mixed-pipeline point as ``(lower bound, key, scorer)``."""
    for bound, family in _mixed_families(ctx):
        for key, scorer in _family_points(ctx, family):
            yield bound, key, scorer


def _mixed_scorer(ctx, order, tps, dp, mb, rc, costs, m, key, splitter=split_layers, parts=None, floor_s: float = 0.0
                  ) -> Callable[[float], Scored | None]:
    """``floor_s``: a lower bound of the pipeline without its sends (:func:`_order_free_bound_s`); each stage
    pays its sends every micro-batch, so at least the least of them ``m - 1`` times more, and all once."""
    def score(threshold: float) -> Scored | None:
        pp = len(costs)
        stages = _mixed_groups(order, tps, dp, "pp")
        layout = ("mixed", tuple(p.key for p in order), tps, dp)
        offsets, fill = _send_offsets(ctx, stages, mb, layout)
        bound = max(_bound_s(ctx, parts or _bound_parts(ctx, costs), m, offsets, fill),
                    floor_s + (m - 1) * min(offsets) + sum(offsets) + fill)
        if bound >= threshold:
            return None  # the sends alone rule it out (the bound it was visited by leaves them out)
        slow = _stage_speeds(ctx, stages)  # a throttled group's stage priced at its pace gets fewer units
        paced = costs if slow is None else _paced(ctx, order, tps, dp, mb, rc, costs, slow)
        masks = [c.masked(min(pp - j, m), ctx.options.ignore_memory, ctx.zero, 1.0 / dp) for j, c in enumerate(paced)]
        split, fill = _split_with_sends(ctx, splitter, masks, stages, mb, m, layout, threshold)
        if split is None:
            return None
        grads = [float(c.grad_bytes[a, b]) for c, (a, b) in zip(costs, split.ranges)]
        estimate = split.objective_s + fill + _replica_comm_s(ctx, stages, paced, split, grads, layout, mb)
        placements = ("pp", "dp")
        if dp > 1:  # the other placement at the same split: its sends, rings and gathers
            other = _mixed_groups(order, tps, dp, "dp")
            other_layout = layout + ("dp",)
            offsets, other_fill = _send_offsets(ctx, other, mb, other_layout)
            speeds = _stage_speeds(ctx, other)
            other_costs = costs if speeds is None else _paced(ctx, order, tps, dp, mb, rc, costs, speeds)
            times = [float(c.time_s[a, b]) + o for c, (a, b), o in zip(other_costs, split.ranges, offsets)]
            priced = ((m - 1) * max(times) + sum(times) + other_fill
                      + _replica_comm_s(ctx, other, other_costs, split, grads, other_layout, mb))
            if priced < estimate:
                estimate, placements = priced, ("dp", "pp")

        def build() -> list[Plan]:  # the placement the estimate prices first
            return [assemble(_mixed_groups(order, tps, dp, placement), [split.bounds] * dp, [m] * dp, mb, rc,
                             ctx.workload, zero=ctx.zero) for placement in placements]

        return Scored(estimate, key + (split.bounds,), build)

    return score


# --------------------------------------------------------------------------------------------- typed replicas


@dataclass(frozen=True)
class _PoolConfig:
    pool: Pool
    tp: int
    pp: int
    split: Split
    fixed_s: float
    """Fill, drain, p2p and sync of one replica, seconds."""

    @property
    def dp(self) -> int:
        return self.pool.num_devices // (self.tp * self.pp)

    @property
    def rate(self) -> float:
        return self.dp / self.split.bottleneck_s


def _pool_configs(ctx: _Context, pool: Pool, mb: int, rc: str, total_mb: int) -> list[_PoolConfig]:
    """The best :attr:`~SearchOptions.configs_per_pool` configurations (tp, pp) of ``pool`` by
    :attr:`_PoolConfig.rate` under each memory assumption (:func:`_mask_fractions`), fastest first.

    Each configuration's rate is at most ``dp`` over its least bottleneck (:func:`~hetpart.policies.partition._minimax`,
    one pass of the split's dynamic program; the sends only add): configurations are split in order of that bound,
    and no more once the kept ones all beat the next bound. The same configurations in the same order as splitting
    every one (:func:`~hetpart.policies.search_reference.pool_configs_reference`), in a third of the splits on
    the 1,024-GPU acceptance entry's H100s."""
    pending: dict[bool, list] = {}  # per memory assumption, in the order of its first configuration that fits
    order = itertools.count()
    for tp in tp_options(pool, ctx.model):
        groups = tp_groups(pool, tp)
        for pp in pipeline_depths(len(groups), _most_stages(ctx)):
            dp = len(groups) // pp
            m_est = max(1, total_mb // (dp * len(ctx.pools)))
            costs = ctx.table.get(pool, tp, mb, rc)
            for fraction in _mask_fractions(ctx, dp):
                masks = [costs.masked(pp - j, ctx.options.ignore_memory, ctx.zero, fraction) for j in range(pp)]
                least = _minimax(masks)
                if math.isfinite(least):  # (else nothing fits: no configuration)
                    pending.setdefault(fraction == 0.0, []).append(
                        (-dp / least, next(order), partial(pool_config, ctx, pool, tp, pp, mb, costs, masks, m_est)))
    kept: dict[tuple, _PoolConfig] = {}
    for entries in pending.values():  # the best of each memory assumption, once each
        for c in _fastest(entries, ctx.options.configs_per_pool):
            kept.setdefault((c.tp, c.pp, c.split.bounds), c)
    return sorted(kept.values(), key=lambda c: -c.rate)


def _fastest(entries: list[tuple[float, int, Callable[[], _PoolConfig | None]]], count: int) -> list[_PoolConfig]:
    """The ``count`` configurations of highest rate (ties: the first made), fastest first, of ``entries``
    ``(-bound on the rate, order made, make)``, made in order of their bounds until no bound left can beat them
    (a relative margin of 1e-9 covers the rounding of the sends added to a split's stages)."""
    heapq.heapify(entries)
    made: list[tuple[float, int, _PoolConfig]] = []
    while entries:
        if len(made) >= count and -made[count - 1][0] > -entries[0][0] * (1 + 1e-9):
            break
        _, index, make = heapq.heappop(entries)
        config = make()
        if config is not None:
            bisect.insort(made, (-config.rate, index, config), key=lambda t: (t[0], t[1]))
    return [c for _, _, c in made[:count]]


def pool_config(ctx: _Context, pool: Pool, tp: int, pp: int, mb: int, costs: StageCosts, masks: list[np.ndarray],
                m_est: int, splitter: Callable[..., Split | None] = split_layers) -> _PoolConfig | None:
    """One pool's replicas of a ``pp``-stage, ``tp``-wide pipeline (``masks``: each stage's range times,
    memory masked), split for ``m_est`` micro-batches; None when nothing fits. Its fixed cost per step is
    the pipeline's fill (blocking sends included, :func:`_split_with_sends`) and the pool's gradient sync."""
    split = pool_split(ctx, pool, tp, pp, mb, masks, m_est, splitter)
    return None if split is None else pool_config_of(ctx, pool, tp, pp, costs, m_est, *split)


def pool_split(ctx: _Context, pool: Pool, tp: int, pp: int, mb: int, masks: list[np.ndarray], m_est: int,
               splitter: Callable[..., Split | None] = split_layers) -> tuple[Split, float] | None:
    """:func:`pool_config` before the gradient sync: the split (sends included) and the seconds the sends that
    do not block add to the fill. Its bottleneck alone gives the configuration's :attr:`_PoolConfig.rate`,
    which is all the policy's walk needs of most pipeline depths it compares (the sync's rings are most of the
    rest of a configuration's cost; on the 1,024-GPU public entry 58 of the 97 configurations the walk compares
    are never priced as typed replicas)."""
    groups = tp_groups(pool, tp)
    dp = len(groups) // pp
    replicas = [groups[r * pp:(r + 1) * pp] for r in range(dp)]
    split, delay = _split_with_sends(ctx, splitter, masks, replicas, mb, m_est, ("pool", pool.key, tp, pp))
    return None if split is None else (split, delay)


def pool_config_of(ctx: _Context, pool: Pool, tp: int, pp: int, costs: StageCosts, m_est: int, split: Split,
                   delay: float) -> _PoolConfig:
    """:func:`pool_config` from its :func:`pool_split`."""
    groups = tp_groups(pool, tp)
    dp = len(groups) // pp
    # the sum of stage times, sends included: the objective less (m - 1) bottlenecks
    fill = split.objective_s - m_est * split.bottleneck_s + delay
    peers = [[groups[r * pp + j][0] for r in range(dp)] for j in range(pp)]
    sync = _sync_s(ctx, peers, [float(costs.grad_bytes[a, b]) for a, b in split.ranges], [tp] * pp,
                   layout=("pool", pool.key, tp, pp))
    return _PoolConfig(pool, tp, pp, split, fill + sync)


def _mask_fractions(ctx: _Context, dp: int) -> tuple[float, ...]:
    """The shard fractions a pool's configurations are fitted under, before the pools they join are
    known: ``1 / dp`` (sharded over this pool's replicas only: fits in any combination, even or not) and,
    when sharding, ``0`` (the replicas of the other pools hold the states: with uneven fractions, or with
    even ones over enough replicas; the evaluator checks the plan built). Each assumption keeps its own
    best configurations, so a pool's splits that fit only once other pools share its states are not lost
    to the safe ones, nor the other way round."""
    return (1.0 / dp, 0.0) if ctx.zero else (1.0 / dp,)


def typed_structures(ctx: _Context) -> Iterator[tuple[float, tuple, Callable[[float], Scored | None]]]:
    """Every typed-replica point (per pool: best configurations or unused) as ``(bound, key, scorer)``."""
    wl = ctx.workload
    for mb in microbatch_options(wl.global_batch, ctx.options.max_micro_batch):
        total = wl.global_batch // mb
        if len(ctx.pools) == 1 and not _uneven_replicas(ctx, ctx.pools[0], total):
            continue  # every point of one pool would be skipped below: its configurations are not worth splitting
        for rc in recompute_modes(wl):
            per_pool = [[None] + _pool_configs(ctx, p, mb, rc, total) for p in ctx.pools]
            for combo in itertools.product(*per_pool):
                chosen = [c for c in combo if c is not None]
                if not zones_linked(ctx.cluster, (c.pool.zone for c in chosen)):
                    continue  # replicas in zones without a link cannot sync gradients
                if not chosen or len(chosen) == 1 and total % chosen[0].dp == 0 or sum(c.dp for c in chosen) > total:
                    continue  # a single pool whose replicas split the batch evenly is a mixed pipeline of one pool
                bound = total / sum(c.rate for c in chosen)
                key = ("typed", tuple((c.pool.key, c.tp, c.pp) for c in chosen), mb, rc)
                yield bound, key, _typed_scorer(ctx, chosen, mb, rc, total, key)


def _uneven_replicas(ctx: _Context, pool: Pool, total: int) -> bool:
    """Whether some configuration of ``pool`` has replicas that cannot share ``total`` micro-batches evenly (and
    are no more than them): on a cluster of one pool only those make typed points (the rest are mixed pipelines
    of one pool). On a homogeneous sub-cluster of 512 A100 or 128 MI250X GCDs (the upper bound's) none has, and
    splitting every configuration only to skip each point took half of the bound's time at 1,024 GPUs."""
    for tp in tp_options(pool, ctx.model):
        groups = len(tp_groups(pool, tp))
        if any(groups // pp <= total and total % (groups // pp) for pp in pipeline_depths(groups, _most_stages(ctx))):
            return True
    return False


def _typed_scorer(ctx, chosen: list[_PoolConfig], mb: int, rc: str, total: int, key
                  ) -> Callable[[float], Scored | None]:
    def score(threshold: float) -> Scored | None:
        per, fixed, groups, bounds = [], [], [], []
        for c in chosen:
            stage_groups = tp_groups(c.pool, c.tp)
            for r in range(c.dp):
                # a throttled device slows its whole replica: it gets fewer micro-batches
                speed = min(map(partial(_speed, ctx), stage_groups[r * c.pp:(r + 1) * c.pp]))
                per.append(c.split.bottleneck_s / speed)
                fixed.append(c.fixed_s)
                groups.append(stage_groups[r * c.pp:(r + 1) * c.pp])
                bounds.append(c.split.bounds)
        # every replica takes at least one micro-batch, and all of them the whole batch: the slowest finishes
        # no earlier than where all would finish together with shares in fractions
        level = (total + sum(f / p for f, p in zip(fixed, per))) / sum(1.0 / p for p in per)
        if max(level, max(f + p for f, p in zip(fixed, per))) >= threshold:
            return None
        counts = allocate_microbatches(per, fixed, total)
        estimate = max(f + p * k for p, f, k in zip(per, fixed, counts))
        layout = ("typed", tuple((c.pool.key, c.tp, c.pp, c.split.bounds) for c in chosen))
        peers, tps = [[g[0][0] for g in groups]], [max(c.tp for c in chosen)]
        flows = partial(_typed_flows, ctx, groups, bounds)
        estimate += _sync_s(ctx, peers, [max(_max_grad(ctx, c, mb, rc) for c in chosen)], tps, flows, layout=layout)
        estimate += _tied_s(ctx, groups)
        if ctx.zero in (1, 2):  # per pool configuration its largest stage's gather, on the one ring
            pieces, first = [], 0
            for c in chosen:
                costs = ctx.table.get(c.pool, c.tp, mb, rc)
                grads = [float(costs.grad_bytes[r]) for r in c.split.ranges]
                j = grads.index(max(grads))
                sends = _forward_sends(ctx, groups[first:first + 1], mb)  # its replicas alike: the first's
                pieces.append((0, costs, c.split.ranges[j], sends[j]))
                first += c.dp
            estimate += _gather_s(ctx, peers, tps, layout, pieces, flows)

        def build() -> list[Plan]:
            plan = assemble(groups, bounds, counts, mb, rc, ctx.workload, zero=ctx.zero)
            if _uneven(ctx) and plan.zero:
                from hetpart.policies.shard_fractions import choose_shard_fractions

                fractions = choose_shard_fractions(ctx.model, ctx.cluster, plan)
                if fractions is not None:  # the even plan stays a candidate: padded collectives can cost more
                    return [replace(plan, shard_fractions=fractions), plan]
            return [plan]

        return Scored(estimate, key + (tuple(counts),), build)

    return score


def _uneven(ctx: _Context) -> bool:
    """Whether typed replicas may hold uneven shard fractions at this level (what the runtime runs)."""
    from hetpart.rules import RULES

    return ctx.options.uneven_shards and ctx.zero in RULES.uneven_shard_levels


def _max_grad(ctx: _Context, c: _PoolConfig, mb: int, rc: str) -> float:
    costs = ctx.table.get(c.pool, c.tp, mb, rc)
    return max(float(costs.grad_bytes[a, b]) for a, b in c.split.ranges)


# --------------------------------------------------------------------------------------------- driver


def search_space(ctx: _Context) -> Iterator[tuple[float, tuple, Callable[[float], Scored | None]]]:
    """Both families, unordered."""
    yield from mixed_structures(ctx)
    yield from typed_structures(ctx)


def _group(key: tuple) -> tuple:
    """Family and set of pools of a point: every group keeps its own best estimate."""
    pools = key[1] if key[0] == "mixed" else tuple(k[0] for k in key[1])
    return key[0], frozenset(pools)


def _top_scored(ctx: _Context) -> list[Scored]:
    """The ``top_k`` best estimates overall plus the best estimate of every group (family and set of
    pools used) and of every basin within 5% of the best estimate (:func:`_basins`), visiting points in order
    of their lower bound. A point is skipped once its bound can beat neither the ``top_k``-th estimate nor its
    group's best nor its basin's (while that is near the best): the estimate is a model, so
    keeping each group's best lets the simulator, not the estimate, decide between groups (two
    A100s alone can beat a mixed plan that must cross a slow network), and each near basin's best lets the
    hill-climb start there (:func:`_near_basins`).

    Mixed pipelines come as :class:`_Family` entries, whose orders are enumerated only when one is reached,
    after its bound was raised once to :func:`_order_free_bound_s` (and the entry put back in its new place):
    six device types have 246,000 points and seven 2.4 million, most of them never reached. The points kept
    are the same as when every point is listed and sorted: a point is skipped only when its estimate could
    not enter the result, and thresholds only fall."""
    entries: list[tuple[float, int, int, Any]] = []  # (bound, tie-break, stage, item); stage 0: family to raise
    tie = itertools.count()
    # listing may take half of the time left (smaller groups of pools come first), visiting the rest
    deadline = ctx.options.deadline
    listed_by = time.monotonic() + (deadline - time.monotonic()) / 2
    for n, (bound, family) in enumerate(_mixed_families(ctx)):
        if n % 256 == 0 and time.monotonic() > listed_by:
            break
        entries.append((bound, next(tie), 0, family))
    for n, (bound, key, scorer) in enumerate(typed_structures(ctx)):
        if n % 256 == 0 and time.monotonic() > listed_by:
            break
        entries.append((bound, next(tie), 2, (key, scorer)))
    heapq.heapify(entries)
    best: list[tuple[float, int, Scored]] = []  # max-heap on estimate via negation
    by_group: dict[tuple, Scored] = {}
    by_basin: dict[tuple, Scored] = {}
    lowest = [math.inf]  # the best estimate so far
    basin_of, near = _basins(ctx)
    visits = itertools.count()

    def threshold(group: tuple, basin: tuple | None = None) -> float:
        """``basin`` None: the largest threshold of any basin of ``group`` (a family's orders are several)."""
        kth = -best[0][0] if len(best) >= ctx.options.top_k else math.inf
        keep = near * lowest[0] if near else 0.0
        if basin is not None and basin in by_basin:
            keep = min(keep, by_basin[basin].estimate_s)
        return max(kth, by_group[group].estimate_s if group in by_group else math.inf, keep)

    def visit(key: tuple, scorer: Callable[[float], Scored | None], bound: float) -> None:
        group, basin = _group(key), basin_of(key)
        limit = threshold(group, basin)
        if bound >= limit:
            return
        scored = scorer(limit)
        if scored is None or not math.isfinite(scored.estimate_s):
            return
        if group not in by_group or scored.estimate_s < by_group[group].estimate_s:
            by_group[group] = scored
        if basin not in by_basin or scored.estimate_s < by_basin[basin].estimate_s:
            by_basin[basin] = scored
        lowest[0] = min(lowest[0], scored.estimate_s)
        heapq.heappush(best, (-scored.estimate_s, next(visits), scored))
        if len(best) > ctx.options.top_k:
            heapq.heappop(best)

    while entries:
        if best and time.monotonic() > deadline:
            break  # something is priced: answer with it
        bound, order, stage, item = heapq.heappop(entries)
        if stage == 2:
            visit(*item, bound)
            continue
        if bound >= threshold(item.group):
            continue
        if stage == 0:
            raised = _order_free_bound_s(ctx, item)
            if raised > bound:
                heapq.heappush(entries, (raised, order, 1, item))
                continue
        for key, scorer in _family_points(ctx, item, bound):
            visit(key, scorer, bound)
    chosen = ({id(s): s for _, _, s in best} | {id(s): s for s in by_group.values()}
              | {id(s): s for s in by_basin.values() if near and s.estimate_s <= near * lowest[0]})
    return sorted(chosen.values())


def _basins(ctx: _Context) -> tuple[Callable[[tuple], tuple], float]:
    """What :func:`_top_scored` keeps besides the ``top_k`` and each group's best: ``(basin of a point, share)``, the
    best estimate of every basin (:func:`~hetpart.policies.policy_planner._basin`: a mixed pipeline's pools in
    pipeline order and their tensor-parallel degrees, which the hill-climb cannot change) within ``share`` times the
    best estimate: :data:`~hetpart.policies.policy_planner.BASIN_ESTIMATE` more, as the policy's shortlist keeps, up
    to :data:`~hetpart.policies.policy_planner.FEWER_NODES_MAX_DEVICES` devices; beyond, 0 (none)."""
    from hetpart.policies.policy_planner import BASIN_ESTIMATE, FEWER_NODES_MAX_DEVICES, _basin

    return _basin, (1 + BASIN_ESTIMATE if ctx.cluster.num_devices <= FEWER_NODES_MAX_DEVICES else 0.0)


def make_context(model, cluster, workload, options: SearchOptions, zero: int | None = None,
                 evaluator: Evaluator | None = None) -> _Context:
    """The search's tables for one sharding level (default: the workload's); ``evaluator``: the predictor the
    candidates will be priced by, whose engine options (``overlap_p2p``) the estimate follows."""
    check_zones_connected(cluster)
    zero = (workload.zero or 0) if zero is None else zero
    flat: dict[tuple[int, int], int] = {}
    for d in cluster.devices:
        flat.setdefault(d.node_key, len(flat))
    first = {}
    for d in cluster.devices:
        first.setdefault(flat[d.node_key], d.id)
    return _Context(model, cluster, workload, options, device_pools(cluster),
                    CostTable(model, cluster, workload.precision, workload.optimizer, workload.attention,
                              offload=workload.offload), zero=zero,
                    device_index={d.id: i for i, d in enumerate(cluster.devices)},
                    places=np.array([(flat[d.node_key], d.node_key[0], d.local) for d in cluster.devices],
                                    dtype=np.int64).reshape(-1, 3),
                    node_group=[key[0] for key in flat], node_device=[first[i] for i in range(len(flat))],
                    out_bytes=max(u.out_act_bytes for u in model.units),
                    uniform_speed=cluster.uniform_speed,
                    overlap_p2p=bool(getattr(getattr(evaluator, "predictor", None), "overlap_p2p", False)))


def zero_levels(workload: "Workload") -> tuple[int, ...]:
    """Sharding levels the search tries, in order, until a plan fits (:func:`~hetpart.policies.common.sharding_levels`)."""
    return sharding_levels(workload)


_OPTION_NAMES = frozenset(f.name for f in fields(SearchOptions)) - {"deadline", "finish_by", "views"}  # plan_search's
SEARCH_SHARE = 0.75
"""Share of the time limit the search lists and visits points in; the rest finishes (the hill-climb from the best of
each family, the policy's walk when cut short, the baselines). With the whole limit for the search, fuzzed
clusters answered 12-43% past it."""


def plan_search(model: "ModelGraph", cluster: "Cluster", workload: "Workload", *,
                options: SearchOptions | None = None, evaluator: Evaluator | None = None,
                **overrides: object) -> Evaluated:
    """The best plan of the search space (and of the baselines) under the evaluator's predictor.

    Structures are ranked by the analytical stage costs (:mod:`hetpart.policies.search_costs`);
    the candidates they yield are priced, and the best chosen, by ``evaluator``'s predictor (branch
    and bound only where the predictor has a lower bound).

    Args:
        options: :class:`SearchOptions`; keyword ``overrides`` replace single fields.
        evaluator: prices candidates (default: the default predictor).

    Raises:
        PlanError: an override that is no :class:`SearchOptions` field.
        WorkloadError: zones without a link, or nothing fits (why and what would fit).
    """
    unknown = sorted(set(overrides) - _OPTION_NAMES)
    if unknown:
        raise PlanError(f"planner 'search': unknown option(s) {', '.join(unknown)}; it takes "
                        f"{', '.join(sorted(_OPTION_NAMES))}")
    options = replace(options or SearchOptions(), **overrides)
    if options.views is None:
        options = replace(options, views={})
    if options.time_limit_s and options.deadline == math.inf:
        now = time.monotonic()
        options = replace(options, deadline=now + SEARCH_SHARE * options.time_limit_s,
                          finish_by=now + options.time_limit_s)
    evaluate = evaluator
    if evaluate is None or evaluate.ignore_memory != options.ignore_memory:
        evaluate = Evaluator(model, cluster, workload, options.ignore_memory,
                             evaluator.predictor if evaluator is not None else None)
    best = level0 = None
    starts: dict[tuple, Evaluated] = {}  # the best of each kind of candidate: where the hill-climb starts
    levels = zero_levels(workload)
    both = searches_level_one(workload, cluster)  # levels 0 and 1 both searched (_next_level_wanted)
    ahead = _level_one_ahead(model, cluster, workload, options, evaluate) if both else None
    try:
        for n, zero in enumerate(levels):
            if ahead is not None and zero == 1:
                got, simulations = ahead.result()
                evaluate.simulations += simulations
            else:
                got = _level_pass(model, cluster, workload, options, evaluate, zero)
            found = None
            for kind, e in got.items():
                starts[kind] = best_of([starts.get(kind), e])
                found = best_of([found, e])
            best = best_of([best, found])
            if zero == 0:
                level0 = found
            if not _next_level_wanted(found, best, zero, levels[n + 1:], both):
                break
            if best is not None and _late(options):
                break
            if options.ignore_memory and not (both and zero == 0):  # memory lifted: nothing binds above 1
                break
    finally:
        if ahead is not None:
            ahead.close()
    if both and level0 is not None and not _late(options):
        for i, e in enumerate(_level_one_lifts(model, cluster, workload, evaluate, level0)):
            starts[("level 1 from level 0", i)] = e
            best = best_of([best, e])
    if options.walk and best is not None and not options.ignore_memory and not _late(options):
        for zero in ((0, 1) if both else (best.plan.zero,)):
            for i, e in enumerate(_walked(model, cluster, workload, evaluate, zero, list(starts.values()))):
                starts[("walk", zero, i)] = e
                best = best_of([best, e])
    if options.speed_types and not _late(options):
        typed = _speed_typed_best(model, cluster, workload, options, evaluate)
        if typed is not None:
            starts[("speed-typed",)] = typed
            best = best_of([best, typed])
    if best is not None and options.refine_steps:
        # the hill-climb is local: it starts from the best plan of each family (mixed pipelines, typed
        # replicas) with even and with uneven shard fractions, so that a family whose best estimate ranks
        # second (or fractions that win before the climb) cannot hide what the other climbs to
        distinct = {s.plan: s for s in starts.values() if s is not None}  # the same plan climbs the same way once
        best = best_of([refine(evaluate, s, options.refine_steps, options.finish_by) for s in distinct.values()])
    if options.single_types and not _late(options):
        best = best_of([best, _single_types_best(model, cluster, workload, options, evaluate, best)])
    if options.fewer_nodes and not _late(options):
        best = best_of([best, _fewer_nodes_best(model, cluster, workload, options, evaluate, best)])
    late = _late(options)
    if late:
        for e in {id(x): x for x in (evaluate, evaluator) if x is not None}.values():
            e.time_limited = options.time_limit_s
    if late and not options.ignore_memory:  # cut short, the search may not have reached what the policy's walk finds
        from hetpart.policies.policy_planner import plan_policy

        # a floor, run whole (a walk cut to what is left of the limit fell below the policy's own answer): it
        # runs in the quarter of the limit the search leaves, past it where the limit is shorter than the walk
        try:
            best = best_of([best, plan_policy(model, cluster, workload, evaluator=evaluate)])
        except WorkloadError:
            pass
    if options.include_baselines and not options.ignore_memory:
        best = best_of([best, *_baselines(model, cluster, workload, evaluate)])
    if best is None:
        raise no_plan_error(model, cluster, workload, "search",
                            "no point of the search space (mixed pipelines and typed replicas, every tensor-parallel "
                            "degree, pipeline depth, micro-batch and recompute mode) fits in memory")
    return best


def _level_one_lifts(model, cluster, workload, evaluate: Evaluator, level0: Evaluated) -> list[Evaluated]:
    """Level 0's best plan with its optimizer states sharded, as it is and split again at level 1
    (:func:`~hetpart.policies.policy_planner.level_one_starts`, which the policy climbs from): level 1's own pass
    ranks its points by estimate and may not keep that structure, while sharding frees memory and the optimizer's
    time. Seven model families as config.json on 2 x 8 A100 + 2 x 8 V100 (experiments/suites/hf-families-11-30)
    climbed 1.5-2.3% above search's plan from there (opt-6.7b: 79,726 -> 81,490 tokens/s)."""
    from hetpart.policies.policy_planner import level_one_starts
    from hetpart.policies.structure import Scenario

    return level_one_starts(Scenario(model, cluster, workload, evaluator=evaluate), evaluate, level0)


def _walked(model, cluster, workload, evaluate: Evaluator, zero: int, plans: list) -> list[Evaluated]:
    """:func:`~hetpart.policies.policy_planner.walk_starts` at sharding level ``zero`` from ``plans``."""
    from hetpart.policies.policy_planner import walk_starts
    from hetpart.policies.structure import Scenario

    return walk_starts(Scenario(model, cluster, replace(workload, zero=zero), evaluator=evaluate), evaluate, plans)


def _late(options: SearchOptions) -> bool:
    """Whether the search's time limit has run out (:attr:`SearchOptions.time_limit_s`)."""
    return time.monotonic() > options.deadline


def _view_search(model, workload, options: SearchOptions, **changes: Any) -> Callable[..., Evaluated]:
    """``search(view, evaluator)``: the search of a view of the cluster with ``changes`` to ``options``, no baselines
    (the whole cluster's search adds them)."""
    def search(view, evaluator: Evaluator) -> Evaluated:
        changed = replace(options, include_baselines=False, **changes)
        memo = options.views if options.views is not None else {}
        key = _view_key(model, view, workload, changed, evaluator)
        if key in memo:
            got = memo[key]
            if isinstance(got, Exception):
                raise got
            return got
        try:
            got = plan_search(model, view, workload, options=changed, evaluator=evaluator)
        except (PlanError, WorkloadError) as exc:
            got = exc
        if not _late(changed):  # a search cut short is not what the view's whole search finds
            memo[key] = got
        if isinstance(got, Exception):
            raise got
        return got

    return search


def _view_key(model, view: "Cluster", workload, options: SearchOptions, evaluator: Evaluator) -> tuple:
    """What a view's search depends on: the view (its name aside: two paths name one view two ways), the real
    devices its devices stand for and the predictor that prices them there (:meth:`_OnReal.on_real`), the
    workload, memory limits and the options (their clocks aside)."""
    ids = [d.id for d in view.devices]
    predictor = evaluator.predictor
    real, priced_by = predictor.on_real(ids) if isinstance(predictor, _OnReal) else (ids, predictor)
    return (id(model), replace(view, name=""), tuple(real), id(priced_by), workload, evaluator.ignore_memory,
            replace(options, deadline=math.inf, finish_by=math.inf, views=None))


def _speed_typed_best(model, cluster, workload, options: SearchOptions, evaluate: Evaluator) -> Evaluated | None:
    """The search's plan on the speed-typed view (:func:`speed_typed_best`)."""
    return speed_typed_best(model, cluster, workload, evaluate,
                            _view_search(model, workload, options, speed_types=False, refine_steps=0))


def speed_typed_best(model, cluster, workload, evaluate: Evaluator, planner: Callable[..., Evaluated]
                     ) -> Evaluated | None:
    """The best plan ``planner(view, evaluator)`` finds on the :func:`~hetpart.costmodel.pools.speed_typed` view
    of ``cluster``, moved onto the real devices and priced there by ``evaluate`` (None without throttled
    devices, or when nothing of that search fits on the real devices)."""
    from hetpart.costmodel.pools import speed_typed

    view = speed_typed(cluster)
    if view is None:
        return None
    typed, to_real = view
    try:
        found = planner(typed, Evaluator(model, typed, workload, evaluate.ignore_memory,
                                         _OnReal(evaluate.predictor, to_real, cluster)))
    except (PlanError, WorkloadError):
        return None
    return evaluate(_on_real(found.plan, to_real, cluster))


def _on_real(plan: Plan, to_real: dict[str, str], cluster: "Cluster") -> Plan:
    """``plan``, made on a view of ``cluster``, on the real devices ``to_real`` maps its devices to."""
    replicas = tuple(replace(r, stages=tuple(replace(s, devices=tuple(to_real[d] for d in s.devices))
                                            for s in r.stages)) for r in plan.replicas)
    meta = dict(plan.meta)
    if "cluster" in meta:
        meta["cluster"] = cluster.name
    return replace(plan, replicas=replicas, meta=meta)


class _OnReal:
    """``predictor``, made for ``cluster``, pricing the candidates of a view of ``cluster`` whose devices are
    numbered anew (:func:`~hetpart.costmodel.pools.speed_typed`, :func:`~hetpart.costmodel.pools.type_view`):
    each plan is moved onto the real devices ``to_real`` names (:func:`_on_real`) and priced there, as it will
    run (the caller's predictor and profile, each device at its own speed). Asked the view's ids directly,
    ``cluster`` answered for other devices, or none: ``1/0/1`` of a speed-typed view is ``0/1/1``."""

    def __init__(self, predictor: Any, to_real: dict[str, str], cluster: "Cluster") -> None:
        self._inner, self._to_real, self._cluster = predictor, to_real, cluster
        bound = getattr(predictor, "lower_bound_s", None)
        self.lower_bound_s = None if bound is None else self._bound

    def _bound(self, plan: Plan, whole=None) -> float:
        """The inner predictor's bound on the real devices (``whole``'s first devices moved there too)."""
        bound = self._inner.lower_bound_s
        if whole is None:
            return bound(self._real(plan))
        real = self._to_real
        return bound(self._real(plan), whole=[([real[d] for d in firsts], cuts, tps) for firsts, cuts, tps in whole])

    def _real(self, plan: Plan) -> Plan:
        return _on_real(plan, self._to_real, self._cluster)

    def on_real(self, ids: list[str]) -> tuple[list[str], Any]:
        """The view's device ``ids`` as the real devices they stand for, and the predictor that prices them
        there (through every view of a view)."""
        real = [self._to_real[i] for i in ids]
        return self._inner.on_real(real) if isinstance(self._inner, _OnReal) else (real, self._inner)

    def estimate_batch(self, plans):
        return self._inner.estimate_batch([self._real(p) for p in plans])

    def predict(self, plan: Plan, workload=None, *, validate: bool = True, trace: bool = False):
        return self._inner.predict(self._real(plan), workload, validate=validate, trace=trace)

    def __getattr__(self, name: str) -> Any:  # name, version, fork_safe, overlap_p2p, ...
        return getattr(self._inner, name)


def _single_types_best(model, cluster, workload, options: SearchOptions, evaluate: Evaluator,
                       best: Evaluated | None) -> Evaluated | None:
    """The search's plan on one device type alone (:func:`single_types_best`)."""
    return single_types_best(model, cluster, workload, evaluate, best,
                             _view_search(model, workload, options, single_types=False))


def single_types_best(model, cluster, workload, evaluate: Evaluator, best: Evaluated | None,
                      planner: Callable[..., Evaluated], max_devices: int | None = None) -> Evaluated | None:
    """The best plan ``planner(view, evaluator)`` finds on one device type of ``cluster`` alone
    (:func:`~hetpart.costmodel.pools.type_view`; None on a cluster of one type), priced by ``evaluate``'s
    predictor on the whole cluster (the other types idle). Types are visited from the lowest compute floor
    (:func:`_compute_floor_s`) up; one whose floor the best plan so far already beats is not planned, nor
    one whose memory cannot hold the model's states however sharded, nor (``max_devices``) a larger one.
    Only where the whole cluster's search skipped sharding level 1 (:func:`searches_level_one`; the workload
    leaves the level open): otherwise each type alone is already part of its space at both levels."""
    from hetpart.costmodel.memory import memory_capacity_gb
    from hetpart.costmodel.pools import type_view
    from hetpart.policies.common import device_state_bytes_per_param

    if len(cluster.gpu_types) < 2 or zero_levels(workload)[:2] != (0, 1) or searches_level_one(workload, cluster):
        return None
    tokens = workload.global_batch * workload.seq_len
    states_gb = model.num_params * device_state_bytes_per_param(workload) / 1e9
    views = sorted((type_view(cluster, t) for t in cluster.gpu_types),
                   key=lambda v: _compute_floor_s(model, v[0], workload))
    found = None
    for view, to_real in views:
        top = best_of([best, found])
        if top is not None and _compute_floor_s(model, view, workload) >= tokens / top.tokens_per_s:
            break  # nor can any slower type
        if (max_devices is not None and view.num_devices > max_devices
                or sum(memory_capacity_gb(d.gpu) for d in view.devices) < states_gb):
            continue
        try:
            got = planner(view, Evaluator(model, view, workload, evaluate.ignore_memory,
                                          _OnReal(evaluate.predictor, to_real, cluster)))
        except (PlanError, WorkloadError):
            continue
        found = best_of([found, evaluate(_on_real(got.plan, to_real, cluster))])
    return found


def _fewer_nodes_best(model, cluster, workload, options: SearchOptions, evaluate: Evaluator,
                      best: Evaluated | None) -> Evaluated | None:
    """The search's plan on fewer nodes (:func:`fewer_nodes_best`)."""
    return fewer_nodes_best(model, cluster, workload, evaluate, best,
                            _view_search(model, workload, options, fewer_nodes=False))


def fewer_nodes_best(model, cluster, workload, evaluate: Evaluator, best: Evaluated | None,
                     planner: Callable[..., Evaluated]) -> Evaluated | None:
    """The best plan ``planner(view, evaluator)`` finds on :func:`~hetpart.costmodel.pools.fewer_nodes`
    views of ``cluster``: halved, then halved again while the half beats ``best`` and every plan found
    before it, or while nothing fits, or while the view has more devices than the batch has sequences
    (bert-large, batch 8, on 32 A10 + 1 RTX 2080 Ti: the policy's plan on all of them 26,803 tokens/s, on 17
    devices 25,784, on 9 devices 41,892, which stopping at the first half that lost never reached); a view whose
    compute floor (:func:`_compute_floor_s`) the best plan so far already beats, or whose memory cannot hold the model's states however sharded, is not planned
    (nor fewer nodes still); where nothing fits on the whole cluster, views are planned only when it has
    more devices than the batch has sequences (otherwise memory was what failed, and fewer devices hold
    less: each failing search of a view cost minutes on a 405B model). Priced by ``evaluate``'s predictor on the
    whole cluster (the view's devices are the whole cluster's: their plans run there as they are, the
    other nodes idle); None when no view helps."""
    from hetpart.costmodel.pools import fewer_nodes

    from hetpart.costmodel.memory import memory_capacity_gb
    from hetpart.policies.common import device_state_bytes_per_param

    if best is None and cluster.num_devices <= workload.global_batch:
        return None  # nothing fits, and not for want of sequences: fewer devices hold less
    found = None
    tokens = workload.global_batch * workload.seq_len
    states_gb = model.num_params * device_state_bytes_per_param(workload) / 1e9
    last = None
    for halvings in itertools.count(1):
        view = fewer_nodes(cluster, halvings)
        if view is not None and last is not None and view.groups == last.groups:
            break  # one node of each group already
        last = view
        top = best_of([best, found])
        if view is None or (top is not None and _compute_floor_s(model, view, workload) >= tokens / top.tokens_per_s):
            break
        if sum(memory_capacity_gb(d.gpu) for d in view.devices) < states_gb:
            break  # the view cannot hold the model's states however they are sharded (nor can fewer nodes)
        try:
            got = planner(view, Evaluator(model, view, workload, evaluate.ignore_memory, evaluate.predictor))
        except (PlanError, WorkloadError):
            got = None
        here = evaluate(replace(got.plan, meta=dict(got.plan.meta, cluster=cluster.name))
                        if "cluster" in got.plan.meta else got.plan) if got is not None else None
        if here is None and top is not None:
            break
        if here is not None:
            if top is not None and best_of([top, here]) is not here:
                if view.num_devices <= workload.global_batch:
                    break
                continue  # fewer sequences than devices: a smaller view still may win, as far as its floor allows
            found = here
    return found


def _compute_floor_s(model, cluster, workload) -> float:
    """Seconds below which no plan on ``cluster`` computes a step: the model's training FLOPs at every
    device's peak times the largest efficiency its curve reaches (large products), communication and
    bubbles free; each device at its speed factor (a device declared faster computes more: without it the floor
    of such a view sat above what it reaches, and the view could be skipped wrongly). Where the best plan found
    already beats the floor of fewer nodes, searching them is moot."""
    from hetpart.costmodel.efficiency import curve_for, effective_precision

    rate = 0.0
    for d in cluster.devices:
        precision = effective_precision(d.gpu, workload.precision)
        rate += d.gpu.tflops(precision) * 1e12 * curve_for(d.gpu).e_peak(precision) * d.speed
    return model.train_flops * workload.global_batch / rate


def _level_pass(model, cluster, workload, options: SearchOptions, evaluate: Evaluator, zero: int
                ) -> dict[tuple, Evaluated | None]:
    """One sharding level's search: the best simulated plan of each kind of candidate (family, with or
    without shard fractions, the level), before the hill-climb."""
    ctx = make_context(model, cluster, workload, options, zero, evaluate)
    kinds: dict[tuple, list[Plan]] = {}
    top = _top_scored(ctx)
    for scored in top:
        for p in scored.build():
            # per level too: a level's best start must not hide another level's, whose climb may go higher;
            # with throttled devices, one replica apart from several: the evaluator prices replicas at unlike
            # speeds with speed-proportional shares, which may lift them above a pipeline that climbs higher
            several = bool(cluster.slow) and p.dp > 1
            kinds.setdefault((scored.key[0], p.shard_fractions is not None, zero, several), []).append(p)
    found = {kind: evaluate.best(plans) for kind, plans in kinds.items()}
    return found | _near_basins(evaluate, top, best_of(found.values()), zero, cluster.num_devices)


def _near_basins(evaluate: Evaluator, top: list[Scored], best: Evaluated | None, zero: int, devices: int
                 ) -> dict[tuple, Evaluated]:
    """The best simulated plan of every basin (:func:`~hetpart.policies.policy_planner._basin`: a mixed pipeline's
    pools in order and their tensor-parallel degrees) of the level's points ``top`` that comes within
    :data:`~hetpart.policies.policy_planner.NEAR_GROUP` of the level's ``best``, keyed as starts of the hill-climb
    (:func:`~hetpart.policies.policy_planner._near_groups`, which the policy climbs from too). The climb cannot
    leave a basin, and one a hair behind may climb, or interleave, higher: llama3-8b at sequence 32,768 on 8 H100 +
    8 A100-40GB, A100 TP 4 then H100 TP 2 simulated best (44,843 tokens/s) and climbed no higher, while A100 TP 4
    then H100 TP 4, 1.7% behind at 1F1B, interleaves to 46,305; the policy climbed it and beat search by 3.2%."""
    from hetpart.policies.policy_planner import _near_groups

    return {("near basin", zero, i): e for i, e in enumerate(_near_groups(evaluate, top, best, devices))}


def _counted_pass(model, cluster, workload, options: SearchOptions, evaluate: Evaluator, zero: int):
    """:func:`_level_pass` and the simulations it ran (a forked child's count does not reach the parent's
    evaluator otherwise)."""
    before = evaluate.simulations
    got = _level_pass(model, cluster, workload, options, evaluate, zero)
    return got, evaluate.simulations - before


LEVEL_ONE_MAX_DEVICES = 256
"""Up to this many devices the search always searches level 1 beside level 0 (:func:`_next_level_wanted`).
Beyond, level 1 only where level 0 has nothing that fits, as before: on the 1,024-GPU acceptance entry
(llama2-70b on ``mixed-1024.yaml``) the level-1 pass took 48 s against level 0's 22 s on a 2-core
machine (more structures fit, so fewer are cut by memory) and found 1.1% more."""

def searches_level_one(workload: "Workload", cluster: "Cluster") -> bool:
    """Whether level 1 is searched beside level 0: the workload leaves the level open (its levels begin 0,
    1) and the cluster has at most :data:`LEVEL_ONE_MAX_DEVICES` devices. The policy walks level 1 where
    this holds, and the reference space holds both levels."""
    return zero_levels(workload)[:2] == (0, 1) and cluster.num_devices <= LEVEL_ONE_MAX_DEVICES


PARALLEL_LEVELS = True
"""Search level 1 in a forked child beside level 0 where a child can run (tests turn it off to compare)."""


def _level_one_ahead(model, cluster, workload, options: SearchOptions, evaluate: Evaluator):
    """Level 1's pass started now (:class:`~hetpart.policies.forked.Forked`) where
    :func:`searches_level_one`: level 1 is searched whether or not level 0 fits (:func:`_next_level_wanted`),
    so on a second core it runs beside level 0."""
    from hetpart.policies.forked import Forked, can_fork

    return Forked(_counted_pass, model, cluster, workload, options, evaluate, 1,
                  fork=PARALLEL_LEVELS and can_fork(evaluate.predictor))


def _next_level_wanted(found: Evaluated | None, best: Evaluated | None, zero: int, higher: tuple[int, ...],
                       both: bool = True) -> bool:
    """Whether the search goes on to the next sharding level after level ``zero``.

    * After level 0, level 1 always (``both``: up to :data:`LEVEL_ONE_MAX_DEVICES` devices, when the
      workload leaves the level open): level 1 shards only the
      optimizer states, moves the same bytes (a reduce-scatter and an all-gather in place of an all-reduce)
      and frees memory that buys larger micro-batches, no recompute or fewer stages; on the public suite
      that was 2-6% more throughput on 6 of 7 entries where level 0 already fit. The faster plan is kept.
    * Above it, only while nothing fits yet, or when the best plan splits a tensor-parallel group unevenly
      (:func:`_split_wants_shards`)."""
    if not higher:
        return False
    if both and zero == 0 and higher[0] == 1:
        return True
    if found is None and best is None:
        return True
    return _split_wants_shards((found or best).plan, higher)


def _split_wants_shards(plan: Plan, higher: tuple[int, ...]) -> bool:
    """Whether the next sharding level is worth a pass after ``plan`` fits: an uneven tensor-parallel split
    gives its fast devices more than ``1 / tp`` of the parameters, so memory binds there before it binds
    in the even plan, and sharded optimizer states (which run with a split at levels 1-2) can buy back the
    larger micro-batch (the next level is searched once; the faster plan is kept)."""
    from hetpart.rules import RULES

    split = any(s.tp_split is not None for r in plan.replicas for s in r.stages)
    return split and plan.dp > 1 and bool(higher) and higher[0] in RULES.uneven_shard_levels


def _baselines(model, cluster, workload, evaluate: Evaluator) -> list[Evaluated]:
    from hetpart.policies.plan_proportional import plan_proportional
    from hetpart.policies.plan_uniform import plan_uniform

    out = []
    for planner in (plan_uniform, plan_proportional):
        try:
            out.append(planner(model, cluster, workload, evaluator=evaluate))
        except WorkloadError:
            continue
    return out


SEARCH = FunctionPlanner("search", plan_search, _OPTION_NAMES | {"options"},
                         "exact search over mixed pipelines and typed replicas, refined under the predictor")
"""The registry's ``search`` planner (options: :class:`SearchOptions` fields, or ``options=``)."""
