"""The policy's forked ``proportional`` baseline is not waited for when no layout's lower bound beats the policy's
own plan (:func:`hetpart.policies.plan_proportional.cannot_beat`): the answer is the one the sequential call gives,
decided from the bounds alone."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

from hetpart import Workload, load_cluster, load_model
from hetpart.costmodel.evaluator import Evaluator

proportional = importlib.import_module("hetpart.policies.plan_proportional")


def _case():
    model, cluster = load_model("gpt2-medium", seq_len=1024), load_cluster("a100-v100-16")
    workload = Workload(64, 1024)
    return model, cluster, workload, Evaluator(model, cluster, workload)


def test_cannot_beat_follows_the_bounds_and_the_planner():
    model, cluster, workload, evaluate = _case()
    best = proportional.plan_proportional(model, cluster, workload, evaluator=evaluate)
    fast = SimpleNamespace(step_time_s=best.step_time_s / 1000)  # far below every layout's bound
    slow = SimpleNamespace(step_time_s=best.step_time_s * 1000)  # every layout's bound is below it
    assert proportional.cannot_beat(model, cluster, workload, evaluate, fast) is True
    assert proportional.cannot_beat(model, cluster, workload, evaluate, slow) is False
    # a sharding level set, or no pruning, leaves it to the planner
    assert proportional.cannot_beat(model, cluster, Workload(64, 1024, zero=1), evaluate, fast) is False


def test_the_pending_baseline_answers_none_without_waiting_when_the_bounds_say_so(monkeypatch):
    planner = importlib.import_module("hetpart.policies.policy_planner")
    model, cluster, workload, evaluate = _case()
    pending = planner._PendingBaseline(model, cluster, workload, evaluate)
    try:
        fast = SimpleNamespace(step_time_s=1e-9)
        if pending.forked:  # the child may have finished already: then its answer is taken, also None here
            assert pending.result(fast) is None
        monkeypatch.setattr(planner, "_cannot_beat", lambda *args: True)
        again = planner._PendingBaseline(model, cluster, workload, evaluate)
        if again.forked and not again.job.ready():
            assert again.result(fast) is None and again.pid is None  # the child is stopped and reaped
        again.close()
    finally:
        pending.close()
