""":meth:`Evaluator.best`'s screen (a plan whose first replica's bound is beyond the incumbent is dropped before its
whole bound is computed) against the plain branch and bound: the same plan on small clusters for incumbents of every
strength, the first replica's bound never above the whole plan's, and fewer whole bounds computed."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hetpart import load_cluster, load_model
from hetpart.costmodel import evaluator as evaluator_module
from hetpart.costmodel.evaluator import Evaluator
from hetpart.policies.plan_proportional import hap_plans, holmes_plans
from hetpart.workload import Workload


def _candidates(model, cluster, workload) -> list:
    return [p for gen in (holmes_plans, hap_plans) for layout in gen(model, cluster, workload) for p in layout]


@pytest.mark.parametrize("model_name,cluster_name,batch", [("gpt2-medium", "tiny-mixed", 32),
                                                           ("gpt2-medium", "consumer-mix", 64),
                                                           ("llama2-7b", "a100-v100-16", 64)])
def test_screened_best_is_the_plain_best(model_name: str, cluster_name: str, batch: int, monkeypatch) -> None:
    model, cluster = load_model(model_name, seq_len=1024), load_cluster(cluster_name)
    workload = Workload(global_batch=batch, seq_len=1024)
    plans = _candidates(model, cluster, workload)
    plain = Evaluator(model, cluster, workload)
    priced = sorted((e for p in plans if (e := plain(p)) is not None), key=lambda e: e.step_time_s)
    assert len(priced) >= 3
    incumbents = [None, priced[0], priced[len(priced) // 2], priced[-1]]  # strongest to weakest (and none)
    monkeypatch.setattr(evaluator_module, "BOUND_SCREEN", False)
    expected = [Evaluator(model, cluster, workload).best(plans, incumbent=i) for i in incumbents]
    monkeypatch.setattr(evaluator_module, "BOUND_SCREEN", True)
    screened = Evaluator(model, cluster, workload)
    calls = []
    bound = screened._bound
    screened._bound = lambda p: calls.append(p.dp) or bound(p)
    found = [screened.best(plans, incumbent=i) for i in incumbents]
    assert [(e.plan, e.tokens_per_s) for e in found] == [(e.plan, e.tokens_per_s) for e in expected]
    for p in plans:  # the screen's premise: one replica's bound is at most the whole plan's
        if p.dp > 1 and not p.zero:
            assert bound(replace(p, replicas=p.replicas[:1])) <= bound(p)
    assert any(p.dp > 1 for p in plans) and calls


def test_screen_skips_whole_bounds_beyond_a_strong_incumbent(monkeypatch) -> None:
    model, cluster = load_model("gpt2-medium", seq_len=1024), load_cluster("consumer-mix")
    workload = Workload(global_batch=64, seq_len=1024)
    plans = _candidates(model, cluster, workload)
    ev = Evaluator(model, cluster, workload)
    best = ev.best(plans)
    counts = {}
    for screen in (False, True):
        monkeypatch.setattr(evaluator_module, "BOUND_SCREEN", screen)
        e = Evaluator(model, cluster, workload)
        whole = []
        bound = e._bound
        e._bound = lambda p, b=bound, w=whole: (w.append(p) if len(p.replicas) == p.dp and any(
            q is p for q in plans) else None) or b(p)
        assert e.best(plans, incumbent=best).plan == best.plan
        counts[screen] = len(whole)
    assert counts[True] < counts[False]


@pytest.mark.parametrize("cluster_name", ["tiny-mixed", "consumer-mix", "a100-v100-16"])
def test_with_splits_equals_fill_tp_splits(cluster_name: str) -> None:
    """The evaluator's memoised check that no stage mixes unlike devices, against the split it stands in for: the
    same plan (the same object where nothing is split), on layouts whose TP groups are alike and unlike."""
    from hetpart.costmodel.tp_split import fill_tp_splits

    model, cluster = load_model("gpt2-medium", seq_len=1024), load_cluster(cluster_name)
    workload = Workload(global_batch=64, seq_len=1024)
    ev = Evaluator(model, cluster, workload)
    plans = _candidates(model, cluster, workload)
    for p in list(plans):  # the same plans with each TP group's last device swapped with another type's
        stages = [s for r in p.replicas for s in r.stages if s.tp >= 2]
        kinds = {cluster.device(s.devices[0]).gpu.name: s for s in stages}
        if len(kinds) >= 2:
            a, b = list(kinds.values())[:2]
            swap = {a.devices[-1]: b.devices[-1], b.devices[-1]: a.devices[-1]}
            plans.append(replace(p, replicas=tuple(replace(r, stages=tuple(
                replace(s, devices=tuple(swap.get(d, d) for d in s.devices)) for s in r.stages)) for r in p.replicas)))
    changed = 0
    for p in plans:
        fast, plain = ev.with_splits(p), fill_tp_splits(p, model, cluster)
        assert fast == plain and (fast is p) == (plain is p)
        changed += fast is not p
    assert len(plans) > 10 and (changed > 0) == ev._unlike
