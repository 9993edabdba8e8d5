"""The simulator against its frozen answers on seeded random plans (``tests/fixtures/sim_reference.py``).

The fast paths (caches by structural keys, numpy over replicas, the batch scorer's parse and validation)
must not move a number: step times, metrics, estimates and every breakdown entry agree to 1e-9."""

import math

import pytest

from hetpart import Plan
from hetpart.costmodel import Simulator
from hetpart.costmodel.batch import predict_lines
from tests.fixtures import sim_reference as ref


@pytest.fixture(scope="module")
def cases():
    return ref.load()


def _close(got, want, where: str) -> None:
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), where
        for k in want:
            _close(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, (list, tuple)) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            _close(g, w, f"{where}[{i}]")
    elif isinstance(want, float):
        assert math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-15), f"{where}: {got!r} != {want!r}"
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


def test_the_frozen_plans_are_the_seeded_ones(cases):
    plans = ref.random_plans()
    assert [c["plan"] for c in cases] == [p.to_dict() for p in plans]
    assert sum(p.dp >= 16 for p in plans) >= 8 and any(p.schedule == "interleaved" for p in plans)
    assert {p.zero for p in plans} == {0, 1, 2, 3} and any(p.shard_group for p in plans)
    assert any(s.tp_split is not None for p in plans for r in p.replicas for s in r.stages)


def test_the_simulator_gives_its_frozen_answers(cases):
    model, cluster = ref.model(), ref.cluster()
    sims = {name: Simulator(model, cluster, **kw) for name, kw in ref.VARIANTS.items()}
    for i, case in enumerate(cases):
        plan = Plan.from_dict(case["plan"])
        _close(ref.answers(plan, sims), case["answers"], f"plan {i}")
        # the per-device memory is its breakdown entry's
        memory = sims["default"].simulate(plan).memory_gb
        rows = case["answers"]["default"]["rows"]
        for (r, d, *_), row in zip(case["answers"]["shape"], rows, strict=True):
            for dev in plan.replicas[r].stages[d].devices:
                _close(memory[dev], row[ref.ROW.index("memory_gb")], f"plan {i} memory of {dev}")
    assert len(cases) == 48  # every frozen plan checked (tests/fixtures/sim_reference.py writes 48)


def test_the_batch_scorer_gives_the_frozen_metrics(cases):
    import json

    model, cluster = ref.model(), ref.cluster()
    lines = [json.dumps(c["plan"]) for c in cases]
    answers = list(predict_lines(lines, Simulator(model, cluster)))
    for i, (got, case) in enumerate(zip(answers, cases, strict=True)):
        _close(got["metrics"], case["answers"]["default"]["metrics"], f"line {i + 1}")
    assert len(answers) == 48


def test_forked_workers_answer_what_one_process_answers(cases):
    """``jobs=2``: the same answers, exactly, in the file's order, errors and blank lines included."""
    import json
    import os

    from hetpart.costmodel.batch import CHUNK

    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("forked scoring runs on Linux only")
    model, cluster = ref.model(), ref.cluster()
    lines = [json.dumps(c["plan"]) for c in cases]
    lines[3:3] = ["", '{"global_batch": 8}', "  "]  # a blank line, an invalid plan, a blank line
    assert len(lines) > 2 * CHUNK  # at least two chunks, so both workers get some
    one = list(predict_lines(lines, Simulator(model, cluster), jobs=1))
    two = list(predict_lines(lines, Simulator(model, cluster), jobs=2))
    assert two == one and len(one) == len(cases) + 1
    assert one[3]["error"].startswith("plans.jsonl:5: ")
    for i, (got, case) in enumerate(zip(one[:3] + one[4:], cases, strict=True)):
        _close(got["metrics"], case["answers"]["default"]["metrics"], f"answer {i}")


def test_how_many_workers_score():
    from hetpart.costmodel.batch import CHUNK, workers_for

    sim = Simulator(ref.model(), ref.cluster())

    class Learned:  # a predictor that does not say it is fork-safe
        pass

    cores = len(__import__("os").sched_getaffinity(0))
    assert workers_for(sim, 1, 1000) == 1
    assert workers_for(Learned(), 0, 1000) == 1 and workers_for(Learned(), 4, 1000) == 1
    assert workers_for(sim, 0, 1000) == cores and workers_for(sim, None, 1000) == cores
    assert workers_for(sim, 3, 1000) == 3  # what the user asks, even past the cores
    assert workers_for(sim, 0, CHUNK) == 1 and workers_for(sim, 8, 2 * CHUNK + 1) == 3  # one per chunk at most
    with pytest.raises(ValueError, match="jobs must be 0"):
        workers_for(sim, -1, 10)


def test_stopping_early_leaves_no_worker_behind(cases):
    import json
    import multiprocessing

    lines = [json.dumps(c["plan"]) for c in cases]
    answers = predict_lines(lines, Simulator(ref.model(), ref.cluster()), jobs=2)
    assert "metrics" in next(answers)
    assert multiprocessing.active_children()  # the pool's workers
    answers.close()  # the consumer stops: the workers are terminated and reaped
    assert not multiprocessing.active_children()
