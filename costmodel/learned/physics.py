"""The analytic leaf terms the surrogate composes: per-unit, per-transfer and per-all-reduce seconds.

The surrogate (:mod:`hetpart.costmodel.learned.surrogate`) predicts a plan's step time by composing
leaf costs through the pipeline schedule, the gradient all-reduces and the optimizer step. Its networks
learn *corrections* to analytic leaf costs rather than re-learning the physics from raw roofline terms:

* per unit and stage configuration: forward and backward compute seconds (the device's efficiency
  curve, activation traffic and per-operator host cost, :func:`~hetpart.costmodel.compute.unit_compute_s`)
  and the tensor-parallel all-reduce seconds over the group's achieved link;
* per pipeline transfer: seconds over the achieved link, the NIC bandwidth shared among the pipeline
  transfers that cross each node at once (Megatron-style blocking sends: the sender waits);
* per gradient all-reduce: seconds of the whole run and of its last bucket (the bucket that stays
  exposed after the backward), with the NICs shared among the rings crossing each node, and whether it
  leaves a node over TCP (then it is not overlapped with the backward);
* per replica and pipeline device: the optimizer step's HBM seconds.

These are the simulator's own leaf functions (:class:`~hetpart.costmodel.simulator.Simulator`), never
its plan-level results: the surrogate composes the step itself (schedule, bubbles, overlap, the order
of the all-reduces). Devices enter only through their node and device group, so relabelling devices
inside a node keeps every term.
"""

from __future__ import annotations

import numpy as np

from hetpart.plan import Plan
from hetpart.costmodel.sharding import collective_pad, microbatches_run

__all__ = ["add_physics", "SCHEDULE_CODES"]

_VECTOR_MIN_REPLICAS = 16
"""The simulator's threshold between its two all-reduce paths (:mod:`hetpart.costmodel.simulator`): a
sharded plan's gradient sync is priced on the whole ring with the NICs' sharing from it, per shard
group below it."""

SCHEDULE_CODES = {"1f1b": 0, "gpipe": 1, "interleaved": 2}


def _simulator(ctx):
    sim = getattr(ctx, "_physics_sim", None)
    if sim is None:
        from hetpart.costmodel.simulator import Simulator

        sim = ctx._physics_sim = Simulator(ctx.model, ctx.cluster)
    return sim


def add_physics(ctx, plans: list[Plan], batch) -> None:
    """Attach the analytic leaf terms of ``plans`` (the encoded plans of ``batch``, in its order) to
    ``batch``: ``unit_exact [C, U, 4]``, ``p2p_exact [R, K-1]``, ``rep_sched [R]``, ``opt_exact [R, D]``, ``gather_exposed [R, D]``,
    ``seg_exact [G]``, ``seg_last_exact [G]``, ``seg_tcp [G]``."""
    from hetpart.costmodel.memory import optimizer_step_bytes

    sim = _simulator(ctx)
    enc = [plans[i] for i in batch.rows]
    R = len(batch.rep_plan)
    K1 = batch.p2p_base.shape[1] if batch.p2p_base.ndim == 3 else 1
    C, U = batch.unit_x.shape[:2] if batch.unit_x.ndim == 3 else (0, ctx.model.num_units)
    rows: list = [None] * C  # per configuration row: the unit costs' identity and their seconds
    stage_cfg = batch.stage_cfg.copy()
    by_ident: dict = {}  # (configuration, what the unit costs depend on) -> row
    origin: list[int] = []  # rows copied for device groups priced otherwise: the row each copies
    p2p = np.zeros((R, K1))
    sched = np.zeros(R, np.int64)
    opt_scale = np.ones(R)
    G = batch.seg_x.shape[0]
    seg_t, seg_last, seg_tcp = np.zeros(G), np.zeros(G), np.zeros(G, bool)
    # encoder segments per plan, in order (spans by first unit, then tied copies)
    seg_a = np.full(G, -1, np.int64)
    if G:
        first_holder = np.searchsorted(batch.hold_seg, np.arange(G))
        lo, hi = batch.hold_lo[first_holder], batch.hold_hi[first_holder]
        seg_a = np.where(hi < 0, -1, lo)
    segs_of: dict[int, list[int]] = {}
    for g, p in enumerate(batch.seg_plan.tolist()):
        segs_of.setdefault(p, []).append(g)
    S = len(batch.stage_cfg)
    stage_x = np.zeros((S, 2))
    rep_m = batch.rep_m.copy()
    opt = batch.opt_base * 0.0
    gather = batch.opt_base * 0.0  # [R, D] exposed parameter all-gather before the replica's wait (levels 1-2)
    opt_set = np.zeros(R, bool)
    seg_skip = np.zeros(G, bool)
    s = r = 0
    for j, plan in enumerate(enc):
        flows = sim._pipeline_flows(plan)
        code = SCHEDULE_CODES.get(plan.schedule, 0)
        sharded = bool(plan.zero) and plan.dp > 1
        shard_comm = sim._shard_comm(plan) if sharded else None
        r0, fwd_of = r, []
        for ri, rep in enumerate(plan.replicas):
            fwd_of.append([])
            if sharded:
                rep_m[r] = microbatches_run(plan, ri)
            for k, st in enumerate(rep.stages):
                c = int(stage_cfg[s])
                g = sim._group(st.devices)
                ident = (g.gpu if g.alike else (g.gpus, g.speeds), g.tp_link if st.tp > 1 else None,
                         plan.precision, plan.attention, st.tp_split)
                hit = by_ident.get((c, ident))
                if hit is None:
                    if rows[c] is None:
                        hit = c
                    else:  # a device group the encoder's configuration (slowest pool, nominal link) pools
                        # with others although its units cost otherwise (cards mixed in a node, ring topology)
                        hit = len(rows)
                        rows.append(None)
                        origin.append(c)
                    pre = sim._unit_prefix(st.devices, st.tp, plan.micro_batch, plan.precision, plan.recompute,
                                           st.tp_split, plan.attention)
                    rows[hit] = np.stack([np.diff(pre.fwd), np.diff(pre.bwd), np.diff(pre.tp_fwd),
                                          np.diff(pre.tp_bwd)], -1)
                    by_ident[(c, ident)] = hit
                stage_cfg[s] = hit
                if k + 1 < len(rep.stages):
                    p2p[r, k] = sim._p2p_s(st, rep.stages[k + 1], plan.micro_batch, flows)
                if sharded:
                    pre = sim._unit_prefix(st.devices, st.tp, plan.micro_batch, plan.precision, plan.recompute,
                                           st.tp_split, plan.attention)
                    if plan.zero >= 2:  # sharded collectives inside each micro-batch, what compute does not hide
                        stage_x[s] = sim._shard_exposed_s(plan, shard_comm.get((ri, k)), pre)
                    a, z = st.layers
                    fwd_of[-1].append(pre.fwd[z] - pre.fwd[a] + pre.tp_fwd[z] - pre.tp_fwd[a] + stage_x[s, 0]
                                      + (p2p[r, k] if k + 1 < len(rep.stages) else 0.0))
                s += 1
            sched[r] = code
            opt_scale[r] = optimizer_step_bytes(plan.optimizer, plan.precision)
            r += 1
        if sharded:
            _sharded_states(sim, plan, batch, j, r0, fwd_of, rep_m, shard_comm, opt, gather)
            opt_set[r0:r] = True
        mine = segs_of.get(j)
        if mine:
            _rings(sim, plan, mine, seg_a, seg_t, seg_last, seg_tcp, seg_skip)
    unit = np.zeros((len(rows), U, 4))
    for j, row in enumerate(rows):
        if row is not None:
            unit[j] = row
    if origin:  # the copies keep their original row's inputs
        batch.unit_x = np.concatenate([batch.unit_x, batch.unit_x[origin]], 0)
        batch.unit_base = np.concatenate([batch.unit_base, batch.unit_base[origin]], 0)
        if batch.configs is not None:
            batch.configs = list(batch.configs) + [batch.configs[j] for j in origin]
        batch.stage_cfg = stage_cfg
        if len(batch.hold_rep):
            batch.hold_cfg = stage_cfg[batch.rep_stages[batch.hold_rep, batch.hold_k]]
    batch.unit_exact = unit
    batch.p2p_exact = p2p
    batch.rep_sched = sched
    batch.opt_exact = np.where(opt_set[:, None], opt, batch.opt_base * opt_scale[:, None])
    batch.gather_exposed = gather
    batch.seg_exact, batch.seg_last_exact, batch.seg_tcp = seg_t, seg_last, seg_tcp
    batch.seg_skip = seg_skip
    batch.seg_after = (seg_a < 0) & sim._tied_pairs  # Megatron's tied pairs follow the data-parallel sync
    batch.stage_x = stage_x
    batch.rep_m = rep_m


class _Pipe:
    """What :meth:`Simulator._memory_and_optimizer` and ``_add_param_gather`` read of a pipeline."""

    def __init__(self, pp: int, m: int, fwd: list[float]) -> None:
        self.pp, self.m, self.fwd = pp, m, fwd


def _sharded_states(sim, plan: Plan, batch, j: int, r0: int, fwd_of: list, rep_m, shard_comm, opt,
                    gather) -> None:
    """A sharded plan's optimizer step per pipeline device (its shard; ``gather``: at levels 1-2 the parameter
    all-gather less the next forward that hides it) and its memory (sharded states): the simulator's
    accounting, written over the encoder's unsharded one."""
    pipes = [_Pipe(plan.pipeline_devices(ri), int(rep_m[r0 + ri]), fwd_of[ri]) for ri in range(plan.dp)]
    memory, optim = sim._memory_and_optimizer(plan, pipes)
    if shard_comm and plan.zero <= 2:  # the surrogate hides it behind each replica's wait for the sync, as the simulator
        for (ri, d), exposed in sim._param_gather_exposed(plan, pipes, shard_comm).items():
            gather[r0 + ri, d] = exposed
    by_name: dict[str, float] = {}
    fits, headroom = True, float("inf")
    for (ri, d), gb in memory.items():
        opt[r0 + ri, d] = optim[(ri, d)]
        g = sim._group(plan.replicas[ri].stages[d].devices)
        for gpu in g.gpus:
            by_name[gpu.name] = max(by_name.get(gpu.name, 0.0), gb)
        fits &= gb <= g.capacity_gb
        headroom = min(headroom, g.capacity_gb - gb)
    batch.memory_gb[j] = by_name
    batch.fits[j] = fits
    if batch.headroom_gb is not None:
        batch.headroom_gb[j] = headroom


def _rings(sim, plan: Plan, mine: list[int], seg_a, seg_t, seg_last, seg_tcp, seg_skip) -> None:
    """The simulator's all-reduce leaf costs of ``plan``'s gradient runs, matched to the encoder's
    segments ``mine`` (spans by first unit, tied copies in order)."""
    table = sim._stage_table(plan)
    segments = sim._dp_segments(plan, table)
    flats = [table.offsets[seg.holders[:, 0]] + seg.holders[:, 1] for seg in segments]
    # the NICs' sharing and, where the cluster has zones, the zone links' (the simulator's _ring_flows)
    flows = sim._ring_flows(list(zip(table.node[f].tolist(), table.group[f].tolist(), table.tp[f].tolist()))
                            for f in flats)
    spans = {seg.a: (seg, f) for seg, f in zip(segments, flats) if seg.a >= 0}
    tied = [(seg, f) for seg, f in zip(segments, flats) if seg.a < 0]
    t_i = 0
    for g in mine:
        a = int(seg_a[g])
        if a >= 0:
            hit = spans.get(a)
        else:
            hit = tied[t_i] if t_i < len(tied) else None
            t_i += 1
        if hit is None:
            continue
        seg, flat = hit
        ring = sim._ring(plan, seg.holders, table, flows)
        seg_tcp[g] = a >= 0 and sim._crosses_tcp([table.first_device[i] for i in flat.tolist()])
        if plan.zero and a >= 0:
            if plan.zero >= 2 and not plan.shard_group:
                seg_skip[g] = True  # reduce-scattered every micro-batch, inside the backward
                continue
            if plan.dp >= _VECTOR_MIN_REPLICAS and not plan.shard_group:  # a reduce-scatter: NCCL's rings
                pad = collective_pad(plan, range(plan.dp))  # padded bytes; the ring's latency once
                seg_t[g] = sim._reduce_scatter_s(seg.nbytes * pad, ring)
                seg_last[g] = sim._reduce_scatter_s(seg.last_bytes * pad, ring)
                continue
            # a reduce-scatter inside each shard group (padded for uneven shards), plus, under hybrid
            # sharding, the all-reduce of each shard across the groups
            pairs = tuple((int(x), int(y)) for x, y in seg.holders.tolist())
            seg_t[g] = sim._sharded_sync_s(plan, pairs, seg.nbytes, flows)
            seg_last[g] = sim._sharded_sync_s(plan, pairs, seg.last_bytes, flows)
            continue
        seg_t[g] = sim._bucketed_s(seg.nbytes, seg.last_bytes, ring)  # one NCCL call per bucket
        seg_last[g] = sim._allreduce_s(seg.last_bytes, ring)
