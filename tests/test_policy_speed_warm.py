"""The structure walk's warm start (a child prices the seeds while the network decodes) against the plain walk,
and the staged child that sends it before the baseline."""

from __future__ import annotations

import math
import os
import pickle

import pytest

from hetpart import Workload, load_cluster, load_model
from hetpart.policies.forked import Staged, can_fork

CASES = [("gpt2-small", 256, "tiny-mixed", 16), ("llama2-7b", 2048, "consumer-mix", 128),
         ("gpt2-medium", 1024, "a100-v100-16", 64)]


def _scenario(model: str, seq_len: int, cluster: str, batch: int):
    from hetpart.policies.structure import Scenario

    return Scenario(load_model(model, seq_len=seq_len), load_cluster(cluster), Workload(batch, seq_len))


def _starts(scenario) -> list[tuple]:
    """A few decoded-like starts: each pool alone at its widest TP degree, fewest replicas, micro-batch 1."""
    from hetpart.policies.neighbourhood import Neighbourhood

    hood = Neighbourhood(scenario)
    out = []
    for p in range(len(scenario.pools)):
        tps = (scenario.tps[p][-1],)
        for rc in scenario.modes:
            for dp in scenario.dp_options((p,), tps):
                point = ("mixed", (p,), tps, dp, 1, rc)
                if hood.valid(point) and hood.fits(point):
                    out.append(point)
                    break
            else:
                continue
            break
    return out


@pytest.mark.parametrize("case", CASES, ids=[c[2] for c in CASES])
@pytest.mark.parametrize("limit", [20, 100])
def test_walk_with_a_warm_start_visits_and_returns_what_the_plain_walk_does(case, limit) -> None:
    """Every point, price, key and plan of the walk is the same with the warm start (passed through a pickle
    round trip, as from a child) as without, and so is the count of points priced (the walk's budget)."""
    from hetpart.policies.neighbourhood import Neighbourhood, improve, warm_up

    plain_scenario, warm_scenario = _scenario(*case), _scenario(*case)
    starts = _starts(plain_scenario)
    plain = Neighbourhood(plain_scenario)
    expected = improve(plain, starts, math.inf, limit=limit)
    data = pickle.loads(pickle.dumps(warm_up(_scenario(*case), limit)))
    assert data["priced"]  # the warm start priced something to take
    warm = Neighbourhood(warm_scenario, warm=lambda: data)
    found = improve(warm, starts, math.inf, limit=limit)
    assert list(found) == list(expected)
    assert warm.priced == plain.priced
    used = [p for p in data["priced"] if p not in warm._ready and p not in starts]
    assert used  # prices the walk took from the warm start instead of its own
    for point, scored in expected.items():
        assert found[point].estimate_s == scored.estimate_s
        assert found[point].key == scored.key
        assert found[point].build() == scored.build()
        assert warm.exact(point) == plain.exact(point)


def test_a_warm_start_is_taken_once_and_none_is_nothing() -> None:
    from hetpart.policies.neighbourhood import Neighbourhood

    calls = []
    hood = Neighbourhood(_scenario(*CASES[0]), warm=lambda: calls.append(1))
    hood.take_warm()
    hood.take_warm()
    assert calls == [1] and not hood._ready


def _values(n: int):
    for i in range(n):
        yield i * 10


def _fails_after_one():
    yield "first"
    raise RuntimeError("boom")


def test_staged_child_sends_its_values_in_order_and_falls_back_where_it_has_none() -> None:
    if not can_fork(type("P", (), {"fork_safe": True})()):
        pytest.skip("needs Linux and a second core")
    with Staged(_values, 3) as job:
        assert job.forked and job.pid != os.getpid()
        assert [job.next(lambda: None) for _ in range(3)] == [0, 10, 20]
        assert job.next(lambda: "none left") == "none left"
    with Staged(_fails_after_one) as job:
        assert job.next(lambda: None) == "first"
        assert job.next(lambda: "computed here") == "computed here" and job.failed
    here = Staged(_values, 3, fork=False)
    assert not here.forked and here.ready() and here.next(lambda: "here") == "here"


@pytest.mark.slow
def test_policy_plan_is_the_same_with_the_warm_start_in_the_baseline_child(monkeypatch) -> None:
    """decode() with the child (warm start, then baseline) and without any child: the same plan."""
    import hetpart.policies.policy_planner as pp

    model, cluster, work = load_model("llama2-7b", seq_len=2048), load_cluster("consumer-mix"), Workload(128, 2048)
    if not pp._can_fork(pp.Evaluator(model, cluster, work)):
        pytest.skip("needs Linux and a second core")
    forked = pp.decode(model, cluster, work, samples=2)
    assert forked.timings_s["baseline_forked"] is True
    monkeypatch.setattr(pp, "PARALLEL_BASELINE", False)
    alone = pp.decode(model, cluster, work, samples=2)
    assert forked.best.plan == alone.best.plan
    assert forked.timings_s["walk_points"] == alone.timings_s["walk_points"]
