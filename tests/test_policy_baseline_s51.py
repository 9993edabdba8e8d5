"""The policy's forked ``proportional`` baseline is not waited for when no layout's lower bound beats the policy's
own plan (:func:`hetpart.policies.plan_proportional.cannot_beat`), and is priced in the parent where only a few
layouts' bounds are below it (:func:`~hetpart.policies.plan_proportional.layouts_beating`): the answer is the one the
sequential call gives."""

from __future__ import annotations

import importlib
from dataclasses import replace
from types import SimpleNamespace

from hetpart import Workload, load_cluster, load_model
from hetpart.costmodel.evaluator import Evaluated, Evaluator

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


class _Job:
    """A forked child that has not answered yet (``ready`` False): what it would send, if asked."""

    forked, pid = True, 1

    def __init__(self, answer) -> None:
        self.answer, self.asked, self.closed = answer, 0, 0

    def ready(self) -> bool:
        return False

    def next(self, fallback):
        self.asked += 1
        return self.answer

    def close(self) -> None:
        self.closed += 1


def test_the_pending_baseline_answers_none_without_waiting_when_the_bounds_say_so(monkeypatch):
    planner = importlib.import_module("hetpart.policies.policy_planner")
    model, cluster, workload, evaluate = _case()
    monkeypatch.setattr(planner, "PARALLEL_BASELINE", False)
    pending = planner._PendingBaseline(model, cluster, workload, evaluate)
    fast = SimpleNamespace(step_time_s=1e-9)
    pending.job, pending.warm_taken = _Job(answer=None), True
    monkeypatch.setattr(planner, "_layouts_beating", lambda *args: 0)
    assert pending.result(fast) is None
    assert (pending.job.asked, pending.job.closed) == (0, 1)  # not waited for: stopped
    pending.job = _Job(answer=None)
    monkeypatch.setattr(planner, "_layouts_beating", lambda *args: None)
    assert pending.result(fast) is None
    assert (pending.job.asked, pending.job.closed) == (1, 0)  # undecided by the bounds: the child's answer
    pending.job = _Job(answer=None)
    monkeypatch.setattr(planner, "_layouts_beating", lambda *args: planner.FEW_LAYOUTS + 1)
    assert pending.result(fast) is None
    assert (pending.job.asked, pending.job.closed) == (1, 0)  # many left: the child's answer


def test_a_few_layouts_left_are_priced_here_as_the_sequential_call_prices_them(monkeypatch):
    """Where only a few layouts' bounds are below the incumbent, the parent stops the child and prices those: the
    answer is the sequential call's, the baseline beating the incumbent or None."""
    planner = importlib.import_module("hetpart.policies.policy_planner")
    model, cluster, workload, _ = _case()
    evaluate = planner._Deadline(model, cluster, workload)  # the planner's own evaluator
    best = proportional.plan_proportional(model, cluster, workload, evaluator=evaluate)
    monkeypatch.setattr(planner, "PARALLEL_BASELINE", False)
    real_count, unpatched = planner._layouts_beating, 0
    for step, want in ((best.step_time_s * 1.5, best), (best.step_time_s / 1.5, None)):
        incumbent = Evaluated(best.plan, replace(best.estimate, step_time_s=step,
                                                 tokens_per_s=best.tokens_per_s * best.step_time_s / step))
        left = proportional.layouts_beating(model, cluster, workload, evaluate, incumbent)
        assert left is not None and (left > 0 or want is None)
        pending = planner._PendingBaseline(model, cluster, workload, evaluate)
        pending.job, pending.warm_taken = _Job(answer="never asked"), True
        if left > planner.FEW_LAYOUTS:  # many layouts left: the count made few, to price them here all the same
            monkeypatch.setattr(planner, "_layouts_beating", lambda *args: 1)
        else:  # the planner's own count (the fast incumbent: 3 layouts left on this case)
            monkeypatch.setattr(planner, "_layouts_beating", real_count)
            unpatched += 1
        got = pending.result(incumbent)
        assert (pending.job.asked, pending.job.closed) == (0, 1)
        sequential = planner._baseline(model, cluster, workload, evaluate, incumbent=incumbent)
        assert (got is None) == (want is None) == (sequential is None)
        if want is not None:
            assert got.plan == sequential.plan == best.plan and got.step_time_s == best.step_time_s
    assert unpatched  # one case went through the real count, not a patched one
