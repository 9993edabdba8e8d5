"""The surrogate: a decomposed graph network that prices a plan from unit, device and link inputs.

It does not read the simulator's step time or stage totals. It predicts the pieces and adds them up
(the decomposition that NeuSight and Lumos use); the pieces are analytic leaf terms
(:mod:`hetpart.costmodel.learned.physics`: per unit, per transfer, per all-reduce) times learned
corrections, so the networks learn residuals rather than re-learning the physics:

1. **Unit x configuration messages** (unit node + device-pool node + the stage's tensor-parallel,
   micro-batch and recompute settings): an MLP predicts per unit the log corrections of its forward
   and backward compute seconds (efficiency curve, activation traffic, per-operator host cost) and of
   its tensor-parallel all-reduce seconds. A stage aggregates its units by a sum (prefix sums: O(1)
   per stage).
2. **Stage -> stage messages**: an MLP corrects each activation transfer's seconds (the achieved
   link, its NICs shared among the pipeline transfers that cross a node at once). Sends block their
   sender (Megatron-style): a stage's forward ends after its send, its backward after the gradient
   sent back.
3. **Pipeline composition**: the stage seconds run through the schedule's dependencies (1F1B, GPipe,
   interleaved: :func:`_exact_pipelines`) for the makespan and each stage's last backward. Gradients
   flow through a differentiable closed form, ``m * period + (sum of stage times - period) / v`` with
   the period the slowest device's work or, for 1F1B, the slowest cycle through the stages below,
   whose value the schedule's replaces (straight-through).
4. **Gradient rings**: an MLP corrects each data-parallel all-reduce's seconds and its last bucket's
   (NICs shared among the rings crossing a node). A ring starts once every holder's backward has
   passed its units (before the blocking send) and ends no sooner than the last bucket after the
   last unit; over TCP NICs it waits for the backward that holds it and is not overlapped; rings of
   one device group run one after another.
5. The optimizer step: its HBM bytes over bandwidth, times a learned scale.
6. A **plan-level head** reads the plan's shape and the composed terms and adds a log correction
   and a log variance: what the composition misses, and the model's uncertainty.

With every correction at zero (the initialisation) the composition is the simulator's step
(``tests/test_learned_physics.py``); training on simulator labels keeps it there, training on
measured runs moves the corrections where measurements disagree.

Output: log step time (seconds) and its log variance per plan.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from hetpart.errors import HetpartError
from hetpart.costmodel.features import POOL_FEATURES, UNIT_FEATURES
from hetpart.costmodel.learned.encode import CONFIG_FEATURES, DP_FEATURES, P2P_FEATURES, PLAN_FEATURES, PlanBatch

__all__ = ["Surrogate", "SurrogateConfig", "TensorBatch", "to_tensors"]

_COMPOSED = 8
"""Composed terms the plan-level head reads besides PLAN_FEATURES."""


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


_SCHEDULE_NAMES = ("1f1b", "gpipe", "interleaved")


def _wavefront_tables(name: str, pp: int, m: int, v: int) -> tuple:
    """Per schedule shape: the wavefronts, each operation's duration slot (``kind * K + stage``) and
    the flat operation of each virtual stage's last backward (cached)."""
    key = (name, pp, m, v)
    hit = _WAVE_CACHE.get(key)
    if hit is None:
        from hetpart.costmodel.schedule import BWD, _layout, _levels

        lay = _layout(name, pp, m, v)
        K, n = pp * v, lay.kind.shape[1]
        slot = (lay.kind * K + lay.stage).ravel()
        last = np.zeros(K, np.int64)
        for d in range(pp):
            for j in range(n):
                if lay.kind[d, j] == BWD:
                    last[int(lay.stage[d, j])] = d * n + j
        if len(_WAVE_CACHE) > 512:
            _WAVE_CACHE.clear()
        hit = _WAVE_CACHE[key] = (_levels(name, pp, m, v), slot, last)
    return hit


_WAVE_CACHE: dict = {}
_WAVEFRONT_MIN_STAGE_ROWS = 512
"""Distinct replicas x virtual stages of one shape from which the wavefront pass beats the scalar one
(measured: a wavefront costs about as much as 40-50 scalar operations)."""


def _exact_pipelines(Fb: np.ndarray, Bb: np.ndarray, depth: np.ndarray, m: np.ndarray, v: np.ndarray,
                     sched: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Makespan ``[R]`` and last backward end per virtual stage ``[R, K]`` of each replica's pipeline,
    run through the schedule (the dependencies of :mod:`hetpart.costmodel.schedule`) with the given
    per-micro-batch stage seconds (blocking sends included, so transfers add no delay).

    Replicas of one shape (depth, micro-batches, interleave, schedule) run together: one pass over
    the schedule's wavefronts, numpy over the replicas and the operations of each wavefront; a lone
    replica of a shallow pipeline takes the scalar pass. Equal replicas run once. Where a schedule
    refuses a shape: NaN (the caller keeps the closed form)."""
    from hetpart.costmodel.schedule import pipeline_summary

    R, K = Fb.shape
    makespan = np.full(R, np.nan)
    last = np.zeros((R, K))
    groups: dict = {}
    for r, key in enumerate(zip(depth.tolist(), m.tolist(), v.tolist(), sched.tolist())):
        groups.setdefault(key, []).append(r)
    for (k, mm, vv, sc), rows in groups.items():
        k, mm, vv, sc = int(k), int(mm), int(vv), int(sc)
        name = _SCHEDULE_NAMES[sc]
        rows = np.asarray(rows)
        F, B = Fb[rows, :k], Bb[rows, :k]
        # equal replicas once
        if len(rows) > 1:
            uniq, inv = np.unique(np.concatenate([F, B], 1), axis=0, return_inverse=True)
            inv = inv.reshape(-1)
            F, B = uniq[:, :k], uniq[:, k:]
        else:
            uniq, inv = F, np.zeros(1, np.int64)
        pp = k // max(vv, 1)
        try:
            if pp == 1 and vv == 1:
                ms = mm * (F[:, 0] + B[:, 0])
                lb = ms[:, None]
            elif len(uniq) * k < _WAVEFRONT_MIN_STAGE_ROWS:  # scalar: ~0.1 us an operation
                out = [pipeline_summary(f.tolist(), b.tolist(), [0.0] * (k - 1), name, mm, vv) for f, b in zip(F, B)]
                ms, lb = np.array([o[0] for o in out]), np.array([o[1] for o in out])
            else:  # numpy over a wavefront's operations and the replicas: ~5 us a wavefront
                levels, slot, lastpos = _wavefront_tables(name, pp, mm, vv)
                dur = np.concatenate([F, B], 1)[:, slot]
                n = dur.shape[1]
                end = np.zeros((n + 1, len(uniq)))
                durT = np.ascontiguousarray(dur.T)
                for ids, prev, dep in levels:
                    end[ids] = np.maximum(end[prev], end[dep]) + durT[ids]
                ms = end[:-1].max(0)
                lb = end[lastpos].T
        except (ValueError, IndexError, ZeroDivisionError, HetpartError):
            continue
        makespan[rows] = ms[inv]
        last[rows, :k] = lb[inv]
    return makespan, last


class Surrogate(nn.Module):
    """Predicts ``(log step seconds, log variance)`` for every plan of a :class:`TensorBatch`."""

    def __init__(self, config: SurrogateConfig = SurrogateConfig()) -> None:
        super().__init__()
        self.config = config
        fu = len(UNIT_FEATURES) + len(POOL_FEATURES) + len(CONFIG_FEATURES)
        # corrections (log multipliers) of: forward compute, backward compute, TP forward, TP backward
        self.unit = _mlp(fu, config.hidden, 4)
        # of each pipeline transfer (and a spare output kept at zero)
        self.p2p = _mlp(len(P2P_FEATURES), config.edge_hidden, 2)
        # of each gradient all-reduce: the whole run, its last bucket
        self.ring = _mlp(len(DP_FEATURES), config.edge_hidden, 2)
        self.log_optimizer_scale = nn.Parameter(torch.tensor(0.0))
        self.head = _mlp(len(PLAN_FEATURES) + _COMPOSED, config.hidden, 2, [0.0, -6.0])

    # ------------------------------------------------------------------ pieces
    def unit_times(self, b: TensorBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Prefix sums ``[C, U+1]`` of forward and backward seconds (compute + tensor-parallel) per unit
        and configuration: the analytic leaf terms times the unit network's corrections."""
        mult = torch.exp(self.unit(b.unit_x).clamp(-8, 8))
        base = b.unit_exact
        fwd = mult[..., 0] * base[..., 0] + mult[..., 2] * base[..., 2]
        bwd = mult[..., 1] * base[..., 1] + mult[..., 3] * base[..., 3]
        zero = torch.zeros(fwd.shape[0], 1, device=fwd.device)
        return torch.cat([zero, fwd.cumsum(1)], 1), torch.cat([zero, bwd.cumsum(1)], 1)

    def _transfers(self, b: TensorBatch) -> torch.Tensor:
        """Seconds of each pipeline transfer ``[R, K-1]`` (0 padded)."""
        uid = b.get("p2p_uid")
        if uid is not None and b.p2p_first.numel():
            # each distinct transfer once (the encoder's dedup), then gathered; padding has no seconds
            flat = b.p2p_x.reshape(-1, b.p2p_x.shape[-1])[b.p2p_first]
            mult = torch.exp(self.p2p(flat)[:, 0].clamp(-8, 8))[uid.clamp(min=0)]
        else:
            mult = torch.exp(self.p2p(b.p2p_x)[..., 0].clamp(-8, 8))
        return mult * b.p2p_exact

    def _pipelines(self, b: TensorBatch, pf: torch.Tensor, pb: torch.Tensor):
        """Per replica: makespan, last backward per stage ``[R, K]``, the blocking receive-side send
        per stage ``[R, K]``, period, summed stage time and the shape terms.

        Sends block their sender (Megatron-style): a stage's forward ends after it sent its
        activations, its backward after it sent the gradients back. The makespan and the last
        backwards come from running the schedule on the stage seconds; gradients flow through the
        closed form ``m * period + (sum of stage times - period) / v`` (straight-through: its value
        is replaced by the schedule's)."""
        cfg, a, z = b.stage_cfg, b.stage_a, b.stage_z
        f = pf[cfg, z] - pf[cfg, a]
        bw = pb[cfg, z] - pb[cfg, a]
        x = b.get("stage_x")
        if x is not None and x.numel():  # sharded collectives the stage's compute does not hide (ZeRO 2-3)
            f, bw = f + x[:, 0], bw + x[:, 1]
        R, K = b.rep_stages.shape
        mask = b.rep_stages >= 0
        idx = b.rep_stages.clamp(min=0)
        F, B = f[idx] * mask, bw[idx] * mask
        C = self._transfers(b)[:, :K - 1] if K > 1 else torch.zeros(R, 0, device=F.device)
        zero = torch.zeros(R, 1, device=F.device)
        send_f = torch.cat([C, zero], 1)[:, :K] * mask
        send_b = torch.cat([zero, C], 1)[:, :K] * mask
        Fb, Bb = F + send_f, B + send_b
        T = Fb + Bb
        pp = mask.sum(1)
        v, m, gp = b.rep_v, b.rep_m, b.rep_gpipe
        period = T.max(1).values
        inter = torch.nonzero(v > 1).squeeze(1)
        if inter.numel():  # a device runs several virtual stages: sum them per device
            dev = (torch.arange(K, device=T.device)[None, :] % (pp[inter] / v[inter]).long().clamp(min=1)[:, None])
            per_dev = torch.zeros_like(T[inter]).scatter_add(1, dev, T[inter])
            period = period.index_put((inter,), per_dev.max(1).values)
        gpipe = Fb.max(1).values + Bb.max(1).values
        period = torch.where(gp, torch.maximum(period, gpipe), period)
        suffix_T = T.flip(1).cumsum(1).flip(1)
        k = torch.arange(K, device=T.device)[None, :].float()
        flight = (pp[:, None] - k).clamp(min=1)
        limits = mask & (m[:, None] > flight) & ~gp[:, None] & (v[:, None] == 1)
        period = torch.maximum(period, torch.where(limits, suffix_T / flight, torch.zeros_like(T)).max(1).values)
        total = T.sum(1)
        closed = m * period + (total - period) / v
        before = torch.cat([torch.zeros(R, 1, device=T.device), Bb.cumsum(1)[:, :-1]], 1)
        closed_last = closed[:, None] - before
        sched = b.get("rep_sched")
        if sched is None:
            sched = gp.long()
        ms, last = _exact_pipelines(Fb.detach().cpu().double().numpy(), Bb.detach().cpu().double().numpy(),
                                    pp.cpu().numpy(), m.cpu().numpy(), v.cpu().numpy(), sched.cpu().numpy())
        ok = torch.from_numpy(~np.isnan(ms)).to(T.device)
        ms_t = torch.from_numpy(np.nan_to_num(ms)).to(T.device, T.dtype)
        last_t = torch.from_numpy(last).to(T.device, T.dtype)
        makespan = torch.where(ok, closed + (ms_t - closed).detach(), closed)
        last_bwd = torch.where(ok[:, None], closed_last + (last_t - closed_last).detach(), closed_last) * mask
        devices = (pp / v).clamp(min=1)
        shape = torch.stack([torch.log(period * devices / total.clamp(min=1e-12)),
                             torch.log1p(2 * C.sum(1) / total.clamp(min=1e-12))], 1)
        return makespan, last_bwd, send_b, period, total, shape

    def ring_times(self, b: TensorBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Seconds of each gradient all-reduce ``[G]`` and of its last bucket alone ``[G]``."""
        mult = torch.exp(self.ring(b.seg_x).clamp(-8, 8))
        return mult[:, 0] * b.seg_exact, mult[:, 1] * b.seg_last_exact

    def _rings(self, b: TensorBatch, pb: torch.Tensor, last_bwd: torch.Tensor, send_b: torch.Tensor,
               num_plans: int) -> torch.Tensor:
        if b.seg_x.shape[0] == 0:
            return torch.zeros(num_plans, device=pb.device)
        t, t_last = self.ring_times(b)
        c = b.hold_cfg
        whole = b.hold_hi < 0
        # a stage's gradients are ready before the blocking send that ends its last backward
        done = last_bwd[b.hold_rep, b.hold_k] - torch.where(whole, torch.zeros_like(t[:1]),
                                                            send_b[b.hold_rep, b.hold_k])
        hi, lo = b.hold_hi.clamp(min=0), b.hold_lo.clamp(min=0)
        start = pb[c, b.hold_first]
        first = torch.where(whole, done, done - (pb[c, hi] - start))
        last = torch.where(whole, done, done - (pb[c, lo] - start))
        G = b.seg_x.shape[0]
        seg_first = _scatter_max(first, b.hold_seg, G)
        seg_last = _scatter_max(last, b.hold_seg, G)
        tcp = b.seg_tcp.bool()
        if bool(tcp.any()):  # over TCP: the whole all-reduce after the backward that holds it
            seg_first = torch.where(tcp, seg_last, seg_first)
            t_last = torch.where(tcp, t, t_last)
        # rings start in order of readiness; rings sharing a device group run one after another
        order = torch.argsort(seg_first.detach(), stable=True)
        skip = b.get("seg_skip")
        if skip is not None and bool(skip.any()):  # reduce-scattered inside the backward (ZeRO 2-3)
            order = order[~skip.bool()[order]]
        after = b.get("seg_after")
        if after is not None and bool(after.any()):  # issued after the data-parallel sync (Simulator._job_order)
            order = order[torch.argsort(after.long()[order], stable=True)]
        order = order[torch.argsort(b.seg_plan[order], stable=True)]
        plan_of = b.seg_plan[order]
        counts = torch.bincount(plan_of, minlength=num_plans)
        offsets = torch.cumsum(counts, 0) - counts
        rank = torch.arange(len(order), device=order.device) - offsets[plan_of]
        slots = torch.full((num_plans, int(counts.max()) if len(order) else 0), -1, dtype=torch.long,
                           device=order.device)
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
        makespan, last_bwd, send_b, period, total, shape = self._pipelines(b, pf, pb)
        pipe_end = _scatter_max(makespan, b.rep_plan, n)
        dp_end = self._rings(b, pb, last_bwd, send_b, n)
        sync = torch.maximum(pipe_end, dp_end)
        opt = b.opt_exact * torch.exp(self.log_optimizer_scale)
        if b.get("gather_exposed") is not None:  # hidden behind the next forward and the slowest replica's lag
            opt = opt + torch.relu(b.gather_exposed - (pipe_end[b.rep_plan] - makespan)[:, None])
        opt = _scatter_max(opt.max(1).values, b.rep_plan, n)
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
