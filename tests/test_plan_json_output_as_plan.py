"""`hetpart plan --json` output given where a plan is expected (a probe of 2026-11-30: the answer was "plan: unknown
key; allowed keys ..."): one line that says what the file is and how to write the plan itself."""

from __future__ import annotations

import json

import pytest

from hetpart.errors import PlanError
from hetpart.plan import Plan


def test_plan_json_output_is_told_apart_from_a_plan():
    output = {"plan": {"global_batch": 8, "micro_batch": 1, "seq_len": 128, "replicas": []}, "metrics": {},
              "planner": {"name": "search"}}
    with pytest.raises(PlanError) as caught:
        Plan.from_json(json.dumps(output), "out.json")
    said = str(caught.value)
    assert said.startswith("out.json: plan:") and "plan --out" in said and "\n" not in said
