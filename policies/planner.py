"""One front door to every planner: ``plan(model, cluster, workload, planner="search") -> PlanResult``.

Built-in planners (:mod:`hetpart.policies.registry`; ``register_planner`` adds more):

* ``uniform`` -- Megatron-LM without heterogeneity awareness (:mod:`hetpart.policies.plan_uniform`);
* ``proportional`` -- Holmes / HAP: layers and batch in proportion to device speed
  (:mod:`hetpart.policies.plan_proportional`);
* ``search`` -- Metis / AMP / Sailor style exact search (:mod:`hetpart.policies.plan_search`).

Every planner prices its candidates with one predictor from the costmodel registry
(:func:`hetpart.costmodel.predictor.get_predictor`) and returns only plans that fit in memory; when
none exists it raises :class:`~hetpart.errors.WorkloadError` saying why and what would fit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Union

from hetpart.costmodel.evaluator import Evaluator
from hetpart.costmodel.pools import check_zones_connected
from hetpart.errors import WorkloadError
from hetpart.plan import Plan
from hetpart.policies.common import check_options, no_plan_error, spec_name
from hetpart.policies.registry import get_planner

if TYPE_CHECKING:  # pragma: no cover
    from hetpart.cluster import Cluster
    from hetpart.costmodel.predictor import Predictor
    from hetpart.costmodel.simulator import Prediction
    from hetpart.graph.model_graph import ModelGraph
    from hetpart.workload import Workload

__all__ = ["PlanResult", "plan", "make_evaluator"]


@dataclass(frozen=True)
class PlanResult:
    """A planner's answer."""

    plan: Plan
    """The chosen plan (its ``meta`` records model, cluster, workload and planner)."""
    prediction: "Prediction"
    """The predictor's full report for it (always ``fits_in_memory``)."""
    wall_time_s: float
    """Seconds the planner took."""
    planner: str
    """Planner name."""
    evaluation: dict[str, Any] = field(default_factory=dict)
    """Which predictor priced the candidates (name, version) and whether branch and bound pruned
    (:meth:`~hetpart.costmodel.evaluator.Evaluator.describe`)."""

    def to_dict(self) -> dict[str, Any]:
        return {"plan": self.plan.to_dict(), "metrics": dict(self.prediction.metrics),
                "planner": {"name": self.planner, "wall_time_s": self.wall_time_s} | self.evaluation}


def make_evaluator(model: "ModelGraph", cluster: "Cluster", workload: "Workload",
                   predictor: Union[str, "Predictor", None] = None, ignore_memory: bool = False,
                   predictor_options: dict[str, Any] | None = None) -> Evaluator:
    """An :class:`Evaluator` with ``predictor`` (a registry name, an object, or None for the default);
    ``predictor_options`` go to the registry's factory (a name only: ``{"profile": ...}``)."""
    from hetpart.costmodel.predictor import get_predictor

    if predictor is None or isinstance(predictor, str):
        predictor = get_predictor(predictor, model, cluster, workload, **(predictor_options or {}))
    return Evaluator(model, cluster, workload, ignore_memory, predictor)


def plan(model: "ModelGraph", cluster: "Cluster", workload: "Workload", planner: str = "search", *,
         predictor: Union[str, "Predictor", None] = None, **options: Any) -> PlanResult:
    """Plan ``workload`` for ``model`` on ``cluster`` with the named planner.

    Args:
        planner: a registered planner (:func:`~hetpart.policies.registry.available_planners`).
        predictor: what prices the candidates: a registry name, a predictor, or None (the default).
        options: the planner's options (its ``options``; anything else is refused).

    Raises:
        PlanError: unknown planner, predictor or option.
        WorkloadError: no plan fits (the message says why and what would fit).

    With ``workload.offload`` ``auto`` the planner plans without offload first, then with the optimizer on
    the host, then with everything there (``full``, at level 3), and returns the first that fits.
    """
    if workload.offload == "auto":
        return _plan_offload_auto(model, cluster, workload, planner, predictor, options)
    chosen_planner = get_planner(planner)
    check_options(chosen_planner, options)
    _check_workload(model, workload)
    check_zones_connected(cluster)
    _check_capacity(model, cluster, workload, planner)
    prepare = getattr(chosen_planner, "prepare", None)
    if prepare is not None:  # one-off set-up (loading a trained network) is not planning time
        checkpoint = options.get("checkpoint")
        prepare(**({"checkpoint": checkpoint} if checkpoint is not None else {}))
    start = time.perf_counter()
    evaluator = make_evaluator(model, cluster, workload, predictor)
    best = chosen_planner.plan(model, cluster, workload, evaluator=evaluator, **options)
    # Whatever a planner does inside, what leaves here is a plan the runtime runs (hetpart.rules).
    best.plan.check(model, cluster, source=f"{planner} planner: emitted plan")
    prediction = evaluator.predict(best.plan)
    wall = time.perf_counter() - start
    chosen = replace(best.plan, meta={
        "model": spec_name(model.source, model.name), "cluster": spec_name(cluster.source, cluster.name),
        "workload": workload.to_dict(), "planner": planner,
        "predicted_tokens_per_s": best.tokens_per_s, "plan_time_s": wall})
    described = _describe(evaluator, planner)
    if prepare is not None and planner == "policy":  # which network planned: the shipped one or a user's
        from hetpart.policies.policy_planner import DEFAULT_CHECKPOINT

        described["checkpoint"] = str(options.get("checkpoint") or DEFAULT_CHECKPOINT)
        chosen = replace(chosen, meta=chosen.meta | {"policy_checkpoint": described["checkpoint"]})
    return PlanResult(chosen, prediction, wall, planner, described)


EXACT_PLANNERS = frozenset({"search"})
"""Planners that visit their whole space (branch and bound): their ``planner`` block says ``exact``."""


def _describe(evaluator: "Evaluator", planner: str) -> dict[str, Any]:
    """The evaluator's pricing (predictor, pruning, complete) as the ``planner`` block of a result; a planner
    that is not an exhaustive search says so, and says that its pruning note covers only what it priced."""
    out = evaluator.describe()
    out["exact"] = planner in EXACT_PLANNERS and out["complete"]
    if planner not in EXACT_PLANNERS:
        how = "with branch and bound" if out["pruned"] else "every one"
        out["pruning"] = (f"{planner}: not an exhaustive search; its own candidates priced by "
                          f"{evaluator.predictor.name} ({how})")
    return out


def _plan_offload_auto(model, cluster, workload, planner, predictor, options) -> PlanResult:
    """:func:`plan` with ``offload: auto``: none, then ``optimizer``, then ``full`` (not where ``--zero`` names a
    level below 3), the first that fits; when none does, the error of planning without offload, which says
    why, and that offloading did not help either."""
    first: WorkloadError | None = None
    for level in ("none", "optimizer", "full"):
        if level == "full" and workload.zero not in (None, 3):
            continue
        try:
            return plan(model, cluster, replace(workload, offload=level), planner, predictor=predictor, **options)
        except WorkloadError as exc:
            first = first or exc
    from hetpart.policies.common import OFFLOAD_HINTS

    assert first is not None
    why = str(first)
    for hint in OFFLOAD_HINTS:
        why = why.replace(hint, "")
    raise WorkloadError(f"{why} (--offload auto: nor with the optimizer or everything in host memory)")


def _check_workload(model: "ModelGraph", workload: "Workload") -> None:
    if workload.seq_len != model.seq_len:
        raise WorkloadError(f"--seq-len: the model graph was built for {model.seq_len} tokens but the workload "
                            f"asks for {workload.seq_len}; load the model with seq_len={workload.seq_len}")


def _check_capacity(model: "ModelGraph", cluster: "Cluster", workload: "Workload", planner: str) -> None:
    """Fail fast when the model states alone exceed every device's memory together."""
    from hetpart.costmodel.memory import memory_capacity_gb
    from hetpart.policies.common import device_state_bytes_per_param

    state_gb = model.num_params * device_state_bytes_per_param(workload) / 1e9
    if state_gb > sum(memory_capacity_gb(d.gpu) for d in cluster.devices):
        raise no_plan_error(model, cluster, workload, planner, "the model states alone exceed the cluster's memory")
