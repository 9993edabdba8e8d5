"""The words every part uses for a training step's choices, defined once.

Each is a ``Literal`` type (for annotations) with the tuple of its values (for checks and CLI help):

>>> PRECISIONS, RECOMPUTE_MODES, SCHEDULES
(('bf16', 'fp16', 'fp32'), ('none', 'selective', 'full'), ('gpipe', '1f1b', 'interleaved'))
>>> chunks_per_device("interleaved", 2), chunks_per_device("1f1b", 2)
(2, 1)
"""

from __future__ import annotations

from typing import Literal, get_args

__all__ = ["Precision", "PRECISIONS", "DTYPE_BYTES", "RecomputeMode", "RECOMPUTE_MODES", "Recompute",
           "RECOMPUTE_CHOICES", "Schedule", "SCHEDULES", "UnitKind", "UNIT_KINDS", "chunks_per_device"]

Precision = Literal["bf16", "fp16", "fp32"]
"""Compute precision of matrix products (mixed precision with fp32 master weights unless fp32)."""
PRECISIONS: tuple[str, ...] = get_args(Precision)
DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp32": 4}
"""Bytes of one activation element at each precision."""

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
