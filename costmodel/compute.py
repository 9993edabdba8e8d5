"""Per-unit compute and tensor-parallel communication times of one micro-batch on one device type.

These are the primitives planners call in their inner loops: pure functions of numbers, O(units)
(vectorized), returning per-unit arrays that callers prefix-sum to cost any stage ``[first, last)``
in O(1).

Compute: ``flops * micro_batch / tp / (peak * eff)`` per unit, with the efficiency of
:mod:`hetpart.costmodel.efficiency` (per architecture and precision; a head whose vocabulary is not
16-byte aligned runs its product at :data:`~hetpart.costmodel.efficiency.UNALIGNED_FRACTION` of the
16-bit peak at most), plus the memory-bound kernels' ``act_traffic * act_bytes / hbm`` (twice that in
the backward), plus a fixed host cost per operator the unit runs (:data:`OPS_PER_UNIT` operators at
``curve.host_us_per_op`` each: kernel launches, PyTorch dispatch, autograd; it is what makes
micro-batch 1 slower per sample than 4). The backward includes the recomputed forward of the
recompute mode, memory-bound share and operators too: all of it under full recompute, the attention
core's share of the activations under selective. Under fused attention (flash / SDPA) the ``a s^2``
score matrix is neither stored nor streamed through HBM, so the memory-bound term uses the
activations without it, and the backward always recomputes the scores (half the attention core's
FLOPs), which makes selective recomputation a no-op.

Tensor parallelism (Megatron-LM; sequence parallelism assumed: its all-gather + reduce-scatter pair
moves the same bytes as the all-reduce it replaces) costs two all-reduces of ``s b h`` elements per
block in the forward and two in the backward, one per embedding or head, plus the forward's again
under full recompute; they are not overlapped with compute (Megatron 2022).
"""

from __future__ import annotations

import numpy as np

from hetpart.graph.model_graph import ModelGraph
from hetpart.hardware import GPUSpec

from hetpart.costmodel.efficiency import (UNALIGNED_FRACTION, EfficiencyCurve, aligned, curve_for,
                                         effective_precision, unit_gemm_width)

__all__ = ["unit_compute_s", "unit_attention_core_s", "CP_OPS_PER_STEP", "unit_tp_comm_s", "stage_compute_s", "stage_tp_comm_s", "OPS_PER_UNIT", "unit_ops",
           "saved_act_mode"]

OPS_PER_UNIT: dict[str, tuple[int, int]] = {
    "block": (32, 112), "block/llama": (66, 138), "embedding": (4, 10), "head": (8, 24), "module": (0, 0),
}
"""MEASURED: top-level ATen operators one unit dispatches per micro-batch, ``(forward, backward)``, counted
with ``torch.profiler`` on hetpart's runtime units (Hugging Face GPT-2 and Llama modules, SDPA
attention; the head's count includes its cross-entropy loss). Megatron-style fused kernels dispatch
fewer; traced modules have no count (0: no fixed cost). Recount with
``python -m hetpart.experiments.bench_validation --count-ops``."""


def unit_ops(model: ModelGraph) -> tuple[np.ndarray, np.ndarray]:
    """``(fwd_ops[units], bwd_ops[units])``: operators each unit dispatches per micro-batch (:data:`OPS_PER_UNIT`)."""
    family = getattr(model.config, "family", "")
    keys = ["block/llama" if u.kind == "block" and family == "llama" else u.kind for u in model.units]
    return (np.array([OPS_PER_UNIT[k][0] for k in keys], dtype=float),
            np.array([OPS_PER_UNIT[k][1] for k in keys], dtype=float))


def saved_act_mode(recompute: str, attention: str) -> str:
    """The activation column that holds what a unit saves: fused attention stores no score matrix, so
    without recomputation it saves what selective recomputation saves (the graph's ``none`` minus the
    ``a s^2`` terms)."""
    return "selective" if recompute == "none" and attention == "fused" else recompute


def _recomputed_flops(unit, recompute: str, attention: str) -> float:
    """Forward FLOPs a unit's backward runs again. Fused attention (FlashAttention, Dao et al. 2022)
    recomputes the scores ``Q K^T`` in its backward whatever the recompute mode (half of the attention
    core's ``4 s^2 h``), so selective recomputation adds nothing on top of it."""
    core = unit.recompute_flops["selective"]
    if attention != "fused":
        return unit.recompute_flops[recompute]
    if recompute == "full":
        return unit.recompute_flops["full"] + 0.5 * core
    return 0.5 * core


def _unit_arrays(model: ModelGraph, recompute: str, attention: str = "eager") -> dict[str, np.ndarray]:
    units = model.units
    full = saved_act_mode("none", attention)
    return {
        "fwd": np.array([u.fwd_flops for u in units], dtype=float),
        "bwd": np.array([u.bwd_flops + _recomputed_flops(u, recompute, attention) for u in units], dtype=float),
        "none": np.array([u.act_bytes[full] for u in units], dtype=float),
        "selective": np.array([u.act_bytes["selective"] for u in units], dtype=float),
        "shardable": np.array([u.tp_shardable for u in units], dtype=bool),
        "inner": np.array([u.kind in ("block", "module") for u in units], dtype=bool),
        "width": np.array([unit_gemm_width(u.width, u.kind, 1, u.fwd_flops / model.seq_len) for u in units]),
        "tp_bytes": np.array([u.tp_comm_bytes_fwd for u in units], dtype=float),
        "calls": np.array([2.0 if u.kind == "block" else 1.0 for u in units]),
        "head": np.array([u.kind == "head" for u in units], dtype=bool),
    }


def _unit_rates(model: ModelGraph, gpu: GPUSpec, tp: int, micro_batch: int, precision: str,
                curve: EfficiencyCurve | None, cp: int = 1, u: dict | None = None
                ) -> tuple[np.ndarray, np.ndarray, EfficiencyCurve, str]:
    """``(FLOP/s of each unit on one device, its TP shard, the curve, the effective precision)``: the
    device's peak times the efficiency at the unit's per-device width and tokens (``micro_batch`` whole
    sequences, or ``1/cp`` of them under context parallelism)."""
    precision = effective_precision(gpu, precision)
    peak_tflops = gpu.tflops(precision)
    curve = curve or curve_for(gpu)
    u = u if u is not None else _unit_arrays(model, "none")
    shard = np.where(u["shardable"], tp, 1)
    width = np.maximum(np.where(u["inner"], u["width"] / shard, u["width"]), 1.0)  # see unit_gemm_width
    tokens = max(micro_batch * model.seq_len, 1) if cp == 1 else max(micro_batch * model.seq_len / cp, 1.0)
    size16 = gpu.tflops_bf16  # the device's size (SMs) sets where its products saturate
    eff = curve.e_peak(precision) / (1.0 + (curve.w0(size16) / width) ** curve.alpha
                                     + (curve.t0(size16) / tokens) ** curve.alpha)
    vocab = int(getattr(model.config, "vocab_size", 0) or 0)
    if vocab and not aligned(vocab, precision):
        cap = UNALIGNED_FRACTION * gpu.tflops_bf16 / peak_tflops
        eff = np.where(u["head"], np.minimum(eff, cap), eff)
    return peak_tflops * 1e12 * eff * shard, shard, curve, precision


def unit_compute_s(model: ModelGraph, gpu: GPUSpec, tp: int, micro_batch: int, precision: str,
                   recompute: str, curve: EfficiencyCurve | None = None,
                   attention: str = "fused", cp: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """``(fwd_s[units], bwd_s[units])``: compute seconds of each unit for one micro-batch on one device.

    The backward includes the recomputation of ``recompute`` (``none``, ``selective`` or ``full``).
    ``curve`` overrides the device's efficiency curve (calibration uses it); ``attention`` is the
    workload's kernel (``fused`` or ``eager``). ``cp``: context parallelism
    (:mod:`~hetpart.costmodel.context_parallel`): the device holds ``1/cp`` of each sequence, so every
    unit's FLOPs (the attention core's too: the load-balanced causal split gives each rank an equal
    share of the score blocks) and activation traffic divide by ``cp``, its products run on ``1/cp`` of
    the tokens, and each block launches :data:`CP_OPS_PER_STEP` more operators per extra ring step.
    """
    u = _unit_arrays(model, recompute, attention)
    rate, shard, curve, _ = _unit_rates(model, gpu, tp, micro_batch, precision, curve, cp, u)
    work = micro_batch if cp == 1 else micro_batch / cp  # sequences' worth of tokens on this device
    memory = curve.act_traffic * u["none"] * work / shard / (gpu.hbm_gbyte_s * 1e9)
    if recompute == "full":
        extra = memory
    elif recompute == "selective":
        share = np.divide(u["selective"], u["none"], out=np.ones_like(memory), where=u["none"] > 0)
        extra = memory * (1.0 - share)
    else:
        extra = np.zeros_like(memory)
    ops_fwd, ops_bwd = unit_ops(model)
    if cp > 1:  # the ring's extra attention calls, corrections and send/recv launches, per block
        blocks = np.array([un.kind == "block" for un in model.units], dtype=float)
        ops_fwd = ops_fwd + blocks * (cp - 1) * CP_OPS_PER_STEP[0]
        ops_bwd = ops_bwd + blocks * (cp - 1) * CP_OPS_PER_STEP[1]
    host = curve.host_us_per_op * 1e-6
    host_bwd = ops_bwd + (ops_fwd if recompute == "full" else 0.0)
    fwd = u["fwd"] * work / rate + memory + host * ops_fwd
    bwd = u["bwd"] * work / rate + 2 * memory + extra + host * host_bwd
    return fwd, bwd


CP_OPS_PER_STEP = (4, 4)
"""ASSUMED (counted from Transformer Engine's ring-attention loop, ``AttnFuncWithCPAndKVP2P``, not
measured): operators a block launches per extra context-parallel ring step, ``(forward, backward)``:
one attention kernel, two output / log-sum-exp corrections (forward) or gradient accumulations
(backward), and one batched send/receive."""


def unit_attention_core_s(model: ModelGraph, gpu: GPUSpec, tp: int, micro_batch: int, precision: str,
                          curve: EfficiencyCurve | None = None, cp: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """``(fwd_s[units], bwd_s[units])``: the part of :func:`unit_compute_s` (fused attention) that the
    attention core's products take on one device for one micro-batch: ``Q K^T`` and the product with
    ``V`` forward (the graph's ``4 s^2 h``, its selective-recompute FLOPs), and their gradients plus
    the recomputed scores backward (2.5 times that); 0 for units without attention. Context
    parallelism's ring overlaps its transfers with this (:mod:`~hetpart.costmodel.context_parallel`)."""
    rate, _, _, _ = _unit_rates(model, gpu, tp, micro_batch, precision, curve, cp)
    core = np.array([un.recompute_flops["selective"] if un.kind == "block" else 0.0 for un in model.units])
    fwd = core * micro_batch / cp / rate
    return fwd, 2.5 * fwd


def unit_tp_comm_s(model: ModelGraph, tp: int, micro_batch: int, recompute: str, bandwidth_gbyte_s: float,
                   latency_us: float) -> tuple[np.ndarray, np.ndarray]:
    """``(fwd_s[units], bwd_s[units])``: tensor-parallel all-reduce seconds per unit and micro-batch.

    Args:
        bandwidth_gbyte_s, latency_us: the slowest hop of the tensor-parallel group's ring.
    """
    if tp <= 1:
        return np.zeros(model.num_units), np.zeros(model.num_units)
    u = _unit_arrays(model, recompute)
    steps = 2 * (tp - 1)
    # each of ``calls`` all-reduces moves ``bytes / calls``: a ring all-reduce per call (ring_allreduce_time_s)
    one = np.where(u["shardable"] & (u["tp_bytes"] > 0),
                   u["calls"] * steps * latency_us * 1e-6
                   + steps / tp * u["tp_bytes"] * micro_batch / (bandwidth_gbyte_s * 1e9), 0.0)
    return one, one * (2 if recompute == "full" else 1)


def stage_compute_s(model: ModelGraph, first: int, last: int, gpu: GPUSpec, tp: int, micro_batch: int,
                    precision: str = "bf16", recompute: str = "none", attention: str = "fused") -> tuple[float, float]:
    """``(fwd_s, bwd_s)`` of units ``[first, last)`` for one micro-batch (bwd includes recompute).

    For many stages of one model, call :func:`unit_compute_s` once and prefix-sum instead.
    """
    fwd, bwd = unit_compute_s(model, gpu, tp, micro_batch, precision, recompute, attention=attention)
    return float(fwd[first:last].sum()), float(bwd[first:last].sum())


def stage_tp_comm_s(model: ModelGraph, first: int, last: int, tp: int, micro_batch: int, recompute: str,
                    bandwidth_gbyte_s: float, latency_us: float) -> tuple[float, float]:
    """``(fwd_s, bwd_s)`` tensor-parallel communication of units ``[first, last)`` for one micro-batch."""
    fwd, bwd = unit_tp_comm_s(model, tp, micro_batch, recompute, bandwidth_gbyte_s, latency_us)
    return float(fwd[first:last].sum()), float(bwd[first:last].sum())
