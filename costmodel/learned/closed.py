"""A closed-form learned surrogate: leaf costs in numpy, its own composition, learned corrections.

The surrogate of :mod:`~hetpart.costmodel.learned.surrogate` runs the simulator's own schedule and
composition methods; this one composes a step itself, for a whole batch of plans at once, from leaf
costs only:

* **leaves** (allowed inputs): per unit and stage configuration the forward and backward compute
  seconds (:func:`~hetpart.costmodel.compute.unit_compute_s`) and tensor-parallel all-reduce seconds
  (:func:`~hetpart.costmodel.compute.unit_tp_comm_s`) on the group's slowest hop
  (:func:`~hetpart.costmodel.device_group.device_group_facts`); the link between two devices
  (:func:`~hetpart.costmodel.links.achieved_link`) and a node's NIC bandwidth; the cost lines of one
  all-reduce among given members at a given concurrency (NCCL's algorithm x protocol candidates)
  (:func:`~hetpart.costmodel.collectives.allreduce_cost`). All cached per scenario.
* **composition** (this module's, numpy over every replica and gradient run of the batch):
  pipeline transfers whose NICs are shared by the cross-node transfers leaving each node at once,
  sends that block their sender (a stage's forward ends after its send, its backward after the
  gradient sent back); the pipeline's makespan in closed form (1F1B: fill + ``(m - 1)`` periods,
  the period the slowest stage or, with few micro-batches in flight, the slowest cycle through the
  stages below; interleaved: ``m`` periods of the busiest device + the fill over ``v``; GPipe: the
  forward and backward flow shops); each stage's last backward from the makespan; gradient runs
  all-reduced bucket by bucket from when their first bucket is ready, their last bucket exposed,
  rings crossing a TCP NIC only after the backward, the NICs shared by the rings crossing each node,
  rings of one device group one after another; the optimizer step after the slowest ring.
* **learned** (:class:`ClosedHead`): a small MLP on pooled plan features (the composed terms, the
  pipeline's shape and imbalance) adds a log correction to the composed step, trained on simulator
  labels with a pairwise ranking term (:func:`train_closed`); a variance model, linear in the same
  features and fitted apart (:func:`fit_variance`), gives each plan its own relative standard deviation.

``metrics["uncertainty"]`` is that spread, raised to at least ``OOD_RELATIVE_STD`` when the plan is out
of distribution: a feature outside its training range, or a device type the learned models do not cover
(:mod:`~hetpart.costmodel.learned.coverage`, the test ``learned-graph`` applies too), with the reasons
in ``out_of_distribution_reasons``.

Plans it does not compose (ZeRO sharding, uneven tensor-parallel splits, clusters with more node
groups than the vectorised encoder handles) are priced by the simulator (``priced_by``); their
uncertainty claims no learned spread (``relative_std`` None, ``source: "simulator"``) and carries the
simulator's compute error band over the plan's device types as the low and high step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from hetpart.cluster import Cluster
from hetpart.graph.model_graph import ModelGraph
from hetpart.plan import Plan
from hetpart.workload import DTYPE_BYTES

from hetpart.costmodel.activations import DEFAULT_KERNELS
from hetpart.costmodel.memory import GRAD_BYTES

__all__ = ["ClosedContext", "Composed", "compose", "ClosedHead", "HEAD_FEATURES", "ClosedTrainConfig", "train_closed",
           "record_examples", "evaluate_examples", "fit_variance", "save_head", "load_head", "ClosedPredictor", "closed_predictor",
           "kendall_tau"]

_BUCKET_PARAMS = 40_000_000
"""Gradients per data-parallel bucket (Megatron-LM's DDP: the last bucket of a stage is exposed)."""

HEAD_FEATURES = ("log_step", "pipe_share", "dp_over_pipe", "opt_share", "log_m", "log_pp", "m_over_pp",
                 "interleaved", "gpipe", "log_v", "fill_share", "imbalance", "suffix_over_max", "send_share",
                 "log_dp", "tcp_share", "dp_exposed", "mixed", "tp_share", "bwd_over_fwd")


def _step_bytes(optimizer: str) -> float:
    """HBM bytes one optimizer step moves per parameter: the simulator's one table
    (:data:`hetpart.costmodel.memory.OPTIMIZER_STEP_BYTES`; plans carry a known optimizer)."""
    from hetpart.costmodel.memory import OPTIMIZER_STEP_BYTES

    return float(OPTIMIZER_STEP_BYTES[optimizer])




@dataclass
class ClosedContext:
    """Per (model, cluster, precision): the encoder's context and the leaf caches."""

    model: ModelGraph
    cluster: Cluster
    precision: str = "bf16"
    enc: Any = field(init=False)

    def __post_init__(self) -> None:
        from hetpart.costmodel.learned.encode import ScenarioContext

        self.enc = ScenarioContext(self.model, self.cluster, self.precision)
        self._units: dict = {}
        self._facts: dict = {}
        self._links: dict = {}
        self._hops: dict = {}
        self._rings: dict = {}
        self._ready = False

    def vectorised(self) -> bool:
        """Whether the vectorised encoder takes this cluster (at most 62 node groups and device types)."""
        from hetpart.costmodel.learned.encode import _context_tables

        _context_tables(self.enc)
        return self.enc._vec is not None

    def tables(self) -> None:
        """Per device of the encoder's table: its physical node; per node: NIC GB/s, RDMA (once)."""
        if self._ready:
            return
        from hetpart.costmodel.links import node_nic_gbyte_s

        V = self.enc._vec
        cl = self.cluster
        nodes: dict = {}
        self.dev_node = np.array([nodes.setdefault(cl.device(i).node_key, len(nodes)) for i in V["dev_ids"]],
                                 np.int64)
        keys = list(nodes)
        self.node_nic = np.array([node_nic_gbyte_s(cl.groups[g]) for g, _ in keys], float)
        self.node_rdma = np.array([cl.groups[g].nic.rdma for g, _ in keys], bool)
        self.num_nodes = max(len(keys), 1)
        self.node_group = np.array([g for g, _ in keys], np.int64)
        # per node its zone; per pair of zones what their link carries for all flows crossing it (GB/s)
        from hetpart.costmodel.links import zone_gbyte_s

        zones = cl.zones
        self.node_zone = np.array([zones.index(cl.groups[g].zone) for g, _ in keys], np.int64)
        self.num_zones = len(zones)
        self.zone_gbyte_s = np.array([[zone_gbyte_s(cl, a, b) for b in zones] for a in zones], float)
        devs = [cl.device(i) for i in V["dev_ids"]]
        self.dev_group = np.array([d.group for d in devs], np.int64)
        self.dev_local = np.array([d.local for d in devs], np.int64)
        self.width = int(max(self.dev_local.max(initial=0), len(cl.groups))) + 1
        # a link depends on the two node groups (between nodes) or on the group and the two GPUs'
        # places (inside a node: a cube-mesh wires some pairs only): per device, its key's parts
        rng = np.random.default_rng(12345)
        self.dev_hash = rng.integers(1, 2 ** 62, size=len(devs), dtype=np.int64)
        self.group_hash = rng.integers(1, 2 ** 62, size=len(cl.groups), dtype=np.int64)
        self._ready = True

    def facts(self, devices: tuple[str, ...]):
        hit = self._facts.get(devices)
        if hit is None:
            from hetpart.costmodel.device_group import device_group_facts

            hit = self._facts[devices] = device_group_facts(self.cluster, devices)
        return hit

    def unit_row(self, devices: tuple[str, ...], tp: int, mb: int, recompute: str, attention: str) -> np.ndarray:
        """``[2, U]``: forward and backward seconds (compute + tensor-parallel) of each unit for one
        micro-batch on the group's devices (the slowest device's share where the group mixes cards)."""
        g = self.facts(devices)
        key = (g, tp, mb, recompute, attention)
        hit = self._units.get(key)
        if hit is None:
            from hetpart.costmodel.compute import unit_compute_s, unit_tp_comm_s

            if g.alike:
                # the simulator's default operator counts and vocabulary padding: its kernel set's (op_counts="engine")
                f, b = unit_compute_s(self.model, g.gpu, tp, mb, self.precision, recompute, None, attention,
                                      kernels=DEFAULT_KERNELS)
            else:
                from hetpart.costmodel.tp_split import unit_shares

                shares = unit_shares(self.model, tp, None)
                f = b = None
                for i, (gpu, speed) in enumerate(zip(g.gpus, g.speeds)):
                    fi, bi = unit_compute_s(self.model, gpu, 1.0 / shares[i], mb, self.precision, recompute, None,
                                            attention, kernels=DEFAULT_KERNELS, speed=speed)
                    f, b = (fi, bi) if f is None else (np.maximum(f, fi), np.maximum(b, bi))
            tf, tb = unit_tp_comm_s(self.model, tp, mb, recompute, *g.tp_link)
            hit = self._units[key] = np.stack([f + tf, b + tb, tf + tb])
        return hit

    def link(self, a: str, b: str, key) -> tuple[int, float, float]:
        """(kind: 0 self, 1 inside a node, 2 between nodes; GB/s; latency us) of one transfer from
        ``a`` to ``b`` (``key``: what the link depends on, see :func:`compose`)."""
        hit = self._links.get(key)
        if hit is None:
            from hetpart.costmodel.links import achieved_link
            from hetpart.errors import PlanError

            link = achieved_link(self.cluster, a, b)
            if link is None:
                raise PlanError(f"pipeline: devices {a} and {b} sit in zones without a link; add one under 'links'")
            kind = 0 if link.kind == "self" else 1 if link.kind == "intra_node" else 2
            hit = self._links[key] = (kind, link.bandwidth_gbyte_s, link.latency_us)
        return hit

    def ring_lines(self, key: tuple, members: list[str], concurrent: float, zone: float | None = None) -> tuple:
        hit = self._rings.get(key)
        if hit is None:
            from hetpart.costmodel.collectives import allreduce_cost

            hit = self._rings[key] = allreduce_cost(members, self.cluster, concurrent, self._hops, zone)
        return hit


@dataclass
class Composed:
    """What :func:`compose` returns per encoded plan (rows of ``batch.rows``)."""

    step: np.ndarray
    pipe_end: np.ndarray
    dp_end: np.ndarray
    opt: np.ndarray
    features: np.ndarray
    batch: Any
    busy: np.ndarray
    """Per replica: its devices' busy seconds (micro-batches x stage seconds, summed over devices)."""
    span: np.ndarray
    """Per replica: pipeline devices x makespan (the bubble fraction is 1 - busy / span)."""


def compose(cc: ClosedContext, plans: Sequence[Plan], batch=None) -> Composed:
    """Compose the step of every plan ``encode_plans`` could encode (``batch.rows``)."""
    from hetpart.costmodel.learned.encode import encode_plans

    if batch is None:
        batch = encode_plans(cc.enc, list(plans), physics=False, lean=True)
    cc.tables()
    raw = batch.raw
    kept = [plans[i] for i in batch.rows]
    N = batch.num_plans
    R, K = batch.rep_stages.shape
    # ---- leaves: unit rows per configuration
    stages = raw["stages"]
    rows = []
    for s in raw["config_stage"].tolist():
        st = stages[s]
        plan = kept[int(raw["stage_plan"][s])]
        rows.append(cc.unit_row(st.devices, st.tp, plan.micro_batch, plan.recompute, plan.attention))
    U = cc.model.num_units
    C = len(rows)
    unit = np.stack(rows) if rows else np.zeros((0, 3, U))
    zero = np.zeros((C, 1))
    pf = np.concatenate([zero, unit[:, 0].cumsum(1)], 1)
    pb = np.concatenate([zero, unit[:, 1].cumsum(1)], 1)
    cfg, a, z = batch.stage_cfg, batch.stage_a, batch.stage_z
    f = pf[cfg, z] - pf[cfg, a]
    b = pb[cfg, z] - pb[cfg, a]
    tpc = np.concatenate([zero, unit[:, 2].cumsum(1)], 1)
    tp_s = tpc[cfg, z] - tpc[cfg, a]
    # ---- leaves and composition: pipeline transfers, NICs shared per node
    pr, pk = raw["p2p_rep"], raw["p2p_k"]
    S = len(cfg)
    r_off = batch.rep_stages[:, 0]
    nst = np.diff(np.append(r_off, S))
    srep = np.repeat(np.arange(R), nst)
    sk = np.arange(S) - r_off[srep]
    send_f = np.zeros(S)  # a stage's blocking send of its activations (ends its forward)
    send_b = np.zeros(S)  # and of the gradients back (ends its backward)
    if len(pr):
        ids = cc.enc._vec["dev_ids"]
        da, db = raw["p2p_da"], raw["p2p_db"]
        na, nb = cc.dev_node[da], cc.dev_node[db]
        w = cc.width
        lk = np.where(da == db, -1, np.where(na == nb, (cc.dev_group[da] * w + cc.dev_local[da]) * w + cc.dev_local[db],
                                              -2 - (cc.dev_group[da] * w + cc.dev_group[db])))
        lu, lfirst, linv = np.unique(lk, return_index=True, return_inverse=True)
        linv = linv.reshape(-1)
        facts = np.array([cc.link(ids[da[j]], ids[db[j]], k) for k, j in zip(lu.tolist(), lfirst.tolist())],
                         float).reshape(-1, 3)
        kind, bw, lat = facts[linv, 0], facts[linv, 1], facts[linv, 2]
        tp = raw["p2p_tp"].astype(float)
        plan_of = batch.rep_plan[pr]
        pp = raw["rep_pp"][pr]
        cross = na != nb
        # interleaved chunks of one device pair send one after another: counted once
        pair = (pr * (K + 1) + pk % pp) * (K + 1) + (pk + 1) % pp
        sel = np.nonzero(cross)[0]
        if len(sel):
            _, first = np.unique(pair[sel], return_index=True)
            sel = sel[first]
        NN = cc.num_nodes
        out = np.bincount(plan_of[sel] * NN + na[sel], weights=tp[sel], minlength=N * NN)
        into = np.bincount(plan_of[sel] * NN + nb[sel], weights=tp[sel], minlength=N * NN)
        flows = np.maximum(out, into)
        fa = np.maximum(flows[plan_of * NN + na], 1.0)
        fb = np.maximum(flows[plan_of * NN + nb], 1.0)
        share = np.minimum(cc.node_nic[na] / fa, cc.node_nic[nb] / fb)
        if cc.num_zones > 1:  # the link between two zones is shared by the transfers crossing it, either way
            Z = cc.num_zones
            za, zb = cc.node_zone[na], cc.node_zone[nb]
            zsel = sel[za[sel] != zb[sel]]
            ways = np.bincount((plan_of[zsel] * Z + za[zsel]) * Z + zb[zsel], weights=tp[zsel],
                               minlength=N * Z * Z).reshape(N, Z, Z)
            ways = np.maximum(ways, ways.transpose(0, 2, 1))
            fz = np.maximum(ways[plan_of, za, zb], 1.0)
            share = np.where(za != zb, np.minimum(share, cc.zone_gbyte_s[za, zb] / fz), share)
        bw = np.where(cross, np.minimum(bw, share), bw)
        nbytes = raw["p2p_bytes"]
        t = np.where((kind == 0) | (nbytes <= 0), 0.0, lat * 1e-6 + nbytes / (bw * 1e9))
        src = r_off[pr] + pk
        send_f[src] = t
        send_b[src + 1] = t
    # ---- pipelines (per stage, in replica order; reductions per replica)
    F, B = f + send_f, b + send_b
    T = F + B
    m, v = batch.rep_m, batch.rep_v
    pp = np.maximum(nst // np.maximum(v, 1).astype(np.int64), 1)
    total = np.add.reduceat(T, r_off)
    maxT = np.maximum.reduceat(T, r_off)
    cT = np.concatenate([[0.0], np.cumsum(T)])
    suffix = cT[(r_off + nst)[srep]] - cT[:-1]  # the stage and those below it
    flight = np.maximum(pp[srep] - sk, 1)
    lim = np.maximum.reduceat(np.where(m[srep] > flight, suffix / flight, 0.0), r_off)
    period = np.maximum(maxT, lim)
    ms = total + (m - 1) * period
    inter = v > 1
    if inter.any():
        ii = np.nonzero(inter)[0]
        sel = inter[srep]
        width = int(pp[ii].max())
        local = (np.cumsum(inter) - 1)[srep[sel]]
        W = np.bincount(local * width + sk[sel] % pp[srep[sel]], weights=T[sel],
                        minlength=len(ii) * width).reshape(len(ii), width)
        busy = W.max(1)
        ms[ii] = m[ii] * busy + (total[ii] - busy) / v[ii]
        period[ii] = busy
    gp = batch.rep_gpipe
    if gp.any():
        gi = np.nonzero(gp)[0]
        sF, xF = np.add.reduceat(F, r_off)[gi], np.maximum.reduceat(F, r_off)[gi]
        sB, xB = np.add.reduceat(B, r_off)[gi], np.maximum.reduceat(B, r_off)[gi]
        ms[gi] = sF + (m[gi] - 1) * xF + sB + (m[gi] - 1) * xB
        period[gi] = xF + xB
    cB = np.concatenate([[0.0], np.cumsum(B)])
    last_bwd = ms[srep] - (cB[:-1] - cB[r_off][srep])  # the last backward runs back up through the stages above
    if gp.any():  # GPipe's backwards flow from the last stage up, as a flow shop: a stage's last one ends
        # after the forwards, its own and the stages' below it backwards once and (m - 1) times their slowest
        below = np.add.reduceat(B, r_off)[srep] - (cB[:-1] - cB[r_off][srep])  # this stage and those below it
        big = 2.0 * float(B.max(initial=0.0)) + 1.0
        lift = (len(r_off) - srep[::-1]) * big  # rises along the reversed stages: a running max per replica
        slowest = (np.maximum.accumulate(B[::-1] + lift) - lift)[::-1]
        fwd_end = (np.add.reduceat(F, r_off) + (m - 1) * np.maximum.reduceat(F, r_off))[srep]
        on = gp[srep]
        last_bwd = np.where(on, fwd_end + below + (m[srep] - 1) * slowest, last_bwd)
    pipe_end = np.zeros(N)
    np.maximum.at(pipe_end, batch.rep_plan, ms)
    # ---- gradient rings
    dp_end, tcp_share, exposed = _rings(cc, batch, kept, pb, last_bwd, send_b, r_off, N)
    # ---- optimizer
    ob = np.array([_step_bytes(p.optimizer) for p in kept])
    opt_r = batch.opt_base.max(1) * ob[batch.rep_plan]
    opt = np.zeros(N)
    np.maximum.at(opt, batch.rep_plan, opt_r)
    step = np.maximum(pipe_end, dp_end) + opt
    # ---- features of the replica that ends last
    worst = np.full(N, -1.0)
    np.maximum.at(worst, batch.rep_plan, ms)
    is_worst = ms >= worst[batch.rep_plan]
    wr = np.zeros(N, np.int64)
    wr[batch.rep_plan[is_worst]] = np.nonzero(is_worst)[0]
    eps = 1e-12
    fw = np.add.reduceat(f, r_off) + 1e-30
    meanT = total / np.maximum(nst, 1)
    dp = np.bincount(batch.rep_plan, minlength=N).astype(float)
    mixed = batch.plan_x[:, 7] if batch.plan_x.shape[1] > 7 else np.zeros(N)
    feats = np.stack([
        np.log(step + eps) / 5,
        np.log((pipe_end + eps) / (step + eps)),
        np.clip(np.log((dp_end + eps) / (pipe_end + eps)), -5, 5) / 5,
        np.log((opt + eps) / (step + eps)) / 10,
        np.log(m[wr]) / 3, np.log(pp[wr]) / 3, np.minimum(m[wr] / pp[wr], 8) / 8,
        inter[wr].astype(float), gp[wr].astype(float), np.log(v[wr]),
        (total[wr] - period[wr]) / (ms[wr] + eps),
        np.log(maxT[wr] / (meanT[wr] + eps) + eps) / 2,
        np.log(period[wr] / (maxT[wr] + eps) + eps),
        np.add.reduceat(send_f + send_b, r_off)[wr] / (total[wr] + eps),
        np.log(dp) / 4, tcp_share, exposed,
        mixed,
        np.add.reduceat(tp_s, r_off)[wr] / (total[wr] + eps),
        np.log(np.add.reduceat(b, r_off)[wr] / fw[wr] + eps) / 2,
    ], 1)
    return Composed(step, pipe_end, dp_end, opt, feats, batch, m * total, pp * ms)


def _concurrency(batch, hseg, hplace, htp, m_seg, m_place, crossing, starts, hstarts, NN: int, N: int, G: int
                 ) -> np.ndarray:
    """Per ring, how many rings share the NICs of its nodes (``hplace``/``m_place``: each holder's and
    member's node, ``NN`` nodes), or the links of its zones (their zones, ``NN`` zones; ``crossing``: the
    rings that leave one): the simulator's nic_flows and concurrency, per plan."""
    seg_plan = batch.seg_plan
    grp = batch.hold_group
    hc = crossing[hseg]
    NG = batch.num_groups
    gtp = np.zeros(NG + 1)
    gnode = np.zeros(NG + 1, np.int64)
    gplan = np.zeros(NG + 1, np.int64)
    active = np.zeros(NG + 1)
    if hc.any():
        np.maximum.at(gtp, grp[hc], htp[hc])
        gnode[grp[hc]] = hplace[hc]
        gplan[grp[hc]] = seg_plan[hseg[hc]]
        pair = np.unique(hseg[hc] * (NG + 1) + grp[hc])  # each (crossing ring, group) once
        ps, pg = pair // (NG + 1), pair % (NG + 1)
        busy = np.bincount(pg, minlength=NG + 1)
        seg_busy = np.zeros(G)
        np.maximum.at(seg_busy, ps, busy[pg])
        np.add.at(active, pg, 1.0 / seg_busy[ps])
    flows = np.bincount(gplan * NN + gnode, weights=gtp * np.minimum(active, 1.0), minlength=N * NN)
    # members per (ring, node)
    rn = m_seg * NN + m_place
    rnu, rnc = np.unique(rn, return_counts=True)
    rseg, rplace = rnu // NN, rnu % NN
    per = flows[seg_plan[rseg] * NN + rplace] / rnc
    conc = np.maximum.reduceat(htp, hstarts)
    np.maximum.at(conc, rseg, np.where(crossing[rseg], per, 0.0))
    return conc


def _rings(cc: ClosedContext, batch, kept, pb, last_bwd, send_b, r_off, N: int):
    """End of the last gradient all-reduce per plan, the share of a plan's rings over TCP and how far
    the rings end after the pipelines (their exposed part over the pipeline end, per plan)."""
    raw = batch.raw
    G = batch.seg_x.shape[0]
    dp_end = np.zeros(N)
    if G == 0:
        return dp_end, np.zeros(N), np.zeros(N)
    hseg = batch.hold_seg
    hdev = raw["hold_dev"]
    hnode = cc.dev_node[hdev]
    htp = raw["hold_tp"].astype(float)
    seg_plan = batch.seg_plan
    # distinct members (first devices) of each ring
    key = hseg * (len(cc.dev_node) + 1) + hdev
    uk, ui = np.unique(key, return_index=True)
    m_seg, m_dev = hseg[ui], hdev[ui]
    m_node = cc.dev_node[m_dev]
    starts = np.searchsorted(m_seg, np.arange(G))  # every ring has members (>= 2)
    hstarts = np.searchsorted(hseg, np.arange(G))
    crossing = np.minimum.reduceat(m_node, starts) != np.maximum.reduceat(m_node, starts)
    # NIC sharing: per plan and node, the tp shards of the device groups holding a crossing ring, each
    # group's rings taking turns (the simulator's nic_flows: a ring runs 1/k of the time when its busiest
    # group is in k crossing rings; a group counts the share of the time one of its rings runs)
    conc = _concurrency(batch, hseg, hnode, htp, m_seg, m_node, crossing, starts, hstarts, cc.num_nodes, N, G)
    zconc = np.full(G, -1.0)  # rings that cross a zone link: how many share it (-1: none crossed)
    if cc.num_zones > 1:
        m_zone = cc.node_zone[m_node]
        zcross = np.minimum.reduceat(m_zone, starts) != np.maximum.reduceat(m_zone, starts)
        if zcross.any():
            zc = _concurrency(batch, hseg, cc.node_zone[hnode], htp, m_seg, m_zone, zcross, starts, hstarts,
                              cc.num_zones, N, G)
            zconc = np.where(zcross, zc, -1.0)
    NN = cc.num_nodes
    rnu, rnc = np.unique(m_seg * NN + m_node, return_counts=True)  # members per (ring, node)
    rseg, rnode = rnu // NN, rnu % NN
    # ring cost lines, keyed by the members' nodes and the concurrency
    # across nodes the cost depends on the node groups (NICs, zones, links between them), how many
    # members each node holds and the concurrency, not on which node of a group: a ring's key is a
    # sum of random 62-bit words per (node group, members on the node), wrapping; inside one node
    # it depends on the members' places (a sum of per-device words)
    ends = np.append(starts[1:], len(m_seg))
    rstarts = np.searchsorted(rseg, np.arange(G))
    with np.errstate(over="ignore"):
        across = np.add.reduceat(cc.group_hash[cc.node_group[rnode]] * (rnc.astype(np.int64) * 2654435761 + 1),
                                 rstarts)
        inside = np.add.reduceat(cc.dev_hash[m_dev], starts)
        rkey = (np.where(crossing, across, inside) * np.int64(1_000_003) + np.round(conc * 1024).astype(np.int64)
                + np.round(zconc * 1024).astype(np.int64) * np.int64(999_983))
    ku, kfirst, kinv = np.unique(rkey, return_index=True, return_inverse=True)
    kinv = kinv.reshape(-1)
    ids = cc.enc._vec["dev_ids"]
    found = []
    for k, g in zip(ku.tolist(), kfirst.tolist()):
        members = [ids[d] for d in m_dev[starts[g]:ends[g]].tolist()]
        found.append(cc.ring_lines(k, members, float(conc[g]), float(zconc[g]) if zconc[g] >= 0 else None))
    # every candidate line of NCCL's tuner (algorithm x protocol, and the hierarchical all-reduce)
    lines = np.full((len(ku), max(map(len, found), default=1) or 1, 2), np.inf)
    for j, ls in enumerate(found):
        for i, (fixed, per_byte) in enumerate(ls):
            lines[j, i] = (fixed, per_byte)
    prec = cc.precision
    scale = GRAD_BYTES[prec] / DTYPE_BYTES[prec]
    nb = raw["seg_bytes"] * scale
    first_b = raw["seg_first_bytes"] * scale
    tied = raw["seg_tied"]
    last_b = np.where(tied, nb, np.minimum(nb, np.maximum(first_b, _BUCKET_PARAMS * GRAD_BYTES[prec])))
    L = lines[kinv]

    def cost(x):
        c = L[:, :, 0] + L[:, :, 1] * x[:, None]
        c = np.where(np.isfinite(c), c, np.inf).min(1)
        return np.where((x > 0) & np.isfinite(c), c, 0.0)

    # one NCCL call per bucket, each at its own algorithm (the simulator's _bucketed_s)
    calls = np.where(last_b > 0, np.maximum(1.0, np.ceil(nb / np.where(last_b > 0, last_b, 1.0) - 1e-9)), 1.0)
    t, t_last = calls * cost(nb / calls), cost(last_b)
    rdma_all = np.logical_and.reduceat(cc.node_rdma[m_node], starts)
    tcp = crossing & ~rdma_all & ~tied
    # readiness: the holder's last backward (less the blocking send that ends it), less the units
    # still to run below the bucket's unit
    c = batch.hold_cfg
    whole = batch.hold_hi < 0
    flat = r_off[batch.hold_rep] + batch.hold_k
    done = last_bwd[flat] - np.where(whole, 0.0, send_b[flat])
    hi, lo = np.maximum(batch.hold_hi, 0), np.maximum(batch.hold_lo, 0)
    start = pb[c, batch.hold_first]
    ready_first = np.where(whole, done, done - (pb[c, hi] - start))
    ready_last = np.where(whole, done, done - (pb[c, lo] - start))
    sf = np.maximum.reduceat(ready_first, hstarts)
    sl = np.maximum.reduceat(ready_last, hstarts)
    sf = np.where(tcp, sl, sf)
    t_last = np.where(tcp, t, t_last)
    # rings in order of readiness per plan; rings of one device group one after another; Megatron's tied
    # pairs after the data-parallel sync (the simulator's _job_order)
    after = tied & (cc.enc.tables.kernels == "fused")
    order = np.lexsort((sf, after, seg_plan))
    plan_of = seg_plan[order]
    counts = np.bincount(plan_of, minlength=N)
    offsets = np.cumsum(counts) - counts
    rank = np.arange(G) - offsets[plan_of]
    slots = np.full((N, int(counts.max())), -1, np.int64)
    slots[plan_of, rank] = order
    groups = batch.seg_groups
    free = np.zeros(batch.num_groups + 1)
    for j in range(slots.shape[1]):
        col = slots[:, j]
        live = np.nonzero(col >= 0)[0]
        seg = col[live]
        gs = groups[seg]
        begin = np.maximum(sf[seg], free[gs].max(1))
        end = np.maximum(begin + t[seg], sl[seg] + t_last[seg])
        real = gs != batch.num_groups
        free[gs[real]] = np.broadcast_to(end[:, None], gs.shape)[real]
        dp_end[live] = np.maximum(dp_end[live], end)
    cnt = np.maximum(np.bincount(seg_plan, minlength=N), 1)
    tcp_share = np.bincount(seg_plan, weights=tcp.astype(float), minlength=N) / cnt
    tsum = np.bincount(seg_plan, weights=t, minlength=N)
    exposed = np.log1p(tsum / (np.bincount(batch.rep_plan, weights=np.maximum.reduceat(last_bwd, r_off), minlength=N)
                               / np.maximum(np.bincount(batch.rep_plan, minlength=N), 1) + 1e-12))
    return dp_end, tcp_share, exposed


class ClosedHead:
    """The learned part: an MLP (numpy at inference) from :data:`HEAD_FEATURES` to a log correction
    of the composed step and a log variance."""

    def __init__(self, weights: dict[str, np.ndarray] | None = None) -> None:
        self.w = weights or {}

    def __call__(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if not self.w:
            return np.zeros(len(x)), np.full(len(x), -6.0)
        mu, sd = self.w["mean"], self.w["std"]
        h = (x - mu) / sd
        for i in range(self.w["layers"].item()):
            h = h @ self.w[f"W{i}"] + self.w[f"b{i}"]
            if i < self.w["layers"].item() - 1:
                h = h / (1 + np.exp(-h))  # SiLU
        log_var = h[:, 1]
        if "var_w" in self.w:
            log_var = self.variance(x)
        return h[:, 0], np.clip(log_var, -12, 4)

    def variance(self, x: np.ndarray) -> np.ndarray:
        """The log variance of the variance model (:func:`fit_variance`): linear in the normalised
        features, each held inside its training range (beyond it the OOD test speaks)."""
        lo, hi = self.w.get("x_lo"), self.w.get("x_hi")
        if lo is not None:
            x = np.clip(x, lo, hi)
        return self.w["var_b"].item() + ((x - self.w["mean"]) / self.w["std"]) @ self.w["var_w"]


# --------------------------------------------------------------------------------------------- training
def kendall_tau(a, b) -> float:
    """Kendall's tau-a between two sequences (ties count as neither)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    s = np.sign(a[:, None] - a[None, :]) * np.sign(b[:, None] - b[None, :])
    iu = np.triu_indices(len(a), 1)
    c, d = (s[iu] > 0).sum(), (s[iu] < 0).sum()
    return float((c - d) / max(1, c + d))


def record_examples(records: list[dict], progress=None) -> list[dict]:
    """Per data-set record (scenario): the composed log step, the head's features and the simulator's
    log step of each plan it composes, with the record's split."""
    from hetpart.costmodel.learned.sampling import Scenario

    out = []
    for i, r in enumerate(records):
        model, cluster = Scenario.rebuild(r["model_spec"], r["cluster_spec"])
        plans = [Plan.from_dict(p) for p in r["plans"]]
        keep = [j for j, p in enumerate(plans) if _composable(p)]
        cc = ClosedContext(model, cluster)
        if not cc.vectorised():
            continue
        comp = compose(cc, [plans[j] for j in keep])
        rows = [keep[j] for j in comp.batch.rows]
        y = np.asarray(r["log_step_s"], float)[rows]
        out.append({"name": r["name"], "split": r["split"], "family": r.get("family"), "shape": r.get("shape"),
                    "x": comp.features.astype(np.float32), "base": np.log(comp.step), "y": y})
        if progress:
            progress(i + 1, len(records))
    return out


def _composable(plan: Plan) -> bool:
    """Whether :func:`compose` prices ``plan`` (else the simulator does)."""
    return _deferred_because(plan) is None


def _deferred_because(plan: Plan) -> str | None:
    """Why :func:`compose` does not price ``plan`` (the simulator does), None when it does."""
    if plan.zero and plan.dp >= 2:
        return f"ZeRO {plan.zero} sharding"
    if any(s.tp_split is not None for r in plan.replicas for s in r.stages):
        return "an uneven tensor-parallel split"
    if int(getattr(plan, "cp", 1) or 1) > 1:
        return "context parallelism"
    if plan.offload != "none":
        return f"{plan.offload} offload to host memory"
    return None


@dataclass(frozen=True)
class ClosedTrainConfig:
    """`hetpart costmodel train-closed` settings."""

    epochs: int = 200
    lr: float = 3e-3
    hidden: int = 32
    rank_weight: float = 0.5
    rank_temperature: float = 0.02
    weight_decay: float = 1e-4
    adam_eps: float = 1e-8
    seed: int = 0


def evaluate_examples(head: ClosedHead, examples: list[dict]) -> dict[str, float]:
    """Mean and p90 step-time error (%), Kendall tau per scenario (mean, spread), top-1 regret (%)."""
    errs, taus, regrets, n = [], [], [], 0
    for ex in examples:
        mu = ex["base"] + head(ex["x"])[0]
        y = ex["y"]
        errs += list(np.abs(np.exp(mu - y) - 1))
        n += len(y)
        if len(y) >= 2:
            taus.append(kendall_tau(mu, y))
            regrets.append(float(np.exp(y[int(np.argmin(mu))] - y.min()) - 1))
    return {"scenarios": len(examples), "plans": n,
            "error_pct_mean": float(np.mean(errs) * 100) if errs else float("nan"),
            "error_pct_p90": float(np.percentile(errs, 90) * 100) if errs else float("nan"),
            "tau_mean": float(np.mean(taus)) if taus else float("nan"),
            "tau_std": float(np.std(taus)) if taus else float("nan"),
            "top1_regret_pct": float(np.mean(regrets) * 100) if regrets else float("nan")}


def train_closed(examples: list[dict], cfg: ClosedTrainConfig = ClosedTrainConfig(), progress=None) -> tuple[ClosedHead, dict]:
    """Fit the head on the ``train`` examples (the ``val`` ones pick the epoch; ``test`` is never
    looked at here): squared log error + a pairwise hinge per scenario + the variance head's
    Gaussian likelihood. Returns the head and a report per split."""
    import torch
    from torch import nn

    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    train = [e for e in examples if e["split"] == "train"]
    val = [e for e in examples if e["split"] == "val"]
    if not train:
        from hetpart.errors import SpecError

        raise SpecError("train-closed: the data set has no training scenario")
    X = np.concatenate([e["x"] for e in train])
    mean, std = X.mean(0), X.std(0) + 1e-3
    F = X.shape[1]
    last = nn.Linear(cfg.hidden, 2)
    nn.init.zeros_(last.weight)
    with torch.no_grad():
        last.bias.copy_(torch.tensor([0.0, -6.0]))
    net = nn.Sequential(nn.Linear(F, cfg.hidden), nn.SiLU(), nn.Linear(cfg.hidden, cfg.hidden), nn.SiLU(), last)
    opt = torch.optim.AdamW(net.parameters(), cfg.lr, weight_decay=cfg.weight_decay, eps=cfg.adam_eps)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, cfg.epochs * len(train), eta_min=cfg.lr * 0.05)
    data = [(torch.from_numpy((e["x"] - mean) / std).float(), torch.from_numpy(e["base"]).float(),
             torch.from_numpy(e["y"]).float()) for e in train]

    def head_now() -> ClosedHead:
        w = {"mean": mean.astype(np.float64), "std": std.astype(np.float64), "layers": np.array(3)}
        lin = [m for m in net if isinstance(m, nn.Linear)]
        for i, m in enumerate(lin):
            w[f"W{i}"] = m.weight.detach().double().numpy().T.copy()
            w[f"b{i}"] = m.bias.detach().double().numpy().copy()
        return ClosedHead(w)

    best, best_score = head_now(), evaluate_examples(head_now(), val)["error_pct_mean"] if val else float("inf")
    for epoch in range(cfg.epochs):
        for j in rng.permutation(len(data)).tolist():
            x, base, y = data[j]
            out = net(x)
            mu, log_var = base + out[:, 0], out[:, 1].clamp(-12, 4)
            err = (mu - y).abs().mean()  # the metric's own shape: a few large misses do not steer the rest
            diff = y[:, None] - y[None, :]
            clear = diff.abs() > 1e-3
            margin = (0.5 * diff.abs()).clamp(max=cfg.rank_temperature)
            pair = torch.relu(margin - torch.sign(diff) * (mu[:, None] - mu[None, :])) / cfg.rank_temperature
            rank = (pair * clear).sum() / clear.sum().clamp(min=1)
            nll = 0.5 * (torch.exp(-log_var) * (mu.detach() - y) ** 2 + log_var).mean()
            loss = err * 10 + cfg.rank_weight * rank + 0.01 * nll
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        if val and (epoch % 10 == 9 or epoch == cfg.epochs - 1):
            score = evaluate_examples(head_now(), val)["error_pct_mean"]
            if score < best_score:
                best, best_score = head_now(), score
        if progress:
            progress(epoch + 1, cfg.epochs)
    if not val:
        best = head_now()
    best.w["x_lo"] = X.min(0).astype(np.float64)
    best.w["x_hi"] = X.max(0).astype(np.float64)
    # the variance is fitted apart from the correction: when validation keeps the zero-initialised head
    # (it usually does), the MLP's variance column is zero too and every plan got the same spread
    spread = fit_variance(best, examples)
    report = {s: {**evaluate_examples(best, [e for e in examples if e["split"] == s]), **spread.get(s, {})}
              for s in ("train", "val", "test")}
    report["composition_only"] = {s: evaluate_examples(ClosedHead(), [e for e in examples if e["split"] == s])
                                  for s in ("train", "val", "test")}
    return best, report


def fit_variance(head: ClosedHead, examples: list[dict], l2: float = 1e-2,
                 coverage: float = 0.95) -> dict[str, dict[str, float]]:
    """Fit ``head``'s variance model in place and return how it does per split.

    The log variance is linear in the normalised features (``var_w``, ``var_b``), fitted to the
    squared log errors of the head's step on the ``train`` split by the Gaussian likelihood (convex:
    Newton's method), its level then set so that ``coverage`` of the ``val`` split's plans (or
    train's) lie within two standard deviations. The step (the correction) is not touched.

    Returns:
        Per split with examples: ``rel_std_mean`` (the mean predicted relative std), ``rel_std_p10``/``p90``,
        ``rms_log_error``, ``within_2std`` (share of plans), ``spearman`` (the predicted std against the
        absolute log error, over plans).
    """
    F = len(head.w["mean"])
    head.w.setdefault("x_lo", np.full(F, -np.inf))
    head.w.setdefault("x_hi", np.full(F, np.inf))
    head.w["var_w"], head.w["var_b"] = np.zeros(F), np.array(0.0)

    def rows(split):
        part = [e for e in examples if e["split"] == split]
        if not part:
            return None
        z = np.concatenate([(np.clip(e["x"], head.w["x_lo"], head.w["x_hi"]) - head.w["mean"]) / head.w["std"]
                            for e in part])
        r2 = np.concatenate([(e["base"] + head(e["x"])[0] - e["y"]) ** 2 for e in part])
        return z, r2

    train = rows("train")
    if train is None:
        return {}
    z, r2 = train
    A = np.concatenate([np.ones((len(z), 1)), z], 1)
    r2f = np.maximum(r2, 1e-8)  # a plan priced exactly would pull its variance to -inf
    theta = np.zeros(F + 1)
    theta[0] = math.log(r2f.mean())
    reg = np.full(F + 1, l2)
    reg[0] = 0.0

    def loss(t):
        lv = A @ t
        return float(np.mean(lv + r2f * np.exp(-lv)) + (reg * t * t).sum())

    for _ in range(50):
        lv = A @ theta
        w = r2f * np.exp(-lv)
        grad = A.T @ (1 - w) / len(A) + 2 * reg * theta
        hess = (A * w[:, None]).T @ A / len(A) + np.diag(2 * reg + 1e-9)
        step = np.linalg.solve(hess, grad)
        t, now = 1.0, loss(theta)
        while loss(theta - t * step) > now and t > 1e-4:
            t /= 2
        theta = theta - t * step
        if np.abs(t * step).max() < 1e-7:
            break
    head.w["var_w"], head.w["var_b"] = theta[1:].copy(), np.array(theta[0])
    # the level: the smallest shift that puts ``coverage`` of the calibration split's plans within two
    # standard deviations (the errors are heavy-tailed: matching the mean variance left most plans' spread
    # far below their error)
    z_cal, r2_cal = rows("val") or train
    std = np.exp(0.5 * (head.w["var_b"].item() + z_cal @ head.w["var_w"]))
    ratio = float(np.quantile(np.sqrt(r2_cal) / (2 * std), coverage))
    head.w["var_b"] = np.array(head.w["var_b"].item() + 2 * math.log(max(ratio, 1e-12)))
    out = {}
    for split in ("train", "val", "test"):
        got = rows(split)
        if got is None:
            continue
        z, r2 = got
        std = np.exp(0.5 * np.clip(head.w["var_b"].item() + z @ head.w["var_w"], -12, 4))
        err = np.sqrt(r2)
        rank = np.argsort(np.argsort(std)), np.argsort(np.argsort(err))
        out[split] = {"rel_std_mean": float(std.mean()), "rel_std_p10": float(np.percentile(std, 10)),
                      "rel_std_p90": float(np.percentile(std, 90)), "rms_log_error": float(np.sqrt(r2.mean())),
                      "within_2std": float((err <= 2 * std).mean()),
                      "spearman": float(np.corrcoef(*rank)[0, 1]) if len(std) > 1 else float("nan")}
    return out


def save_head(head: ClosedHead, path, meta: dict) -> None:
    import json
    from pathlib import Path

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, meta=np.array(json.dumps(meta)), **head.w)


def load_head(path) -> tuple[ClosedHead, dict]:
    """The head and its meta of a file written by :func:`save_head`; any other file is a SpecError naming it."""
    import json
    import zipfile

    from hetpart.errors import SpecError

    wrong = SpecError(f"{path}: not a head written by 'hetpart costmodel train-closed'; give one (or train it "
                      "with 'hetpart costmodel train-closed --out FILE')")
    if not zipfile.is_zipfile(path):  # np.load would read a lone array or refuse a pickle in its own words
        raise wrong
    try:
        with np.load(path) as z:
            w = {k: z[k] for k in z.files if k != "meta"}
            meta = json.loads(str(z["meta"])) if "meta" in z.files else None
    except (ValueError, OSError, zipfile.BadZipFile, json.JSONDecodeError):
        raise wrong from None
    if not isinstance(meta, dict) or (w and not {"mean", "std", "layers"} <= set(w)):
        raise wrong  # another numpy archive, or a torch file (a zip too)
    return ClosedHead(w), meta


# --------------------------------------------------------------------------------------------- predictor
def default_head():
    """``$HETPART_CLOSED_HEAD`` or the head shipped with the package (a :class:`~pathlib.Path`)."""
    import os
    from pathlib import Path

    env = os.environ.get("HETPART_CLOSED_HEAD")
    return Path(env) if env else Path(__file__).parent / "checkpoints" / "closed.npz"


_HEADS: dict = {}
_OOD_MARGIN = 0.25
"""How far outside the training range (in the feature's training spread) a feature may go unflagged."""


def _predictor_base():
    from hetpart.costmodel.learned.predictor import LearnedPredictor

    return LearnedPredictor


class _SimRow:
    """A plan the simulator priced, in the shape ``LearnedPredictor._estimate`` reads."""

    def __init__(self, fits: bool, headroom: float, memory: dict, bubble: float) -> None:
        self.headroom_gb, self.fits, self.memory_gb, self.bubble = [headroom], [fits], [memory], [bubble]


def closed_predictor(model, cluster, workload=None, *, checkpoint=None):
    """Registry factory for ``learned`` (:mod:`hetpart.costmodel.predictor`)."""
    return ClosedPredictor(model, cluster, workload, checkpoint=checkpoint)


class ClosedPredictor(_predictor_base()):
    """The Predictor protocol over :func:`compose` and the learned :class:`ClosedHead`: many plans in
    one numpy pass. Memory is analytic. Plans it does not compose (ZeRO, uneven tensor-parallel
    splits, context parallelism, host offload) are priced by the simulator (``metrics["priced_by"]``)."""

    name = "learned"

    def __init__(self, model, cluster, workload=None, *, checkpoint=None, precision=None) -> None:
        from pathlib import Path

        from hetpart.errors import PlanError

        self.model, self.cluster, self.workload = model, cluster, workload
        path = Path(checkpoint) if checkpoint else default_head()
        key = str(path.resolve())
        if key not in _HEADS:
            if not path.is_file():
                raise PlanError(f"--predictor learned: no head at {path}; train one with "
                                "'hetpart costmodel train-closed' or set HETPART_CLOSED_HEAD")
            _HEADS[key] = load_head(path)
        self.head, meta = _HEADS[key]
        self.version = f"closed:{path.name}:epochs{meta.get('epochs', '?')}"
        self._train_gpus = meta.get("train_gpus")
        from hetpart.costmodel.learned.coverage import checkpoint_scale

        self._train_scale = checkpoint_scale(meta, path, Path(__file__).parent / "checkpoints" / "closed.npz")
        self._bands: dict[tuple[str, ...], tuple] = {}  # (:meth:`_step_band`)
        self._ctx: dict = {}
        self._sim = None
        self._precision = precision

    def _closed(self, precision: str) -> ClosedContext:
        if precision not in self._ctx:
            self._ctx[precision] = ClosedContext(self.model, self.cluster, precision)
        return self._ctx[precision]

    def _unvectorised_because(self, precision: str) -> str | None:
        """Why plans at ``precision`` went to the simulator though they compose (:meth:`_run`), else None."""
        try:
            if self._closed(precision).vectorised():
                return None
        except (KeyError, ValueError, ZeroDivisionError):
            return None  # such plans are refused, not priced
        return "clusters of more than 62 node groups and device types (its vectorised encoder)"

    def _simulated(self, plan: Plan):
        from hetpart.costmodel.simulator import Simulator
        from hetpart.errors import HetpartError

        if self._sim is None:
            self._sim = Simulator(self.model, self.cluster)
        try:
            est = self._sim.estimate(plan)
            metrics = self._sim.predict_metrics(plan, validate=False)
        except HetpartError as exc:
            return str(exc)
        row = _SimRow(est.fits_in_memory, est.memory_headroom_gb, metrics["peak_memory_gb"],
                      metrics["bubble_fraction"])
        return (math.log(est.step_time_s), -12.0, False, row, 0)

    def _estimate(self, plan: Plan, mu: float, log_var: float, ood: bool, batch, row: int):
        est = super()._estimate(plan, mu, log_var, ood, batch, row)
        if isinstance(batch, _SimRow):  # the simulator's own answer: no learned spread around it
            from dataclasses import replace

            est = replace(est, relative_std=0.0)
        return est

    def _simulator_band(self, plan: Plan, step: float) -> dict:
        """``metrics["uncertainty"]`` of a plan the simulator priced: no learned spread (``relative_std``
        None), the simulator's step-level error band over the plan's device types as the low and high step
        (:meth:`_step_band`; None where a device type has no step-level band), the shared device test."""
        lo, hi, band = self._step_band(plan)
        reasons = self.ood_reasons(plan)
        # signed_pct is predicted / measured - 1: a band [lo, hi] puts the measured step at step / (1 + x)
        return {"relative_std": None, "out_of_distribution": bool(reasons),
                "step_time_s_low": None if hi is None else step / (1 + hi / 100),
                "step_time_s_high": None if lo is None else step / (1 + lo / 100),
                "out_of_distribution_reasons": list(reasons), "source": "simulator", "band": band}

    def _ood(self, x: np.ndarray) -> np.ndarray:
        lo, hi = self.head.w.get("x_lo"), self.head.w.get("x_hi")
        if lo is None:
            return np.zeros(len(x), bool)
        spread = self.head.w["std"]
        return ((x < lo - _OOD_MARGIN * spread) | (x > hi + _OOD_MARGIN * spread)).any(1)

    def _run(self, plans):
        from hetpart.errors import PlanError

        out: list = [None] * len(plans)
        by_precision: dict[str, list[int]] = {}
        for i, plan in enumerate(plans):
            try:
                self._check(plan)
            except PlanError as exc:
                out[i] = str(exc)
                continue
            if not _composable(plan):
                out[i] = self._simulated(plan)
                continue
            by_precision.setdefault(plan.precision, []).append(i)
        for precision, idx in by_precision.items():
            try:
                cc = self._closed(precision)
                vectorised = cc.vectorised()
            except (KeyError, ValueError, ZeroDivisionError) as exc:
                for i in idx:
                    out[i] = f"plan: precision: {precision!r}: the learned predictor cannot price it ({exc}); use " \
                             "--predictor simulator"
                continue
            if not vectorised:  # more node groups than the vectorised encoder takes
                for i in idx:
                    out[i] = self._simulated(plans[i])
                continue
            comp = compose(cc, [plans[i] for i in idx])
            batch = comp.batch
            for j, msg in batch.errors.items():
                out[idx[j]] = msg
            if batch.num_plans:
                corr, log_var = self.head(comp.features)
                mu = np.log(comp.step) + corr
                ood = self._ood(comp.features)
                busy = np.bincount(batch.rep_plan, weights=comp.busy, minlength=batch.num_plans)
                span = np.bincount(batch.rep_plan, weights=comp.span, minlength=batch.num_plans)
                batch.bubble = (1 - busy / np.maximum(span, 1e-30)).clip(0, 1).tolist()
                for row, j in enumerate(batch.rows):
                    out[idx[j]] = (float(mu[row]), float(log_var[row]), bool(ood[row]), batch, row)
        return out, {}

    def predict_many(self, plans, workload=None, *, validate: bool = False) -> list:
        """The CONTRACT report of each plan (see :class:`LearnedPredictor`), with ``metrics["priced_by"]``:
        ``learned``, or ``simulator`` for the plans it defers."""
        out = super().predict_many(plans, workload, validate=validate)
        for plan, res in zip(plans, out):
            if not isinstance(res, str):
                why = _deferred_because(plan) or self._unvectorised_because(plan.precision)
                res.metrics["priced_by"] = self.name if why is None else "simulator"
                if why is not None:
                    res.metrics["priced_by_reason"] = f"the learned model does not compose {why}"
                    res.metrics["uncertainty"] = self._simulator_band(plan, res.step_time_s)
                if plan.offload != "none" and self._sim is not None:  # the simulator's host-memory report
                    res.metrics.update({k: v for k, v in self._sim.host_metrics(plan).items() if k != "host_fits"})
        return out
