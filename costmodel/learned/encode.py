"""Plans as arrays for the learned cost model: one :class:`PlanBatch` holds many plans of one scenario.

The surrogate (:mod:`hetpart.costmodel.learned.surrogate`) reads a plan as a graph whose node and
edge inputs are raw physical quantities and analytic leaf costs (per unit, transfer and all-reduce:
:mod:`hetpart.costmodel.learned.physics`), never the simulator's plan-level results:

* **unit x configuration** rows: every unit of the model under every (device pool, tensor-parallel
  degree, micro-batch, recompute mode) that some stage of the batch uses, with the shared unit and
  pool features (:mod:`hetpart.costmodel.features`) and the roofline terms of the unit (FLOPs over
  the pool's peak, activation bytes over its HBM bandwidth, tensor-parallel bytes over its link);
* **stages** (unit -> stage: the units ``[first, last)`` of a configuration), their order in the
  replica (stage -> stage edges carry the activation bytes and the link between the two nodes) and
  their optimizer state over HBM bandwidth;
* **gradient segments**: runs of units held by the same set of stages across replicas (the
  data-parallel rings), with the ring's bytes, members, nodes and links.

Devices appear only through their pool and node: relabelling devices inside a node, or nodes inside a
pool, gives the same arrays. Memory per device stays analytic (:class:`~hetpart.costmodel.memory.PrefixTables`).
"""

from __future__ import annotations

import math
from itertools import chain
from dataclasses import dataclass, field

import numpy as np

from hetpart.cluster import Cluster
from hetpart.graph.model_graph import ModelGraph
from hetpart.plan import Plan
from hetpart.workload import DTYPE_BYTES

from hetpart.costmodel.features import cluster_pools, log_scale, pool_features, unit_features
from hetpart.costmodel.activations import effective_attention
from hetpart.costmodel.memory import PrefixTables, memory_capacity_gb, state_bytes_per_param
from hetpart.costmodel.learned.physics import add_physics

__all__ = ["ScenarioContext", "PlanBatch", "encode_plans", "RECOMPUTE", "CONFIG_FEATURES", "P2P_FEATURES",
           "DP_FEATURES", "PLAN_FEATURES"]

RECOMPUTE = ("none", "selective", "full")
CONFIG_FEATURES = ("log_tp", "log_micro_batch", "recompute_none", "recompute_selective", "recompute_full",
                   "log_gemm_width", "log_tokens", "log_min_width_tokens", "log_flop_over_mem", "log_tp_link_gbyte_s",
                   "log_tp_link_latency_us")
P2P_FEATURES = ("log_bytes", "log_gbyte_s", "log_latency_us", "intra_node", "nic", "inter_zone", "log_tp",
                "log_bytes_over_gbyte_s")
DP_FEATURES = ("log_bytes", "log_members", "log_nodes", "log_per_node", "even_nodes", "log_hop_gbyte_s",
               "log_share_gbyte_s", "log_intra_gbyte_s", "log_latency_us", "cross_zone", "log_concurrent",
               "log_flat_s", "log_hier_over_flat")
PLAN_FEATURES = ("log_microbatches", "log_pp", "microbatches_over_pp", "log_dp", "gpipe", "interleaved",
                 "log_devices", "mixed_replicas")


@dataclass
class ScenarioContext:
    """What does not change between plans of one (model, cluster, precision): features and caches."""

    model: ModelGraph
    cluster: Cluster
    precision: str = "bf16"
    pools: object = field(init=False)
    unit_x: np.ndarray = field(init=False)
    pool_x: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        m = self.model
        self.pools = cluster_pools(self.cluster)
        self.unit_x = unit_features(m)
        self.pool_x = pool_features(self.cluster, self.precision, self.pools)
        self.tables = PrefixTables(m)
        units = m.units
        self.fwd = np.array([u.fwd_flops for u in units])
        self.bwd = {r: np.array([u.bwd_flops + u.recompute_flops[r] for u in units]) for r in RECOMPUTE}
        self.act = np.array([u.act_bytes["none"] for u in units])
        self.tp_bytes = np.array([u.tp_comm_bytes_fwd for u in units])
        self.shardable = np.array([u.tp_shardable for u in units])
        self.inner = np.array([u.kind in ("block", "module") for u in units])
        self.width = np.array([u.width if u.width > 0 else math.sqrt(max(u.fwd_flops / m.seq_len, 2) / 2)
                               for u in units], dtype=float)
        self.out_bytes = [u.out_act_bytes for u in units]
        self.grad_bytes = DTYPE_BYTES[self.precision]
        groups = self.cluster.groups
        self.dev = {}
        for p, pool in enumerate(self.pools.pools):
            for n, node in enumerate(pool.nodes):
                for d in node:
                    self.dev[d] = (p, (p, n), int(d.split("/", 1)[0]))
        self.gpus = [pool.gpu for pool in self.pools.pools]
        self.peak = [g.tflops(self.precision) for g in self.gpus]
        self.capacity = [memory_capacity_gb(g) for g in self.gpus]
        self.node_gbyte_s = [g.node_bandwidth_gbyte_s for g in groups]
        self._p2p: dict = {}
        self._ring: dict = {}
        self._cache: dict = {}

    def slowest(self, devices) -> tuple[int, set]:
        """(pool of the slowest device, set of nodes) of a device group."""
        hit = self._cache.get(devices)
        if hit is None:
            pools = {self.dev[d][0] for d in devices}
            hit = self._cache[devices] = (min(pools, key=lambda p: self.peak[p]), {self.dev[d][1] for d in devices},
                                          tuple(sorted(pools)))
        return hit[0], hit[1]

    def pools_of(self, devices) -> tuple[int, ...]:
        """The pools a device group's devices sit in."""
        self.slowest(devices)
        return self._cache[devices][2]


@dataclass
class PlanBatch:
    """Arrays of many plans of one scenario (see the module docstring). ``*_x`` are model inputs,
    ``*_base`` roofline terms in seconds, the rest integer structure."""

    num_plans: int
    unit_x: np.ndarray          # [C, U, Fu + Fp + Fc]
    unit_base: np.ndarray       # [C, U, 5]: flop_f, flop_b, mem, tp_bytes, tp_latency (seconds)
    stage_cfg: np.ndarray       # [S]
    stage_a: np.ndarray         # [S]
    stage_z: np.ndarray         # [S]
    rep_stages: np.ndarray      # [R, K] stage ids, -1 padded (virtual stages in pipeline order)
    rep_plan: np.ndarray        # [R]
    rep_m: np.ndarray           # [R] micro-batches
    rep_v: np.ndarray           # [R] interleave
    rep_gpipe: np.ndarray       # [R] bool
    p2p_x: np.ndarray           # [R, K-1, Fp2p] (zero padded)
    p2p_base: np.ndarray        # [R, K-1, 2] bytes/bandwidth, latency (seconds)
    opt_base: np.ndarray        # [R, D] params per device / HBM bandwidth (seconds per byte moved), 0 padded
    seg_x: np.ndarray           # [G, Fdp]
    seg_base: np.ndarray        # [G, 3] flat-ring bandwidth term, latency term, share of the last unit
    seg_plan: np.ndarray        # [G]
    hold_seg: np.ndarray        # [H] segment of each holder
    hold_rep: np.ndarray        # [H]
    hold_k: np.ndarray          # [H] virtual stage index in the replica
    hold_first: np.ndarray      # [H] unit index of the holding stage's first unit (prefix index)
    hold_hi: np.ndarray         # [H] prefix index: gradient of unit z-1 ready (first bucket); -1: whole stage
    hold_lo: np.ndarray         # [H] prefix index: gradient of unit a ready (last bucket)
    hold_cfg: np.ndarray        # [H]
    hold_group: np.ndarray      # [H] device group (replica, pipeline device): its all-reduces run one after another
    seg_groups: np.ndarray      # [G, Hmax] device groups of each segment, padded with num_groups
    num_groups: int
    plan_x: np.ndarray          # [N, Fplan]
    plan_tokens: np.ndarray     # [N] tokens per step
    memory_gb: list = field(default_factory=list)       # per plan: {gpu name: peak GB}
    fits: list = field(default_factory=list)            # per plan: bool
    errors: dict = field(default_factory=dict)          # plan index -> message (plans left out)
    rows: list = field(default_factory=list)            # input plan index of each encoded plan
    unit_label: np.ndarray | None = None  # [C, U, 2] teacher forward/backward seconds per unit (training only)
    seg_label: np.ndarray | None = None   # [G] teacher all-reduce seconds per segment (training only)
    headroom_gb: np.ndarray | None = None  # [N] memory headroom of the tightest device type (GB)
    p2p_uid: np.ndarray | None = None      # [R, K-1] row of p2p_first describing each transfer (-1: padding)
    p2p_first: np.ndarray | None = None    # [P] flat index into p2p_x[R, K-1] of each distinct transfer
    configs: list | None = None            # the configuration of each row of unit_x
    seg_members: list | None = None        # per segment (members, concurrent, bytes) (teacher labels only)
    raw: dict | None = None                # structure for closed.py (vectorised encoder only)
    # analytic leaf terms (hetpart.costmodel.learned.physics): what the surrogate's networks correct
    unit_exact: np.ndarray | None = None     # [C, U, 4] forward, backward compute; TP forward, backward (s)
    p2p_exact: np.ndarray | None = None      # [R, K-1] seconds of each pipeline transfer (NICs shared)
    rep_sched: np.ndarray | None = None      # [R] 0 1f1b, 1 gpipe, 2 interleaved
    opt_exact: np.ndarray | None = None      # [R, D] optimizer step seconds per pipeline device
    gather_exposed: np.ndarray | None = None  # [R, D] levels 1-2: parameter all-gather less the forward hiding it
    seg_exact: np.ndarray | None = None      # [G] all-reduce seconds of each gradient segment
    seg_last_exact: np.ndarray | None = None  # [G] seconds of its last bucket
    seg_tcp: np.ndarray | None = None        # [G] leaves a node over TCP: not overlapped with the backward


def _ls(x: float, centre: float, spread: float) -> float:
    """:func:`~hetpart.costmodel.features.log_scale` of one number (no numpy: the encoder's hot path)."""
    return (math.log10(max(x, 10.0 ** (centre - 2.0 * spread))) - centre) / spread


def _tp_link(ctx: ScenarioContext, devices, nodes) -> tuple[float, float]:
    if len(devices) == 1:
        return (1.0, 0.0)
    if len(nodes) == 1:
        g = ctx.cluster.groups[ctx.dev[devices[0]][2]].intra_node
        return (g.bandwidth_gbyte_s, g.latency_us)
    bw, lat = math.inf, 0.0
    for i in range(len(devices)):
        link = ctx.cluster.link_between(devices[i], devices[(i + 1) % len(devices)])
        if link is not None and link.kind != "self":
            bw, lat = min(bw, link.bandwidth_gbyte_s), max(lat, link.latency_us)
    return (bw, lat)



# ---------------------------------------------------------------------------------------------------
# The encoder, vectorised over the plans of a batch. One Python pass reads each stage's unit range,
# tensor-parallel degree and device group (a device group is looked up once per scenario context);
# everything else is numpy over all stages, replicas and gradient segments of the batch. It gives the
# same arrays as the first, plan-at-a-time encoder (encode_reference.encode_plans_reference; compared
# in tests/test_learned_encode.py).

_SCHEDULES = {"1f1b": 0, "gpipe": 1, "interleaved": 2}
_LINK_KINDS = ("self", "intra_node", "nic", "inter_zone")


def _lsv(x, centre: float, spread: float) -> np.ndarray:
    """:func:`_ls` of an array."""
    return (np.log10(np.maximum(x, 10.0 ** (centre - 2.0 * spread))) - centre) / spread


class _Skip(Exception):
    """Plans that cannot be encoded (index in the batch -> message): encode the rest again."""

    def __init__(self, bad: dict[int, str]) -> None:
        super().__init__(bad)
        self.bad = bad


def _context_tables(ctx: ScenarioContext) -> None:
    """Integer device tables and caches of the vectorised encoder (once per context)."""
    if hasattr(ctx, "_vec"):
        return
    if len(ctx.cluster.groups) > 62 or len(ctx.gpus) > 62:
        ctx._vec = None
        return
    ids = list(ctx.dev)
    nodes: dict = {}
    ctx._vec = {
        "dev_index": {d: j for j, d in enumerate(ids)}, "dev_ids": ids,
        "dev_node": np.array([nodes.setdefault(ctx.dev[d][1], len(nodes)) for d in ids], np.int64),
        "dev_group": np.array([ctx.dev[d][2] for d in ids], np.int64),
        "node_gbyte_s": np.asarray(ctx.node_gbyte_s, float), "out_bytes": np.asarray(ctx.out_bytes, float),
        "capacity": np.asarray(ctx.capacity, float), "peak": np.asarray(ctx.peak, float),
        "hbm": np.asarray([g.hbm_gbyte_s for g in ctx.gpus], float),
        "name_of_pool": np.unique([g.name for g in ctx.gpus], return_inverse=True)[1].reshape(-1),
        "names": list(np.unique([g.name for g in ctx.gpus])),
        "info": {}, "info_rows": [], "info_arr": None, "link_ids": {(1.0, 0.0): 0}, "devsets": {},
        "links": {}, "rings": {}, "configs": {},
    }
    ctx._vec["num_nodes"] = max(len(nodes), 1)


def _device_group(ctx: ScenarioContext, devices: tuple) -> int:
    """Row of a stage's device group in the context's table (computed once per group)."""
    V = ctx._vec
    pool, nodes = ctx.slowest(devices)
    pools = ctx.pools_of(devices)
    bw, lat = _tp_link(ctx, devices, nodes)
    link = V["link_ids"].setdefault((bw, lat), len(V["link_ids"]))
    devset = V["devsets"].setdefault(tuple(sorted(devices)), len(V["devsets"]))
    row = (pool, V["dev_index"][devices[0]], bw, lat, link, sum(1 << p for p in pools),
           min(ctx.capacity[p] for p in pools), min(ctx.gpus[p].hbm_gbyte_s for p in pools), len(devices), devset)
    V["info_rows"].append(row)
    V["info_arr"] = None
    j = V["info"][devices] = len(V["info_rows"]) - 1
    return j


def _info_arrays(ctx: ScenarioContext) -> dict:
    V = ctx._vec
    if V["info_arr"] is None:
        cols = list(zip(*V["info_rows"])) if V["info_rows"] else [()] * 10
        names = ("pool", "first", "bw", "lat", "link", "mask", "cap", "hbm", "ndev", "devset")
        kinds = (np.int64, np.int64, float, float, np.int64, np.int64, float, float, np.int64, np.int64)
        V["info_arr"] = {n: np.asarray(c, k) for n, c, k in zip(names, cols, kinds)}
    return V["info_arr"]


def _config_table(ctx: ScenarioContext, configs: list[tuple]) -> tuple[np.ndarray, np.ndarray]:
    """Unit x configuration rows (``unit_x``, ``unit_base``) of ``configs``, cached per context;
    the new ones computed together (arrays ``[C, U]``)."""
    cache = ctx._vec["configs"]
    new = [c for c in configs if c not in cache]
    if new:
        m = ctx.model
        n = m.num_units
        pool = np.array([c[0] for c in new], np.int64)
        tp = np.array([c[1] for c in new], np.int64)
        mb = np.array([c[2] for c in new], np.int64)
        tp_bw = np.array([c[4][0] for c in new], float)
        tp_lat = np.array([c[4][1] for c in new], float)
        shard = np.where(ctx.shardable[None, :], tp[:, None], 1)
        width = np.where(ctx.inner[None, :], ctx.width[None, :] / shard, ctx.width[None, :])
        tokens = mb * m.seq_len
        peak = ctx._vec["peak"][pool] * 1e12
        flop_f = ctx.fwd[None, :] * mb[:, None] / shard / peak[:, None]
        bwd = np.stack([ctx.bwd[c[3]] for c in new])
        flop_b = bwd * mb[:, None] / shard / peak[:, None]
        mem = ctx.act[None, :] * mb[:, None] / shard / (ctx._vec["hbm"][pool] * 1e9)[:, None]
        has_tp = ctx.shardable[None, :] & (ctx.tp_bytes[None, :] > 0) & (tp[:, None] > 1)
        ratio = np.array([2 * (t - 1) / t for t in tp.tolist()])
        tp_s = np.where(has_tp, ratio[:, None] * ctx.tp_bytes[None, :] * mb[:, None] / (tp_bw * 1e9)[:, None], 0.0)
        tp_l = np.where(has_tp, (2 * (tp - 1) * tp_lat * 1e-6)[:, None], 0.0)
        scal = np.array([[math.log2(t) / 3, math.log2(b) / 3, rc == "none", rc == "selective", rc == "full"]
                         for _, t, b, rc, _ in new], float)
        per = np.array([[float(log_scale(tk, 3.5, 1.0)), float(log_scale(bw, 2.0, 1.0)), float(log_scale(lt, 0.5, 1.0))]
                        for tk, bw, lt in zip(tokens.tolist(), tp_bw.tolist(), tp_lat.tolist())])
        C = len(new)
        cols = np.concatenate([
            np.broadcast_to(scal[:, None, :], (C, n, 5)), log_scale(width, 3.0, 1.0)[..., None],
            np.broadcast_to(per[:, None, 0:1], (C, n, 1)),
            log_scale(np.minimum(width, tokens[:, None]), 3.0, 1.0)[..., None],
            (np.log10(np.maximum(flop_f, 1e-15) / np.maximum(mem, 1e-15)) / 3.0)[..., None],
            np.broadcast_to(per[:, None, 1:3], (C, n, 2))], axis=2)
        x = np.concatenate([np.broadcast_to(ctx.unit_x[None].astype(float), (C, n, ctx.unit_x.shape[1])),
                            ctx.pool_x[pool][:, None, :].astype(float).repeat(n, 1), cols], axis=2).astype(np.float32)
        base = np.stack([flop_f, flop_b, mem, tp_s, tp_l], -1)
        for j, c in enumerate(new):
            cache[c] = (x[j], base[j])
    if not configs:
        return np.zeros((0, 0, 0), np.float32), np.zeros((0, 0, 5))
    return np.stack([cache[c][0] for c in configs]), np.stack([cache[c][1] for c in configs])


def encode_plans(ctx: ScenarioContext, plans: list[Plan], *, members: bool = False, physics: bool = True,
                 lean: bool = False) -> PlanBatch:
    """Encode ``plans`` (all of ``ctx``'s model and cluster) into one :class:`PlanBatch`.

    A plan that cannot be encoded (a device the cluster lacks, zones without a link, a replica
    without a micro-batch) is left out and named in ``errors``; the caller reports it. With
    ``members`` the batch also keeps ``configs`` and ``seg_members`` (the teacher's inputs). With
    ``physics`` (the default) it carries the analytic leaf terms the surrogate composes
    (:func:`~hetpart.costmodel.learned.physics.add_physics`). With ``lean`` it leaves out the link
    features (``p2p_x``, ``p2p_base`` empty), which :mod:`~hetpart.costmodel.learned.closed` does not read.
    """
    _context_tables(ctx)
    if ctx._vec is None:  # more node groups or pools than a bit mask holds: the plan-at-a-time encoder
        from hetpart.costmodel.learned.encode_reference import encode_plans_reference

        batch = encode_plans_reference(ctx, plans)
        if physics:
            add_physics(ctx, plans, batch)
        return batch
    keep = list(range(len(plans)))
    errors: dict[int, str] = {}
    while True:
        try:
            batch = _encode([plans[i] for i in keep], ctx, members, lean)
            break
        except _Skip as skip:
            for j, msg in skip.bad.items():
                errors[keep[j]] = f"cannot encode plan: {msg}"
            keep = [i for j, i in enumerate(keep) if j not in skip.bad]
    batch.errors = dict(sorted(errors.items()))
    batch.rows = keep
    if physics:
        add_physics(ctx, plans, batch)
    return batch


def _read(ctx: ScenarioContext, plans: list[Plan]) -> tuple:
    """The Python pass: per stage (first, last, tp, device group), per replica (stages, batch share),
    per plan (replicas, micro-batch, recompute, schedule, interleave, global batch)."""
    V = ctx._vec
    info = V["info"]
    flat, nst, share, nrep, pl = [], [], [], [], []
    bad: dict[int, str] = {}
    for i, plan in enumerate(plans):
        try:
            sched = _SCHEDULES.get(plan.schedule)
            if sched is None:
                raise ValueError(f"unknown schedule {plan.schedule!r}")
            rc = RECOMPUTE.index(plan.recompute)
            reps = plan.replicas
            v = plan.interleave if sched == 2 else 1
            row = (plan.micro_batch, rc, sched, v, plan.global_batch, plan.global_batch * plan.seq_len,
                   state_bytes_per_param(plan.optimizer, plan.precision),
                   int(effective_attention(plan.attention, ctx.model.dtype_bytes, ctx.tables.kernels) == "fused"))
        except (ValueError, AttributeError, TypeError) as exc:
            bad[i] = str(exc)
            continue
        for rep in reps:
            st = rep.stages
            nst.append(len(st))
            flat.extend(st)
        share.extend([rep.batch_share for rep in reps])
        nrep.append(len(reps))
        pl.append(row)
    if bad:
        raise _Skip(bad)
    devs = [s.devices for s in flat]
    infos = [info.get(d, -1) for d in devs]
    if -1 in infos:
        stage_plan = np.repeat(np.repeat(np.arange(len(plans)), nrep), nst)
        for j, d in enumerate(devs):
            if infos[j] < 0:
                try:
                    infos[j] = info[d] if d in info else _device_group(ctx, d)
                except (ValueError, KeyError, IndexError, ZeroDivisionError, TypeError) as exc:
                    bad.setdefault(int(stage_plan[j]), str(exc))
        if bad:
            raise _Skip(bad)
    lay = np.fromiter(chain.from_iterable([s.layers for s in flat]), np.int64, 2 * len(flat))
    tps = np.fromiter([s.tp for s in flat], np.int64, len(flat))
    return lay, tps, np.asarray(infos, np.int64), nst, share, nrep, pl, flat


def _encode(plans: list[Plan], ctx: ScenarioContext, members: bool, lean: bool = False) -> PlanBatch:
    V = ctx._vec
    lay, tps, infos, nst, share, nrep, pl, flat = _read(ctx, plans)
    tab = _info_arrays(ctx)
    N = len(plans)
    n_units = ctx.model.num_units
    # ---- plans, replicas, stages
    pl = np.asarray(pl, np.int64).reshape(-1, 8)
    p_mb, p_rc, p_sched, p_v, p_gb, p_tokens, p_state, p_fused = pl.T
    p_dp = np.asarray(nrep, np.int64)
    p_rep0 = np.cumsum(p_dp) - p_dp
    R = int(p_dp.sum())
    r_plan = np.repeat(np.arange(N), p_dp)
    r_nst = np.asarray(nst, np.int64)
    r_off = np.cumsum(r_nst) - r_nst
    r_m = np.rint(np.asarray(share, float) * p_gb[r_plan]).astype(np.int64) // p_mb[r_plan]
    r_v = p_v[r_plan]
    r_pp = r_nst // r_v
    S = len(tps)
    st_rep = np.repeat(np.arange(R), r_nst)
    st_k = np.arange(S) - r_off[st_rep]
    lay = np.asarray(lay, np.int64).reshape(-1, 2)
    st_a, st_z = lay[:, 0], lay[:, 1]
    st_tp = np.asarray(tps, np.int64)
    st_info = np.asarray(infos, np.int64)
    st_plan = r_plan[st_rep]
    bad = {}
    for r in np.nonzero((r_m < 1) | (r_pp < 1))[0].tolist():
        p = int(r_plan[r])
        bad.setdefault(p, f"replica {r - int(p_rep0[p])} has no micro-batch" if r_m[r] < 1
                       else f"replica {r - int(p_rep0[p])} has fewer stages than the interleave")
    if bad:
        raise _Skip(bad)
    # ---- stage configurations (device pool, tp, micro-batch, recompute, tp link): first-seen order
    multi = st_tp > 1
    st_pool = tab["pool"][st_info]
    st_link = np.where(multi, tab["link"][st_info], 0)
    st_mb, st_rc = p_mb[st_plan], p_rc[st_plan]
    code = st_pool
    for col in (st_tp, st_mb, st_rc, st_link):
        code = code * (int(col.max(initial=0)) + 1) + col
    uniq, first, inv = np.unique(code, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty(len(uniq), np.int64)
    rank[order] = np.arange(len(uniq))
    st_cfg = rank[inv.reshape(-1)]
    reps = first[order]
    configs = [(int(st_pool[s]), int(st_tp[s]), int(st_mb[s]), RECOMPUTE[int(st_rc[s])],
                (float(tab["bw"][st_info[s]]), float(tab["lat"][st_info[s]])) if multi[s] else (1.0, 0.0))
               for s in reps.tolist()]
    unit_x, unit_base = _config_table(ctx, configs)
    # ---- replicas: stage ids, activation transfers
    K = int(r_nst.max(initial=1))
    kk = np.arange(K)
    rep_stages = np.where(kk[None, :] < r_nst[:, None], r_off[:, None] + kk[None, :], -1)
    src = np.nonzero(st_k < r_nst[st_rep] - 1)[0]
    dst = src + 1
    tp = np.maximum(st_tp[src], st_tp[dst])
    da, db = tab["first"][st_info[src]], tab["first"][st_info[dst]]
    na, nb = V["dev_node"][da], V["dev_node"][db]
    lkey = (na * V["num_nodes"] + nb) * 2 + (da == db)
    lu, linv = np.unique(lkey, return_inverse=True)
    lkind, lbw, llat = np.zeros(len(lu), np.int64), np.zeros(len(lu)), np.zeros(len(lu))
    first_pair = np.zeros(len(lu), np.int64)
    first_pair[linv[::-1]] = np.arange(len(linv))[::-1]
    missing = []
    for u, key in enumerate(lu.tolist()):
        hit = V["links"].get(key)
        if hit is None:
            j = int(first_pair[u])
            a_id, b_id = V["dev_ids"][da[j]], V["dev_ids"][db[j]]
            link = ctx.cluster.link_between(a_id, b_id)
            hit = V["links"][key] = (("missing", a_id, b_id) if link is None else
                                     (_LINK_KINDS.index(link.kind), link.bandwidth_gbyte_s, link.latency_us))
        if hit[0] == "missing":
            missing.append(u)
            continue
        lkind[u], lbw[u], llat[u] = hit
    if missing:
        for j in np.nonzero(np.isin(linv, missing))[0].tolist():  # the first such transfer of each plan
            bad.setdefault(int(st_plan[src[j]]), f"devices {V['dev_ids'][da[j]]} and {V['dev_ids'][db[j]]} "
                                                 "sit in zones without a link")
        raise _Skip(bad)
    kind = lkind[linv]
    bw = lbw[linv]
    lat = llat[linv]
    ng = V["node_gbyte_s"]
    slow = (kind == 2) | (kind == 3)
    bw = np.where(slow, np.minimum(bw, np.minimum(ng[V["dev_group"][da]] / tp, ng[V["dev_group"][db]] / tp)), bw)
    nbytes = V["out_bytes"][st_z[src] - 1] * st_mb[src] / tp
    live = kind != 0
    pr, pk = st_rep[src], st_k[src]
    K1 = max(K - 1, 1)
    if lean:  # closed.py prices the transfers itself and reads no link features
        p2p_x = np.zeros((0, K1, len(P2P_FEATURES)), np.float32)
        p2p_base = np.zeros((0, K1, 2))
        p2p_uid = p2p_first = None
    else:
        base = np.where(live, nbytes / (bw * 1e9), 0.0)
        px = np.stack([_lsv(nbytes, 6.0, 2.0), _lsv(bw, 1.5, 1.0), _lsv(lat, 0.5, 1.0), kind == 1, kind == 2, kind == 3,
                       np.log2(tp) / 3, _lsv(base, -3.0, 2.0)], 1)
        px = np.where(live[:, None], px, 0.0)
        p2p_x = np.zeros((R, K1, len(P2P_FEATURES)), np.float32)
        p2p_base = np.zeros((R, K1, 2))
        p2p_x[pr, pk] = px
        p2p_base[pr, pk, 0] = base
        p2p_base[pr, pk, 1] = np.where(live, lat * 1e-6, 0.0)
        # identical transfers share one row of the link network (the surrogate evaluates each once)
        ukey = np.where(live, (lkey * (int(tp.max(initial=0)) + 1) + tp) * (n_units + 1) + st_z[src], -1)
        ukey = ukey * (int(st_mb.max(initial=0)) + 1) + st_mb[src]
        uu, uinv = np.unique(ukey, return_inverse=True)
        ufirst = np.zeros(len(uu), np.int64)
        ufirst[uinv[::-1]] = np.arange(len(uinv))[::-1]
        p2p_uid = np.full((R, K1), -1, np.int64)
        p2p_uid[pr, pk] = uinv.reshape(-1)
        p2p_first = (pr * K1 + pk)[ufirst]
    # ---- memory per pipeline device (its virtual stages d, d + pp, ...) and the optimizer term
    D = int(r_pp.max(initial=0))
    mrep = np.repeat(np.arange(R), r_pp)
    md = np.arange(len(mrep)) - np.repeat(np.cumsum(r_pp) - r_pp, r_pp)
    mpp, mm, mv = r_pp[mrep], r_m[mrep], r_v[mrep]
    msched = p_sched[r_plan[mrep]]
    flight = np.where(msched == 1, mm.astype(float),
                      np.where(msched == 0, np.minimum(mpp - md, mm).astype(float),
                               np.minimum(mm * mv, 2 * (mpp - md - 1) + (mv - 1) * mpp + 1) / mv))
    gb = np.zeros(len(mrep))
    work = np.zeros(len(mrep))  # the working set, once per device: the largest of its chunks'
    params = np.zeros(len(mrep))
    mplan = r_plan[mrep]
    chunk_flight = _interleaved_flights(ctx, flight, msched, mrep, md, mpp, mm, mv, r_off, st_a, st_z, st_tp,
                                        p_rc[mplan], p_fused[mplan])
    for j in range(int((r_nst // np.maximum(r_pp, 1)).max(initial=0)) + 1):
        k = md + j * mpp
        sel = k < r_nst[mrep]
        if not sel.any():
            break
        s = r_off[mrep[sel]] + k[sel]
        fused = p_fused[mplan[sel]].astype(bool)
        gb[sel] = gb[sel] + ctx.tables.memory_gb_many(st_a[s], st_z[s], st_tp[s], p_mb[mplan[sel]],
                                                      chunk_flight[sel, min(j, chunk_flight.shape[1] - 1)],
                                                      p_rc[mplan[sel]], state_bytes=p_state[mplan[sel]],
                                                      fused=fused, working_set=False, fp8=ctx.precision == "fp8")
        work[sel] = np.maximum(work[sel], ctx.tables.working_gb_many(st_a[s], st_z[s], st_tp[s], p_mb[mplan[sel]],
                                                                     p_rc[mplan[sel]], fused=fused))
        params[sel] = params[sel] + ctx.tables.params_per_device_many(st_a[s], st_z[s], st_tp[s])
    gb = gb + work
    s0 = r_off[mrep] + md
    g0 = st_info[s0]
    opt = np.zeros((R, max(D, 1) if R else 1))
    opt[mrep, md] = params / (tab["hbm"][g0] * 1e9)
    fits_rows = gb <= tab["cap"][g0]
    fits = np.ones(N, bool)
    np.logical_and.at(fits, mplan, fits_rows)
    memory_gb, headroom = _memory_by_name(ctx, N, mplan, gb, tab["mask"][g0])
    # ---- gradient segments
    seg = _segments(ctx, N, p_dp, p_rep0, r_plan, r_nst, r_v, st_rep, st_k, st_a, st_tp, st_info, st_cfg, st_plan, tab)
    # ---- plan features
    dp = p_dp.astype(float)
    mean_m = np.add.reduceat(r_m.astype(float), p_rep0) / dp if N else np.zeros(0)
    pp = r_nst[p_rep0] // p_v if N else np.zeros(0, np.int64)
    ndev = _devices_per_plan(N, st_plan, st_info, tab)
    mixed = (np.minimum.reduceat(r_nst, p_rep0) != np.maximum.reduceat(r_nst, p_rep0)) | \
        (np.minimum.reduceat(r_m, p_rep0) != np.maximum.reduceat(r_m, p_rep0)) if N else np.zeros(0, bool)
    plan_x = np.stack([log_scale(mean_m, 1.0, 1.0), np.log2(np.maximum(pp, 1)) / 5,
                       np.minimum(mean_m / np.maximum(pp, 1), 8.0) / 8, np.log2(dp) / 8, p_sched == 1, p_sched == 2,
                       np.log2(ndev) / 12, mixed], 1).astype(np.float32).reshape(-1, len(PLAN_FEATURES))
    batch = PlanBatch(
        num_plans=N, unit_x=unit_x, unit_base=unit_base, stage_cfg=st_cfg, stage_a=st_a.copy(), stage_z=st_z.copy(),
        rep_stages=rep_stages, rep_plan=r_plan, rep_m=r_m.astype(float), rep_v=r_v.astype(float),
        rep_gpipe=p_sched[r_plan] == 1, p2p_x=p2p_x, p2p_base=p2p_base, opt_base=opt, plan_x=plan_x,
        plan_tokens=p_tokens.astype(float), memory_gb=memory_gb, fits=fits.tolist(), **seg["arrays"])
    batch.headroom_gb = headroom
    batch.p2p_uid, batch.p2p_first = p2p_uid, p2p_first
    batch.configs = configs
    # raw structure for compositions that price leaves themselves (closed.py): the stages, the plan
    # of each stage, a stage of each configuration, and each transfer's ends, shards and bytes
    batch.raw = {"stages": flat, "stage_plan": st_plan, "stage_rep": st_rep, "stage_k": st_k, "stage_tp": st_tp,
                 "stage_dev": tab["first"][st_info], "config_stage": reps, "p2p_rep": pr, "p2p_k": pk,
                 "p2p_da": da, "p2p_db": db, "p2p_na": na, "p2p_nb": nb, "p2p_tp": tp, "p2p_bytes": nbytes,
                 "rep_pp": r_pp, "seg_bytes": seg["raw"]["bytes"], "seg_first_bytes": seg["raw"]["first"],
                 "seg_tied": seg["raw"]["tied"], "hold_dev": seg["raw"]["hold_dev"], "hold_tp": seg["raw"]["hold_tp"]}
    if members:
        batch.seg_members = seg["members"]()
    return batch


def _devices_per_plan(N: int, st_plan, st_info, tab: dict) -> np.ndarray:
    """Distinct devices per plan (the device groups of its stages, each counted once)."""
    W = int(tab["devset"].max(initial=0)) + 1
    ds_ndev = np.zeros(W)
    ds_ndev[tab["devset"]] = tab["ndev"]
    key = np.unique(st_plan * W + tab["devset"][st_info])
    return np.bincount(key // W, weights=ds_ndev[key % W], minlength=N)


def _memory_by_name(ctx: ScenarioContext, N: int, mplan, gb, mask) -> tuple[list, np.ndarray]:
    """Per plan: ``{gpu name: peak GB}`` (names in the order the devices are met) and the headroom
    (capacity minus peak) of the tightest device type."""
    V = ctx._vec
    name_of, cap = V["name_of_pool"], V["capacity"]
    NP, NN = len(name_of), len(V["names"])
    rows = [np.nonzero((mask >> p) & 1)[0] for p in range(NP)]
    pools = np.concatenate([np.full(len(r), p, np.int64) for p, r in enumerate(rows)])
    rows = np.concatenate(rows)
    key = mplan[rows] * NN + name_of[pools]
    big = np.iinfo(np.int64).max
    peak = np.full(N * NN, -np.inf)
    np.maximum.at(peak, key, gb[rows])
    first = np.full(N * NN, big, np.int64)
    np.minimum.at(first, key, rows * NP + pools)
    caps = np.full(N * NN, np.inf)
    np.minimum.at(caps, key, cap[pools])
    live = np.nonzero(first < big)[0]
    live = live[np.lexsort((first[live], live // NN))]
    head = np.full(N, np.inf)
    np.minimum.at(head, live // NN, caps[live] - peak[live])
    head[np.isinf(head)] = 0.0
    out: list[dict] = [{} for _ in range(N)]
    names = V["names"]
    for k, v in zip(live.tolist(), peak[live].tolist()):
        out[k // NN][names[k % NN]] = v
    return out, head


def _ring_facts(ctx: ScenarioContext, gmask: int, multi: bool, concurrent: int) -> tuple | None:
    """(hop, latency, share, intra, crosses zones) of a ring over node groups ``gmask`` (a bit mask);
    None where two of its zones have no link. The first encoder's ``_ring``, keyed by groups."""
    key = (gmask, multi, concurrent)
    cache = ctx._vec["rings"]
    if key in cache:
        return cache[key]
    cl = ctx.cluster
    groups = [g for g in range(gmask.bit_length()) if gmask >> g & 1]
    zones = {cl.groups[g].zone for g in groups}
    intra = min(cl.groups[g].intra_node.bandwidth_gbyte_s for g in groups)
    hit = None
    if not multi:
        hit = (intra, max(cl.groups[g].intra_node.latency_us for g in groups), intra, intra, len(zones) > 1)
    else:
        hop = min(cl.groups[g].nic.bandwidth_gbyte_s for g in groups)
        lat = max(cl.groups[g].nic.latency_us for g in groups)
        zl = [cl.zone_link(a, b) for a in zones for b in zones if a < b]
        if not any(z is None for z in zl):
            if zl:
                hop = min([hop] + [z.bandwidth_gbyte_s for z in zl])
                lat += max(z.latency_us for z in zl)
            share = min(ctx.node_gbyte_s[g] / concurrent for g in groups)
            hit = (hop, lat, share, intra, len(zones) > 1)
    cache[key] = hit
    return hit


def _segments(ctx: ScenarioContext, N: int, p_dp, p_rep0, r_plan, r_nst, r_v, st_rep, st_k, st_a, st_tp, st_info,
              st_cfg, st_plan, tab: dict) -> dict:
    """Gradient all-reduce segments of every plan: runs of units with one holder set (spans between
    consecutive stage starts of any replica), then tied-embedding copies, in plan order."""
    V = ctx._vec
    tables = ctx.tables
    T = tables._arrays()
    n = ctx.model.num_units
    W = n + 1
    st_key = st_rep * W + st_a

    def holder(rep, unit):
        return np.searchsorted(st_key, rep * W + unit, side="right") - 1

    cut = np.unique(st_plan * W + st_a)
    sp_plan, sp_a = cut // W, cut % W
    same = np.append(sp_plan[1:] == sp_plan[:-1], False)
    sp_z = np.where(same, np.append(sp_a[1:], 0), n)
    sel = p_dp[sp_plan] >= 2
    j_plan, j_a, j_z = sp_plan[sel], sp_a[sel], sp_z[sel]
    cnt = p_dp[j_plan]
    h_seg = np.repeat(np.arange(len(j_plan)), cnt)
    h_rep = p_rep0[j_plan][h_seg] + np.arange(int(cnt.sum())) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    h_st = holder(h_rep, j_a[h_seg])
    starts = np.cumsum(cnt) - cnt
    tpmin = np.minimum.reduceat(st_tp[h_st], starts) if len(j_plan) else np.zeros(0, np.int64)
    sh, whole = T["p_sh"][j_z] - T["p_sh"][j_a], T["p_rep"][j_z] - T["p_rep"][j_a]
    fsh, fwhole = T["p_sh"][j_a + 1] - T["p_sh"][j_a], T["p_rep"][j_a + 1] - T["p_rep"][j_a]
    pairs = tables.kernels == "fused"  # Simulator._tied_pairs: a copy reduced in its stage's buffer
    if pairs and tables.owner >= 0:
        copy = ~((j_a <= tables.owner) & (tables.owner < j_z))
        sh = sh + np.where(copy, T["s_sh"][j_z] - T["s_sh"][j_a], 0.0)
        whole = whole + np.where(copy, T["s_rep"][j_z] - T["s_rep"][j_a], 0.0)
        fsh = fsh + np.where(copy, T["s_sh"][j_a + 1] - T["s_sh"][j_a], 0.0)
        fwhole = fwhole + np.where(copy, T["s_rep"][j_a + 1] - T["s_rep"][j_a], 0.0)
    segs = {"plan": [j_plan], "kind": [np.zeros(len(j_plan), np.int64)], "order": [j_a],
            "bytes": [(sh / tpmin + whole) * ctx.grad_bytes], "last": [(fsh / tpmin + fwhole) * ctx.grad_bytes],
            "a": [j_a], "z": [j_z], "tied": [np.zeros(len(j_plan), bool)]}
    holders, hseg = [h_st], [h_seg]
    G0 = len(j_plan)
    owner = tables.owner
    if owner >= 0 and N:
        R = len(r_plan)
        reps = np.arange(R)
        ko = holder(reps, owner)
        for ui, u in enumerate(tables.sharers):
            ku = holder(reps, u)
            differ = ku != ko
            plans = np.nonzero(np.logical_or.reduceat(differ, p_rep0))[0]
            if not len(plans):
                continue
            if pairs:  # one 2-member all-reduce per replica whose copy and owner sit apart, in replica order
                rr = reps[differ]
                hr = np.repeat(rr, 2)
                hst = np.where(np.arange(len(hr)) % 2 == 0, np.minimum(ku[hr], ko[hr]), np.maximum(ku[hr], ko[hr]))
                local = np.repeat(np.arange(len(rr)), 2)
                seg_plan = r_plan[rr]
                order = ui * (int(p_dp.max()) + 1) + rr - p_rep0[seg_plan]
                tpm = np.minimum(st_tp[ku[rr]], st_tp[ko[rr]])
            else:  # one ring over every replica's stages holding either
                in_plan = np.isin(r_plan, plans)
                rr = reps[in_plan]
                c = 1 + differ[rr]
                hr = np.repeat(rr, c)
                second = np.arange(len(hr)) - np.repeat(np.cumsum(c) - c, c)
                hst = np.where(second == 0, np.minimum(ku[hr], ko[hr]), np.maximum(ku[hr], ko[hr]))
                local = np.searchsorted(plans, r_plan[hr])
                starts_t = np.searchsorted(local, np.arange(len(plans)))
                tpm = np.minimum.reduceat(st_tp[hst], starts_t)
                seg_plan, order = plans, np.full(len(plans), ui)
            nb = ctx.model.units[u].shared_params * ctx.grad_bytes / tpm
            count = len(seg_plan)
            segs["plan"].append(seg_plan)
            segs["kind"].append(np.ones(count, np.int64))
            segs["order"].append(order)
            segs["bytes"].append(nb)
            segs["last"].append(nb)
            segs["a"].append(np.full(count, -1))
            segs["z"].append(np.full(count, -1))
            segs["tied"].append(np.ones(count, bool))
            holders.append(hst)
            hseg.append(local + G0)
            G0 += count
    sg = {k: np.concatenate(v) for k, v in segs.items()}
    h_st, h_seg = np.concatenate(holders), np.concatenate(hseg)
    G = len(sg["plan"])
    hstart = np.searchsorted(h_seg, np.arange(G))
    # members: distinct first devices of the holding stages; their nodes, node groups, tp
    dev = tab["first"][st_info[h_st]]
    o = np.lexsort((dev, h_seg))
    sd, ss = dev[o], h_seg[o]
    new = np.ones(len(sd), bool)
    new[1:] = (sd[1:] != sd[:-1]) | (ss[1:] != ss[:-1])
    n_mem = np.bincount(ss[new], minlength=G)
    nodes_key = ss[new] * V["num_nodes"] + V["dev_node"][sd[new]]
    nk, ncount = np.unique(nodes_key, return_counts=True)
    nseg = nk // V["num_nodes"]
    n_nodes = np.bincount(nseg, minlength=G)
    cmin = np.full(G, np.iinfo(np.int64).max)
    np.minimum.at(cmin, nseg, ncount)
    cmax = np.zeros(G, np.int64)
    np.maximum.at(cmax, nseg, ncount)
    gmask = np.zeros(G, np.int64)
    np.bitwise_or.at(gmask, h_seg, np.left_shift(1, V["dev_group"][dev]))
    conc = np.maximum.reduceat(st_tp[h_st], hstart) if G else np.zeros(0, np.int64)
    keep = (sg["bytes"] > 0) & (n_mem >= 2)
    facts = np.zeros((G, 5))
    bad: dict[int, str] = {}
    fk = gmask * 2 + (n_nodes > 1)
    for key in np.unique(np.stack([fk, conc], 1)[keep], axis=0).tolist() if keep.any() else []:
        hit = _ring_facts(ctx, key[0] >> 1, bool(key[0] & 1), key[1])
        rows = keep & (fk == key[0]) & (conc == key[1])
        if hit is None:
            for p in np.unique(sg["plan"][rows]).tolist():
                bad.setdefault(p, "gradient all-reduce across zones without a link")
            continue
        facts[rows] = hit
    if bad:
        raise _Skip(bad)
    # the kept segments in plan order (spans by their first unit, then tied copies)
    kept = np.nonzero(keep)[0]
    kept = kept[np.lexsort((sg["order"][kept], sg["kind"][kept], sg["plan"][kept]))]
    newid = np.full(G, -1, np.int64)
    newid[kept] = np.arange(len(kept))
    hsel = np.nonzero(newid[h_seg] >= 0)[0]
    hsel = hsel[np.argsort(newid[h_seg[hsel]], kind="stable")]
    hs = h_st[hsel]
    g = newid[h_seg[hsel]]
    k_ = kept
    nb, last = sg["bytes"][k_], sg["last"][k_]
    n, nodes = n_mem[k_], n_nodes[k_]
    even = (cmin[k_] == cmax[k_]) & (nodes > 1) & (cmin[k_] != 1)
    kk = np.where(even, cmin[k_], 1)
    hop, lat, share, intra, cross = facts[k_].T
    concurrent = conc[k_]
    bw = np.where(nodes > 1, np.minimum(hop, share), hop)
    flat = 2 * (n - 1) / n * nb / (bw * 1e9)
    across = np.where(nodes > 1, np.minimum(hop, share * concurrent / (kk * concurrent)), hop)
    hier = np.where(even, 2 * (kk - 1) / kk * nb / (intra * 1e9) + 2 * (nodes - 1) / nodes * nb / kk / (across * 1e9),
                    flat)
    seg_x = np.stack([_lsv(nb, 8.0, 2.0), np.log2(n) / 6, np.log2(nodes) / 6, np.log2(kk) / 3, even,
                      _lsv(hop, 1.5, 1.0), _lsv(share, 1.5, 1.0), _lsv(intra, 2.0, 1.0), _lsv(lat, 0.5, 1.0), cross,
                      np.log2(concurrent) / 3, _lsv(flat, -2.0, 2.0),
                      np.log10(np.maximum(hier, 1e-12) / np.maximum(flat, 1e-12))], 1)
    seg_base = np.stack([flat, 2 * (n - 1) * lat * 1e-6, last / nb], 1)
    rep = st_rep[hs]
    k = st_k[hs]
    tied = sg["tied"][h_seg[hsel]]
    a, z = sg["a"][h_seg[hsel]], sg["z"][h_seg[hsel]]
    grp_key = rep * 4096 + k % (r_nst[rep] // r_v[rep])
    _, hold_group = np.unique(grp_key, return_inverse=True)
    hold_group = hold_group.reshape(-1).astype(np.int64)
    num_groups = int(hold_group.max()) + 1 if len(hold_group) else 0
    dup = np.zeros(len(g), bool)
    dup[1:] = (g[1:] == g[:-1]) & (hold_group[1:] == hold_group[:-1])
    ug, ugrp = g[~dup], hold_group[~dup]
    counts = np.bincount(ug, minlength=len(kept))
    pos = np.arange(len(ug)) - np.repeat(np.cumsum(counts) - counts, counts)
    seg_groups = np.full((len(kept), int(counts.max(initial=1))), num_groups, np.int64)
    seg_groups[ug, pos] = ugrp

    def members() -> list:
        ids = V["dev_ids"]
        out = [[] for _ in kept]
        for gi, d in zip(g.tolist(), tab["first"][st_info[hs]].tolist()):
            if ids[d] not in out[gi]:
                out[gi].append(ids[d])
        return [(tuple(m), int(c), float(b)) for m, c, b in zip(out, concurrent.tolist(), nb.tolist())]

    arrays = {"seg_x": seg_x.astype(np.float32).reshape(-1, len(DP_FEATURES)), "seg_base": seg_base.reshape(-1, 3),
              "seg_plan": sg["plan"][k_].astype(np.int64), "hold_seg": g, "hold_rep": rep, "hold_k": k,
              "hold_first": st_a[hs], "hold_hi": np.where(tied, -1, z - 1), "hold_lo": np.where(tied, -1, a),
              "hold_cfg": st_cfg[hs], "hold_group": hold_group, "seg_groups": seg_groups, "num_groups": num_groups}
    raw = {"bytes": nb, "first": last, "tied": sg["tied"][k_], "hold_dev": tab["first"][st_info[hs]],
           "hold_tp": st_tp[hs]}
    return {"arrays": arrays, "members": members, "raw": raw}


def teacher_labels(ctx: ScenarioContext, plans: list[Plan]) -> PlanBatch:
    """:func:`encode_plans` plus the teacher's leaf labels for training: the simulator's own per-unit
    seconds (compute + tensor-parallel) and per-ring seconds (the analytic leaf terms the surrogate
    corrects, so the leaf loss keeps its corrections near the teacher's leaves)."""
    batch = encode_plans(ctx, plans, members=True)
    if batch.errors:
        raise ValueError(next(iter(batch.errors.values())))
    u = np.asarray(batch.unit_exact, float)
    batch.unit_label = np.stack([u[..., 0] + u[..., 2], u[..., 1] + u[..., 3]], -1).reshape(
        batch.unit_base.shape[:2] + (2,))
    batch.seg_label = np.asarray(batch.seg_exact, float)
    return batch


def _interleaved_flights(ctx, flight, msched, mrep, md, mpp, mm, mv, r_off, st_a, st_z, st_tp, rc, fused) -> np.ndarray:
    """``[devices, chunks]``: micro-batches in flight per chunk of each pipeline device; ``flight`` in every column,
    except on devices of interleaved plans, whose chunks hold unlike counts
    (:func:`~hetpart.costmodel.memory.chunk_flights`, as the simulator counts them)."""
    from hetpart.costmodel.memory import chunk_flights

    width = int(mv.max(initial=1))
    out = np.repeat(flight[:, None], width, axis=1)
    rows = np.flatnonzero((msched == 2) & (mv > 1))
    seen: dict[tuple, tuple[float, ...]] = {}
    for i in rows:
        v, pp, d = int(mv[i]), int(mpp[i]), int(md[i])
        ks = r_off[mrep[i]] + d + pp * np.arange(v)
        chunks = tuple((int(st_a[s]), int(st_z[s]), float(st_tp[s])) for s in ks)
        key = (chunks, d, pp, int(mm[i]), v, int(rc[i]), bool(fused[i]))
        got = seen.get(key)
        if got is None:
            got = seen[key] = chunk_flights(ctx.tables, "interleaved", d, pp, int(mm[i]), v, list(chunks),
                                            RECOMPUTE[int(rc[i])], "fused" if fused[i] else "eager")
        out[i, :v] = got
    return out
