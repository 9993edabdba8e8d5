"""Re-predict recorded runs: what a predictor says today for exactly what a record's run executed."""

from __future__ import annotations

import math
from typing import Any

from hetpart.records import RunRecord

__all__ = ["RUNTIME_TERMS", "repredict", "with_runtime_terms"]


def repredict(record: RunRecord, predictor: str | None = None, source: str = "<record>") -> dict[str, Any]:
    """``{"metrics", "predictor", "predictor_version", "options", "graph_matches_record"}``: the prediction of
    ``predictor`` (from :mod:`hetpart.costmodel.predictor`'s registry; default: the record's own, with
    the options it used) for the record's run: the model that ran, on the cluster it emulated.

    Raises:
        PlanError: the predictor is unknown or refuses the options, or the plan does not fit its cluster.
    """
    from hetpart.costmodel.predictor import get_predictor
    from hetpart.workload import Workload

    recorded = record.predicted
    name = predictor or (recorded.predictor if recorded is not None else None)
    options = dict(recorded.options) if recorded is not None and recorded.predictor == name else {}
    graph = record.model_graph()
    workload = Workload(**record.workload)
    # what the runtime's ranks measured beyond what the predictor prices, added to its step (with_runtime_terms)
    terms = {k: float(options[k]) for k in RUNTIME_TERMS if options.get(k)}
    chosen = get_predictor(name, graph, record.prediction_cluster(source), workload,
                           **{k: v for k, v in options.items() if k not in RUNTIME_TERMS})
    prediction = chosen.predict(record.run_plan(source), workload)
    metrics = with_runtime_terms(dict(prediction.metrics), terms)
    return {"metrics": metrics, "predictor": chosen.name, "predictor_version": chosen.version,
            "options": options, "graph_matches_record": record.graph_matches(graph)}


RUNTIME_TERMS = ("host_work_s", "transport_excess_s")
"""Seconds a step of ``hetpart run`` takes that no predictor prices, measured by its ranks and added to the
predicted step (:func:`hetpart.runtime.measure.predict`), kept by name in the record's predictor options:
``host_work_s``, the slowest rank's own host work (taking its batch rows, packing and unpacking its gradient
buckets: :meth:`hetpart.runtime.engine.Executor.host_work_s`); ``transport_excess_s``, where an emulated link
is faster than this machine's own transport under it, what a collective takes beyond the emulated time (the
emulation delays a collective up to the emulated time and cannot shorten it: ``runtime.worker.WorkerHooks``)."""


def with_runtime_terms(metrics: dict[str, Any], terms: dict[str, float]) -> dict[str, Any]:
    """``metrics`` (``step_time_s``, ``tokens_per_s``, ``samples_per_s``, ...) with the seconds of ``terms``
    (:data:`RUNTIME_TERMS`) added to the step, the rates scaled to match, and each term under its name:
    :func:`hetpart.runtime.measure.predict` and :func:`repredict` share this arithmetic, so that a record
    replays to its prediction to the last bit. Unchanged where the terms add nothing or the step is not
    finite (a plan that does not fit)."""
    step = metrics.get("step_time_s")
    added = sum(terms[k] for k in RUNTIME_TERMS if terms.get(k))
    if not added or step is None or not math.isfinite(step):
        return metrics
    rates = {k: metrics[k] * step / (step + added) for k in ("tokens_per_s", "samples_per_s") if k in metrics}
    return {**metrics, "step_time_s": step + added, **rates, **{k: float(terms[k]) for k in RUNTIME_TERMS if k in terms}}
