"""A planner's call in a forked child (:mod:`hetpart.policies.forked`): the same value as in the process,
a failed child redone in the process, a child no longer wanted killed and reaped."""

from __future__ import annotations

import os

import pytest

from hetpart.costmodel import Simulator
from hetpart.policies.forked import Forked, can_fork

if not (hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) >= 2):
    pytest.skip("forking a planner's call needs Linux and a second core", allow_module_level=True)


def _where(n: int) -> tuple[int, list[int]]:
    return os.getpid(), [i * i for i in range(n)]


def test_a_forked_call_gives_the_value_the_process_would():
    job = Forked(_where, 5)
    assert job.forked and job.pid
    pid, value = job.result()
    assert pid != os.getpid() and value == [0, 1, 4, 9, 16]  # computed in the child
    assert job.pid is None  # reaped
    here = Forked(_where, 5, fork=False)
    assert not here.forked and here.result() == (os.getpid(), [0, 1, 4, 9, 16])


def _fails_in_a_child(parent: int) -> str:
    if os.getpid() != parent:
        raise RuntimeError("the child broke")
    return "computed here"


def test_a_child_that_fails_is_redone_here_or_by_the_fallback():
    assert Forked(_fails_in_a_child, os.getpid()).result() == "computed here"
    assert Forked(_fails_in_a_child, os.getpid()).result(fallback=lambda: "fallback") == "fallback"


def _sleeps() -> None:
    import time

    time.sleep(60)


def test_a_child_no_longer_wanted_is_killed_and_reaped():
    with Forked(_sleeps) as job:
        pid = job.pid
    assert job.pid is None
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def test_only_fork_safe_predictors_fork(monkeypatch):
    import hetpart.policies.forked as forked
    from hetpart import load_cluster, load_model

    sim = Simulator(load_model("gpt2-small", seq_len=128), load_cluster("tiny-mixed"))
    assert can_fork(sim) and not can_fork(object())  # the learned model says nothing: not fork-safe
    monkeypatch.setattr(forked, "ENABLED", False)
    assert not can_fork(sim)
