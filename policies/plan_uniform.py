"""The ``uniform`` planner: what Megatron-LM does without heterogeneity awareness.

It searches the uniform grid ``tp x pp x dp = all devices`` (tensor parallelism inside a node,
dividing the attention heads), every micro-batch size that divides a replica's batch (up to 16)
and the allowed recompute modes, with the even layer split and even batch split of
:func:`hetpart.costmodel.megatron.megatron_plan`, and keeps the fastest plan that fits in memory
on every device (so the smallest device bounds it). Schedule: 1F1B.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from hetpart.costmodel.evaluator import Evaluated, Evaluator
from hetpart.costmodel.pools import divisors
from hetpart.errors import HetpartError, WorkloadError
from hetpart.plan import Plan
from hetpart.policies.common import (FunctionPlanner, microbatch_options, no_plan_error, recompute_modes,
                                     with_full_shard_fallback)

if TYPE_CHECKING:  # pragma: no cover
    from hetpart.cluster import Cluster
    from hetpart.graph.model_graph import ModelGraph
    from hetpart.workload import Workload

__all__ = ["plan_uniform", "uniform_grid", "UNIFORM"]


def uniform_grid(model: "ModelGraph", cluster: "Cluster", workload: "Workload") -> Iterator[tuple[int, int, int]]:
    """Every ``(tp, pp, dp)`` with ``tp * pp * dp`` = all devices that Megatron could run."""
    n = cluster.num_devices
    per_node = min(g.gpus_per_node for g in cluster.groups)
    heads = model.num_heads or 1
    for tp in divisors(per_node):
        if heads % tp or (tp > 1 and model.traced):
            continue
        if any(g.gpus_per_node % tp for g in cluster.groups):  # a TP group would cross a node (and tp * pp * dp < n)
            continue
        for pp in divisors(n // tp):
            dp = n // (tp * pp)
            if pp <= model.num_units and workload.global_batch % dp == 0:
                yield tp, pp, dp


def _plans(model: "ModelGraph", cluster: "Cluster", workload: "Workload", tp: int, pp: int, dp: int,
           fits) -> Iterator[Plan]:
    """Per micro-batch size, the plan with the least recomputation that fits (more recomputation of
    the same plan is only slower)."""
    from hetpart.costmodel.megatron import megatron_plan

    for micro_batch in microbatch_options(workload.global_batch // dp):
        for recompute in recompute_modes(workload):
            try:
                candidate = megatron_plan(model, cluster, workload, tp=tp, pp=pp, dp=dp, micro_batch=micro_batch,
                                          schedule="1f1b", interleave=1, recompute=recompute)
            except HetpartError:
                break
            if fits(candidate):
                yield candidate
                break


def plan_uniform(model: "ModelGraph", cluster: "Cluster", workload: "Workload", *,
                 evaluator: Evaluator | None = None) -> Evaluated:
    """The fastest uniform Megatron plan that fits (on every device; where none does, on the first nodes of
    each node group, :func:`~hetpart.policies.plan_search.fewer_nodes_best`).

    Raises:
        WorkloadError: when no grid point fits in memory on every device.
    """
    evaluate = evaluator or Evaluator(model, cluster, workload)
    best = with_full_shard_fallback(_best_uniform, model, cluster, workload, evaluate)
    if best is None:  # a batch too small for every device: the grid over the first nodes of each group
        from hetpart.policies.plan_search import fewer_nodes_best

        best = fewer_nodes_best(model, cluster, workload, evaluate, None, lambda view, ev: with_full_shard_fallback(
            _best_uniform, model, view, workload, ev))
    if best is None:
        n = cluster.num_devices
        batch_error = _batch_is_the_cause(model, cluster, workload)
        if batch_error is not None:
            raise batch_error
        if next(uniform_grid(model, cluster, workload), None) is None:  # not memory: no grid covers the devices
            per_node = min(g.gpus_per_node for g in cluster.groups)
            raise WorkloadError(
                f"uniform planner: no plan for {model.name} (global batch {workload.global_batch}) on {cluster.name}: "
                f"no tp x pp x dp grid covers its {n} devices (tp divides every node's GPUs (the smallest has {per_node}) and "
                f"the {model.num_heads or 1} heads, pp is at most the model's {model.num_units} units, dp divides "
                "the global batch); use a global batch or a device count that factors so, or --planner search "
                "(any split of the devices, some left idle)")
        raise no_plan_error(model, cluster, workload, "uniform",
                            f"no uniform tp x pp x dp grid over its {n} devices fits in memory on every device")
    return best


def _best_uniform(model, cluster, workload, evaluate: Evaluator) -> Evaluated | None:
    return evaluate.best(candidate for tp, pp, dp in uniform_grid(model, cluster, workload)
                         for candidate in _plans(model, cluster, workload, tp, pp, dp, evaluate.fits))


UNIFORM = FunctionPlanner("uniform", plan_uniform, frozenset(),
                          "Megatron-LM's uniform tp x pp x dp grid, heterogeneity-unaware")
"""The registry's ``uniform`` planner (takes no options)."""


def _batch_is_the_cause(model, cluster, workload) -> WorkloadError | None:
    """Where the global batch divides by no data-parallel degree of a grid that would fit (a batch of 7 on 26
    devices), the error that says so; ``None`` where a batch that every grid's dp divides fits no better."""
    from dataclasses import replace

    n = cluster.num_devices
    relaxed = replace(workload, global_batch=workload.global_batch * n)  # every grid's dp divides n
    if set(uniform_grid(model, cluster, relaxed)) == set(uniform_grid(model, cluster, workload)):
        return None
    best = with_full_shard_fallback(_best_uniform, model, cluster, relaxed, Evaluator(model, cluster, relaxed))
    if best is None:
        return None
    dp = len(best.plan.replicas)
    batch = -(-workload.global_batch // dp) * dp
    return WorkloadError(
        f"uniform planner: no plan for {model.name} (global batch {workload.global_batch}) on {cluster.name}: "
        f"the global batch is the cause, not memory: {workload.global_batch} sequences split evenly over the "
        f"data-parallel copies of no grid over its {n} devices that fits (the fastest such grid has dp {dp}); use "
        f"--global-batch {batch} (a multiple of {dp}), or --planner search (any split of the devices, some left idle)")
