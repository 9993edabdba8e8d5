"""The runtime's rules as data (hetpart.rules): what they allow, what they refuse, and that every plan a
planner emits for every public scenario passes them (and the runtime's own check)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from hetpart import load_cluster, load_model
from hetpart.plan import Plan, Replica, Stage
from hetpart.rules import RULES, allowed_tp_degrees, check, tp_problems
from tests._suite_plans import suite_plan

REPO = Path(__file__).resolve().parents[1]
SUITES = [p for p in (REPO / "shared" / "scenarios" / "suite.yaml", REPO.parent / "shared" / "scenarios" / "suite.yaml",
                       REPO / "experiments" / "suites" / "public" / "suite.yaml") if p.is_file()]  # the repo's copy

GPT2 = load_model("gpt2-small", seq_len=128)
CLUSTER = load_cluster("a100-v100-16")  # 1 node of 8 A100 (group 0), 1 node of 8 V100 (group 1)


def _plan(*stages: Stage, schedule: str = "1f1b", micro_batch: int = 1, global_batch: int = 8,
          interleave: int = 1) -> Plan:
    return Plan(global_batch=global_batch, micro_batch=micro_batch, seq_len=128, schedule=schedule,
                interleave=interleave, replicas=(Replica(1.0, stages),))


def _st(first: int, last: int, *devices: str) -> Stage:
    return Stage((first, last), devices, len(devices))


def test_stages_of_a_replica_may_differ_in_tp_under_gpipe_and_1f1b() -> None:
    for schedule in ("gpipe", "1f1b"):
        plan = _plan(_st(0, 8, "0/0/0", "0/0/1"), _st(8, 14, "1/0/0"), schedule=schedule)
        assert check(plan, GPT2, CLUSTER) == [] and plan.validate(GPT2, CLUSTER) == []
    interleaved = _plan(_st(0, 4, "0/0/0", "0/0/1"), _st(4, 8, "1/0/0"), _st(8, 11, "0/0/0", "0/0/1"),
                        _st(11, 14, "1/0/0"), schedule="interleaved", interleave=2)
    assert any("tensor-parallel degrees [1, 2] differ, which schedule 'interleaved' does not run" in p
               for p in check(interleaved, GPT2, CLUSTER))
    assert RULES.stages_may_differ_in_tp("gpipe") and not RULES.stages_may_differ_in_tp("interleaved")


def test_tp_must_divide_heads_kv_heads_and_mlp() -> None:
    llama = load_model("llama2-70b", seq_len=128)  # 64 heads, 8 key/value heads, MLP 28672
    assert tp_problems(llama, 8) == []
    assert tp_problems(llama, 16) == ["16 does not divide the 8 key/value heads"]
    assert tp_problems(GPT2, 8) == ["8 does not divide the 12 attention heads"]
    assert allowed_tp_degrees(GPT2, 8) == (1, 2, 4)
    assert allowed_tp_degrees(llama, 8) == (1, 2, 4, 8)
    assert allowed_tp_degrees(GPT2, 8, allow_cross_node_tp=True, max_devices=16) == (1, 2, 3, 4, 6, 12)
    plan = _plan(_st(0, 14, *(f"0/0/{i}" for i in range(8))))
    with pytest.raises(Exception, match=r"stages\[0\]\.tp: 8 does not divide the 12 attention heads"):
        plan.check(GPT2, CLUSTER)


def test_models_without_a_transformer_config_run_with_tp_1() -> None:
    toy = load_model("python:tests.fixtures.toy:build", seq_len=8)
    assert allowed_tp_degrees(toy, 8) == (1,)
    n = toy.num_units
    plan = Plan(global_batch=2, micro_batch=1, seq_len=toy.seq_len, replicas=(
        Replica(1.0, (_st(0, n, "0/0/0", "0/0/1"),)),))
    assert any("needs a transformer config" in p for p in check(plan, toy, CLUSTER))


def test_tp_groups_stay_inside_a_node_and_interleaved_rounds_are_whole() -> None:
    across = _plan(_st(0, 14, "0/0/7", "1/0/0"))
    assert any("spans 2 nodes" in p for p in check(across, GPT2, CLUSTER))
    # 2 device groups, 3 micro-batches: rounds = 3 // 2 = 1 (fine); 5 micro-batches: 2 rounds do not divide 5.
    ok = _plan(_st(0, 4, "0/0/0"), _st(4, 8, "0/0/1"), _st(8, 11, "0/0/0"), _st(11, 14, "0/0/1"),
               schedule="interleaved", interleave=2, global_batch=3)
    bad = _plan(*ok.replicas[0].stages, schedule="interleaved", interleave=2, global_batch=5)
    assert check(ok, GPT2, CLUSTER) == []
    assert check(bad, GPT2, CLUSTER) == ["replicas[0]: 5 micro-batches is not a multiple of 2 rounds of 2 "
                                         "(interleaved 1F1B); change micro_batch or the share"]


@pytest.mark.slow
@pytest.mark.skipif(not SUITES, reason="shared/scenarios is not next to this checkout")
def test_every_planner_on_every_public_scenario_emits_a_plan_the_runtime_runs() -> None:
    from hetpart.policies import available_planners
    from hetpart.errors import WorkloadError
    from hetpart.experiments.suite import load_suite
    from hetpart.runtime.engine import check_runnable
    from hetpart.runtime.models import runnable_spec, scaled_seq_len

    checked = 0
    for entry in load_suite(SUITES[0]):
        model, cluster = load_model(entry.model, seq_len=entry.seq_len), load_cluster(entry.cluster)
        for name in available_planners():
            try:  # planned once per session: test_planners compares the same plans
                result = suite_plan(entry.model, entry.seq_len, entry.cluster, entry.global_batch, name)
            except WorkloadError:  # nothing fits (a baseline may fail); nothing emitted, nothing to check
                continue
            p = result.plan
            where = f"{entry.name} / {name}"
            assert check(p, model, cluster) == [], where
            assert p.validate(model, cluster) == [], where
            tps = [s.tp for r in p.replicas for s in r.stages]
            runnable = runnable_spec(entry.model, "tiny", max_tp=math.lcm(*tps))
            small = replace(p, seq_len=scaled_seq_len(p.seq_len, "tiny"), precision="fp32")
            assert check_runnable(small, runnable) == [], where
            checked += 1
    assert checked >= len(available_planners()) * 5, checked


def test_docstring_examples_run() -> None:
    import doctest

    import hetpart.rules

    result = doctest.testmod(hetpart.rules)
    assert result.attempted >= 3 and result.failed == 0
