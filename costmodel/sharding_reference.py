"""A slow, unit-by-unit reference of the simulator's sharded data parallelism (tests compare the two).

It walks every unit of every stage with the plain functions (:func:`~hetpart.costmodel.memory.stage_memory_gb`,
:func:`~hetpart.costmodel.collectives.reduce_scatter_time_s`) instead of the simulator's prefix tables, ring
caches and segments, and states the model of :mod:`hetpart.costmodel.sharding` once more in loops.
"""

from __future__ import annotations

from hetpart.cluster import Cluster
from hetpart.graph.model_graph import ModelGraph
from hetpart.plan import Plan
from hetpart.workload import DTYPE_BYTES

from hetpart.costmodel.collectives import reduce_scatter_time_s, zone_concurrency
from hetpart.costmodel.activations import unit_working_bytes
from hetpart.costmodel.memory import GRAD_BYTES, PrefixTables, chunk_flights, stage_memory_gb
from hetpart.costmodel.sharding import state_bytes

__all__ = ["reference_memory_gb", "reference_nic_rings", "reference_unit_gather_s", "reference_unit_scatter_s",
           "reference_unit_params",
           "reference_exposed_s"]


def _holder(plan: Plan, replica: int, unit: int):
    return next(s for s in plan.replicas[replica].stages if s.layers[0] <= unit < s.layers[1])


def reference_memory_gb(model: ModelGraph, plan: Plan) -> dict[tuple[int, int], float]:
    """(replica, pipeline device group) -> predicted peak memory, GB, unit by unit."""
    w, g, opt = state_bytes(plan.precision, plan.optimizer)
    tables = PrefixTables(model)  # (the chunks' weights for the counts in flight: chunk_flights)
    out = {}
    for r, rep in enumerate(plan.replicas):
        pp = plan.pipeline_devices(r)
        for d in range(pp):
            m = plan.num_microbatches(r)
            if plan.zero >= 2:  # padded up to the shard group's largest count
                m = max(plan.num_microbatches(x) for g in plan.shard_groups() if r in g for x in g)
            flights = chunk_flights(tables, plan.schedule, d, pp, m, plan.chunks_per_device,
                                    [(*rep.stages[k].layers, rep.stages[k].tp) for k in range(d, rep.pp, pp)],
                                    plan.recompute, plan.attention)
            total = 0.0
            params = 0.0
            largest = 0.0
            work = 0.0  # the running unit's working set: one unit of the device runs at a time
            transient = unit_working_bytes(model, plan.recompute, plan.attention)
            for k, flight in zip(range(d, rep.pp, pp), flights):
                s = rep.stages[k]
                total += stage_memory_gb(model, s.layers[0], s.layers[1], s.tp, plan.micro_batch, flight,
                                         plan.recompute, plan.precision, plan.optimizer, plan.attention,
                                         working_set=False, zero=3 if plan.offload == "full" else (
                                             plan.zero if plan.dp > 1 or plan.offload != "none" else 0)) * 1e9
                params += model.range_params(s.layers[0], s.layers[1], s.tp)
                for u in range(*s.layers):
                    largest = max(largest, model.range_params(u, u + 1, s.tp))
                    split = s.tp if model.units[u].tp_shardable else 1
                    work = max(work, transient[u] / split * plan.micro_batch)
            total += work
            total -= params * (w + g + opt)  # the unsharded states stage_memory_gb counted
            f = plan.shard_fraction(r)
            zero = plan.zero if plan.dp > 1 or plan.offload != "none" else 0
            keep = {0: w + g + opt, 1: w + g + opt * f, 2: w + (g + opt) * f, 3: (w + g + opt) * f}[zero]
            if plan.offload == "optimizer":  # on the host: the moments, the master weights, sharded gradients
                keep = {0: w + g, 1: w + g, 2: w, 3: w * f}[zero]
            elif plan.offload == "full":  # everything on the host; units gathered as at level 3
                keep, zero = 0.0, 3
            extra = {0: 0.0, 1: 0.0, 2: g * largest, 3: 0.0}[zero]
            if zero == 3:  # the running unit, its prefetched neighbour, the running unit's gradient in the backward
                for k in range(d, rep.pp, pp):
                    a, z = rep.stages[k].layers
                    held = [model.range_params(u, u + 1, rep.stages[k].tp) for u in range(a, z)]
                    for i in range(len(held)):
                        nxt = held[i + 1] if i + 1 < len(held) else 0.0
                        prev = held[i - 1] if i else 0.0
                        extra = max(extra, w * (held[i] + nxt), w * (held[i] + prev) + g * held[i])
            out[(r, d)] = (total + params * keep + extra) / 1e9
    return out


def _node(cluster: Cluster, device: str):
    return cluster.device(device).node_key


def _zone(cluster: Cluster, device: str):
    return "zone", cluster.device(device).zone


def reference_nic_rings(model: ModelGraph, cluster: Cluster, plan: Plan, place=_node) -> dict:
    """Per node: how many shard rings leave it at once. A ring is the set of holders of some unit in a shard
    group; one that spans nodes is crossing. A pipeline device group runs its crossing rings one after
    another, so a ring runs 1/k of the time when its busiest member is in k crossing rings; each device
    group adds its ``tp`` rings (one per tensor-parallel rank) to its node's count for the share of the
    time one of its rings runs (at most all of it). ``place``: what the rings are counted by (the node;
    :func:`_zone` counts the rings crossing a zone link per zone, keys ``("zone", name)``)."""
    rings = []  # distinct crossing rings, each a tuple of (replica, stage) holders
    for unit in range(model.num_units):
        for group in plan.shard_groups():
            if len(group) < 2:
                continue
            held = []
            for r in group:
                k = next(i for i, s in enumerate(plan.replicas[r].stages) if s.layers[0] <= unit < s.layers[1])
                held.append((r, k))
            nodes = {place(cluster, plan.replicas[r].stages[k].devices[0]) for r, k in held}
            if len(nodes) > 1 and tuple(held) not in rings:
                rings.append(tuple(held))

    def device_group(r: int, k: int) -> tuple[int, int]:
        return r, k % plan.pipeline_devices(r)

    count: dict[tuple[int, int], int] = {}
    for ring in rings:
        for g in {device_group(r, k) for r, k in ring}:
            count[g] = count.get(g, 0) + 1
    active: dict[tuple[int, int], float] = {}
    width: dict[tuple[int, int], tuple] = {}
    for ring in rings:
        share = 1.0 / max(count[device_group(r, k)] for r, k in ring)
        for g in {device_group(r, k) for r, k in ring}:
            active[g] = active.get(g, 0.0) + share
        for r, k in ring:
            s = plan.replicas[r].stages[k]
            g = device_group(r, k)
            width[g] = (place(cluster, s.devices[0]), max(s.tp, width[g][1] if g in width else 0))
    out: dict = {}
    for g, (node, tp) in width.items():
        out[node] = out.get(node, 0.0) + tp * min(1.0, active[g])
    return out


def reference_unit_gather_s(model: ModelGraph, cluster: Cluster, plan: Plan, replica: int, unit: int) -> float:
    """One all-gather of ``unit``'s parameters (in the training dtype) among the holders in ``replica``'s shard
    group, its ring sharing each node's NICs with the shard rings of the plan's other device groups there
    (:func:`reference_nic_rings`)."""
    return _unit_collective_s(model, cluster, plan, replica, unit, DTYPE_BYTES[plan.precision])


def reference_unit_scatter_s(model: ModelGraph, cluster: Cluster, plan: Plan, replica: int, unit: int) -> float:
    """One reduce-scatter of ``unit``'s gradients among the same holders, in the bytes gradients are reduced in
    (:data:`~hetpart.costmodel.memory.GRAD_BYTES`: fp32 under bf16)."""
    return _unit_collective_s(model, cluster, plan, replica, unit, GRAD_BYTES[plan.precision])


def reference_unit_params(model: ModelGraph, unit: int, tp: int, stages: list[tuple[int, int]]) -> float:
    """Parameters one device of a ``tp``-way stage gathers (and reduce-scatters) of ``unit``, its holders' stages
    spanning ``stages``: its own and a tied copy it uses, unless every holder's stage holds the copy's owner (one
    weight there, gathered with the owner's unit)."""
    params = model.range_params(unit, unit + 1, tp)
    owner, shared = model.tied_owner_index, model.units[unit].shared_params
    if shared and owner >= 0 and unit != owner and all(a <= owner < z for a, z in stages):
        params -= shared / tp if model.units[unit].tp_shardable else shared
    return params


def _unit_collective_s(model: ModelGraph, cluster: Cluster, plan: Plan, replica: int, unit: int,
                       elem_bytes: float) -> float:
    group = next(g for g in plan.shard_groups() if replica in g)
    stages = [_holder(plan, r, unit) for r in group]
    if len(stages) < 2:
        return 0.0
    tp = min(s.tp for s in stages)
    nbytes = reference_unit_params(model, unit, tp, [s.layers for s in stages]) * elem_bytes
    members = [s.devices[0] for s in stages]
    pad = 1.0 if plan.shard_fractions is None else len(group) * max(plan.shard_fractions[r] for r in group)
    concurrent = max(s.tp for s in stages)
    nics = reference_nic_rings(model, cluster, plan)
    for node in {_node(cluster, d) for d in members}:
        here = sum(1 for d in members if _node(cluster, d) == node)
        concurrent = max(concurrent, nics.get(node, 0) / here)
    zone = None
    if len(cluster.zones) > 1:  # the zone links are shared by the rings crossing them, counted alike
        zone = zone_concurrency([_zone(cluster, d) for d in members], max(s.tp for s in stages),
                                reference_nic_rings(model, cluster, plan, _zone))
    return reduce_scatter_time_s(nbytes * pad, members, cluster, concurrent=concurrent, zone_concurrent=zone)


def reference_exposed_s(model: ModelGraph, cluster: Cluster, plan: Plan, replica: int, stage: int,
                        unit_fwd_s: list[float], unit_bwd_s: list[float]) -> tuple[float, float]:
    """Per micro-batch (forward, backward) seconds a stage pays for its level-2/3 collectives, from an
    explicit timeline: the units in execution order (the forward first unit up, the backward last unit
    down) on a compute stream, the collectives on one communication stream in the order they are issued:
    a unit's gather (level 3) issued when the unit before it starts (the first at time 0) and awaited
    before it computes, its reduce-scatter issued when it finishes."""
    first, last = plan.replicas[replica].stages[stage].layers
    gather = {u: reference_unit_gather_s(model, cluster, plan, replica, u) for u in range(first, last)}
    if not any(gather.values()):
        return 0.0, 0.0
    scatter = {u: reference_unit_scatter_s(model, cluster, plan, replica, u) for u in range(first, last)}

    def timeline(order: list[int], compute: dict[int, float], gathers: bool, scatters: bool) -> float:
        done: dict[tuple[str, int], float] = {}
        stream_free = 0.0

        def issue(at: float, kind: str, unit: int) -> None:
            nonlocal stream_free
            took = gather[unit] if kind == "ag" else scatter[unit]
            stream_free = max(stream_free, at) + took  # FIFO: runs after everything issued before
            done[(kind, unit)] = stream_free

        if gathers:
            issue(0.0, "ag", order[0])
        clock = 0.0
        for k, u in enumerate(order):
            begin = max(clock, done.get(("ag", u), 0.0))
            if gathers and k + 1 < len(order):
                issue(begin, "ag", order[k + 1])
            clock = begin + compute[u]
            if scatters:
                issue(clock, "rs", u)
        return max(clock, stream_free) - sum(compute[u] for u in order)

    fwd_t = {u: unit_fwd_s[u] for u in range(first, last)}
    bwd_t = {u: unit_bwd_s[u] for u in range(first, last)}
    down = list(range(last - 1, first - 1, -1))
    if plan.zero >= 3:
        return (timeline(list(range(first, last)), fwd_t, True, False), timeline(down, bwd_t, True, True))
    return 0.0, timeline(down, bwd_t, False, True)
