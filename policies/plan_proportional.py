"""The ``proportional`` planner: Holmes' self-adapting partition and HAP's batch shares.

Speed is the datasheet peak (``tflops_bf16 x tp``): no cost model is consulted to split, only to
choose among the resulting plans. Two layouts are tried and the faster fitting one is kept:

* Holmes (Li et al. 2023): every data-parallel replica is one pipeline across all pools (pipeline
  parallelism crosses zones and NIC types, tensor- and data-parallel groups stay inside one pool
  and so inside one NIC type), layers cut in proportion to each stage's speed, batch split evenly;
* HAP (Zhang et al. 2024, DP-CP): every pool runs its own replicas of a ``pp``-stage pipeline, and
  the batch is split between replicas in proportion to their speed.

Both run over a small grid (tensor-parallel degree, pipeline depth, micro-batch, recompute mode).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Iterator

from hetpart.costmodel.evaluator import Evaluated, Evaluator, best_of
from hetpart.costmodel.pools import Pool, device_pools, divisors, tp_groups, tp_options, zone_path_ok
from hetpart.plan import Plan, Replica, Stage
from hetpart.policies.common import (FunctionPlanner, microbatch_options, no_plan_error, recompute_modes,
                                     with_full_shard_fallback)
from hetpart.policies.layout import assemble, proportional_bounds, proportional_counts

if TYPE_CHECKING:  # pragma: no cover
    from hetpart.cluster import Cluster
    from hetpart.graph.model_graph import ModelGraph
    from hetpart.workload import Workload

__all__ = ["plan_proportional", "holmes_plans", "hap_plans", "PROPORTIONAL"]


def _zone_order(pools: list[Pool], cluster: "Cluster", tied: bool) -> list[Pool]:
    """Pools grouped by zone (one zone crossing per boundary), the zones in the first order of their first
    appearance whose crossings all have links (:func:`~hetpart.costmodel.pools.zone_path_ok`: zones linked
    only in a chain go along it), cluster order otherwise."""
    zones = list(dict.fromkeys(p.zone for p in pools))
    if len(zones) <= _ZONE_ORDERS_MAX:
        zones = next((list(o) for o in itertools.permutations(zones) if zone_path_ok(cluster, o, tied)), zones)
    return sorted(pools, key=lambda p: zones.index(p.zone))


_ZONE_ORDERS_MAX = 7
"""Zones up to which a pipeline's zone order is chosen among all orders (5,040 at 7)."""


def _pool_tp(pool: Pool, model: "ModelGraph", tp: int) -> int | None:
    options = tp_options(pool, model)
    fitting = [t for t in options if t <= tp]
    return max(fitting) if fitting else None


@dataclass(frozen=True)
class _Layout:
    """One layout of the grid: per replica its stage device groups, layer bounds and micro-batches."""

    groups: list[list[tuple[str, ...]]]
    bounds: list[tuple[int, ...]]
    counts: tuple[int, ...]
    micro_batch: int

    def plan(self, recompute: str, workload: "Workload") -> Plan:
        return assemble(self.groups, self.bounds, self.counts, self.micro_batch, recompute, workload)


def _holmes_layouts(model: "ModelGraph", cluster: "Cluster", workload: "Workload") -> Iterator[_Layout]:
    pools = _zone_order(device_pools(cluster), cluster, model.tied_owner_index >= 0)
    for tp in sorted({t for p in pools for t in tp_options(p, model)}):
        tps = [_pool_tp(p, model, tp) for p in pools]
        groups = [tp_groups(p, t) for p, t in zip(pools, tps)]
        for dp in divisors(math.gcd(*(len(g) for g in groups))):
            if workload.global_batch % dp:
                continue
            per = [len(g) // dp for g in groups]
            speeds = [p.gpu.tflops_bf16 * t for p, t, s in zip(pools, tps, per) for _ in range(s)]
            bounds = proportional_bounds(model, speeds)
            if bounds is None:
                continue
            replicas = [[grp for g, s in zip(groups, per) for grp in g[r * s:(r + 1) * s]] for r in range(dp)]
            samples = workload.global_batch // dp
            for mb in microbatch_options(samples):
                yield _Layout(replicas, [bounds] * dp, (samples // mb,) * dp, mb)


def _hap_layouts(model: "ModelGraph", cluster: "Cluster", workload: "Workload") -> Iterator[_Layout]:
    pools = device_pools(cluster)
    for tp in sorted({t for p in pools for t in tp_options(p, model)}):
        tps = [_pool_tp(p, model, tp) for p in pools]
        groups = [tp_groups(p, t) for p, t in zip(pools, tps)]
        for pp in divisors(math.gcd(*(len(g) for g in groups))):
            if pp > model.num_units:
                continue
            replicas, speeds = [], []
            for p, t, g in zip(pools, tps, groups):
                for r in range(len(g) // pp):
                    replicas.append(g[r * pp:(r + 1) * pp])
                    speeds.append(p.gpu.tflops_bf16 * t * pp)
            bounds = proportional_bounds(model, [1.0] * pp)
            for mb in _common_microbatches(workload.global_batch, len(replicas)):
                counts = proportional_counts(speeds, workload.global_batch // mb)
                if counts is None:
                    continue
                yield _Layout(replicas, [bounds] * len(replicas), counts, mb)


def holmes_plans(model: "ModelGraph", cluster: "Cluster", workload: "Workload") -> Iterator[Iterator[Plan]]:
    """Identical replicas, each one pipeline across every pool; layers by speed, batch even.

    Yields one iterator per layout: the same plan under each allowed recompute mode, least first."""
    for layout in _holmes_layouts(model, cluster, workload):
        yield _variants(layout, workload)


def hap_plans(model: "ModelGraph", cluster: "Cluster", workload: "Workload") -> Iterator[Iterator[Plan]]:
    """Each pool runs its own ``pp``-stage replicas; batch shares in proportion to replica speed.

    Yields one iterator per layout, like :func:`holmes_plans`."""
    for layout in _hap_layouts(model, cluster, workload):
        yield _variants(layout, workload)


def _variants(layout: _Layout, workload: "Workload") -> Iterator[Plan]:
    """One layout under each allowed recompute mode, least first, assembled only when asked for (a
    1,024-GPU plan takes milliseconds to build, and the first mode that fits ends the walk)."""
    for rc in recompute_modes(workload):
        yield layout.plan(rc, workload)


def _common_microbatches(global_batch: int, replicas: int) -> list[int]:
    return [b for b in microbatch_options(global_batch) if global_batch // b >= replicas]


def plan_proportional(model: "ModelGraph", cluster: "Cluster", workload: "Workload", *,
                      evaluator: Evaluator | None = None, incumbent: Evaluated | None = None) -> Evaluated:
    """The faster fitting plan of the Holmes and HAP layouts (on every device; where none fits, on the first
    nodes of each node group, :func:`~hetpart.policies.plan_search.fewer_nodes_best`).

    Args:
        incumbent: a plan already in hand: layouts whose lower bound cannot beat it are never
            simulated, and it is returned itself when no layout beats it (a caller that only needs
            the baseline when it wins, as the policy planner does, saves the simulations). The
            sharding level is the one planned without it: where no layout fits unsharded, the
            sharded fallback is planned whatever the incumbent.

    Raises:
        WorkloadError: when no layout of the grid fits in memory.
    """
    evaluate = evaluator or Evaluator(model, cluster, workload)
    best = with_full_shard_fallback(partial(_best_proportional, incumbent=incumbent), model, cluster, workload,
                                    evaluate)
    if best is None:  # a batch too small for every device: the layouts over the first nodes of each group
        from hetpart.policies.plan_search import fewer_nodes_best

        best = fewer_nodes_best(model, cluster, workload, evaluate, None, lambda view, ev: with_full_shard_fallback(
            _best_proportional, model, view, workload, ev))
    if best is None:
        raise no_plan_error(model, cluster, workload, "proportional",
                            "no speed-proportional layout of its grid fits in memory")
    return best


def _best_proportional(model, cluster, workload, evaluate: Evaluator, incumbent: Evaluated | None = None
                       ) -> Evaluated | None:
    layouts = [*_holmes_layouts(model, cluster, workload), *_hap_layouts(model, cluster, workload)]
    if evaluate.pruning and not workload.zero:
        found = _best_by_class(layouts, cluster, workload, evaluate, incumbent)
        if found is not _UNDECIDED:
            return found
    # more recomputation of the same layout is only slower: keep the least that fits
    fitting = [p for layout in layouts
               if (p := next((p for p in _variants(layout, workload) if evaluate.fits(p)), None)) is not None]
    return evaluate.best(fitting, incumbent=incumbent) if fitting else None  # None: try the next sharding level


_UNDECIDED = object()


def cannot_beat(model, cluster, workload, evaluate: Evaluator, incumbent: Evaluated) -> bool:
    """Whether :func:`plan_proportional` given ``incumbent`` would return the incumbent itself, decided from the
    layouts' memory and lower bounds alone (no simulation): some layout fits unsharded and none's bound is
    below the incumbent's step. False where that cannot be told so (a stage of unlike devices, a sharding
    level set, nothing fitting unsharded: the planner's other paths decide)."""
    return layouts_beating(model, cluster, workload, evaluate, incumbent) == 0


def layouts_beating(model, cluster, workload, evaluate: Evaluator, incumbent: Evaluated) -> int | None:
    """How many layouts :func:`plan_proportional` given ``incumbent`` would price: those that fit unsharded and
    whose lower bound is not above the incumbent's step (0: it returns the incumbent itself), from memory and
    the bounds alone. None where that cannot be told (a stage of unlike devices, a sharding level set, nothing
    fitting unsharded: the planner's other paths decide)."""
    if not evaluate.pruning or workload.zero:
        return None
    layouts = [*_holmes_layouts(model, cluster, workload), *_hap_layouts(model, cluster, workload)]
    fitting = _class_bounds(layouts, cluster, workload, evaluate)
    if not fitting:
        return None
    return sum(bound <= incumbent.step_time_s for bound, *_ in fitting)


def _class_bounds(layouts: list[_Layout], cluster: "Cluster", workload: "Workload", evaluate: Evaluator
                  ) -> list[tuple[float, int, _Layout, str]] | None:
    """``(lower bound, index, layout, recompute)`` of each layout's least-recompute plan that fits, memory and
    bound taken on one representative replica per class of interchangeable replicas (:func:`_best_by_class`);
    None when a stage mixes unlike devices."""
    kinds = _GroupKinds(cluster)
    fitting = []
    for i, layout in enumerate(layouts):
        keep = _representatives(layout, kinds)
        if keep is None:
            return None
        few = _Layout([layout.groups[r] for r in keep], [layout.bounds[r] for r in keep],
                      tuple(layout.counts[r] for r in keep), layout.micro_batch)
        # the whole layout's replicas as the bound reads them (whose sends share the NICs, which nodes hold each unit)
        whole = [([g[0] for g in groups], cuts, [len(g) for g in groups])
                 for groups, cuts in zip(layout.groups, layout.bounds)]
        for rc in recompute_modes(workload):
            small = _partial_plan(few, rc, workload)
            if evaluate.fits(small):
                fitting.append((evaluate.lower_bound_s(small, whole=whole), i, layout, rc))
                break
    return fitting


def _best_by_class(layouts: list[_Layout], cluster: "Cluster", workload: "Workload", evaluate: Evaluator,
                   incumbent: Evaluated | None = None):
    """What :meth:`Evaluator.best` picks among the layouts' least-recompute fitting plans, checking
    memory and ordering by the lower bound on one representative replica per class of interchangeable
    replicas (same device facts per stage, same layers and micro-batches: without sharding, memory and
    the bound are per replica, so a class answers for all its members); only the plans branch and bound
    prices are built whole. ``_UNDECIDED`` when a stage mixes unlike devices (their uneven TP splits go
    through the evaluator)."""
    fitting = _class_bounds(layouts, cluster, workload, evaluate)
    if fitting is None:
        return _UNDECIDED
    if not fitting:
        return None  # nothing fits at this level: the caller tries the next sharding level, incumbent or not
    best = incumbent
    for bound, _, layout, rc in sorted(fitting, key=lambda t: (t[0], t[1])):
        if best is not None and bound > best.step_time_s:
            break
        best = best_of([best, evaluate(layout.plan(rc, workload), split=False)])
    return best


def _representatives(layout: _Layout, kinds: "_GroupKinds") -> list[int] | None:
    """Indices of one replica per class (None when some stage group mixes unlike devices)."""
    seen: dict[tuple, int] = {}
    for r, groups in enumerate(layout.groups):
        sig = tuple(map(kinds.of, groups))
        if None in sig:
            return None
        seen.setdefault((sig, layout.bounds[r], layout.counts[r]), r)
    return sorted(seen.values())


class _GroupKinds:
    """A small id per kind of stage group (None: unlike devices). Groups with the same node group,
    local index and speed per device, sharing nodes alike, have the same device facts (their GPUs,
    and the links between them: :func:`~hetpart.costmodel.links.achieved_link` reads nothing else),
    so the facts are derived once per such shape."""

    def __init__(self, cluster: "Cluster") -> None:
        self.cluster = cluster
        self._of_group: dict[tuple[str, ...], int | None] = {}
        self._of_shape: dict[tuple, int | None] = {}
        self._ids: dict[tuple, int] = {}

    def of(self, group: tuple[str, ...]) -> int | None:
        if group in self._of_group:
            return self._of_group[group]
        from hetpart.costmodel.device_group import device_group_facts

        nodes: dict[tuple[int, int], int] = {}
        shape = tuple((d.group, d.local, d.speed, nodes.setdefault(d.node_key, len(nodes)))
                      for d in map(self.cluster.device, group))
        if shape not in self._of_shape:
            f = device_group_facts(self.cluster, group)
            kind = (f.gpus, f.speeds, f.tp_link)
            self._of_shape[shape] = self._ids.setdefault(kind, len(self._ids)) if f.alike else None
        self._of_group[group] = self._of_shape[shape]
        return self._of_group[group]


def _partial_plan(layout: _Layout, recompute: str, workload: "Workload") -> Plan:
    """Some replicas of a layout as a plan (their batch shares kept: it covers part of the batch);
    what memory and the lower bound say of it holds for those replicas in the whole plan."""
    replicas = tuple(Replica(c * layout.micro_batch / workload.global_batch,
                             tuple(Stage((int(a), int(b)), tuple(g), len(g))
                                   for g, a, b in zip(groups, cuts[:-1], cuts[1:])))
                     for groups, cuts, c in zip(layout.groups, layout.bounds, layout.counts))
    return Plan(global_batch=workload.global_batch, micro_batch=layout.micro_batch, seq_len=workload.seq_len,
                replicas=replicas, schedule="1f1b", recompute=recompute, precision=workload.precision,
                zero=3 if workload.offload == "full" else 0, offload=workload.offload,
                optimizer=workload.optimizer, attention=workload.attention)


PROPORTIONAL = FunctionPlanner("proportional", plan_proportional, frozenset(),
                               "Holmes / HAP: layers and batch in proportion to datasheet speed")
"""The registry's ``proportional`` planner (takes no options)."""
