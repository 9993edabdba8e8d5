"""The words every part uses for a training step's choices, defined once.

Each is a ``Literal`` type (for annotations) with the tuple of its values (for checks and CLI help):

>>> PRECISIONS, RECOMPUTE_MODES, SCHEDULES
(('bf16', 'fp16', 'fp32', 'tf32', 'fp8'), ('none', 'selective', 'full'), ('gpipe', '1f1b', 'interleaved'))
>>> chunks_per_device("interleaved", 2), chunks_per_device("1f1b", 2)
(2, 1)
"""

from __future__ import annotations

from typing import Literal, get_args

__all__ = ["Precision", "PRECISIONS", "DTYPE_BYTES", "Optimizer", "OPTIMIZERS", "Attention", "ATTENTIONS",
           "ARCHITECTURES", "Offload", "OFFLOADS", "OffloadChoice", "OFFLOAD_CHOICES",
           "RecomputeMode", "RECOMPUTE_MODES", "Recompute",
           "RECOMPUTE_CHOICES", "Schedule", "SCHEDULES", "UnitKind", "UNIT_KINDS", "chunks_per_device"]

Precision = Literal["bf16", "fp16", "fp32", "tf32", "fp8"]
"""Compute precision of matrix products: bf16/fp16 mixed precision with fp32 master weights; fp32
(IEEE fp32 products, PyTorch's default since 1.12); tf32 (fp32 tensors, TF32 tensor-core products:
``torch.backends.cuda.matmul.allow_tf32 = True``); fp8 (Transformer Engine style: fp8 products,
bf16 activations, fp32 master weights)."""
PRECISIONS: tuple[str, ...] = get_args(Precision)
DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp32": 4, "tf32": 4, "fp8": 2}
"""Bytes of one activation element at each precision (fp8 keeps bf16 activations between products)."""

Optimizer = Literal["adam", "sgd", "adam8bit"]
"""Optimizer: Adam (two fp32 moments), SGD with momentum (one), 8-bit Adam (two 1-byte moments, Dettmers et al. 2022)."""
OPTIMIZERS: tuple[str, ...] = get_args(Optimizer)
Attention = Literal["fused", "eager"]
"""Attention kernel: ``fused`` (flash / SDPA: no attention-score matrix stored) or ``eager`` (scores
and softmax stored for the backward, Korthikanti et al. 2022's ``5 a s^2``)."""
ATTENTIONS: tuple[str, ...] = get_args(Attention)
Offload = Literal["none", "optimizer", "full"]
"""Model states kept in host memory: ``optimizer`` the fp32 master weights, the optimizer's moments and the
gradient shards, with the optimizer step run on the CPU (ZeRO-Offload, Ren et al. 2021; DeepSpeed's
``offload_optimizer``, Megatron-Core's ``--optimizer-cpu-offload``); ``full`` also the 16-bit parameters,
copied to the device unit by unit before each gather (FSDP2's ``CPUOffloadPolicy``, ZeRO-Infinity's
``offload_param``; needs ``zero`` 3)."""
OFFLOADS: tuple[str, ...] = get_args(Offload)
OffloadChoice = Literal["none", "optimizer", "full", "auto"]
"""What a workload asks for: an offload, or ``auto`` (the planner offloads only where nothing fits otherwise:
none first, then the optimizer, then everything)."""
OFFLOAD_CHOICES: tuple[str, ...] = get_args(OffloadChoice)
ARCHITECTURES: tuple[str, ...] = ("pascal", "volta", "turing", "ampere", "ada", "hopper", "cdna2", "cdna3", "davinci")
"""GPU architectures the cost model knows (``GPUSpec.arch``)."""

RecomputeMode = Literal["none", "selective", "full"]
"""Activation recomputation of a plan (Korthikanti et al. 2022): none, attention only, whole layers."""
RECOMPUTE_MODES: tuple[str, ...] = get_args(RecomputeMode)
Recompute = Literal["none", "selective", "full", "auto"]
"""What a workload asks for: a mode, or ``auto`` (the planner chooses per plan)."""
RECOMPUTE_CHOICES: tuple[str, ...] = get_args(Recompute)

Schedule = Literal["gpipe", "1f1b", "interleaved"]
"""Pipeline schedule: GPipe, 1F1B (PipeDream-Flush), Megatron's interleaved 1F1B."""
SCHEDULES: tuple[str, ...] = get_args(Schedule)

UnitKind = Literal["embedding", "block", "head", "module"]
"""A partitionable unit: a transformer's embedding, block or head, or a traced module."""
UNIT_KINDS: tuple[str, ...] = get_args(UnitKind)


def chunks_per_device(schedule: str, interleave: int) -> int:
    """Model chunks (virtual stages) each pipeline device runs: ``interleave`` under the interleaved
    schedule, else one."""
    return interleave if schedule == "interleaved" else 1
