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
        for (r, d, *_), row in zip(case["answers"]["shape"], rows):
            for dev in plan.replicas[r].stages[d].devices:
                _close(memory[dev], row[ref.ROW.index("memory_gb")], f"plan {i} memory of {dev}")


def test_the_batch_scorer_gives_the_frozen_metrics(cases):
    import json

    model, cluster = ref.model(), ref.cluster()
    lines = [json.dumps(c["plan"]) for c in cases]
    answers = list(predict_lines(lines, Simulator(model, cluster)))
    for i, (got, case) in enumerate(zip(answers, cases)):
        _close(got["metrics"], case["answers"]["default"]["metrics"], f"line {i + 1}")
