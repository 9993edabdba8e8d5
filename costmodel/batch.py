"""Scoring many plans in one process: one answer per plan, in order, an error where a plan is invalid.

``hetpart predict --plans plans.jsonl`` reads one plan JSON per line and prints one JSON line each,
``{"metrics": {...}}`` (what ``--plan`` gives) or ``{"error": "..."}``; the model, the cluster and
the predictor's caches are built once for the whole file. With a fork-safe predictor (the simulator)
and more than one core, forked workers score chunks of the file side by side and the answers come
back in the file's order (``jobs``; ``--jobs`` on the command line).
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

from hetpart.errors import HetpartError
from hetpart.plan import Plan

if TYPE_CHECKING:  # pragma: no cover
    from hetpart.costmodel.predictor import Predictor
    from hetpart.workload import Workload

__all__ = ["predict_lines", "pricer", "answer_lines", "workers_for"]

CHUNK = 8
"""Plans per task handed to a worker: small enough that two workers finish together on a file of mixed
plan sizes, large enough that the pipe between them costs little (a 1,024-GPU plan takes tens of ms)."""


def workers_for(predictor: "Predictor", jobs: int | None, plans: int) -> int:
    """How many processes score ``plans`` plans: ``jobs`` (``None`` or 0: every core this process may run
    on), at most one per chunk of :data:`CHUNK`; 1 where forking is not safe: not Linux, or a predictor
    that does not say it is fork-safe (the learned model's torch thread pools do not survive a fork)."""
    if jobs is not None and jobs < 0:
        raise ValueError(f"jobs must be 0 (every core) or more, not {jobs}")
    if jobs == 1 or not (sys.platform.startswith("linux") and getattr(predictor, "fork_safe", False)):
        return 1
    cores = len(os.sched_getaffinity(0))
    return max(1, min(jobs or cores, -(-plans // CHUNK)))


def predict_lines(lines: Iterable[str], predictor: "Predictor", workload: "Workload | None" = None,
                  source: str = "plans.jsonl", jobs: int | None = 1) -> Iterator[dict[str, Any]]:
    """One answer per non-blank line: ``{"metrics": ...}``, or ``{"error": ...}`` naming the line.

    Args:
        lines: plan JSON, one per line (blank lines are skipped, not answered).
        predictor: prices every plan (validated against its model and cluster first).
        workload: when given, a plan whose global batch or sequence length differs is an error.
        jobs: processes to score with (:func:`workers_for`; ``None`` or 0: every core). The answers are
            the same whatever the number: each plan is priced on its own, and caches only save work.
    """
    many = getattr(predictor, "predict_many", None)
    if many is not None:  # a predictor that prices a whole batch in one pass (the learned one)
        yield from _predict_batched(lines, many, workload, source)
        return
    numbered = [(number, line) for number, line in enumerate(lines, 1) if line.strip()]
    price = pricer(predictor, source)

    def answer(number: int, line: str) -> dict[str, Any]:
        try:
            plan = Plan.from_json(line, f"{source}:{number}")
        except HetpartError as exc:
            return _error(str(exc), source, number)
        return price(number, plan, workload)
    yield from answer_lines(numbered, answer, workers_for(predictor, jobs, len(numbered)))


def pricer(predictor: "Predictor", source: str,
           validate: bool = True) -> Callable[[int, Plan, "Workload | None"], dict[str, Any]]:
    """The answer to the plan of line ``number`` of ``source`` (a workload given: a plan whose global batch or
    sequence length differs is an error): its metrics, or the error naming the line. ``validate`` False: the
    caller has checked each plan against the predictor's model and cluster already (on 1,024-GPU plans the
    rules take about a tenth of an answer, and they give the same verdict twice)."""
    metrics_of = getattr(predictor, "predict_metrics", None)  # the metrics alone, where a predictor has them
    if metrics_of is None:
        def metrics_of(plan: Plan, workload: "Workload | None", validate: bool) -> dict[str, Any]:
            return predictor.predict(plan, workload, validate=validate).metrics

    def price(number: int, plan: Plan, workload: "Workload | None") -> dict[str, Any]:
        try:
            return {"metrics": metrics_of(plan, workload, validate=validate)}
        except HetpartError as exc:
            return _error(str(exc), source, number)
    return price


def answer_lines(numbered: list[tuple[int, str]], answer: Callable[[int, str], dict],
                 workers: int) -> Iterator[dict[str, Any]]:
    """``answer(number, line)`` of each numbered line, in order, by ``workers`` processes (:func:`workers_for`):
    this one, or forked ones that score chunks of the lines side by side. Everything ``answer`` does per line
    (parsing included) is then split between them; what it built before the fork they inherit."""
    with _young_collections():
        if workers == 1:
            for number, line in numbered:
                yield answer(number, line)
            return
        yield from _forked(numbered, answer, workers)


GC_YOUNG = 20_000
"""Allocations between two collections of the youngest generation while lines are scored (Python's default:
700). A 1,024-GPU plan's answer allocates tens of thousands of objects, nearly all freed with it and none
in cycles; at the default the collector ran about five times per plan and the oldest generation's scans
(the predictor's caches, the model graph) took about a tenth of the CPU time."""


@contextmanager
def _young_collections() -> Iterator[None]:
    """Score with the collector's youngest threshold at :data:`GC_YOUNG` and what exists now frozen (never
    scanned again: the model, the cluster, the caches built so far); forked workers inherit both. The
    settings come back when scoring ends or stops."""
    import gc

    threshold = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(GC_YOUNG, *threshold[1:])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()


_ANSWER: Callable[[int, str], dict] | None = None
"""The forked workers' ``answer`` (:func:`answer_lines`), set in the parent before the fork (a closure cannot be
pickled; a forked child inherits it, with the predictor's caches as they were)."""


def _score_chunk(chunk: list[tuple[int, str]]) -> list[dict[str, Any]]:
    return [_ANSWER(number, line) for number, line in chunk]


def _forked(numbered: list[tuple[int, str]], answer, workers: int) -> Iterator[dict[str, Any]]:
    """:func:`answer_lines` over ``workers`` forked processes, in order. A worker that dies (killed, out of
    memory) fails the whole call with multiprocessing's error rather than leaving lines unanswered."""
    import gc
    import multiprocessing

    global _ANSWER
    chunks = [numbered[i:i + CHUNK] for i in range(0, len(numbered), CHUNK)]
    _ANSWER = answer
    gc.freeze()  # the workers must never collect the parent's garbage (see hetpart.policies.forked)
    try:
        pool = multiprocessing.get_context("fork").Pool(workers)
    finally:
        gc.unfreeze()
    try:
        for answers in pool.imap(_score_chunk, chunks):
            yield from answers
        pool.close()
    finally:
        pool.terminate()  # stops the workers too where the consumer stopped early or an error came back
        pool.join()
        _ANSWER = None


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
