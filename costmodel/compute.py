"""Per-unit compute and tensor-parallel communication times of one micro-batch on one device type.

These are the primitives planners call in their inner loops: pure functions of numbers, O(units)
(vectorized), returning per-unit arrays that callers prefix-sum to cost any stage ``[first, last)``
in O(1).

Compute: ``flops * micro_batch / tp / (peak * eff)`` per unit, with the fitted efficiency of
:mod:`hetpart.costmodel.efficiency`, plus the memory-bound kernels' ``act_traffic * act_bytes / hbm``
(twice that in the backward). The backward includes the recomputed forward of the recompute mode,
memory-bound share too: all of it under full recompute, the attention core's share of the
activations under selective.

Tensor parallelism (Megatron-LM; sequence parallelism assumed: its all-gather + reduce-scatter pair
moves the same bytes as the all-reduce it replaces) costs two all-reduces of ``s b h`` elements per
block in the forward and two in the backward, one per embedding or head, plus the forward's again
under full recompute; they are not overlapped with compute (Megatron 2022).
"""

from __future__ import annotations

import numpy as np

from hetpart.graph.model_graph import ModelGraph
from hetpart.hardware import GPUSpec

from hetpart.costmodel.efficiency import EfficiencyCurve, curve_for, unit_gemm_width

__all__ = ["unit_compute_s", "unit_tp_comm_s", "stage_compute_s", "stage_tp_comm_s"]


def _unit_arrays(model: ModelGraph, recompute: str) -> dict[str, np.ndarray]:
    units = model.units
    return {
        "fwd": np.array([u.fwd_flops for u in units], dtype=float),
        "bwd": np.array([u.bwd_flops + u.recompute_flops[recompute] for u in units], dtype=float),
        "none": np.array([u.act_bytes["none"] for u in units], dtype=float),
        "selective": np.array([u.act_bytes["selective"] for u in units], dtype=float),
        "shardable": np.array([u.tp_shardable for u in units], dtype=bool),
        "inner": np.array([u.kind in ("block", "module") for u in units], dtype=bool),
        "width": np.array([unit_gemm_width(u.width, u.kind, 1, u.fwd_flops / model.seq_len) for u in units]),
        "tp_bytes": np.array([u.tp_comm_bytes_fwd for u in units], dtype=float),
        "calls": np.array([2.0 if u.kind == "block" else 1.0 for u in units]),
    }


def unit_compute_s(model: ModelGraph, gpu: GPUSpec, tp: int, micro_batch: int, precision: str,
                   recompute: str, curve: EfficiencyCurve | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(fwd_s[units], bwd_s[units])``: compute seconds of each unit for one micro-batch on one device.

    The backward includes the recomputation of ``recompute`` (``none``, ``selective`` or ``full``).
    ``curve`` overrides the device's efficiency curve (calibration uses it).
    """
    peak_tflops = gpu.tflops(precision)
    curve = curve or curve_for(gpu)
    u = _unit_arrays(model, recompute)
    shard = np.where(u["shardable"], tp, 1)
    width = np.where(u["inner"], u["width"] / shard, u["width"])  # see unit_gemm_width
    w = np.maximum(np.minimum(width, micro_batch * model.seq_len), 1.0)
    eff = curve.e_max / (1.0 + (curve.w0(peak_tflops) / w) ** curve.alpha)
    rate = peak_tflops * 1e12 * eff * shard
    memory = curve.act_traffic * u["none"] * micro_batch / shard / (gpu.hbm_gbyte_s * 1e9)
    if recompute == "full":
        extra = memory
    elif recompute == "selective":
        share = np.divide(u["selective"], u["none"], out=np.ones_like(memory), where=u["none"] > 0)
        extra = memory * (1.0 - share)
    else:
        extra = np.zeros_like(memory)
    fwd = u["fwd"] * micro_batch / rate + memory
    bwd = u["bwd"] * micro_batch / rate + 2 * memory + extra
    return fwd, bwd


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
