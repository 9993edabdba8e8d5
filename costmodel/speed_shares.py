"""Batch shares for replicas that differ only in measured device speed (``slow:`` in the cluster file).

The planners size replicas by device type, so replicas cut alike on devices of one type get equal
shares of the batch, and a replica that holds a throttled device then paces the step. Here each group
of such replicas (same layers, TP degrees and device types, device by device, per stage; speeds aside) shares its own
micro-batches in proportion to the replicas' speeds, in whole micro-batches: the slowest finishes no
later than it must. Shares between groups (the planners' choice between device types) are kept.

A replica's speed is its slowest stage's, a stage's that of its tensor-parallel group: each device
runs its share of every unit's split work (:func:`~hetpart.costmodel.tp_split.unit_shares`, even
without a ``tp_split``) at its speed, and the group waits for the most loaded device relative to its
speed. This is a proportion, not a prediction: the evaluator prices the plan with and without these
shares and keeps the faster, and the hill-climb moves single micro-batches from there.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import replace
from typing import TYPE_CHECKING, Sequence

import numpy as np

from hetpart.costmodel.tp_split import unit_shares

if TYPE_CHECKING:  # pragma: no cover
    from hetpart.cluster import Cluster
    from hetpart.graph.model_graph import ModelGraph
    from hetpart.plan import Plan, Replica, Stage

__all__ = ["replica_classes", "replica_speed", "speed_shares", "whole_shares"]


def replica_classes(plan: "Plan", cluster: "Cluster", speeds: bool = False) -> dict[tuple, list[int]]:
    """Indices of ``plan``'s replicas by class: the same layers, TP degree and device types (device by
    device) per stage, and with ``speeds`` the same measured speeds (``slow:``) too. Replicas of one class
    differ only in where they sit (and without ``speeds``, in how fast their devices run)."""
    out: dict[tuple, list[int]] = defaultdict(list)
    for i, r in enumerate(plan.replicas):
        out[tuple((s.layers, tuple(cluster.device(d).gpu.name for d in s.devices), s.tp,
                   tuple(cluster.device(d).speed for d in s.devices) if speeds else ())
                  for s in r.stages)].append(i)
    return out


def _stage_speed(model: "ModelGraph", cluster: "Cluster", stage: "Stage", cp: int) -> float:
    speeds = np.array([cluster.device(d).speed for d in stage.devices])
    if cp > 1:  # cp tensor-parallel groups of tp devices: the slowest group paces the stage
        return min(_group_speed(model, stage, speeds[c * stage.tp:(c + 1) * stage.tp]) for c in range(cp))
    return _group_speed(model, stage, speeds)


def _group_speed(model: "ModelGraph", stage: "Stage", speeds: np.ndarray) -> float:
    if (speeds == 1.0).all():
        return 1.0
    a, z = stage.layers
    shares = unit_shares(model, stage.tp, stage.tp_split)[:, a:z]  # [tp, units]
    work = np.array([u.fwd_flops + u.bwd_flops for u in model.units[a:z]])
    at_speed = (shares / speeds[:, None]).max(axis=0) * stage.tp  # per unit: time against the group at full speed
    return float(work.sum() / max((work * at_speed).sum(), 1e-30)) if work.sum() > 0 else float(speeds.min())


def replica_speed(model: "ModelGraph", cluster: "Cluster", replica: "Replica", cp: int = 1) -> float:
    """The replica's rate against the same replica at full speed (1.0 without throttled devices)."""
    return min(_stage_speed(model, cluster, s, cp) for s in replica.stages)


def whole_shares(speeds: Sequence[float], microbatches: int) -> list[int] | None:
    """``microbatches`` handed out so that the slowest finishes first (``max count / speed`` least), each at
    least one; None when there are fewer micro-batches than replicas."""
    k = len(speeds)
    if microbatches < k:
        return None
    counts = [1] * k
    heap = [(2 / s, i) for i, s in enumerate(speeds)]  # the finish time of one more micro-batch
    heapq.heapify(heap)
    for _ in range(microbatches - k):
        _, i = heapq.heappop(heap)
        counts[i] += 1
        heapq.heappush(heap, ((counts[i] + 1) / speeds[i], i))
    return counts


def speed_shares(model: "ModelGraph", cluster: "Cluster", plan: "Plan") -> "Plan":
    """``plan`` with each group of replicas that differ only in device speed sharing that group's
    micro-batches in proportion to their speeds (:func:`replica_speed`); the same object where nothing
    changes: no throttled device, one replica, or sharding level 2-3 (where every replica of a shard
    group runs the group's largest count, padded: uneven shares buy nothing)."""
    if not cluster.slow or plan.dp < 2 or plan.zero >= 2:
        return plan
    groups = replica_classes(plan, cluster)
    per_mb = plan.micro_batch / plan.global_batch
    shares = [r.batch_share for r in plan.replicas]
    for members in groups.values():
        if len(members) < 2:
            continue
        speeds = [replica_speed(model, cluster, plan.replicas[i], plan.cp) for i in members]
        if max(speeds) - min(speeds) < 1e-9:
            continue
        total = round(sum(shares[i] for i in members) / per_mb)
        counts = whole_shares(speeds, total)
        if counts is None:
            continue
        for i, c in zip(members, counts):
            shares[i] = c * per_mb
    if shares == [r.batch_share for r in plan.replicas]:
        return plan
    return replace(plan, replicas=tuple(replace(r, batch_share=s) for r, s in zip(plan.replicas, shares)))
