"""One interface to every planner: ``plan(model, cluster, workload, planner="search") -> PlanResult``.

Planners (``PLANNERS``):

* ``uniform`` -- Megatron-LM without heterogeneity awareness (:mod:`hetpart.costmodel.plan_uniform`);
* ``proportional`` -- Holmes / HAP: layers and batch in proportion to device speed
  (:mod:`hetpart.costmodel.plan_proportional`);
* ``search`` -- Metis / AMP / Sailor style exact search (:mod:`hetpart.costmodel.plan_search`).

``policy`` (the learned planner) is named so that the CLI can say clearly that it is not built yet.
Every planner returns only plans that the simulator says fit in memory; when none exists the
planner raises :class:`~hetpart.errors.WorkloadError` saying why and what would fit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable

from hetpart.costmodel.evaluator import Evaluated, Evaluator, best_of, evaluate
from hetpart.costmodel.pools import check_zones_connected
from hetpart.errors import PlanError, WorkloadError
from hetpart.plan import Plan

if TYPE_CHECKING:  # pragma: no cover
    from hetpart.cluster import Cluster
    from hetpart.costmodel.simulator import Prediction
    from hetpart.graph.model_graph import ModelGraph
    from hetpart.workload import Workload

__all__ = ["PLANNERS", "PlanResult", "plan", "recompute_modes", "microbatch_options", "evaluate", "best_of",
           "no_plan_error", "spec_name", "Evaluated", "Evaluator"]

PLANNERS: tuple[str, ...] = ("uniform", "proportional", "search")
_NOT_BUILT = ("policy",)


@dataclass(frozen=True)
class PlanResult:
    """A planner's answer."""

    plan: Plan
    """The chosen plan (its ``meta`` records model, cluster, workload and planner)."""
    prediction: "Prediction"
    """The simulator's prediction for it (always ``fits_in_memory``)."""
    wall_time_s: float
    """Seconds the planner took."""
    planner: str
    """Planner name."""

    def to_dict(self) -> dict[str, Any]:
        return {"plan": self.plan.to_dict(), "metrics": dict(self.prediction.metrics),
                "planner": {"name": self.planner, "wall_time_s": self.wall_time_s}}


def _registry() -> dict[str, Callable[..., "Evaluated"]]:
    from hetpart.costmodel.plan_proportional import plan_proportional
    from hetpart.costmodel.plan_search import plan_search
    from hetpart.costmodel.plan_uniform import plan_uniform

    return {"uniform": plan_uniform, "proportional": plan_proportional, "search": plan_search}


def plan(model: "ModelGraph", cluster: "Cluster", workload: "Workload", planner: str = "search",
         **opts: Any) -> PlanResult:
    """Plan ``workload`` for ``model`` on ``cluster`` with the named planner.

    Args:
        planner: one of ``PLANNERS``.
        opts: planner options (see each planner's function).

    Raises:
        PlanError: unknown planner, or ``policy`` (not built yet).
        WorkloadError: no plan fits (the message says why and what would fit).
    """
    if planner in _NOT_BUILT:
        raise PlanError(f"--planner: {planner!r} is not built yet (the learned policy comes with the RL issue); "
                        f"use one of {', '.join(PLANNERS)}")
    if planner not in PLANNERS:
        raise PlanError(f"--planner: unknown planner {planner!r}; use one of {', '.join(PLANNERS)}")
    _check_workload(model, workload)
    check_zones_connected(cluster)
    _check_capacity(model, cluster, workload, planner)
    start = time.perf_counter()
    best = _registry()[planner](model, cluster, workload, **opts)
    prediction = Evaluator(model, cluster, workload).predict(best.plan)
    wall = time.perf_counter() - start
    chosen = replace(best.plan, meta={
        "model": spec_name(model.source, model.name), "cluster": spec_name(cluster.source, cluster.name),
        "workload": workload.to_dict(), "planner": planner,
        "predicted_tokens_per_s": best.tokens_per_s})
    return PlanResult(chosen, prediction, wall, planner)


def spec_name(source: str, fallback: str) -> str:
    """The ``--model`` / ``--cluster`` argument that reloads an object read from ``source``."""
    if source.startswith("catalog:"):
        return source.split(":", 1)[1]
    return source if source and not source.startswith("<") else fallback


def _check_workload(model: "ModelGraph", workload: "Workload") -> None:
    if workload.seq_len != model.seq_len:
        raise WorkloadError(f"--seq-len: the model graph was built for {model.seq_len} tokens but the workload "
                            f"asks for {workload.seq_len}; load the model with seq_len={workload.seq_len}")


def _check_capacity(model: "ModelGraph", cluster: "Cluster", workload: "Workload", planner: str) -> None:
    """Fail fast when the model states alone exceed every device's memory together."""
    from hetpart.costmodel.memory import MODEL_STATE_BYTES_PER_PARAM, memory_capacity_gb

    state_gb = model.num_params * MODEL_STATE_BYTES_PER_PARAM / 1e9
    if state_gb > sum(memory_capacity_gb(d.gpu) for d in cluster.devices):
        raise no_plan_error(model, cluster, workload, planner, "the model states alone exceed the cluster's memory")


def recompute_modes(workload: "Workload") -> tuple[str, ...]:
    """Modes a planner may choose: all three for ``auto``, else the one asked for."""
    if workload.recompute == "auto":
        return ("none", "selective", "full")
    return (workload.recompute,)


def microbatch_options(samples: int, limit: int = 16) -> list[int]:
    """Micro-batch sizes that divide ``samples`` sequences, up to ``limit``."""
    return [b for b in range(1, min(samples, limit) + 1) if samples % b == 0]


def no_plan_error(model: "ModelGraph", cluster: "Cluster", workload: "Workload", planner: str, why: str) -> WorkloadError:
    """A :class:`WorkloadError` that says why nothing fits and what would."""
    from hetpart.costmodel.memory import memory_capacity_gb

    state_gb = model.num_params * 16 / 1e9  # fp32 master + 2 Adam moments + 16-bit weights and grads
    capacity = sum(memory_capacity_gb(d.gpu) for d in cluster.devices)
    hint = (f"the weights, gradients and Adam states alone need {state_gb:.1f} GB and the cluster's devices hold "
            f"{capacity:.1f} GB usable in all")
    if state_gb >= capacity:
        fix = (f"use a smaller model (under {capacity / 16:.1f}B parameters, less with activations) or a cluster "
               "with more device memory")
    else:
        fix = ("try --recompute full (or auto), a smaller --global-batch that divides into whole micro-batches, "
               "a shorter --seq-len, or more devices")
    return WorkloadError(f"{planner} planner: no plan for {model.name} (global batch {workload.global_batch}, seq "
                         f"{workload.seq_len}) fits {cluster.name}: {why}; {hint}; {fix}")
