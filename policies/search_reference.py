"""The slow reference of the search: every plan of its space, enumerated (for differential tests).

:func:`space_plans` lists every plan of the space described in :mod:`hetpart.policies.plan_search`
-- each shape, micro-batch, recompute mode, *every* layer split and (for typed replicas) *every*
whole-micro-batch allocation, each also with its water-filled shard fractions where the search allows
them -- so that a test can simulate them all on a small cluster and check that the search's answer is
the best of them. It grows combinatorially: small clusters only.
"""

from __future__ import annotations

import itertools
from bisect import bisect_right
from dataclasses import replace
from typing import TYPE_CHECKING, Iterator

from hetpart.costmodel.collectives import nic_flows
from hetpart.costmodel.pools import tp_groups, tp_options
from hetpart.plan import Plan
from hetpart.policies.common import microbatch_options, recompute_modes
from hetpart.policies.layout import assemble
from hetpart.policies.plan_search import (SearchOptions, _mask_fractions, _mixed_groups, _mixed_shapes, _most_stages,
                                          _uneven, make_context, pipeline_depths, pool_config)
from hetpart.policies.shard_fractions import choose_shard_fractions

if TYPE_CHECKING:  # pragma: no cover
    from hetpart.cluster import Cluster
    from hetpart.graph.model_graph import ModelGraph
    from hetpart.workload import Workload

__all__ = ["space_plans", "all_splits", "all_allocations", "pool_configs_reference", "typed_flows_reference"]


def all_splits(num_units: int, num_stages: int) -> Iterator[tuple[int, ...]]:
    """Every way to cut ``num_units`` units into ``num_stages`` non-empty ordered stages."""
    for cuts in itertools.combinations(range(1, num_units), num_stages - 1):
        yield (0, *cuts, num_units)


def all_allocations(total: int, parts: int) -> Iterator[tuple[int, ...]]:
    """Every way to give ``parts`` replicas at least one of ``total`` micro-batches."""
    for cuts in itertools.combinations(range(1, total), parts - 1):
        yield tuple(b - a for a, b in zip((0, *cuts), (*cuts, total)))


def _mixed(ctx) -> Iterator[Plan]:
    wl = ctx.workload
    for order, tps, dp in _mixed_shapes(ctx):
        pp = sum((p.num_devices // t) // dp for p, t in zip(order, tps))
        for mb in microbatch_options(wl.global_batch // dp, ctx.options.max_micro_batch):
            m = wl.global_batch // (dp * mb)
            for rc in recompute_modes(wl):
                for bounds in all_splits(ctx.n, pp):
                    for placement in ("pp", "dp"):
                        yield assemble(_mixed_groups(order, tps, dp, placement), [bounds] * dp, [m] * dp, mb, rc, wl,
                                       zero=ctx.zero)


def _pool_layouts(ctx, pool) -> list[tuple[list[tuple[str, ...]], int]]:
    """(tensor-parallel groups, pp) for every configuration of a pool."""
    out = []
    for tp in tp_options(pool, ctx.model):
        groups = tp_groups(pool, tp)
        out += [(groups, pp) for pp in pipeline_depths(len(groups), ctx.n)]  # groups // pp replicas, the rest idle
    return out


def _typed(ctx) -> Iterator[Plan]:
    wl = ctx.workload
    if len(ctx.pools) < 2:
        return
    per_pool = [[None] + _pool_layouts(ctx, p) for p in ctx.pools]
    for combo in itertools.product(*per_pool):
        chosen = [c for c in combo if c is not None]
        if len(chosen) < 2:
            continue
        for splits in itertools.product(*(list(all_splits(ctx.n, pp)) for _, pp in chosen)):
            groups, bounds = [], []
            for (pool_groups, pp), cut in zip(chosen, splits):
                for r in range(len(pool_groups) // pp):
                    groups.append(pool_groups[r * pp:(r + 1) * pp])
                    bounds.append(cut)
            for mb in microbatch_options(wl.global_batch, ctx.options.max_micro_batch):
                total = wl.global_batch // mb
                for rc in recompute_modes(wl):
                    for counts in all_allocations(total, len(groups)):
                        plan = assemble(groups, bounds, counts, mb, rc, wl, zero=ctx.zero)
                        yield plan
                        if _uneven(ctx) and plan.zero:  # and its water-filled shard fractions
                            fractions = choose_shard_fractions(ctx.model, ctx.cluster, plan)
                            if fractions is not None:
                                yield replace(plan, shard_fractions=fractions)


def space_plans(model: "ModelGraph", cluster: "Cluster", workload: "Workload",
                options: SearchOptions | None = None, zero: int | None = None) -> Iterator[Plan]:
    """Every plan of the search space at sharding level ``zero``, mixed pipelines first. Default: the
    workload's level, else levels 0 and 1 where the search always searches both (up to
    ``LEVEL_ONE_MAX_DEVICES`` devices), else 0. (Higher levels the search takes only while nothing fits:
    see its tests.)"""
    from hetpart.policies.plan_search import searches_level_one

    if zero is None and searches_level_one(workload, cluster):
        for level in (0, 1):
            yield from space_plans(model, cluster, workload, options, level)
        return
    ctx = make_context(model, cluster, workload, options or SearchOptions(), zero)
    yield from _mixed(ctx)
    yield from _typed(ctx)


def pool_configs_reference(ctx, pool, mb: int, rc: str, total_mb: int) -> list:
    """:func:`~hetpart.policies.plan_search._pool_configs` the slow way: every configuration of ``pool`` split,
    each memory assumption's sorted by rate (stably: ties keep the order made) and its best
    ``configs_per_pool`` kept, once each, fastest first."""
    out: dict[bool, list] = {}
    for tp in tp_options(pool, ctx.model):
        groups = tp_groups(pool, tp)
        for pp in pipeline_depths(len(groups), _most_stages(ctx)):
            dp = len(groups) // pp
            m_est = max(1, total_mb // (dp * len(ctx.pools)))
            costs = ctx.table.get(pool, tp, mb, rc)
            for fraction in _mask_fractions(ctx, dp):
                masks = [costs.masked(pp - j, ctx.options.ignore_memory, ctx.zero, fraction) for j in range(pp)]
                config = pool_config(ctx, pool, tp, pp, mb, costs, masks, m_est)
                if config is not None:
                    out.setdefault(fraction == 0.0, []).append(config)
    kept: dict[tuple, object] = {}
    for configs in out.values():
        configs.sort(key=lambda c: -c.rate)
        for c in configs[: ctx.options.configs_per_pool]:
            kept.setdefault((c.tp, c.pp, c.split.bounds), c)
    return sorted(kept.values(), key=lambda c: -c.rate)


def typed_flows_reference(ctx, groups: list[list[tuple[str, ...]]], bounds: list[tuple[int, ...]]) -> dict[int, float]:
    """Reference for :func:`~hetpart.policies.plan_search._typed_flows`: typed replicas' gradient rings built one
    member at a time (one ring per span of units between any replica's cuts, holding the stage of every replica
    that holds the span), given to :func:`~hetpart.costmodel.collectives.nic_flows`."""
    flat, index = ctx.places[:, 0].tolist(), ctx.device_index
    rings = []
    for a in sorted({b for cuts in bounds for b in cuts[:-1]}):
        members = []
        for r, (stages, cuts) in enumerate(zip(groups, bounds)):
            k = bisect_right(cuts, a) - 1
            members.append((flat[index[stages[k][0]]], (r, k), len(stages[k])))
        rings.append(members)
    flows = nic_flows(rings)
    if ctx.cluster.zone_links:  # per zone, the rings that cross a zone link (as the simulator counts them)
        names = ctx.cluster.zones
        zone = [names.index(ctx.cluster.groups[g].zone) for g in ctx.node_group]
        flows.update({("zone", z): c for z, c in nic_flows([[(zone[n], g, tp) for n, g, tp in members]
                                                            for members in rings]).items()})
    return flows
