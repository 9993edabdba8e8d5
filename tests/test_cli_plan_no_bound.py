"""`hetpart plan --no-bound`: the plan alone, the upper bound's searches skipped, the roofline kept."""

from __future__ import annotations

import pytest

from tests._cli import cli_json as _json, run_cli as _run

SMALL = ["--model", "gpt2-small", "--cluster", "tiny-mixed", "--global-batch", "8", "--seq-len", "256"]


def test_no_bound_gives_the_same_plan_without_the_searches(capsys) -> None:
    full = _json(capsys, "plan", *SMALL, "--planner", "proportional", "--json")
    alone = _json(capsys, "plan", *SMALL, "--planner", "proportional", "--no-bound", "--json")
    drop = ("plan_time_s",)  # the meta's own timing differs run to run
    assert ({k: v for k, v in alone["plan"]["meta"].items() if k not in drop}
            == {k: v for k, v in full["plan"]["meta"].items() if k not in drop})
    assert {k: v for k, v in alone["plan"].items() if k != "meta"} == {k: v for k, v in full["plan"].items() if k != "meta"}
    assert alone["metrics"] == full["metrics"]
    assert full["upper_bound"]["computed"] is True and full["upper_bound"]["tokens_per_s"] > 0
    bound = alone["upper_bound"]
    assert bound["computed"] is False and bound["tokens_per_s"] is None and bound["per_type"] == {}
    assert bound["roofline_tokens_per_s"] == pytest.approx(full["upper_bound"]["roofline_tokens_per_s"])


def test_no_bound_text_says_so(capsys) -> None:
    code, out, err = _run(capsys, "plan", *SMALL, "--planner", "proportional", "--no-bound")
    assert code == 0
    assert "upper bound not computed (--no-bound)" in out and "roofline" in out
