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

import math
from typing import TYPE_CHECKING, Iterator

from hetpart.costmodel.evaluator import Evaluated, Evaluator
from hetpart.costmodel.pools import Pool, device_pools, divisors, tp_groups, tp_options
from hetpart.plan import Plan
from hetpart.policies.common import (FunctionPlanner, microbatch_options, no_plan_error, recompute_modes,
                                     with_full_shard_fallback)
from hetpart.policies.layout import assemble, proportional_bounds, proportional_counts

if TYPE_CHECKING:  # pragma: no cover
    from hetpart.cluster import Cluster
    from hetpart.graph.model_graph import ModelGraph
    from hetpart.workload import Workload

__all__ = ["plan_proportional", "holmes_plans", "hap_plans", "PROPORTIONAL"]


def _zone_order(pools: list[Pool]) -> list[Pool]:
    """Pools grouped by zone (one zone crossing per boundary), cluster order otherwise."""
    zones = list(dict.fromkeys(p.zone for p in pools))
    return sorted(pools, key=lambda p: zones.index(p.zone))


def _pool_tp(pool: Pool, model: "ModelGraph", tp: int) -> int | None:
    options = tp_options(pool, model)
    fitting = [t for t in options if t <= tp]
    return max(fitting) if fitting else None


def holmes_plans(model: "ModelGraph", cluster: "Cluster", workload: "Workload") -> Iterator[list[Plan]]:
    """Identical replicas, each one pipeline across every pool; layers by speed, batch even.

    Yields one iterator per layout: the same plan under each allowed recompute mode, least first."""
    pools = _zone_order(device_pools(cluster))
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
                yield _variants(replicas, [bounds] * dp, [samples // mb] * dp, mb, workload)


def hap_plans(model: "ModelGraph", cluster: "Cluster", workload: "Workload") -> Iterator[list[Plan]]:
    """Each pool runs its own ``pp``-stage replicas; batch shares in proportion to replica speed.

    Yields one iterator per layout, like :func:`holmes_plans`."""
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
                yield _variants(replicas, [bounds] * len(replicas), counts, mb, workload)


def _variants(replicas, bounds, counts, mb: int, workload: "Workload") -> Iterator[Plan]:
    """One layout under each allowed recompute mode, least first, assembled only when asked for (a
    1,024-GPU plan takes milliseconds to build, and the first mode that fits ends the walk)."""
    for rc in recompute_modes(workload):
        yield assemble(replicas, bounds, counts, mb, rc, workload)


def _common_microbatches(global_batch: int, replicas: int) -> list[int]:
    return [b for b in microbatch_options(global_batch) if global_batch // b >= replicas]


def plan_proportional(model: "ModelGraph", cluster: "Cluster", workload: "Workload", *,
                      evaluator: Evaluator | None = None) -> Evaluated:
    """The faster fitting plan of the Holmes and HAP layouts.

    Raises:
        WorkloadError: when no layout of the grid fits in memory.
    """
    evaluate = evaluator or Evaluator(model, cluster, workload)
    best = with_full_shard_fallback(_best_proportional, model, cluster, workload, evaluate)
    if best is None:
        raise no_plan_error(model, cluster, workload, "proportional",
                            "no speed-proportional layout of its grid fits in memory")
    return best


def _best_proportional(model, cluster, workload, evaluate: Evaluator) -> Evaluated | None:
    # more recomputation of the same layout is only slower: keep the least that fits
    layouts = (*holmes_plans(model, cluster, workload), *hap_plans(model, cluster, workload))
    fitting = (next((p for p in variants if evaluate.fits(p)), None) for variants in layouts)
    return evaluate.best(p for p in fitting if p is not None)


PROPORTIONAL = FunctionPlanner("proportional", plan_proportional, frozenset(),
                               "Holmes / HAP: layers and batch in proportion to datasheet speed")
"""The registry's ``proportional`` planner (takes no options)."""
