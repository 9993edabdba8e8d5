"""Device memory of a pipeline stage (Korthikanti et al. 2022 accounting).

Per device of a stage holding units ``[first, last)`` with tensor parallelism ``tp``:

* model states, bytes per parameter by optimizer and precision (:func:`state_bytes_per_param`): the
  weights in the training dtype (2 bytes, fp32 4), the gradients as the engine keeps them
  (:data:`GRAD_BYTES`: bf16 and fp8 training accumulate and reduce them in fp32, fp16 training keeps
  them in fp16), under mixed precision an fp32 master copy (4), and the optimizer's moments
  (:data:`MOMENT_BYTES`: Adam two fp32 ones, 8). Adam: bf16 2 + 4 + 4 + 8 = 18 (Megatron-LM's
  distributed-optimizer table, "bf16 param, fp32 grads"), fp16 2 + 2 + 4 + 8 = 16 (the ZeRO paper's
  accounting, Rajbhandari et al. 2020), fp32 4 + 4 + 8 = 16. Momentum SGD keeps one moment; 8-bit Adam
  (Dettmers et al. 2022, bitsandbytes) two 1-byte moments (its block-wise scales are ~0.2%).
  Tensor-parallel units are split ``tp`` ways (under the ``torch`` kernel set the blocks only: hetpart's
  runtime keeps the embedding and head whole on every TP rank, :func:`~hetpart.costmodel.activations.unit_params_split`);
  a tied embedding copy counts where it is held.
* activations saved for backward, per unit ``saved * micro_batch / tp`` with ``saved`` the bytes per
  sequence of :func:`hetpart.costmodel.activations.unit_kept_bytes` (what autograd saves, plus what the
  engine holds beyond it; the ``fused`` kernel set of
  Megatron-Core / Transformer Engine by default, Korthikanti's ``34 s h + 5 a s^2`` per GPT layer with
  dropout; the ``torch`` set measured on hetpart's runtime modules, with the logits its last pipeline stage
  holds until their backward), under ``fused`` sequence parallelism assumed so every term divides by ``tp``
  (under ``torch`` the residual stream, norms, embedding and head stay whole:
  :func:`~hetpart.costmodel.activations.unit_replicated_bytes`), times the micro-batches in flight for the
  schedule; with full recompute
  one unit's full activations are live again while it is recomputed. Fused attention (flash / SDPA,
  the default) stores no ``a s^2`` score matrix; eager attention stores it;
* the running unit's working set (its backward's transients; under full recompute its activations again),
  once per *device*: a device runs one unit at a time, so a device hosting several model chunks
  (interleaved schedules) adds the largest of its chunks' working sets, not their sum
  (:func:`device_memory_gb`);
* under fp8 and the ``fused`` set (Transformer Engine), :func:`fp8_stage_bytes`: the fp8 copy and transpose of
  every linear weight, cached across the micro-batches of a step (2 bytes per weight element, below level 3),
  and the linear inputs saved as fp8 (the norms' outputs and fc2's input at 1 byte, plus an fp8 copy of the
  attention output): :data:`~hetpart.costmodel.activations.FP8_WEIGHT_CACHE_BYTES`;
* a framework overhead (CUDA context, cuBLAS workspaces, NCCL buffers, allocator fragmentation),
  taken off the device's capacity by :func:`memory_capacity_gb`.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from hetpart.graph.model_graph import ModelGraph
from hetpart.hardware import GIB, GPUSpec

from hetpart.costmodel.activations import (DEFAULT_KERNELS, FP8_WEIGHT_CACHE_BYTES, unit_fp8_cached_params,
                                           unit_fp8_saved_delta, unit_params_split, unit_replicated_bytes,
                                           unit_kept_bytes, unit_replicated_working_bytes, unit_working_bytes)

__all__ = ["MODEL_STATE_BYTES_PER_PARAM", "OPTIMIZER_STATE_BYTES", "GRAD_BYTES", "MOMENT_BYTES", "state_split", "OPTIMIZER_STEP_BYTES", "optimizer_step_bytes", "state_bytes_per_param", "FRAMEWORK_OVERHEAD_GB", "FRAGMENTATION_FRACTION",
           "memory_capacity_gb", "in_flight_microbatches", "stage_params_per_device", "stage_memory_gb", "fp8_stage_bytes", "fp8_range_bytes",
           "stage_working_gb", "device_memory_gb", "chunk_in_flight", "chunk_flights", "pipeline_recv_buffer_bytes", "PrefixTables"]

MODEL_STATE_BYTES_PER_PARAM = 16
"""Weights + gradients + Adam states per parameter with 16-bit gradients (fp16 mixed precision) or fp32."""
OPTIMIZER_STATE_BYTES: dict[str, int] = {"adam": 16, "sgd": 12, "adam8bit": 10}
"""Model-state bytes per parameter by optimizer in the ZeRO paper's accounting (16-bit gradients: fp16
mixed precision, 2 + 2 + 4 master + moments; fp32 training 4 + 4 + moments, the same totals). bf16
training keeps fp32 gradients on top (:func:`state_bytes_per_param`); the learned model's encoder reads
these as the optimizer's identity."""
MOMENT_BYTES: dict[str, int] = {"adam": 8, "sgd": 4, "adam8bit": 2}
"""The optimizer's moments per parameter: Adam two fp32 ones, momentum SGD one, 8-bit Adam two 1-byte ones."""
GRAD_BYTES: dict[str, int] = {"bf16": 4, "fp8": 4, "fp16": 2, "fp32": 4, "tf32": 4}
"""Bytes per gradient element kept from the backward to the optimizer step and reduced over data
parallelism. bf16 (and fp8, whose weights and gradients are bf16) training accumulates and reduces them
in fp32: Megatron-LM forces ``accumulate_allreduce_grads_in_fp32`` under bf16 (its main-gradient buffer;
"bf16 param, fp32 grads" in its distributed-optimizer table), torchtitan's FSDP2 reduces in fp32
(``mixed_precision_reduce``), DeepSpeed's bf16 optimizer accumulates into fp32. fp16 training keeps fp16
gradients (ZeRO paper; Megatron-LM's fp16 buffer); fp32 training fp32 ones."""
OPTIMIZER_STEP_BYTES: dict[str, int] = {"adam": 28, "sgd": 20, "adam8bit": 16}
"""HBM bytes one optimizer step moves per parameter with 16-bit gradients (fp16 training; fp32 training
moves the same totals): read the gradient, master weight and moments, write the master, the moments and
the 16-bit weight (Adam: 2+4+8 read, 4+8+2 written = 28; SGD 2+4+4, 4+4+2 = 20; 8-bit Adam 2+4+2,
4+2+2 = 16). :func:`optimizer_step_bytes` gives them by precision (bf16's fp32 gradient reads 2 more);
the learned models read this table as the optimizer's identity."""


def state_split(precision: str, optimizer: str = "adam") -> tuple[float, float, float]:
    """``(weights, gradients, optimizer)`` bytes per parameter under ``precision`` (module docstring): the
    weights in the training dtype, the gradients at :data:`GRAD_BYTES`, the optimizer's fp32 master copy
    (mixed precision only) and :data:`MOMENT_BYTES`."""
    if precision not in GRAD_BYTES:
        raise ValueError(f"unknown precision {precision!r}")
    full = precision in ("fp32", "tf32")
    w = 4.0 if full else 2.0
    return w, float(GRAD_BYTES[precision]), (0.0 if full else 4.0) + MOMENT_BYTES[optimizer]


def optimizer_step_bytes(optimizer: str, precision: str) -> float:
    """HBM bytes one optimizer step moves per parameter under ``precision``: read the gradient
    (:data:`GRAD_BYTES`), the fp32 weight or master copy and the moments, write the copy and the moments
    back and, under mixed precision, the 16-bit weight. Adam: 28 under fp32 and fp16, 30 under bf16."""
    w, g, _ = state_split(precision, optimizer)
    mixed = precision not in ("fp32", "tf32")
    return g + 2 * (4.0 + MOMENT_BYTES[optimizer]) + (w if mixed else 0.0)


def state_bytes_per_param(optimizer: str, precision: str) -> float:
    """Model-state bytes per parameter for ``optimizer`` under ``precision`` (:func:`state_split`'s sum):
    Adam 18 under bf16, 16 under fp16 and fp32."""
    return sum(state_split(precision, optimizer))


FRAMEWORK_OVERHEAD_GB = 1.5
"""ASSUMED: CUDA context (~0.5 GB), cuBLAS/cuDNN workspaces and NCCL buffers (~1 GB) per process."""
FRAGMENTATION_FRACTION = 0.05
"""ASSUMED: share of device memory the caching allocator loses to fragmentation."""


def memory_capacity_gb(gpu: GPUSpec) -> float:
    """Memory a training process can use on ``gpu`` after framework overhead and fragmentation, GB.

    The marketed size is in GiB (:attr:`~hetpart.hardware.GPUSpec.memory_gb`): an H100-80GB holds 85.9 GB,
    of which 80.1 GB remain here. The driver's own reserve (nvidia-smi totals are 0-1.4% under the nominal
    GiB) falls inside the fragmentation share."""
    return gpu.memory_gb * GIB * (1.0 - FRAGMENTATION_FRACTION) - FRAMEWORK_OVERHEAD_GB


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


def chunk_in_flight(schedule: str, stage_index: int, pp: int, num_microbatches: int, interleave: int,
                    per_microbatch: "tuple[float, ...] | list[float]") -> tuple[float, ...]:
    """Micro-batches in flight in each of a device's model chunks at the moment its activations peak.

    Without interleaving the device has one chunk and this is :func:`in_flight_microbatches`. Under interleaved
    1F1B the chunks of one device differ (the last device's last chunk holds the head and its logits, the
    first device's first the embedding), and the chunks in flight at the peak are not ``1/interleave`` of each:
    in the warm-up a device runs ``pp`` micro-batches through its first chunk before its second, so at the
    first backward the last device holds two micro-batches of its first chunk and one of its second (``pp = 2``,
    ``interleave = 2``). Walks the device's operations in Megatron's (and torch's
    ``ScheduleInterleaved1F1B``'s) order (:func:`~hetpart.costmodel.schedule.device_op_order`) and returns the
    counts after the forward at which ``sum(count[c] * per_microbatch[c])`` is largest (the earliest such).
    Their sum is :func:`in_flight_microbatches` ``* interleave`` wherever the chunks are alike.

    Args:
        per_microbatch: one micro-batch's activation bytes of each chunk, in the device's chunk order.

    Measured (``bench_memory``, a 2-stage pipeline interleaved x 2 of the small gpt2-small): the last device
    peaks at 397.4 MB; ``interleave``-ths of every chunk (the rule before) predicted 420.2 (+5.7%), these counts
    392.6 (-1.2%). On a Llama-3-405B-like layout (16 devices, 4 chunks, 16 micro-batches) the last device holds
    one micro-batch of its head chunk, not 12.25.
    """
    if schedule != "interleaved" or interleave == 1:
        return (in_flight_microbatches(schedule, stage_index, pp, num_microbatches, interleave),) * interleave
    best, peak = None, -1.0
    for counts in _chunk_counts(pp, num_microbatches, interleave, stage_index):
        held = sum(c * w for c, w in zip(counts, per_microbatch))
        if held > peak:
            best, peak = counts, held
    return tuple(float(c) for c in best)


def chunk_flights(tables: "PrefixTables", schedule: str, stage_index: int, pp: int, num_microbatches: int,
                  interleave: int, chunks: "list[tuple[int, int, float]]", recompute: str,
                  attention: str = "fused") -> tuple[float, ...]:
    """:func:`chunk_in_flight` of a device's ``chunks`` (``(first unit, end unit, tp)`` each, in the device's
    order; ``tp`` of its most loaded device), each weighed by the activations one sequence saves in it
    (:meth:`PrefixTables.saved_gb`). Every path that prices a device's memory (the simulator, its reference,
    the planners' check, the plan encoders, the shard-fraction chooser, the tensor-parallel split) takes its
    counts from here, so they agree."""
    if schedule != "interleaved" or interleave == 1 or num_microbatches % pp:
        # (micro-batches not a multiple of pp: a plan validate refuses, whose memory a planner may still ask)
        return (in_flight_microbatches(schedule, stage_index, pp, num_microbatches, interleave),) * interleave
    per = tuple(tables.saved_gb(a, z, tp, 1, recompute, attention) for a, z, tp in chunks)
    return chunk_in_flight(schedule, stage_index, pp, num_microbatches, interleave, per)


@lru_cache(maxsize=1024)
def _chunk_counts(pp: int, m: int, v: int, d: int) -> tuple[tuple[int, ...], ...]:
    """The distinct per-chunk counts of micro-batches in flight on device ``d`` after each of its forwards
    (interleaved 1F1B), in the order they first occur."""
    from hetpart.costmodel.schedule import FWD, device_op_order

    counts = [0] * v
    seen: dict[tuple[int, ...], None] = {}
    for kind, stage, _ in device_op_order("interleaved", pp, m, v)[d]:
        counts[stage // pp] += 1 if kind == FWD else -1
        if kind == FWD:
            seen.setdefault(tuple(counts))
    return tuple(seen)


def pipeline_recv_buffer_bytes(model: ModelGraph, stages: list[tuple[int, int]], device: int, pp: int,
                               micro_batch: int, num_microbatches: int,
                               in_flight: "float | tuple[float, ...]") -> float:
    """Bytes of torch.distributed.pipelining's receive buffers that one device keeps beside its activations.

    torch allocates one buffer per micro-batch for every tensor a stage receives, once, at the first step, and
    reuses them every step (torch 2.13 ``torch/distributed/pipelining/stage.py``: ``_prepare_forward_infra``,
    ``self.args_recv_info[chunk] = self._create_act_recv_info()`` for each micro-batch, and
    ``_setup_backward_recv_info``, ``self.grad_recv_info[mb_index]`` for each): a stage after the first keeps
    ``M`` buffers of its input, a stage before the last ``M`` of its output's gradient, one micro-batch's
    boundary activation each. The received activation is the buffer itself (``_retrieve_recv_activations``),
    so the inputs of the micro-batches in flight, counted among the saved activations, are not counted again.
    Measured on a 2-stage gpt2-small (h=256, micro-batch 4, seq 128, ``M = 2``): two 0.52 MB buffers alive
    between steps on each rank, ``grad_recv_info[0..1]`` on the first, ``args_recv_info[0..1]`` on the last.

    Args:
        model: the unit graph (``out_act_bytes``: one sequence's boundary activation).
        stages: ``(first, last)`` units of each stage of the replica, in pipeline order.
        device, pp: device group ``device`` of ``pp`` holds stages ``device, device + pp, ...``.
        micro_batch: sequences per micro-batch.
        num_microbatches: micro-batches the replica runs per step.
        in_flight: micro-batches whose activations the device holds at its peak, one number, or one per chunk
            of the device (:func:`chunk_in_flight`).
    """
    chunks = range(device, len(stages), pp)
    flights = in_flight if isinstance(in_flight, tuple) else (in_flight,) * len(chunks)
    total = 0.0
    for k, held in zip(chunks, flights):
        if k > 0:
            total += model.units[stages[k][0] - 1].out_act_bytes * max(0.0, num_microbatches - held)  # what k receives
        if k < len(stages) - 1:
            total += model.units[stages[k][1] - 1].out_act_bytes * num_microbatches
    return total * micro_batch


def stage_params_per_device(model: ModelGraph, first: int, last: int, tp: int, kernels: str = DEFAULT_KERNELS) -> float:
    """Parameters one device of a ``tp``-way stage holding units ``[first, last)`` keeps
    (:meth:`ModelGraph.range_params`; under ``torch`` the embedding and head whole,
    :func:`~hetpart.costmodel.activations.unit_params_split`)."""
    if kernels == DEFAULT_KERNELS:
        return model.range_params(first, last, tp)
    split = unit_params_split(model, kernels)[first:last]
    units = model.units[first:last]
    keeps_copy = not any(u.name == model.tied_owner for u in units)
    total = 0.0
    for u, sh in zip(units, split):
        n = u.params + (u.shared_params if u.shared_params and keeps_copy else 0)
        total += n / tp if sh else n
    return total


def stage_memory_gb(model: ModelGraph, first: int, last: int, tp: int, micro_batch: int, in_flight: float,
                    recompute: str, precision: str = "bf16", optimizer: str = "adam",
                    attention: str = "fused", kernels: str = DEFAULT_KERNELS, working_set: bool = True,
                    zero: int = 0) -> float:
    """Peak memory of one device of a stage, GB (without the framework overhead).

    Args:
        model: the unit graph.
        first, last: units ``[first, last)`` of the stage (one model chunk; a device hosting several
            chunks adds them with :func:`device_memory_gb`).
        tp: tensor-parallel degree of the stage.
        micro_batch: sequences per micro-batch.
        in_flight: micro-batches whose activations are held at the peak (:func:`in_flight_microbatches`).
        recompute: ``none``, ``selective`` or ``full``.
        precision: the workload's precision (the model states' bytes, :func:`state_bytes_per_param`;
            activation bytes are already at the graph's precision).
        optimizer: ``adam``, ``sgd`` or ``adam8bit`` (:data:`OPTIMIZER_STATE_BYTES`).
        attention: ``fused`` or ``eager`` (whether the score matrix is stored).
        kernels: the kernel set whose saved activations count (:mod:`~hetpart.costmodel.activations`).
        working_set: whether to add the running unit's working set (:func:`stage_working_gb`).
        zero: the plan's sharding level as memory counts it (:func:`~hetpart.costmodel.sharding.memory_zero`):
            an fp8 run's cached fp8 weights count below level 3 (:func:`fp8_stage_bytes`).
    """
    states = stage_params_per_device(model, first, last, tp, kernels) * state_bytes_per_param(optimizer, precision)
    saved = unit_kept_bytes(model, recompute, attention, kernels)[first:last]
    whole = unit_replicated_bytes(model, recompute, attention, kernels)[first:last]
    per_mb = sum((b - r) / tp + r for b, r in zip(saved, whole)) * micro_batch
    acts = per_mb * in_flight
    if precision == "fp8":
        states += fp8_stage_bytes(model, first, last, tp, micro_batch, in_flight, recompute, kernels, zero)
    work = stage_working_gb(model, first, last, tp, micro_batch, recompute, attention, kernels) if working_set else 0.0
    return (states + acts) / 1e9 + work


def fp8_stage_bytes(model: ModelGraph, first: int, last: int, tp: float, micro_batch: int, in_flight: float,
                    recompute: str, kernels: str = DEFAULT_KERNELS, zero: int = 0) -> float:
    """Bytes an fp8 run adds on one device of a ``tp``-way stage holding units ``[first, last)`` over the 16-bit
    accounting, under the ``fused`` set (Transformer Engine): the cached fp8 weights and their transposes below
    level 3 (:data:`~hetpart.costmodel.activations.FP8_WEIGHT_CACHE_BYTES`), plus the saved activations'
    difference (:func:`~hetpart.costmodel.activations.unit_fp8_saved_delta`, negative: fp8 inputs) for the
    micro-batches in flight. Blocks are split ``tp`` ways (sequence parallelism)."""
    return fp8_range_bytes(sum(unit_fp8_cached_params(model, kernels)[first:last]),
                           sum(unit_fp8_saved_delta(model, recompute, kernels)[first:last]), tp, micro_batch, in_flight,
                           zero)


def fp8_range_bytes(cached_params: float, saved_delta: float, tp: float, micro_batch: int, in_flight: float,
                    zero: int = 0) -> float:
    """:func:`fp8_stage_bytes` from a range's sums of :func:`~hetpart.costmodel.activations.unit_fp8_cached_params`
    and :func:`~hetpart.costmodel.activations.unit_fp8_saved_delta` (callers that price many stages keep the
    per-unit lists, which those functions rebuild per call)."""
    cache = cached_params * FP8_WEIGHT_CACHE_BYTES if zero < 3 else 0.0
    return (cache + saved_delta * micro_batch * in_flight) / tp


def stage_working_gb(model: ModelGraph, first: int, last: int, tp: int, micro_batch: int, recompute: str,
                     attention: str = "fused", kernels: str = DEFAULT_KERNELS) -> float:
    """The largest working set of units ``[first, last)`` on one device of a ``tp``-way stage, GB: what the
    running unit's backward holds on top of the saved activations (full recompute: its activations live
    again); 0 for an empty range."""
    if last <= first:
        return 0.0
    work = unit_working_bytes(model, recompute, attention, kernels)[first:last]
    whole = unit_replicated_working_bytes(model, recompute, attention, kernels)[first:last]
    return max((b - r) / tp + r for b, r in zip(work, whole)) * micro_batch / 1e9


def device_memory_gb(model: ModelGraph, chunks, micro_batch: int, in_flight: float, recompute: str,
                     precision: str = "bf16", optimizer: str = "adam", attention: str = "fused",
                     kernels: str = DEFAULT_KERNELS, zero: int = 0) -> float:
    """Peak memory of one device hosting the model chunks ``chunks`` (``(first, last, tp)`` each: the
    stages ``d, d + pp, ...`` of an interleaved schedule, or one stage), GB: every chunk's states and
    saved activations, plus the working set once, the largest of the chunks' (one unit runs at a time)."""
    chunks = list(chunks)
    base = sum(stage_memory_gb(model, a, z, tp, micro_batch, in_flight, recompute, precision, optimizer, attention,
                               kernels, working_set=False, zero=zero) for a, z, tp in chunks)
    return base + max((stage_working_gb(model, a, z, tp, micro_batch, recompute, attention, kernels)
                       for a, z, tp in chunks), default=0.0)


class PrefixTables:
    """Prefix sums over the units of a model, so any stage ``[first, last)`` costs O(1).

    Same accounting as :func:`stage_memory_gb` (tests compare the two); planners may use it too.
    """

    def __init__(self, model: ModelGraph, kernels: str = DEFAULT_KERNELS) -> None:
        def prefix(values):
            return np.concatenate([[0.0], np.cumsum(np.asarray(values, dtype=float))]).tolist()

        units = model.units
        sh = [1.0 if split else 0.0 for split in unit_params_split(model, kernels)]
        self._p_sh = prefix([u.params * f for u, f in zip(units, sh)])
        self._p_rep = prefix([u.params * (1 - f) for u, f in zip(units, sh)])
        self._s_sh = prefix([u.shared_params * f for u, f in zip(units, sh)])
        self._s_rep = prefix([u.shared_params * (1 - f) for u, f in zip(units, sh)])
        self.kernels = kernels
        saved = {(mode, att): unit_kept_bytes(model, mode, att, kernels)
                 for mode in ("none", "selective", "full") for att in ("fused", "eager")}
        whole = {(mode, att): unit_replicated_bytes(model, mode, att, kernels)
                 for mode in ("none", "selective", "full") for att in ("fused", "eager")}
        self._act = {key: (prefix([b - r for b, r in zip(acts, whole[key])]), prefix(whole[key]))
                     for key, acts in saved.items()}
        """Per (recompute, attention), prefix sums of the (sharded, replicated) saved activations."""
        self._work = {}
        """Per (recompute, attention), (sharded, replicated) working set of each unit while it runs."""
        for mode in ("none", "selective", "full"):
            for att in ("fused", "eager"):
                work = unit_working_bytes(model, mode, att, kernels)
                rest = unit_replicated_working_bytes(model, mode, att, kernels)
                self._work[(mode, att)] = ([b - r for b, r in zip(work, rest)], rest)
        self.owner = model.tied_owner_index
        self.sharers = [i for i, u in enumerate(units) if u.shared_params]
        self._fp8_cache = prefix(unit_fp8_cached_params(model, kernels))
        """Prefix sums of the linear weights an fp8 run caches (fp8_stage_bytes; zero under ``torch``)."""
        self._fp8_delta = {mode: prefix(unit_fp8_saved_delta(model, mode, kernels))
                           for mode in ("none", "selective", "full")}
        """Per recompute mode, prefix sums of an fp8 run's saved-activation difference per sequence."""

    def params(self, a: int, z: int) -> tuple[float, float]:
        """(tensor-parallel-sharded, replicated) parameters owned by units ``[a, z)``."""
        return self._p_sh[z] - self._p_sh[a], self._p_rep[z] - self._p_rep[a]

    def shared(self, a: int, z: int) -> tuple[float, float]:
        """(tensor-parallel-sharded, replicated) parameters of the tied copies units ``[a, z)`` hold (a head's
        copy of its embedding), whether or not the range also holds their owner."""
        return self._s_sh[z] - self._s_sh[a], self._s_rep[z] - self._s_rep[a]

    def params_per_device(self, a: int, z: int, tp: int) -> float:
        sharded, whole = self.params(a, z)
        if not a <= self.owner < z:
            sharded += self._s_sh[z] - self._s_sh[a]
            whole += self._s_rep[z] - self._s_rep[a]
        return sharded / tp + whole

    # ------------------------------------------------------------------ many stages at once (numpy)
    # The same arithmetic as params_per_device / memory_gb, element by element and in the same order
    # (tests/test_learned_encode.py compares them); keep the two in step.
    def _arrays(self) -> dict:
        arr = getattr(self, "_np", None)
        if arr is None:
            arr = self._np = {"p_sh": np.asarray(self._p_sh), "p_rep": np.asarray(self._p_rep),
                              "s_sh": np.asarray(self._s_sh), "s_rep": np.asarray(self._s_rep),
                              **{("act", *k): (np.asarray(sh), np.asarray(rep)) for k, (sh, rep) in self._act.items()}}
        return arr

    def params_per_device_many(self, a: np.ndarray, z: np.ndarray, tp: np.ndarray) -> np.ndarray:
        """:meth:`params_per_device` of many stages (integer arrays of one shape)."""
        t = self._arrays()
        sharded = t["p_sh"][z] - t["p_sh"][a]
        whole = t["p_rep"][z] - t["p_rep"][a]
        shared = ~((a <= self.owner) & (self.owner < z))
        sharded = np.where(shared, sharded + (t["s_sh"][z] - t["s_sh"][a]), sharded)
        whole = np.where(shared, whole + (t["s_rep"][z] - t["s_rep"][a]), whole)
        return sharded / tp + whole

    def _range_max(self, values: list, a: np.ndarray, z: np.ndarray) -> np.ndarray:
        """``max(values[a:z])`` per element (``z > a``), by a sparse table."""
        key = id(values)
        tables = getattr(self, "_sparse", {})
        self._sparse = tables
        if key not in tables:
            levels = [np.asarray(values, float)]
            while 2 ** len(levels) <= len(values):
                prev, w = levels[-1], 2 ** (len(levels) - 1)
                levels.append(np.maximum(prev[:-w], prev[w:]))
            tables[key] = levels
        levels = tables[key]
        j = np.floor(np.log2(np.maximum(z - a, 1))).astype(np.int64)
        out = np.empty(len(a))
        for lv in np.unique(j):
            sel = j == lv
            w = 2 ** int(lv)
            out[sel] = np.maximum(levels[lv][a[sel]], levels[lv][z[sel] - w])
        return out

    def memory_gb_many(self, a: np.ndarray, z: np.ndarray, tp: np.ndarray, micro_batch: np.ndarray,
                       in_flight: np.ndarray, recompute: np.ndarray, modes: tuple = ("none", "selective", "full"),
                       state_bytes: np.ndarray | float = MODEL_STATE_BYTES_PER_PARAM,
                       fused: np.ndarray | bool = True, working_set: bool = True,
                       fp8: np.ndarray | bool = False) -> np.ndarray:
        """:meth:`memory_gb` of many stages: 1-d arrays, ``recompute`` as indices into ``modes``;
        ``state_bytes`` per element (:func:`state_bytes_per_param` of its optimizer and precision), ``fused`` per
        element (its attention kernel is fused) and ``fp8`` per element (an fp8 run below level 3:
        :func:`fp8_stage_bytes`)."""
        t = self._arrays()
        acts = np.zeros(len(a))
        fused = np.broadcast_to(np.asarray(fused, dtype=bool), a.shape)
        for code, mode in enumerate(modes):
            for attention, kind in (("fused", fused), ("eager", ~fused)):
                sel = (recompute == code) & kind
                if not sel.any():
                    continue
                sh, rep = t[("act", mode, attention)]
                sa, sz, stp = a[sel], z[sel], tp[sel]
                acts[sel] = ((sh[sz] - sh[sa]) / stp + (rep[sz] - rep[sa])) * micro_batch[sel] * in_flight[sel]
        out = (self.params_per_device_many(a, z, tp) * state_bytes + acts) / 1e9
        fp8 = np.broadcast_to(np.asarray(fp8, dtype=bool), a.shape)
        if fp8.any():
            cache = np.asarray(self._fp8_cache)
            extra = np.zeros(len(a))
            for code, mode in enumerate(modes):
                sel = fp8 & (recompute == code)
                if sel.any():
                    d8 = np.asarray(self._fp8_delta[mode])
                    sa, sz = a[sel], z[sel]
                    extra[sel] = ((cache[sz] - cache[sa]) * FP8_WEIGHT_CACHE_BYTES
                                  + (d8[sz] - d8[sa]) * micro_batch[sel] * in_flight[sel]) / tp[sel]
            out = out + extra / 1e9
        if working_set:
            out = out + self.working_gb_many(a, z, tp, micro_batch, recompute, modes, fused)
        return out

    def working_gb_many(self, a: np.ndarray, z: np.ndarray, tp: np.ndarray, micro_batch: np.ndarray,
                        recompute: np.ndarray, modes: tuple = ("none", "selective", "full"),
                        fused: np.ndarray | bool = True) -> np.ndarray:
        """:meth:`working_gb` of many stages (arrays as :meth:`memory_gb_many`; 0 where ``z <= a``)."""
        out = np.zeros(len(a))
        fused = np.broadcast_to(np.asarray(fused, dtype=bool), a.shape)
        for code, mode in enumerate(modes):
            for attention, kind in (("fused", fused), ("eager", ~fused)):
                sel = (recompute == code) & kind & (z > a)
                if not sel.any():
                    continue
                work_sh, work_rep = self._work[(mode, attention)]
                la, lz = a[sel], z[sel]
                if self._mixed(mode, attention):  # units with both parts: the exact maximum, stage by stage
                    out[sel] = [self.working_gb(int(x), int(y), float(t), 1, mode, attention)
                                for x, y, t in zip(la, lz, tp[sel])]
                    out[sel] *= micro_batch[sel]
                    continue
                out[sel] = np.maximum(self._range_max(work_sh, la, lz) / tp[sel],
                                      self._range_max(work_rep, la, lz)) * micro_batch[sel] / 1e9
        return out

    def _mixed(self, recompute: str, attention: str) -> bool:
        """Whether some unit's working set has both a ``tp``-split and a whole part (``torch`` kernels under
        full recomputation); else each unit's is one or the other and the range maxima add up exactly."""
        mixed = getattr(self, "_mixed_keys", None)
        if mixed is None:
            mixed = self._mixed_keys = {key for key, (sh, rep) in self._work.items()
                                        if any(x > 0 and y > 0 for x, y in zip(sh, rep))}
        return (recompute, attention) in mixed

    def saved_gb(self, a: int, z: int, tp: int, micro_batch: int, recompute: str, attention: str = "fused") -> float:
        """Activations units ``[a, z)`` save for one micro-batch on one device, GB."""
        sh, rep = self._act[(recompute, attention)]
        return ((sh[z] - sh[a]) / tp + (rep[z] - rep[a])) * micro_batch / 1e9

    def working_gb(self, a: int, z: int, tp: float, micro_batch: int, recompute: str, attention: str = "fused") -> float:
        """The largest working set of units ``[a, z)`` on one device, GB (:func:`stage_working_gb`)."""
        if z <= a:
            return 0.0
        work_sh, work_rep = self._work[(recompute, attention)]
        if self._mixed(recompute, attention):
            return max(x / tp + y for x, y in zip(work_sh[a:z], work_rep[a:z])) * micro_batch / 1e9
        return max(max(work_sh[a:z]) / tp, max(work_rep[a:z])) * micro_batch / 1e9

    def memory_gb(self, a: int, z: int, tp: float, micro_batch: int, in_flight: float, recompute: str,
                  optimizer: str = "adam", attention: str = "fused", working_set: bool = True, *,
                  precision: str, zero: int = 0) -> float:
        """:func:`stage_memory_gb` of units ``[a, z)`` (``working_set=False``: without the working set,
        which a device adds once over all its chunks: :meth:`device_memory_gb`)."""
        sh, rep = self._act[(recompute, attention)]
        acts = ((sh[z] - sh[a]) / tp + (rep[z] - rep[a])) * micro_batch * in_flight
        if precision == "fp8":  # fp8_stage_bytes, from prefix sums
            cache = (self._fp8_cache[z] - self._fp8_cache[a]) * FP8_WEIGHT_CACHE_BYTES if zero < 3 else 0.0
            d8 = self._fp8_delta[recompute]
            acts += (cache + (d8[z] - d8[a]) * micro_batch * in_flight) / tp
        out = (self.params_per_device(a, z, tp) * state_bytes_per_param(optimizer, precision) + acts) / 1e9
        return out + self.working_gb(a, z, tp, micro_batch, recompute, attention) if working_set else out

    def device_memory_gb(self, chunks, micro_batch: int, in_flight: "float | tuple[float, ...]", recompute: str,
                         optimizer: str = "adam", attention: str = "fused", *, precision: str, zero: int = 0) -> float:
        """:func:`device_memory_gb`: chunks ``(a, z, tp)`` of one device, the working set once; ``in_flight``
        one number for every chunk or one per chunk (:func:`chunk_flights`)."""
        chunks = list(chunks)
        flights = in_flight if isinstance(in_flight, tuple) else (in_flight,) * len(chunks)
        base = sum(self.memory_gb(a, z, tp, micro_batch, f, recompute, optimizer, attention, working_set=False,
                                  precision=precision, zero=zero)
                   for (a, z, tp), f in zip(chunks, flights))
        return base + max((self.working_gb(a, z, tp, micro_batch, recompute, attention) for a, z, tp in chunks),
                          default=0.0)
