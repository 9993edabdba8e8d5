"""The plan encoder as it was first written: one plan at a time, in Python (slow; the reference).

:func:`hetpart.costmodel.learned.encode.encode_plans` is the vectorised encoder the predictor uses;
``tests/test_learned_encode.py`` checks that both give the same arrays on random plans. Keep this
one as it is unless the features change (then change both, and retrain the surrogate).
"""

from __future__ import annotations

import math
from bisect import bisect_right

import numpy as np

from hetpart.plan import Plan

from hetpart.costmodel.features import log_scale
from hetpart.costmodel.learned.encode import DP_FEATURES, P2P_FEATURES, PLAN_FEATURES, PlanBatch, ScenarioContext, \
    _ls, _tp_link
from hetpart.costmodel.memory import chunk_flights

__all__ = ["encode_plans_reference"]


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


def encode_plans_reference(ctx: ScenarioContext, plans: list[Plan]) -> PlanBatch:
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
            chunks = tuple((s.layers, s.tp) for s in rep.stages[d::pp])
            flight = chunk_flights(ctx.tables, plan.schedule, d, pp, m, v, [(a, z, tp) for (a, z), tp in chunks],
                                   plan.recompute, plan.attention)
            key = (chunks, flight, plan.micro_batch, plan.recompute, plan.optimizer, plan.attention, plan.precision)
            hit = ctx._cache.get(key)
            if hit is None:
                gb = ctx.tables.device_memory_gb([(a, z, tp) for (a, z), tp in chunks], plan.micro_batch, flight,
                                                 plan.recompute, plan.optimizer, plan.attention,
                                                 precision=plan.precision)
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
            sh, whole = _run_params(ctx.tables, a, z)
            fsh, fwhole = _run_params(ctx.tables, a, a + 1)
            self._add_segment(i, plan, rep_ids, holders, a, z, (sh / tp_min + whole) * ctx.grad_bytes,
                              (fsh / tp_min + fwhole) * ctx.grad_bytes)
        owner = ctx.tables.owner
        if owner >= 0:
            def holders_of(u):
                return next(h for a, z, h in spans if a <= u < z)
            for u in ctx.tables.sharers:
                hu, ho = holders_of(u), holders_of(owner)
                if hu == ho:
                    continue
                if ctx.tables.kernels == "fused":  # Simulator._tied_pairs: one pair per replica
                    groups = [tuple(sorted({(r, k), (r, ko)})) for (r, k), (_, ko) in zip(hu, ho) if k != ko]
                else:
                    groups = [tuple(sorted(set(hu) | set(ho)))]
                for holders in groups:
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


def _run_params(tables, a: int, z: int) -> tuple[float, float]:
    """``Simulator._run_params``: a run's own parameters and, under Megatron's tied sync, a copy it holds
    apart from its owner."""
    sharded, whole = tables.params(a, z)
    if tables.kernels == "fused" and not a <= tables.owner < z:
        copy_sharded, copy_whole = tables.shared(a, z)
        sharded, whole = sharded + copy_sharded, whole + copy_whole
    return sharded, whole
