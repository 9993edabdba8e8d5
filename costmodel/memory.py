"""Device memory of a pipeline stage (Korthikanti et al. 2022 accounting).

Per device of a stage holding units ``[first, last)`` with tensor parallelism ``tp``:

* model states, ``16`` bytes per parameter held (ZeRO paper accounting, Rajbhandari et al. 2020):
  mixed precision keeps 16-bit weights (2) and gradients (2), an fp32 master copy (4) and Adam's two
  fp32 moments (4 + 4); fp32 training keeps fp32 weights (4), gradients (4) and moments (8), also 16.
  Tensor-parallel units are split ``tp`` ways; a tied embedding copy counts where it is held.
* activations saved for backward, ``act_bytes[recompute] * micro_batch / tp`` per unit (the graph
  follows Korthikanti: ``34 s h + 5 a s^2`` per layer without recompute, the ``s^2`` term dropped by
  selective recompute, ``2 s h`` with full recompute; sequence parallelism assumed, so every term
  divides by ``tp``), times the micro-batches in flight for the schedule; with full recompute one
  unit's full activations are live again while it is recomputed;
* a framework overhead (CUDA context, cuBLAS workspaces, NCCL buffers, allocator fragmentation),
  taken off the device's capacity by :func:`memory_capacity_gb`.
"""

from __future__ import annotations

import numpy as np

from hetpart.graph.model_graph import ModelGraph
from hetpart.hardware import GPUSpec

__all__ = ["MODEL_STATE_BYTES_PER_PARAM", "FRAMEWORK_OVERHEAD_GB", "FRAGMENTATION_FRACTION",
           "memory_capacity_gb", "in_flight_microbatches", "stage_params_per_device", "stage_memory_gb",
           "PrefixTables"]

MODEL_STATE_BYTES_PER_PARAM = 16
"""Weights + gradients + Adam states per parameter (mixed precision or fp32), bytes."""
FRAMEWORK_OVERHEAD_GB = 1.5
"""ASSUMED: CUDA context (~0.5 GB), cuBLAS/cuDNN workspaces and NCCL buffers (~1 GB) per process."""
FRAGMENTATION_FRACTION = 0.05
"""ASSUMED: share of device memory the caching allocator loses to fragmentation."""


def memory_capacity_gb(gpu: GPUSpec) -> float:
    """Memory a training process can use on ``gpu`` after framework overhead and fragmentation, GB."""
    return gpu.memory_gb * (1.0 - FRAGMENTATION_FRACTION) - FRAMEWORK_OVERHEAD_GB


def in_flight_microbatches(schedule: str, stage_index: int, pp: int, num_microbatches: int,
                           interleave: int = 1) -> float:
    """Micro-batches whose activations device-stage ``stage_index`` (of ``pp``) holds at its peak.

    GPipe runs every forward before any backward (``M``); 1F1B holds ``pp - stage`` (at most ``M``);
    interleaved 1F1B (Megatron) warms up ``2 (pp - stage - 1) + (interleave - 1) pp + 1`` model chunks,
    each ``1/interleave`` of the device's layers, so the result is in whole-stage units and may be
    fractional.
    """
    m = num_microbatches
    if schedule == "gpipe":
        return float(m)
    if schedule == "1f1b":
        return float(min(pp - stage_index, m))
    if schedule == "interleaved":
        v = interleave
        chunks = min(m * v, 2 * (pp - stage_index - 1) + (v - 1) * pp + 1)
        return chunks / v
    raise ValueError(f"unknown schedule {schedule!r}")


def stage_params_per_device(model: ModelGraph, first: int, last: int, tp: int) -> float:
    """Parameters one device of a ``tp``-way stage holding units ``[first, last)`` keeps
    (:meth:`ModelGraph.range_params`)."""
    return model.range_params(first, last, tp)


def stage_memory_gb(model: ModelGraph, first: int, last: int, tp: int, micro_batch: int, in_flight: float,
                    recompute: str, precision: str = "bf16") -> float:
    """Peak memory of one device of a stage, GB (without the framework overhead).

    Args:
        model: the unit graph.
        first, last: units ``[first, last)`` of the stage (all virtual chunks of the device).
        tp: tensor-parallel degree of the stage.
        micro_batch: sequences per micro-batch.
        in_flight: micro-batches whose activations are held at the peak (:func:`in_flight_microbatches`).
        recompute: ``none``, ``selective`` or ``full``.
        precision: ``bf16``, ``fp16`` or ``fp32`` (model states are 16 bytes per parameter in all three).
    """
    del precision  # 16 bytes/param either way; activation bytes are already at the graph's precision
    states = stage_params_per_device(model, first, last, tp) * MODEL_STATE_BYTES_PER_PARAM
    units = model.units[first:last]
    per_mb = sum(u.act_bytes[recompute] / (tp if u.tp_shardable else 1) for u in units) * micro_batch
    acts = per_mb * in_flight
    if recompute == "full" and units:
        acts += max(u.act_bytes["none"] / (tp if u.tp_shardable else 1) for u in units) * micro_batch
    return (states + acts) / 1e9


class PrefixTables:
    """Prefix sums over the units of a model, so any stage ``[first, last)`` costs O(1).

    Same accounting as :func:`stage_memory_gb` (tests compare the two); planners may use it too.
    """

    def __init__(self, model: ModelGraph) -> None:
        def prefix(values):
            return np.concatenate([[0.0], np.cumsum(np.asarray(values, dtype=float))]).tolist()

        units = model.units
        sh = [1.0 if u.tp_shardable else 0.0 for u in units]
        self._p_sh = prefix([u.params * f for u, f in zip(units, sh)])
        self._p_rep = prefix([u.params * (1 - f) for u, f in zip(units, sh)])
        self._s_sh = prefix([u.shared_params * f for u, f in zip(units, sh)])
        self._s_rep = prefix([u.shared_params * (1 - f) for u, f in zip(units, sh)])
        self._act = {mode: (prefix([u.act_bytes[mode] * f for u, f in zip(units, sh)]),
                            prefix([u.act_bytes[mode] * (1 - f) for u, f in zip(units, sh)]))
                     for mode in ("none", "selective", "full")}
        self._none_sh = [u.act_bytes["none"] * f for u, f in zip(units, sh)]
        self._none_rep = [u.act_bytes["none"] * (1 - f) for u, f in zip(units, sh)]
        self.owner = model.tied_owner_index
        self.sharers = [i for i, u in enumerate(units) if u.shared_params]

    def params(self, a: int, z: int) -> tuple[float, float]:
        """(tensor-parallel-sharded, replicated) parameters owned by units ``[a, z)``."""
        return self._p_sh[z] - self._p_sh[a], self._p_rep[z] - self._p_rep[a]

    def params_per_device(self, a: int, z: int, tp: int) -> float:
        sharded, whole = self.params(a, z)
        if not a <= self.owner < z:
            sharded += self._s_sh[z] - self._s_sh[a]
            whole += self._s_rep[z] - self._s_rep[a]
        return sharded / tp + whole

    def memory_gb(self, a: int, z: int, tp: int, micro_batch: int, in_flight: float, recompute: str) -> float:
        sh, rep = self._act[recompute]
        acts = ((sh[z] - sh[a]) / tp + (rep[z] - rep[a])) * micro_batch * in_flight
        if recompute == "full" and z > a:
            acts += max(max(self._none_sh[a:z]) / tp, max(self._none_rep[a:z])) * micro_batch
        return (self.params_per_device(a, z, tp) * MODEL_STATE_BYTES_PER_PARAM + acts) / 1e9
