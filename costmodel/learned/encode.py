"""Plans as arrays for the learned cost model: one :class:`PlanBatch` holds many plans of one scenario.

The surrogate (:mod:`hetpart.costmodel.learned.surrogate`) reads a plan as a graph whose node and
edge inputs are raw physical quantities, never the simulator's results:

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
from bisect import bisect_right
from dataclasses import dataclass, field

import numpy as np

from hetpart.cluster import Cluster
from hetpart.graph.model_graph import ModelGraph
from hetpart.plan import Plan
from hetpart.workload import DTYPE_BYTES

from hetpart.costmodel.features import cluster_pools, log_scale, pool_features, unit_features
from hetpart.costmodel.memory import PrefixTables, in_flight_microbatches, memory_capacity_gb

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


def _ls(x: float, centre: float, spread: float) -> float:
    """:func:`~hetpart.costmodel.features.log_scale` of one number (no numpy: the encoder's hot path)."""
    return (math.log10(max(x, 10.0 ** (centre - 2.0 * spread))) - centre) / spread


def _config_rows(ctx: ScenarioContext, configs: list[tuple]) -> tuple[np.ndarray, np.ndarray]:
    m = ctx.model
    xs, bases = [], []
    for pool, tp, mb, rc, (tp_bw, tp_lat) in configs:
        gpu = ctx.gpus[pool]
        shard = np.where(ctx.shardable, tp, 1)
        width = np.where(ctx.inner, ctx.width / shard, ctx.width)
        tokens = mb * m.seq_len
        peak = ctx.peak[pool] * 1e12
        flop_f = ctx.fwd * mb / shard / peak
        flop_b = ctx.bwd[rc] * mb / shard / peak
        mem = ctx.act * mb / shard / (gpu.hbm_gbyte_s * 1e9)
        has_tp = ctx.shardable & (ctx.tp_bytes > 0) & (tp > 1)
        tp_s = np.where(has_tp, 2 * (tp - 1) / tp * ctx.tp_bytes * mb / (tp_bw * 1e9), 0.0)
        tp_l = np.where(has_tp, 2 * (tp - 1) * tp_lat * 1e-6, 0.0)
        n = m.num_units
        cfg = np.array([math.log2(tp) / 3, math.log2(mb) / 3, rc == "none", rc == "selective", rc == "full"], float)
        cols = np.column_stack([
            np.repeat(cfg[None], n, 0), log_scale(width, 3.0, 1.0), np.full(n, float(log_scale(tokens, 3.5, 1.0))),
            log_scale(np.minimum(width, tokens), 3.0, 1.0),
            np.log10(np.maximum(flop_f, 1e-15) / np.maximum(mem, 1e-15)) / 3.0,
            np.full(n, float(log_scale(tp_bw, 2.0, 1.0))), np.full(n, float(log_scale(tp_lat, 0.5, 1.0)))])
        xs.append(np.concatenate([ctx.unit_x, np.repeat(ctx.pool_x[pool][None], n, 0), cols], axis=1))
        bases.append(np.column_stack([flop_f, flop_b, mem, tp_s, tp_l]))
    return np.asarray(xs, np.float32), np.asarray(bases, np.float64)


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


def _p2p(ctx: ScenarioContext, src, dst, mb: int) -> tuple[list, list]:
    tp = max(src.tp, dst.tp)
    a, b = src.devices[0], dst.devices[0]
    full = (a, b, tp, src.layers[1], mb)
    done = ctx._p2p.get(full)
    if done is not None:
        return done
    key = (ctx.dev[a][1], ctx.dev[b][1], a == b, tp)
    hit = ctx._p2p.get(key)
    if hit is None:
        link = ctx.cluster.link_between(a, b)
        if link is None:
            raise ValueError(f"devices {a} and {b} sit in zones without a link")
        bw = link.bandwidth_gbyte_s
        if link.kind in ("nic", "inter_zone"):
            bw = min(bw, min(ctx.node_gbyte_s[ctx.dev[d][2]] / tp for d in (a, b)))
        hit = ctx._p2p[key] = (link.kind, bw, link.latency_us)
    kind, bw, lat = hit
    nbytes = ctx.out_bytes[src.layers[1] - 1] * mb / tp
    if kind == "self":
        done = ([0.0] * len(P2P_FEATURES), [0.0, 0.0])
    else:
        base = nbytes / (bw * 1e9)
        done = ([_ls(nbytes, 6.0, 2.0), _ls(bw, 1.5, 1.0), _ls(lat, 0.5, 1.0), kind == "intra_node", kind == "nic",
                 kind == "inter_zone", math.log2(tp) / 3, _ls(base, -3.0, 2.0)], [base, lat * 1e-6])
    ctx._p2p[full] = done
    return done


def _ring(ctx: ScenarioContext, members: tuple, concurrent: int) -> tuple:
    """Ring facts of an all-reduce among ``members`` (one device per holding stage)."""
    nodes = tuple(sorted(ctx.dev[d][1] for d in members))
    key = (nodes, concurrent)
    hit = ctx._ring.get(key)
    if hit is not None:
        return hit
    cl = ctx.cluster
    by_node: dict = {}
    for d in members:
        by_node.setdefault(ctx.dev[d][1], d)
    groups = {ctx.dev[d][2] for d in members}
    zones = {cl.groups[g].zone for g in groups}
    intra = min(cl.groups[g].intra_node.bandwidth_gbyte_s for g in groups)
    if len(by_node) == 1:
        hop, lat, share = intra, max(cl.groups[g].intra_node.latency_us for g in groups), intra
    else:
        hop = min(cl.groups[g].nic.bandwidth_gbyte_s for g in groups)
        lat = max(cl.groups[g].nic.latency_us for g in groups)
        zl = [cl.zone_link(a, b) for a in zones for b in zones if a < b]
        if any(z is None for z in zl):
            raise ValueError("gradient all-reduce across zones without a link")
        if zl:
            hop = min([hop] + [z.bandwidth_gbyte_s for z in zl])
            lat += max(z.latency_us for z in zl)
        share = min(ctx.node_gbyte_s[g] / concurrent for g in groups)
    counts = {}
    for n in nodes:
        counts[n] = counts.get(n, 0) + 1
    per_node = set(counts.values())
    even = len(per_node) == 1 and len(counts) > 1 and per_node != {1}
    k = next(iter(per_node)) if even else 1
    hit = ctx._ring[key] = (len(nodes), len(counts), k, even, hop, share, intra, lat, len(zones) > 1)
    return hit


def _segment(ctx: ScenarioContext, members: tuple, concurrent: int, nbytes: float, last_bytes: float) -> tuple:
    key = (members, concurrent, nbytes, last_bytes)
    hit = ctx._cache.get(key)
    if hit is not None:
        return hit
    n, nodes, k, even, hop, share, intra, lat, cross = _ring(ctx, members, concurrent)
    bw = min(hop, share) if nodes > 1 else hop
    flat = 2 * (n - 1) / n * nbytes / (bw * 1e9)
    hier = flat
    if even:
        across = min(hop, share * concurrent / (k * concurrent)) if nodes > 1 else hop
        hier = 2 * (k - 1) / k * nbytes / (intra * 1e9) + 2 * (nodes - 1) / nodes * nbytes / k / (across * 1e9)
    x = [_ls(nbytes, 8.0, 2.0), math.log2(n) / 6, math.log2(nodes) / 6, math.log2(k) / 3, even, _ls(hop, 1.5, 1.0),
         _ls(share, 1.5, 1.0), _ls(intra, 2.0, 1.0), _ls(lat, 0.5, 1.0), cross, math.log2(concurrent) / 3,
         _ls(flat, -2.0, 2.0), math.log10(max(hier, 1e-12) / max(flat, 1e-12))]
    hit = ctx._cache[key] = (x, [flat, 2 * (n - 1) * lat * 1e-6, last_bytes / nbytes if nbytes > 0 else 0.0])
    return hit


def encode_plans(ctx: ScenarioContext, plans: list[Plan]) -> PlanBatch:
    """Encode ``plans`` (all of ``ctx``'s model and cluster) into one :class:`PlanBatch`.

    A plan that cannot be encoded (a device the cluster lacks, zones without a link) is left out and
    named in ``errors``; the caller reports it.
    """
    enc = _Encoder(ctx)
    for i, plan in enumerate(plans):
        try:
            enc.add(i, plan)
        except (ValueError, KeyError, IndexError, ZeroDivisionError) as exc:
            enc.rollback()
            enc.errors[i] = f"cannot encode plan: {exc}"
    return enc.finish(len(plans))


class _Encoder:
    def __init__(self, ctx: ScenarioContext) -> None:
        self.ctx = ctx
        self.cfg_index: dict = {}
        self.errors: dict = {}
        self.lists = {k: [] for k in ("stage_cfg", "stage_a", "stage_z", "rep_stages", "rep_plan", "rep_m", "rep_v",
                                      "rep_gpipe", "p2p_x", "p2p_base", "opt_base", "seg_x", "seg_base", "seg_plan",
                                      "hold", "plan_x", "plan_tokens", "memory_gb", "fits", "plan_row",
                                      "seg_members")}

    def rollback(self) -> None:
        n = self._mark
        for k, v in self.lists.items():
            del v[n[k]:]

    def add(self, i: int, plan: Plan) -> None:
        ctx, L = self.ctx, self.lists
        self._mark = {k: len(v) for k, v in L.items()}
        v = plan.interleave if plan.schedule == "interleaved" else 1
        s0 = len(L["stage_cfg"])
        rep_ids, ms, mem, fits = [], [], {}, True
        for r, rep in enumerate(plan.replicas):
            m = plan.num_microbatches(r)
            if m < 1:
                raise ValueError(f"replica {r} has no micro-batch")
            ids = []
            for s in rep.stages:
                pool, nodes = ctx.slowest(s.devices)
                link = _tp_link(ctx, s.devices, nodes) if s.tp > 1 else (1.0, 0.0)
                key = (pool, s.tp, plan.micro_batch, plan.recompute, link)
                cfg = self.cfg_index.setdefault(key, len(self.cfg_index))
                ids.append(len(L["stage_cfg"]))
                L["stage_cfg"].append(cfg)
                L["stage_a"].append(s.layers[0])
                L["stage_z"].append(s.layers[1])
            rep_ids.append(len(L["rep_plan"]))
            L["rep_stages"].append(ids)
            L["rep_plan"].append(i)
            L["rep_m"].append(m)
            L["rep_v"].append(v)
            L["rep_gpipe"].append(plan.schedule == "gpipe")
            p2p = [_p2p(ctx, rep.stages[k], rep.stages[k + 1], plan.micro_batch) for k in range(rep.pp - 1)]
            L["p2p_x"].append([x for x, _ in p2p])
            L["p2p_base"].append([b for _, b in p2p])
            opt, fits = self._memory(plan, rep, m, v, mem, fits)
            L["opt_base"].append(opt)
            ms.append(m)
        self._segments(i, plan, rep_ids, s0)
        pp = len(plan.replicas[0].stages) // v
        L["plan_x"].append([float(log_scale(np.mean(ms), 1.0, 1.0)), math.log2(max(pp, 1)) / 5,
                            min(np.mean(ms) / max(pp, 1), 8.0) / 8, math.log2(plan.dp) / 8, plan.schedule == "gpipe",
                            plan.schedule == "interleaved", math.log2(plan.num_devices) / 12,
                            float(len({len(r.stages) for r in plan.replicas}) > 1 or len(set(ms)) > 1)])
        L["plan_tokens"].append(plan.global_batch * plan.seq_len)
        L["memory_gb"].append(mem)
        L["fits"].append(fits)
        L["plan_row"].append(i)

    def _memory(self, plan: Plan, rep, m: int, v: int, mem: dict, fits: bool) -> tuple[list, bool]:
        ctx = self.ctx
        pp = rep.pp // v
        opt = []
        for d in range(pp):
            flight = in_flight_microbatches(plan.schedule, d, pp, m, v)
            chunks = tuple((s.layers, s.tp) for s in rep.stages[d::pp])
            key = (chunks, flight, plan.micro_batch, plan.recompute)
            hit = ctx._cache.get(key)
            if hit is None:
                gb = sum(ctx.tables.memory_gb(a, z, tp, plan.micro_batch, flight, plan.recompute) for (a, z), tp in chunks)
                params = sum(ctx.tables.params_per_device(a, z, tp) for (a, z), tp in chunks)
                hit = ctx._cache[key] = (gb, params)
            gb, params = hit
            devices = rep.stages[d].devices
            pools = ctx.pools_of(devices)
            for p in pools:
                name = ctx.gpus[p].name
                if mem.get(name, -1.0) < gb:
                    mem[name] = gb
            fits = fits and gb <= min(ctx.capacity[p] for p in pools)
            opt.append(params / (min(ctx.gpus[p].hbm_gbyte_s for p in pools) * 1e9))
        return opt, fits

    def _segments(self, i: int, plan: Plan, rep_ids: list[int], s0: int) -> None:
        """Gradient all-reduce segments: runs of units with one holder set (the simulator's data-parallel
        structure, as plan structure only), plus tied-embedding copies."""
        ctx = self.ctx
        n = ctx.model.num_units
        starts = [[s.layers[0] for s in rep.stages] for rep in plan.replicas]
        cuts = sorted({a for st in starts for a in st} | {n})
        spans = []
        for a, z in zip(cuts[:-1], cuts[1:]):
            holders = tuple((r, bisect_right(starts[r], a) - 1) for r in range(plan.dp))
            spans.append((a, z, holders))
            if plan.dp < 2:
                continue
            tp_min = min(plan.replicas[r].stages[k].tp for r, k in holders)
            sh, whole = ctx.tables.params(a, z)
            fsh, fwhole = ctx.tables.params(a, a + 1)
            self._add_segment(i, plan, rep_ids, holders, a, z, (sh / tp_min + whole) * ctx.grad_bytes,
                              (fsh / tp_min + fwhole) * ctx.grad_bytes)
        owner = ctx.tables.owner
        if owner >= 0:
            def holders_of(u):
                return next(h for a, z, h in spans if a <= u < z)
            for u in ctx.tables.sharers:
                hu, ho = holders_of(u), holders_of(owner)
                if hu != ho:
                    holders = tuple(sorted(set(hu) | set(ho)))
                    tp_min = min(plan.replicas[r].stages[k].tp for r, k in holders)
                    nbytes = ctx.model.units[u].shared_params * ctx.grad_bytes / tp_min
                    self._add_segment(i, plan, rep_ids, holders, -1, -1, nbytes, nbytes)

    def _add_segment(self, i, plan, rep_ids, holders, a, z, nbytes, last_bytes) -> None:
        if len(holders) < 2 or nbytes <= 0:
            return
        L = self.lists
        stages = [plan.replicas[r].stages[k] for r, k in holders]
        members = tuple({s.devices[0]: None for s in stages})
        if len(members) < 2:
            return
        x, base = _segment(self.ctx, members, max(s.tp for s in stages), nbytes, last_bytes)
        g = len(L["seg_x"])
        L["seg_members"].append((members, max(s.tp for s in stages), nbytes))
        L["seg_x"].append(x)
        L["seg_base"].append(base)
        L["seg_plan"].append(i)
        for (r, k), s in zip(holders, stages):
            sid = L["rep_stages"][rep_ids[r]][k]
            first = s.layers[0]
            hi, lo = (z - 1, a) if a >= 0 else (-1, -1)
            dev = k % (len(plan.replicas[r].stages) // (plan.interleave if plan.schedule == "interleaved" else 1))
            L["hold"].append((g, rep_ids[r], k, first, hi, lo, L["stage_cfg"][sid], rep_ids[r] * 4096 + dev))

    def finish(self, num_plans: int) -> PlanBatch:
        ctx, L = self.ctx, self.lists
        configs = sorted(self.cfg_index, key=self.cfg_index.get)
        unit_x, unit_base = _config_rows(ctx, configs) if configs else (np.zeros((0, 0, 0), np.float32),
                                                                          np.zeros((0, 0, 5)))
        R = len(L["rep_stages"])
        K = max((len(s) for s in L["rep_stages"]), default=1)
        D = max((len(o) for o in L["opt_base"]), default=1)
        rep_stages = np.full((R, K), -1, np.int64)
        p2p_x = np.zeros((R, max(K - 1, 1), len(P2P_FEATURES)), np.float32)
        p2p_base = np.zeros((R, max(K - 1, 1), 2))
        opt = np.zeros((R, D))
        for r in range(R):
            ids = L["rep_stages"][r]
            rep_stages[r, :len(ids)] = ids
            if len(ids) > 1:
                p2p_x[r, :len(ids) - 1] = L["p2p_x"][r]
                p2p_base[r, :len(ids) - 1] = L["p2p_base"][r]
            opt[r, :len(L["opt_base"][r])] = L["opt_base"][r]
        # plans were encoded in order, some left out: map plan index -> row
        row = {p: j for j, p in enumerate(L["plan_row"])}
        hold = np.asarray(L["hold"], np.int64).reshape(-1, 8)
        _, hold_group = np.unique(hold[:, 7], return_inverse=True)
        hold_group = hold_group.reshape(-1).astype(np.int64)
        num_groups = int(hold_group.max()) + 1 if len(hold_group) else 0
        members: list[list[int]] = [[] for _ in L["seg_x"]]
        for seg, grp in zip(hold[:, 0].tolist(), hold_group.tolist()):
            if grp not in members[seg]:
                members[seg].append(grp)
        seg_groups = np.full((len(members), max((len(m) for m in members), default=1)), num_groups, np.int64)
        for seg, m in enumerate(members):
            seg_groups[seg, :len(m)] = m
        return PlanBatch(
            num_plans=len(L["plan_row"]), unit_x=unit_x, unit_base=unit_base,
            stage_cfg=np.asarray(L["stage_cfg"], np.int64), stage_a=np.asarray(L["stage_a"], np.int64),
            stage_z=np.asarray(L["stage_z"], np.int64), rep_stages=rep_stages,
            rep_plan=np.asarray([row[p] for p in L["rep_plan"]], np.int64), rep_m=np.asarray(L["rep_m"], float),
            rep_v=np.asarray(L["rep_v"], float), rep_gpipe=np.asarray(L["rep_gpipe"], bool),
            p2p_x=p2p_x, p2p_base=p2p_base, opt_base=opt,
            seg_x=np.asarray(L["seg_x"], np.float32).reshape(-1, len(DP_FEATURES)),
            seg_base=np.asarray(L["seg_base"], float).reshape(-1, 3),
            seg_plan=np.asarray([row[p] for p in L["seg_plan"]], np.int64),
            hold_seg=hold[:, 0], hold_rep=hold[:, 1], hold_k=hold[:, 2], hold_first=hold[:, 3], hold_hi=hold[:, 4],
            hold_lo=hold[:, 5], hold_cfg=hold[:, 6], hold_group=hold_group,
            seg_groups=seg_groups, num_groups=num_groups,
            plan_x=np.asarray(L["plan_x"], np.float32).reshape(-1, len(PLAN_FEATURES)),
            plan_tokens=np.asarray(L["plan_tokens"], float), memory_gb=L["memory_gb"], fits=L["fits"],
            errors=self.errors, rows=list(L["plan_row"]))

    def configs(self) -> list[tuple]:
        return sorted(self.cfg_index, key=self.cfg_index.get)


def teacher_labels(ctx: ScenarioContext, plans: list[Plan]) -> PlanBatch:
    """:func:`encode_plans` plus the simulator's own per-unit and per-ring seconds (the teacher's
    leaf labels for training; never inputs)."""
    from hetpart.costmodel.collectives import allreduce_time_s
    from hetpart.costmodel.compute import unit_compute_s, unit_tp_comm_s

    enc = _Encoder(ctx)
    for i, plan in enumerate(plans):
        enc.add(i, plan)
    batch = enc.finish(len(plans))
    labels = []
    for pool, tp, mb, rc, (bw, lat) in enc.configs():
        fwd, bwd = unit_compute_s(ctx.model, ctx.gpus[pool], tp, mb, ctx.precision, rc)
        tpf, tpb = unit_tp_comm_s(ctx.model, tp, mb, rc, bw, lat)
        labels.append(np.stack([fwd + tpf, bwd + tpb], -1))
    batch.unit_label = np.asarray(labels, float).reshape(batch.unit_base.shape[:2] + (2,))
    batch.seg_label = np.asarray([allreduce_time_s(nb, members, ctx.cluster, conc)
                                  for members, conc, nb in enc.lists["seg_members"]], float)
    return batch
