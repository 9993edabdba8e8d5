"""Uneven shard fractions: how much of the sharded states each replica of a heterogeneous group holds.

A replica's memory is linear in its fraction ``f`` of the sharded states (:mod:`hetpart.costmodel.sharding`):
``need_d(f) = base_d + slope_d * f`` on each of its pipeline devices, so it fits up to
``f_max = min_d (capacity_d - base_d) / slope_d``. Within a shard group the fractions sum to 1, and
the collectives run padded to the largest shard (time ``n * max f``), so the best fractions fit every
device with the smallest largest fraction: water-filling, ``f_r = min(f_max_r, level)`` with the level
that makes them sum to 1 (Cephalo balances batch and shard sizes the same way; the batch shares are the
planner's, chosen for speed, and enter here through the micro-batches in flight).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from hetpart.cluster import Cluster
    from hetpart.graph.model_graph import ModelGraph
    from hetpart.plan import Plan

__all__ = ["fraction_limits", "water_fill", "choose_shard_fractions"]

_MARGIN = 1e-10
"""Relative margin under each replica's largest fraction (:func:`fraction_limits`)."""


def fraction_limits(model: "ModelGraph", cluster: "Cluster", plan: "Plan") -> list[float]:
    """Per replica, the largest fraction of the sharded states its devices hold (may exceed 1, or be
    negative when even its unsharded part does not fit)."""
    from hetpart.costmodel.memory import (PrefixTables, chunk_flights, memory_capacity_gb, stage_memory_gb,
                                          stage_working_gb)
    from hetpart.costmodel.sharding import microbatches_run, sharded_delta_gb

    out = []
    v = plan.chunks_per_device
    tables = PrefixTables(model) if plan.schedule == "interleaved" else None  # (chunk_flights' weights)
    for r, rep in enumerate(plan.replicas):
        pp, m = rep.pp // v, microbatches_run(plan, r)
        limit = float("inf")
        for d in range(pp):
            flights = chunk_flights(tables, plan.schedule, d, pp, m, v,
                                    [(*rep.stages[k].layers, rep.stages[k].tp) for k in range(d, rep.pp, pp)],
                                    plan.recompute, plan.attention)
            base = params = largest = work = 0.0
            for k, flight in zip(range(d, rep.pp, pp), flights):
                s = rep.stages[k]
                base += stage_memory_gb(model, *s.layers, s.tp, plan.micro_batch, flight, plan.recompute, plan.precision,
                                        plan.optimizer, plan.attention, working_set=False)
                work = max(work, stage_working_gb(model, *s.layers, s.tp, plan.micro_batch, plan.recompute,
                                                  plan.attention))  # once per device: one unit runs at a time
                params += model.range_params(*s.layers, s.tp)
                largest = max([largest] + [model.range_params(u, u + 1, s.tp) for u in range(*s.layers)])
            base += work
            at0 = base + sharded_delta_gb(params, largest, plan.precision, plan.zero, 0.0, plan.optimizer, plan.offload)
            slope = (base + sharded_delta_gb(params, largest, plan.precision, plan.zero, 1.0, plan.optimizer, plan.offload)
                     - at0)
            capacity = min(memory_capacity_gb(cluster.device(x).gpu) for x in rep.stages[d].devices)
            # a hair inside the limit: the simulator sums the same terms in another order, and a fraction
            # exactly at the limit may land an ulp over the capacity there
            limit = min(limit, (capacity - at0) / slope * (1.0 - _MARGIN) if slope > 0 else float("inf"))
        out.append(limit)
    return out


def water_fill(limits: list[float]) -> list[float] | None:
    """Fractions ``min(limit, level)`` summing to 1 with the smallest level; None when the limits sum to
    less than 1 (or one is not positive)."""
    if any(x <= 0 for x in limits) or sum(min(x, 1.0) for x in limits) < 1.0 - 1e-12:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if sum(min(x, mid) for x in limits) < 1.0:
            lo = mid
        else:
            hi = mid
    fractions = [min(x, hi) for x in limits]
    total = sum(fractions)
    return [f / total for f in fractions]


def choose_shard_fractions(model: "ModelGraph", cluster: "Cluster", plan: "Plan") -> tuple[float, ...] | None:
    """The water-filled fractions of every shard group of ``plan`` (levels 1-2, no hybrid sharding:
    :func:`hetpart.rules.uneven_shard_problems`), or None where even shards already fit every device (even
    is then optimal), where nothing makes them fit, or where the runtime could not run them."""
    from hetpart.rules import uneven_shard_problems

    if not plan.zero or plan.dp < 2 or uneven_shard_problems(replace(plan, shard_fractions=(1.0,) + (0.0,) * (plan.dp - 1))):
        return None  # the runtime runs uneven shards at levels 1-2 without hybrid sharding only
    limits = fraction_limits(model, cluster, plan)
    groups = plan.shard_groups()
    if all(limits[r] >= 1.0 / len(g) for g in groups for r in g):
        return None
    out = [0.0] * plan.dp
    for g in groups:
        filled = water_fill([limits[r] for r in g])
        if filled is None:
            return None
        for r, f in zip(g, filled):
            out[r] = f
    return tuple(out)
