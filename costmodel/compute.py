"""Per-unit compute and tensor-parallel communication times of one micro-batch on one device type.

These are the primitives planners call in their inner loops: pure functions of numbers, O(units),
returning per-unit arrays that callers prefix-sum to cost any stage ``[first, last)`` in O(1).

Compute: ``flops * micro_batch / tp / (peak * eff)`` per unit, with the fitted efficiency of
:mod:`hetpart.costmodel.efficiency`, plus the memory-bound kernels' ``act_traffic * act_bytes / hbm``
(twice that in the backward); the backward includes the recomputed forward of the recompute mode. Tensor parallelism (Megatron-LM, sequence parallelism assumed: its all-gather +
reduce-scatter pair moves the same bytes as the all-reduce it replaces) costs two all-reduces of
``s b h`` elements per block in the forward and two in the backward, one per embedding or head, plus
the forward's again under full recompute; they are not overlapped with compute (Megatron 2022).
"""

from __future__ import annotations

import numpy as np

from hetpart.graph.model_graph import ModelGraph
from hetpart.hardware import GPUSpec

from hetpart.costmodel.collectives import ring_allreduce_time_s
from hetpart.costmodel.efficiency import EfficiencyCurve, curve_for, unit_gemm_width

__all__ = ["unit_compute_s", "unit_tp_comm_s", "stage_compute_s", "stage_tp_comm_s"]


def unit_compute_s(model: ModelGraph, gpu: GPUSpec, tp: int, micro_batch: int, precision: str,
                   recompute: str, curve: EfficiencyCurve | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(fwd_s[units], bwd_s[units])``: compute seconds of each unit for one micro-batch on one device.

    The backward includes the recomputation of ``recompute`` (``none``, ``selective`` or ``full``).
    ``curve`` overrides the device's efficiency curve (calibration uses it).
    """
    peak = gpu.tflops(precision) * 1e12
    curve = curve or curve_for(gpu)
    tokens = micro_batch * model.seq_len
    hbm = gpu.hbm_gbyte_s * 1e9
    fwd = np.empty(model.num_units)
    bwd = np.empty(model.num_units)
    for i, u in enumerate(model.units):
        shard = tp if u.tp_shardable else 1
        width = unit_gemm_width(u.width, u.kind, shard, u.fwd_flops / model.seq_len)
        rate = peak * curve.efficiency(width, tokens, peak / 1e12) * shard
        memory = curve.act_traffic * u.act_bytes["none"] * micro_batch / shard / hbm
        extra = _recompute_memory_s(u, recompute, memory)
        fwd[i] = u.fwd_flops * micro_batch / rate + memory
        bwd[i] = (u.bwd_flops + u.recompute_flops[recompute]) * micro_batch / rate + 2 * memory + extra
    return fwd, bwd


def _recompute_memory_s(unit, recompute: str, forward_memory_s: float) -> float:
    """Memory-bound time of the recomputed part of the forward: all of it (full) or the attention
    core's share (selective: the activations selective recompute does not keep)."""
    if recompute == "full":
        return forward_memory_s
    if recompute == "selective" and unit.act_bytes["none"] > 0:
        return forward_memory_s * (1 - unit.act_bytes["selective"] / unit.act_bytes["none"])
    return 0.0


def _allreduce_calls(kind: str) -> int:
    return 2 if kind == "block" else 1


def unit_tp_comm_s(model: ModelGraph, tp: int, micro_batch: int, recompute: str, bandwidth_gbyte_s: float,
                   latency_us: float) -> tuple[np.ndarray, np.ndarray]:
    """``(fwd_s[units], bwd_s[units])``: tensor-parallel all-reduce seconds per unit and micro-batch.

    Args:
        bandwidth_gbyte_s, latency_us: the slowest hop of the tensor-parallel group's ring.
    """
    fwd = np.zeros(model.num_units)
    bwd = np.zeros(model.num_units)
    if tp <= 1:
        return fwd, bwd
    for i, u in enumerate(model.units):
        if not u.tp_shardable or u.tp_comm_bytes_fwd <= 0:
            continue
        calls = _allreduce_calls(u.kind)
        one = calls * ring_allreduce_time_s(u.tp_comm_bytes_fwd * micro_batch / calls, tp, bandwidth_gbyte_s,
                                            latency_us)
        fwd[i] = one
        bwd[i] = one * (2 if recompute == "full" else 1)
    return fwd, bwd


def stage_compute_s(model: ModelGraph, first: int, last: int, gpu: GPUSpec, tp: int, micro_batch: int,
                    precision: str = "bf16", recompute: str = "none") -> tuple[float, float]:
    """``(fwd_s, bwd_s)`` of units ``[first, last)`` for one micro-batch (bwd includes recompute).

    For many stages of one model, call :func:`unit_compute_s` once and prefix-sum instead.
    """
    fwd, bwd = unit_compute_s(model, gpu, tp, micro_batch, precision, recompute)
    return float(fwd[first:last].sum()), float(bwd[first:last].sum())


def stage_tp_comm_s(model: ModelGraph, first: int, last: int, tp: int, micro_batch: int, recompute: str,
                    bandwidth_gbyte_s: float, latency_us: float) -> tuple[float, float]:
    """``(fwd_s, bwd_s)`` tensor-parallel communication of units ``[first, last)`` for one micro-batch."""
    fwd, bwd = unit_tp_comm_s(model, tp, micro_batch, recompute, bandwidth_gbyte_s, latency_us)
    return float(fwd[first:last].sum()), float(bwd[first:last].sum())
