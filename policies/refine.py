"""Hill-climbing a plan under the simulator: move layer boundaries and micro-batches one at a time.

The search's estimate and the simulator agree on the shape of good plans but not to the last
unit: the simulator overlaps gradient sync with backward, runs the schedule event by event and
counts memory exactly. A few simulated moves around the best candidate close that gap.
"""

from __future__ import annotations

import math
import time

from dataclasses import replace
from typing import TYPE_CHECKING, Iterator

from hetpart.costmodel.evaluator import Evaluated, Evaluator
from hetpart.costmodel.speed_shares import replica_classes
from hetpart.plan import Plan, Replica

if TYPE_CHECKING:  # pragma: no cover
    from hetpart.cluster import Cluster

__all__ = ["refine", "neighbours", "interleaved"]


def _classes(plan: Plan, cluster: "Cluster", speeds: bool = True) -> dict[tuple, list[int]]:
    """Replicas that move together: the same layer bounds on the same device types at the same measured
    speeds (``slow:``). A replica holding a throttled device is a class of its own, so micro-batches can
    move off it."""
    return replica_classes(plan, cluster, speeds)


def _with_bounds(replica: Replica, j: int, delta: int) -> Replica | None:
    stages = list(replica.stages)
    cut = stages[j].layers[1] + delta
    if not stages[j].layers[0] < cut < stages[j + 1].layers[1]:
        return None
    stages[j] = replace(stages[j], layers=(stages[j].layers[0], cut))
    stages[j + 1] = replace(stages[j + 1], layers=(cut, stages[j + 1].layers[1]))
    return replace(replica, stages=tuple(stages))


def _boundary_moves(plan: Plan, cluster: "Cluster") -> Iterator[Plan]:
    for members in _classes(plan, cluster).values():
        first = plan.replicas[members[0]]
        for j in range(first.pp - 1):
            for delta in (-1, 1):
                replicas = list(plan.replicas)
                moved = [_with_bounds(replicas[i], j, delta) for i in members]
                if any(r is None for r in moved):
                    continue
                for i, r in zip(members, moved):
                    replicas[i] = r
                yield replace(plan, replicas=tuple(replicas))


def _batch_moves(plan: Plan, cluster: "Cluster") -> Iterator[Plan]:
    classes = list(_classes(plan, cluster).values())
    step = plan.micro_batch / plan.global_batch
    for a in classes:
        for b in classes:
            if a is b:
                continue
            give = max(a, key=lambda i: plan.replicas[i].batch_share)
            take = min(b, key=lambda i: plan.replicas[i].batch_share)
            if plan.replicas[give].batch_share - step < step / 2:
                continue
            replicas = list(plan.replicas)
            replicas[give] = replace(replicas[give], batch_share=replicas[give].batch_share - step)
            replicas[take] = replace(replicas[take], batch_share=replicas[take].batch_share + step)
            yield replace(plan, replicas=tuple(replicas))


def neighbours(plan: Plan, cluster: "Cluster") -> Iterator[Plan]:
    """Plans one boundary move (per class of identical replicas) or one micro-batch move away."""
    yield from _boundary_moves(plan, cluster)
    yield from _batch_moves(plan, cluster)


def interleaved(plan: Plan, chunks: int) -> Plan | None:
    """The same plan under Megatron's interleaved 1F1B with ``chunks`` model chunks per device:
    every device keeps (nearly) the same number of units, cut into ``chunks`` pieces taken in
    round-robin order. None when a device holds fewer units than ``chunks`` or the plan is not 1F1B."""
    if plan.schedule != "1f1b" or chunks < 2:
        return None
    replicas = []
    for rep in plan.replicas:
        sizes = [s.layers[1] - s.layers[0] for s in rep.stages]
        if rep.pp < 2 or min(sizes) < chunks:
            return None
        stages, first = [], 0
        for r in range(chunks):
            for s, size in zip(rep.stages, sizes):
                piece = size // chunks + (1 if r < size % chunks else 0)
                stages.append(replace(s, layers=(first, first + piece)))
                first += piece
        replicas.append(replace(rep, stages=tuple(stages)))
    return replace(plan, replicas=tuple(replicas), schedule="interleaved", interleave=chunks)


def finer(plan: Plan, cluster: "Cluster") -> Iterator[Plan]:
    """Variants of ``plan`` on which micro-batches can move off a slow replica, when its replicas run at
    unlike speeds within one device type (``slow:``; nothing for other plans). The planners size
    replicas by device type, so a replica holding a throttled device gets the same share as the others;
    :func:`_batch_moves` can shift work off it one micro-batch at a time, so: ``plan`` at each smaller
    micro-batch size that divides its own, and at sharding levels 2-3 (where every replica runs its
    shard group's largest count of micro-batches, padded: uneven shares buy nothing) the same at level 1."""
    if plan.dp < 2 or not cluster.slow or len(_classes(plan, cluster)) == len(_classes(plan, cluster, speeds=False)):
        return
    for zero in (plan.zero, 1) if plan.zero >= 2 else (plan.zero,):
        for mb in range(plan.micro_batch, 0, -1):
            if plan.micro_batch % mb == 0 and (zero, mb) != (plan.zero, plan.micro_batch):
                yield replace(plan, micro_batch=mb, zero=zero)


def refine(evaluate: Evaluator, start: Evaluated, budget: int, deadline: float = math.inf) -> Evaluated:
    """Hill-climb from ``start``, from its :func:`finer` variants where its replicas run at unlike
    speeds, then from the best of the best one's interleaved variants (2 and 3 chunks, at its micro-batch and
    half of it), spending at most ``budget`` simulations on each climb and stopping at ``deadline``
    (``time.monotonic()``)."""
    best = _climb(evaluate, start, budget, deadline)
    for variant in finer(start.plan, evaluate.cluster):
        if time.monotonic() > deadline:
            return best
        found = evaluate(variant)
        if found is not None:
            found = _climb(evaluate, found, budget, deadline)
            if found.tokens_per_s > best.tokens_per_s * (1 + 1e-9):
                best = found
    # interleaving holds more activations and idles less: where the best 1F1B micro-batch does not fit it (or a
    # smaller one idles less), half of it may; the half is tried where the best's own micro-batch gave nothing
    for chunks in (2, 3):
        if best.plan.schedule != "1f1b":
            break
        for mb in dict.fromkeys((best.plan.micro_batch, best.plan.micro_batch // 2)):
            variant = interleaved(replace(best.plan, micro_batch=mb), chunks) if mb >= 1 else None
            found = evaluate(variant) if variant is not None and time.monotonic() <= deadline else None
            if found is not None:
                found = _climb(evaluate, found, budget, deadline)
                if found.tokens_per_s > best.tokens_per_s * (1 + 1e-9):
                    best = found
                break
    return best


def _climb(evaluate: Evaluator, start: Evaluated, budget: int, deadline: float = math.inf) -> Evaluated:
    """First-improvement hill-climb from ``start`` spending at most ``budget`` simulations, none after
    ``deadline``."""
    cluster = evaluate.cluster
    best, used, improved = start, 0, True
    while improved and used < budget:
        improved = False
        for candidate in neighbours(best.plan, cluster):
            if used >= budget or time.monotonic() > deadline:
                return best
            used += 1
            found = evaluate(candidate)
            if found is not None and found.tokens_per_s > best.tokens_per_s * (1 + 1e-9):
                best, improved = found, True
                break
    return best
