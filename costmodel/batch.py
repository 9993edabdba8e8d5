"""Scoring many plans in one process: one answer per plan, in order, an error where a plan is invalid.

``hetpart predict --plans plans.jsonl`` reads one plan JSON per line and prints one JSON line each,
``{"metrics": {...}}`` (what ``--plan`` gives) or ``{"error": "..."}``; the model, the cluster and
the predictor's caches are built once for the whole file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Iterator

from hetpart.errors import HetpartError
from hetpart.plan import Plan

if TYPE_CHECKING:  # pragma: no cover
    from hetpart.costmodel.predictor import Predictor
    from hetpart.workload import Workload

__all__ = ["predict_lines"]


def predict_lines(lines: Iterable[str], predictor: "Predictor", workload: "Workload | None" = None,
                  source: str = "plans.jsonl") -> Iterator[dict[str, Any]]:
    """One answer per non-blank line: ``{"metrics": ...}``, or ``{"error": ...}`` naming the line.

    Args:
        lines: plan JSON, one per line (blank lines are skipped, not answered).
        predictor: prices every plan (validated against its model and cluster first).
        workload: when given, a plan whose global batch or sequence length differs is an error.
    """
    many = getattr(predictor, "predict_many", None)
    if many is not None:  # a predictor that prices a whole batch in one pass (the learned one)
        yield from _predict_batched(lines, many, workload, source)
        return
    metrics_of = getattr(predictor, "predict_metrics", None)  # the metrics alone, where a predictor has them
    if metrics_of is None:
        def metrics_of(plan: Plan, workload: "Workload | None", validate: bool) -> dict[str, Any]:
            return predictor.predict(plan, workload, validate=validate).metrics
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            plan = Plan.from_json(line, f"{source}:{number}")
            metrics = metrics_of(plan, workload, validate=True)
        except HetpartError as exc:
            message = " ".join(str(exc).split())
            yield {"error": message if message.startswith(source) else f"{source}:{number}: {message}"}
            continue
        yield {"metrics": metrics}


def _error(message: str, source: str, number: int) -> dict[str, Any]:
    message = " ".join(message.split())
    return {"error": message if message.startswith(source) else f"{source}:{number}: {message}"}


def _predict_batched(lines: Iterable[str], many, workload: "Workload | None", source: str) -> Iterator[dict[str, Any]]:
    """:func:`predict_lines` through ``predict_many(plans, workload, validate=True)``, which answers a
    prediction or an error message per plan."""
    answers: list[Any] = []
    plans, where = [], []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            plans.append(Plan.from_json(line, f"{source}:{number}"))
            where.append(len(answers))
            answers.append(number)
        except HetpartError as exc:
            answers.append(_error(str(exc), source, number))
    for slot, result in zip(where, many(plans, workload, validate=True)):
        number = answers[slot]
        answers[slot] = _error(result, source, number) if isinstance(result, str) else {"metrics": result.metrics}
    yield from answers
