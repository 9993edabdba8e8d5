"""What keeps the policy planner fast: one deadline, one incumbent and one cache over every view it plans
(:class:`~hetpart.policies.policy_planner._Views`), each plan simulated once per decode, the walk's checks
memoised. Speed itself is measured by ``experiments/bench_policy_latency.py``, not here."""

from __future__ import annotations

import importlib
import math
import time
from types import SimpleNamespace

import pytest

from hetpart import Workload, load_cluster, load_model
from hetpart.cluster import parse_cluster
from hetpart.errors import WorkloadError

pp = importlib.import_module("hetpart.policies.policy_planner")

SLOW_NODES = {"name": "slow-nodes", "nodes": [
    {"count": 2, "gpus_per_node": 2, "gpu": "A100-40GB", "intra_node": "NVLink3", "nic": "Ethernet-25"},
    {"count": 2, "gpus_per_node": 2, "gpu": "V100-16GB", "intra_node": "NVLink2", "nic": "Ethernet-25"}],
    "slow": {"1/1/0": 0.5}}


SMALL = {"samples": 4, "walk_points": 100, "refine_steps": 8}
"""A small decode: these tests are about which views are planned, not how well."""


@pytest.fixture(scope="module")
def case():
    model = load_model("gpt2-small", seq_len=256)
    cluster = parse_cluster(SLOW_NODES, source="test")
    return model, cluster, Workload(16, 256)


def _views(case, deadline: float = math.inf):
    model, _, workload = case
    return pp._Views(model, workload, deadline)


def test_a_view_whose_compute_floor_cannot_beat_the_best_so_far_is_not_planned(case) -> None:
    from hetpart.costmodel.evaluator import Evaluator
    from hetpart.costmodel.pools import fewer_nodes

    model, cluster, workload = case
    views = _views(case)
    calls = []
    guarded = views.planner("decode", lambda view, ev: calls.append(view))
    view = fewer_nodes(cluster, 1)
    views.best = SimpleNamespace(tokens_per_s=1e15)  # a step far below any floor
    with pytest.raises(WorkloadError, match="compute floor cannot beat"):
        guarded(view, Evaluator(model, view, workload))
    assert calls == [] and views.skipped["floor"] == 1
    views.best = SimpleNamespace(tokens_per_s=1.0)  # a floor that can win: planned
    guarded(view, Evaluator(model, view, workload))
    assert calls == [view]


def test_a_view_asked_again_with_the_same_real_devices_is_answered_from_the_cache(case) -> None:
    from hetpart.costmodel.evaluator import Evaluator
    from hetpart.costmodel.pools import fewer_nodes, type_view
    from hetpart.policies.plan_search import _OnReal

    model, cluster, workload = case
    views = _views(case)
    answer = SimpleNamespace(tokens_per_s=5.0, plan=SimpleNamespace(num_devices=4, recompute="none"))
    calls = []
    guarded = views.planner("policy", lambda view, ev: calls.append(view) or answer)
    view = fewer_nodes(cluster, 1)
    base = Evaluator(model, cluster, workload)
    assert guarded(view, Evaluator(model, view, workload, predictor=base.predictor)) is answer
    renamed = parse_cluster(dict(SLOW_NODES, name="other-name", nodes=[dict(g, count=1) for g in SLOW_NODES["nodes"]],
                                 slow={}), source="test")
    assert guarded(renamed, Evaluator(model, renamed, workload, predictor=base.predictor)) is answer
    assert len(calls) == 1 and views.skipped["repeated"] == 1 and views.best is answer
    # the same view standing for other real devices is another question
    typed, to_real = type_view(cluster, "A100-40GB")
    moved = {k: v.replace("0/0/", "0/1/") if v.startswith("0/0/") else v.replace("0/1/", "0/0/")
             for k, v in to_real.items()}
    assert pp._view_key(typed, Evaluator(model, typed, workload, predictor=_OnReal(base.predictor, to_real, cluster))) \
        != pp._view_key(typed, Evaluator(model, typed, workload, predictor=_OnReal(base.predictor, moved, cluster)))
    # another kind of planning of the same view is not answered from the other's cache
    views.planner("decode", lambda view, ev: calls.append(view) or answer)(view, Evaluator(model, view, workload,
                                                                                          predictor=base.predictor))
    assert len(calls) == 2


def test_no_view_starts_after_the_overall_deadline(case) -> None:
    from hetpart.costmodel.evaluator import Evaluator
    from hetpart.costmodel.pools import fewer_nodes

    model, cluster, workload = case
    views = _views(case, deadline=time.process_time() - 1.0)
    views.best = SimpleNamespace(tokens_per_s=1.0)
    calls = []
    view = fewer_nodes(cluster, 1)
    with pytest.raises(WorkloadError, match="overall deadline"):
        views.planner("decode", lambda v, ev: calls.append(v))(view, Evaluator(model, view, workload))
    assert calls == [] and views.skipped["deadline"] == 1


def test_a_spent_overall_deadline_still_returns_the_whole_clusters_valid_plan(case, monkeypatch) -> None:
    from hetpart.policies import plan

    model, cluster, workload = case
    made = []

    class Recorded(pp._Views):
        def __init__(self, *args) -> None:
            super().__init__(*args)
            made.append(self)

    monkeypatch.setattr(pp, "_Views", Recorded)
    got = plan(model, cluster, workload, "policy", time_budget_s=0.0, **SMALL)  # every view: skipped
    assert got.prediction.fits_in_memory
    got.plan.check(model, cluster, source="test")
    assert made[0].skipped["deadline"] >= 1 and not made[0].answers
    proportional = plan(model, cluster, workload, "proportional")
    assert got.prediction.metrics["tokens_per_s"] >= proportional.prediction.metrics["tokens_per_s"] * (1 - 1e-9)


def test_the_shared_views_change_no_answer(case, monkeypatch) -> None:
    """The same plan with the floor, the cache and the deadline as without them (fewer nodes and the speed-typed
    view, whose own fewer-nodes views repeat the cluster's)."""
    from hetpart.policies import plan

    model, cluster, workload = case
    shared = plan(model, cluster, workload, "policy", **SMALL)

    def unguarded(self, kind, plan_view):
        return plan_view

    monkeypatch.setattr(pp._Views, "planner", unguarded)
    alone = plan(model, cluster, workload, "policy", **SMALL)
    assert shared.plan == alone.plan
    assert shared.prediction.metrics["tokens_per_s"] == alone.prediction.metrics["tokens_per_s"]


def test_each_plan_is_simulated_once_per_decode(case) -> None:
    from hetpart.policies import plan

    model, cluster, workload = case
    first = plan(model, cluster, workload, "proportional").plan
    evaluator = pp._Deadline(model, cluster, workload)
    a = evaluator(first, split=False)
    again = type(first)(**{**{f: getattr(first, f) for f in first.__dataclass_fields__}, "meta": {"asked": 2}})
    b = evaluator(again, split=False)
    assert evaluator.simulations == 1 and a.step_time_s == b.step_time_s
    assert b.plan is again  # the answer carries the plan asked about


def test_the_walks_memoised_checks_equal_the_checks() -> None:
    from hetpart.policies.neighbourhood import Neighbourhood, narrow_seeds
    from hetpart.policies.structure import Scenario

    model, cluster = load_model("gpt2-small", seq_len=256), load_cluster("tiny-mixed")
    hood = Neighbourhood(Scenario(model, cluster, Workload(16, 256)))
    points = {q for p in narrow_seeds(hood) for q in [*hood.neighbours(p), *hood.compound(p)]}
    assert len(points) > 20
    for q in sorted(points, key=repr):
        assert hood.valid(q) == hood._check(q) == hood.valid(q)
        expected = hood.s.mixed_bound_s(*q[1:]) if q[0] == "mixed" and hood._check(q) else None
        if expected is not None:
            assert hood.bound_s(q) == expected == hood.bound_s(q)
