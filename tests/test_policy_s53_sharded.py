"""Where nothing fits unsharded and the workload leaves the sharding level open, the policy decodes at the first
level that fits, as search goes up a level while nothing fits: Gemma-3-27B on 4 A100-80GB + 32 RTX 4090
(heldout-12-01c) holds its 1.4B-parameter tied head on a desktop only with sharded optimizer states; the policy
said "no structure of the search space fits" where search planned it at level 1."""

from __future__ import annotations

import importlib
from dataclasses import replace
from pathlib import Path

import pytest

from hetpart import Workload, load_cluster, load_model
from hetpart.costmodel.evaluator import Evaluator
from hetpart.errors import WorkloadError
from hetpart.policies.structure import Scenario

SUITE = Path(__file__).resolve().parent.parent / "experiments" / "suites" / "heldout-12-01c"
planner = importlib.import_module("hetpart.policies.policy_planner")


def _case(workload: Workload):
    model = load_model(str(SUITE / "gemma-3-27b.json"), seq_len=2048)
    cluster = load_cluster(str(SUITE / "a100-4090-sharded.yaml"))
    return model, cluster, Evaluator(model, cluster, workload)


def test_the_first_level_that_fits_is_taken_only_where_the_level_is_open() -> None:
    workload = Workload(128, 2048)
    model, cluster, evaluator = _case(workload)
    flat = Scenario(model, cluster, workload, evaluator=evaluator)
    assert not flat.feasible
    up = planner._sharded_scenario(flat, evaluator)
    assert up.feasible and up.workload.zero == 1 and up.workload == replace(workload, zero=1)
    fixed = Scenario(model, cluster, replace(workload, zero=0), evaluator=evaluator)
    assert planner._sharded_scenario(fixed, evaluator) is fixed  # a level the user set is kept


def test_the_policy_plans_at_level_one_where_level_zero_fits_nothing() -> None:
    workload = Workload(128, 2048)
    model, cluster, _ = _case(workload)
    found = planner.plan_policy(model, cluster, workload)
    assert found.plan.zero == 1 and found.estimate.fits_in_memory
    with pytest.raises(WorkloadError, match="no structure"):  # a user's --zero 0 is still refused
        planner.decode(model, cluster, replace(workload, zero=0))
