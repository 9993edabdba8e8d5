"""Turning planner decisions (stage device groups, layer bounds, micro-batch counts) into a :class:`Plan`."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from hetpart.graph.model_graph import ModelGraph
from hetpart.plan import Plan, Replica, Stage
from hetpart.workload import Workload

__all__ = ["assemble", "proportional_bounds", "proportional_counts", "unit_train_flops"]


def unit_train_flops(model: ModelGraph) -> np.ndarray:
    """Forward + backward FLOPs per unit (per sequence). Shapes: ``[num_units]``."""
    return np.array([u.fwd_flops + u.bwd_flops for u in model.units], dtype=float)


def proportional_bounds(model: ModelGraph, speeds: Sequence[float]) -> tuple[int, ...] | None:
    """Stage boundaries giving stage ``j`` a share of the training FLOPs proportional to ``speeds[j]``.

    Each stage gets at least one unit; None when there are more stages than units. Units with no
    FLOPs (an embedding lookup) count as a small fraction of a block so that they still move.
    """
    n, pp = model.num_units, len(speeds)
    if pp > n:
        return None
    flops = unit_train_flops(model)
    flops = np.maximum(flops, 0.01 * max(float(flops.max()), 1.0))
    target = np.cumsum(speeds)[:-1] / float(sum(speeds)) * flops.sum()
    prefix = np.cumsum(flops)
    bounds = [0]
    for j, t in enumerate(target):
        cut = int(np.argmin(np.abs(prefix - t))) + 1
        cut = max(cut, bounds[-1] + 1)
        cut = min(cut, n - (pp - 1 - j))
        bounds.append(cut)
    bounds.append(n)
    return tuple(bounds)


def proportional_counts(speeds: Sequence[float], total: int) -> tuple[int, ...] | None:
    """Whole micro-batches per replica in proportion to ``speeds`` (largest remainder, each >= 1)."""
    k = len(speeds)
    if total < k:
        return None
    spare = total - k
    exact = np.asarray(speeds, dtype=float) / float(sum(speeds)) * spare
    counts = np.floor(exact).astype(int)
    order = np.argsort(-(exact - counts), kind="stable")
    counts[order[: spare - int(counts.sum())]] += 1
    return tuple(int(c) + 1 for c in counts)


def assemble(stage_groups: Sequence[Sequence[tuple[str, ...]]], bounds: Sequence[Sequence[int]],
             microbatches: Sequence[int], micro_batch: int, recompute: str, workload: Workload,
             schedule: str = "1f1b", zero: int | None = None) -> Plan:
    """A plan from per replica: stage device groups, layer bounds and micro-batches per step.

    ``sum(microbatches) * micro_batch`` must equal the workload's global batch. ``zero``: the sharding
    level (default: the workload's, else none); a single replica has nothing to shard (level 0).
    """
    total = sum(microbatches) * micro_batch
    if total != workload.global_batch:
        raise ValueError(f"micro-batches cover {total} sequences, not {workload.global_batch}")
    replicas = []
    for groups, cuts, count in zip(stage_groups, bounds, microbatches):
        stages = tuple(Stage((int(a), int(b)), tuple(g), len(g)) for g, a, b in zip(groups, cuts[:-1], cuts[1:]))
        replicas.append(Replica(count * micro_batch / workload.global_batch, stages))
    zero = (workload.zero or 0) if zero is None else zero
    if workload.offload == "full":  # the parameters come from the host unit by unit: FSDP's full shard
        zero = 3
    elif len(replicas) == 1 and workload.offload == "none":  # one replica has nothing to shard (offloaded, it
        zero = 0  # streams its gradients to the host at level 2: ZeRO-Offload on one GPU)
    return Plan(global_batch=workload.global_batch, micro_batch=micro_batch, seq_len=workload.seq_len,
                replicas=tuple(replicas), schedule=schedule, recompute=recompute, precision=workload.precision,
                zero=zero, optimizer=workload.optimizer, attention=workload.attention, offload=workload.offload)
