"""The surrogate: a decomposed graph network that prices a plan from unit, device and link inputs.

It does not read the simulator's step time or stage totals. It predicts the pieces and adds them up
(the decomposition that NeuSight and Lumos use), with a structure every pipeline shares:

1. **Unit x configuration messages** (unit node + device-pool node + the stage's tensor-parallel,
   micro-batch and recompute settings): an MLP predicts per unit the multipliers of its roofline
   terms, so the forward and backward seconds of a unit on that device are learned, as are its
   tensor-parallel all-reduce seconds. A stage aggregates its units by a sum (prefix sums: O(1) per
   stage).
2. **Stage -> stage messages**: an MLP prices the activation transfer between consecutive stages
   from its bytes and the link between their nodes.
3. **Pipeline composition**, differentiable: per replica, ``m * period + (sum of stage times - period
   + 2 * transfers) / v`` with the period the slowest device's work or, for 1F1B, the slowest cycle
   through the stages below (in-flight micro-batches over the round trip); the last backward of each
   stage follows from it.
4. **Gradient rings**: an MLP prices each data-parallel all-reduce from its bytes and its ring
   (members, nodes, the links between them); a ring starts once every holder's backward has passed
   its units and rings of one device group run one after another.
5. The optimizer moves a learned number of bytes per parameter held over HBM bandwidth.
6. A **plan-level head** reads the plan's shape and the composed terms and adds a log correction
   and a log variance: the schedule effects the closed form misses, and the model's uncertainty.

Output: log step time (seconds) and its log variance per plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from hetpart.costmodel.features import POOL_FEATURES, UNIT_FEATURES
from hetpart.costmodel.learned.encode import CONFIG_FEATURES, DP_FEATURES, P2P_FEATURES, PLAN_FEATURES, PlanBatch

__all__ = ["Surrogate", "SurrogateConfig", "TensorBatch", "to_tensors"]

_COMPOSED = 8
"""Composed terms the plan-level head reads besides PLAN_FEATURES."""
_BUCKET_MIN_REPLICAS = 256
"""Batches of at least this many replicas are composed in buckets of similar pipeline depth."""


@dataclass(frozen=True)
class SurrogateConfig:
    """Sizes of the surrogate's networks."""

    hidden: int = 64
    """Width of the unit network and the plan-level head."""
    edge_hidden: int = 32
    """Width of the link and ring networks."""


def _mlp(inp: int, hidden: int, out: int, init_bias: list[float] | None = None) -> nn.Sequential:
    last = nn.Linear(hidden, out)
    nn.init.zeros_(last.weight)
    with torch.no_grad():
        last.bias.copy_(torch.tensor(init_bias or [0.0] * out))
    return nn.Sequential(nn.Linear(inp, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(), last)


class TensorBatch(dict):
    """A :class:`PlanBatch` as torch tensors (attribute access)."""

    __getattr__ = dict.__getitem__


def to_tensors(b: PlanBatch, device: str | torch.device | None = None) -> TensorBatch:
    """Convert a :class:`PlanBatch` (numpy) to tensors (on ``device``, default the CPU)."""
    out = TensorBatch()
    for name, value in vars(b).items():
        if hasattr(value, "dtype"):
            t = torch.from_numpy(value)
            t = t.float() if t.is_floating_point() else t
            out[name] = t.to(device) if device is not None else t
        else:
            out[name] = value
    return out


def _scatter_max(values: torch.Tensor, index: torch.Tensor, size: int, fill: float = 0.0) -> torch.Tensor:
    base = torch.full((size,), fill, dtype=values.dtype, device=values.device)
    if values.numel() == 0:
        return base
    return base.scatter_reduce(0, index, values, "amax", include_self=True)


def _ring_scan(slots, seg_groups, seg_first, seg_last, t, t_last, num_groups: int, num_plans: int):
    """:meth:`Surrogate._rings`' scan in numpy (float32, the same operations in the same order)."""
    import numpy as np

    free = np.zeros(num_groups + 1, seg_first.dtype)
    dp_end = np.zeros(num_plans, seg_first.dtype)
    for j in range(slots.shape[1]):
        col = slots[:, j]
        live = np.nonzero(col >= 0)[0]
        seg = col[live]
        groups = seg_groups[seg]
        start = np.maximum(seg_first[seg], free[groups].max(1))
        end = np.maximum(start + t[seg], seg_last[seg] + t_last[seg])
        real = groups != num_groups
        free[groups[real]] = np.broadcast_to(end[:, None], groups.shape)[real]
        dp_end[live] = np.maximum(dp_end[live], end)
    return dp_end


class Surrogate(nn.Module):
    """Predicts ``(log step seconds, log variance)`` for every plan of a :class:`TensorBatch`."""

    def __init__(self, config: SurrogateConfig = SurrogateConfig()) -> None:
        super().__init__()
        self.config = config
        fu = len(UNIT_FEATURES) + len(POOL_FEATURES) + len(CONFIG_FEATURES)
        # multipliers of: flop_f, mem_f, flop_b, mem_b, tp_bytes_f, tp_latency_f, tp_bytes_b, tp_latency_b
        self.unit = _mlp(fu, config.hidden, 8, [0.3, 1.0, 0.3, 1.6, 0.0, 0.0, 0.0, 0.0])
        self.p2p = _mlp(len(P2P_FEATURES), config.edge_hidden, 2)
        self.ring = _mlp(len(DP_FEATURES), config.edge_hidden, 2)
        self.log_optimizer_bytes = nn.Parameter(torch.tensor(math.log(20.0)))
        self.head = _mlp(len(PLAN_FEATURES) + _COMPOSED, config.hidden, 2, [0.0, -6.0])

    # ------------------------------------------------------------------ pieces
    def unit_times(self, b: TensorBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Prefix sums ``[C, U+1]`` of forward and backward seconds per unit and configuration."""
        mult = torch.exp(self.unit(b.unit_x).clamp(-8, 8))
        base = b.unit_base
        fwd = mult[..., 0] * base[..., 0] + mult[..., 1] * base[..., 2] + mult[..., 4] * base[..., 3] \
            + mult[..., 5] * base[..., 4]
        bwd = mult[..., 2] * base[..., 1] + mult[..., 3] * base[..., 2] + mult[..., 6] * base[..., 3] \
            + mult[..., 7] * base[..., 4]
        zero = torch.zeros(fwd.shape[0], 1, device=fwd.device)
        return torch.cat([zero, fwd.cumsum(1)], 1), torch.cat([zero, bwd.cumsum(1)], 1)

    def _pipelines(self, b: TensorBatch, pf: torch.Tensor, pb: torch.Tensor):
        """Per replica: makespan, last backward per stage ``[R, K]``, period, summed stage time and
        the shape terms. Large batches go in buckets of replicas with similar depth (less padding;
        every row's arithmetic is the same as in one block)."""
        cfg, a, z = b.stage_cfg, b.stage_a, b.stage_z
        f = pf[cfg, z] - pf[cfg, a]
        bw = pb[cfg, z] - pb[cfg, a]
        uid = b.get("p2p_uid")
        if uid is not None and b.p2p_first.numel():
            # each distinct transfer once (the encoder's dedup), then gathered; padding has no bytes
            flat = b.p2p_x.reshape(-1, b.p2p_x.shape[-1])[b.p2p_first]
            mult = torch.exp(self.p2p(flat).clamp(-8, 8))
        else:
            uid, mult = None, torch.exp(self.p2p(b.p2p_x).clamp(-8, 8))
        R, K = b.rep_stages.shape
        if R < _BUCKET_MIN_REPLICAS or K <= 4:
            return self._pipeline_rows(b, f, bw, mult, uid, None, K)
        depth = (b.rep_stages >= 0).sum(1)
        dv = f.device
        makespan, period, total = (torch.zeros(R, device=dv), torch.zeros(R, device=dv),
                                   torch.zeros(R, device=dv))
        last_bwd, shape = torch.zeros(R, K, device=dv), torch.zeros(R, 2, device=dv)
        lo, w = 0, 4
        while lo < K:
            w = min(w, K)
            rows = torch.nonzero((depth > lo) & (depth <= w)).squeeze(1)
            if rows.numel():
                ms, lb, pe, tt, sh = self._pipeline_rows(b, f, bw, mult, uid, rows, w)
                makespan = makespan.index_put((rows,), ms)
                period = period.index_put((rows,), pe)
                total = total.index_put((rows,), tt)
                shape = shape.index_put((rows,), sh)
                last_bwd = last_bwd.index_put((rows,), torch.nn.functional.pad(lb, (0, K - w)))
            lo, w = w, 2 * w
        return makespan, last_bwd, period, total, shape

    def _pipeline_rows(self, b: TensorBatch, f, bw, mult, uid, rows, K: int):
        def pick(x, cols=None):
            x = x if rows is None else x[rows]
            return x if cols is None else x[:, :cols]

        rep_stages = pick(b.rep_stages, K)
        mask = rep_stages >= 0
        idx = rep_stages.clamp(min=0)
        F = f[idx] * mask
        B = bw[idx] * mask
        T = F + B
        if uid is not None:
            m_ = mult[pick(uid, K - 1).clamp(min=0)]
        else:
            m_ = pick(mult, K - 1)
        C = (m_ * pick(b.p2p_base, K - 1)).sum(-1)  # [R, K-1]
        C = torch.cat([C, torch.zeros(C.shape[0], 1, device=C.device)], 1)[:, :T.shape[1]]
        pp = mask.sum(1)
        v = pick(b.rep_v)
        m = pick(b.rep_m)
        gp = pick(b.rep_gpipe)
        # period: the slowest pipeline device's work per micro-batch
        period = T.max(1).values
        inter = torch.nonzero(v > 1).squeeze(1)
        if inter.numel():  # a device runs several virtual stages: sum them per device
            dev = (torch.arange(K, device=T.device)[None, :] % (pp[inter] / v[inter]).long().clamp(min=1)[:, None])
            per_dev = torch.zeros_like(T[inter]).scatter_add(1, dev, T[inter])
            period = period.index_put((inter,), per_dev.max(1).values)
        gpipe = F.max(1).values + B.max(1).values
        period = torch.where(gp, torch.maximum(period, gpipe), period)
        # 1F1B: micro-batches in flight (pp - k) bound the round trip through the stages below k
        suffix_T = T.flip(1).cumsum(1).flip(1)
        suffix_C = C.flip(1).cumsum(1).flip(1)
        k = torch.arange(K, device=T.device)[None, :].float()
        flight = (pp[:, None] - k).clamp(min=1)
        cycle = (suffix_T + 2 * suffix_C) / flight
        limits = mask & (m[:, None] > flight) & ~gp[:, None] & (v[:, None] == 1)
        period = torch.maximum(period, torch.where(limits, cycle, torch.zeros_like(cycle)).max(1).values)
        total = T.sum(1)
        makespan = m * period + (total - period + 2 * C.sum(1)) / v
        before = torch.cat([torch.zeros(T.shape[0], 1, device=T.device), (B + C).cumsum(1)[:, :-1]], 1)
        last_bwd = makespan[:, None] - before
        devices = (pp / v).clamp(min=1)
        shape = torch.stack([torch.log(period * devices / total.clamp(min=1e-12)),
                             torch.log1p(2 * C.sum(1) / total.clamp(min=1e-12))], 1)
        return makespan, last_bwd, period, total, shape

    def ring_times(self, b: TensorBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Seconds of each gradient all-reduce ``[G]`` and of its last bucket alone ``[G]``."""
        mult = torch.exp(self.ring(b.seg_x).clamp(-8, 8))
        t = mult[:, 0] * b.seg_base[:, 0] + mult[:, 1] * b.seg_base[:, 1]
        return t, mult[:, 0] * b.seg_base[:, 0] * b.seg_base[:, 2] + mult[:, 1] * b.seg_base[:, 1]

    def _rings(self, b: TensorBatch, pb: torch.Tensor, last_bwd: torch.Tensor, num_plans: int) -> torch.Tensor:
        if b.seg_x.shape[0] == 0:
            return torch.zeros(num_plans, device=pb.device)
        t, t_last = self.ring_times(b)
        done = last_bwd[b.hold_rep, b.hold_k]
        c = b.hold_cfg
        whole = b.hold_hi < 0
        hi, lo = b.hold_hi.clamp(min=0), b.hold_lo.clamp(min=0)
        start = pb[c, b.hold_first]
        first = torch.where(whole, done, done - (pb[c, hi] - start))
        last = torch.where(whole, done, done - (pb[c, lo] - start))
        G = b.seg_x.shape[0]
        seg_first = _scatter_max(first, b.hold_seg, G)
        seg_last = _scatter_max(last, b.hold_seg, G)
        # rings start in order of readiness; rings sharing a device group run one after another
        order = torch.argsort(seg_first.detach(), stable=True)
        order = order[torch.argsort(b.seg_plan[order], stable=True)]
        plan_of = b.seg_plan[order]
        counts = torch.bincount(plan_of, minlength=num_plans)
        offsets = torch.cumsum(counts, 0) - counts
        rank = torch.arange(G, device=order.device) - offsets[plan_of]
        slots = torch.full((num_plans, int(counts.max())), -1, dtype=torch.long, device=order.device)
        slots[plan_of, rank] = order
        if not torch.is_grad_enabled() and t.device.type == "cpu":  # inference: the same scan in numpy (no autograd, less overhead)
            return torch.from_numpy(_ring_scan(slots.numpy(), b.seg_groups.numpy(), seg_first.numpy(),
                                               seg_last.numpy(), t.numpy(), t_last.numpy(), b.num_groups, num_plans))
        free = torch.zeros(b.num_groups + 1, device=t.device)
        dp_end = torch.zeros(num_plans, device=t.device)
        for j in range(slots.shape[1]):
            seg = slots[:, j]
            live = seg >= 0
            seg = seg[live]
            groups = b.seg_groups[seg]
            start = torch.maximum(seg_first[seg], free[groups].max(1).values)
            end = torch.maximum(start + t[seg], seg_last[seg] + t_last[seg])
            pad = groups == b.num_groups
            free = free.scatter(0, groups[~pad], end[:, None].expand_as(groups)[~pad])
            dp_end = dp_end.index_put((torch.nonzero(live).squeeze(1),), torch.maximum(dp_end[live], end))
        return dp_end

    # ------------------------------------------------------------------ the plan
    def forward(self, b: TensorBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """``(log_step_s [N], log_variance [N])``."""
        out = self.details(b)
        return out["log_step_s"], out["log_variance"]

    def details(self, b: TensorBatch) -> dict[str, torch.Tensor]:
        """``log_step_s``, ``log_variance`` and the composed ``bubble_fraction`` (idle share of the
        pipelines' makespan, averaged over replicas) per plan."""
        n = b.num_plans
        pf, pb = self.unit_times(b)
        makespan, last_bwd, period, total, shape = self._pipelines(b, pf, pb)
        pipe_end = _scatter_max(makespan, b.rep_plan, n)
        dp_end = self._rings(b, pb, last_bwd, n)
        sync = torch.maximum(pipe_end, dp_end)
        opt = (b.opt_base * torch.exp(self.log_optimizer_bytes)).max(1).values
        opt = _scatter_max(opt, b.rep_plan, n)
        step = sync + opt
        busy = _scatter_max(b.rep_m * period, b.rep_plan, n)
        fill = _scatter_max(total, b.rep_plan, n)
        eps = 1e-12
        composed = torch.stack([
            torch.log((dp_end + eps) / (pipe_end + eps)).clamp(-5, 5), torch.log((busy + eps) / (pipe_end + eps)),
            torch.log((fill + eps) / (pipe_end + eps)), torch.log((opt + eps) / (step + eps)) / 5,
            torch.log(step + eps) / 10, (dp_end > pipe_end).float(),
            _scatter_max(shape[:, 0], b.rep_plan, n), _scatter_max(shape[:, 1], b.rep_plan, n)], 1)
        out = self.head(torch.cat([b.plan_x, composed.detach()], 1))
        devices = ((b.rep_stages >= 0).sum(1) / b.rep_v).clamp(min=1)
        idle = 1 - (b.rep_m * total / devices / (makespan + eps)).clamp(0, 1)
        bubble = torch.zeros(n, device=idle.device).index_add(0, b.rep_plan, idle) / torch.bincount(b.rep_plan, minlength=n).clamp(min=1)
        return {"log_step_s": torch.log(step + eps) + out[:, 0], "log_variance": out[:, 1].clamp(-12, 4),
                "bubble_fraction": bubble}
