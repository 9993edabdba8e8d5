"""Re-predict recorded runs: what a predictor says today for exactly what a record's run executed."""

from __future__ import annotations

from typing import Any

from hetpart.records import RunRecord

__all__ = ["repredict"]


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
    chosen = get_predictor(name, graph, record.prediction_cluster(source), workload, **options)
    prediction = chosen.predict(record.run_plan(source), workload)
    return {"metrics": dict(prediction.metrics), "predictor": chosen.name, "predictor_version": chosen.version,
            "options": options, "graph_matches_record": record.graph_matches(graph)}
