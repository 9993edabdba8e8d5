"""Probe C of 2026-11-30 (training, running, dashboards), the findings fixed besides the checkpoint save
(tests/test_checkpoint_atomic.py) and the step band (tests/test_learned_uncertainty.py):

3. ``HETPART_SURROGATE`` naming a file that is not a surrogate gave "internal error: UnpicklingError";
4. ``predict --records`` of an empty file exited 0 and printed nothing, even with ``--json``;
7. a policy plan did not say which checkpoint planned it;
8. a data set with an empty validation split said nothing;
9. errors named the config key (``dataset config: scenarios``, ``tracker:``) instead of the flag typed; the
   plan file kept no planning time, so the HTML comparison left the chosen plan's cell empty.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from tests._cli import run_cli, one_line_exit_2 as _one_line_exit_2




@pytest.fixture(scope="module")
def policy_plan(tmp_path_factory) -> Path:
    """A plan of the shipped policy on the catalog's two-device cluster, written with --out."""
    from hetpart.cli.app import main

    out = tmp_path_factory.mktemp("plan") / "plan.json"
    assert main(["plan", "--model", "gpt2-small", "--cluster", "tiny-mixed", "--global-batch", "8", "--seq-len",
                 "128", "--planner", "policy", "--out", str(out), "--json"]) == 0
    return out


def test_a_surrogate_file_that_is_not_one_is_refused_in_one_line(capsys, tmp_path, monkeypatch, policy_plan):
    bad = tmp_path / "bad.pt"
    bad.write_text("#not a checkpoint")
    monkeypatch.setenv("HETPART_SURROGATE", str(bad))
    code, _, err = run_cli(capsys, "predict", "--plan", str(policy_plan), "--predictor", "learned-graph")
    line = _one_line_exit_2(code, err)
    assert line.startswith(f"hetpart: error: HETPART_SURROGATE: {bad}: not a checkpoint written by "
                           "'hetpart costmodel train'")


def test_records_of_an_empty_file_are_refused(capsys, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    code, out, err = run_cli(capsys, "predict", "--records", str(empty))
    assert _one_line_exit_2(code, err) == (f"hetpart: error: --records: {empty}: the file holds no run record; give a "
                                           "file written by 'hetpart run --out'")
    code, out, err = run_cli(capsys, "predict", "--records", str(empty), "--json")
    assert code == 2 and json.loads(out)["kind"] == "bad_input"


def test_a_policy_plan_names_its_checkpoint_and_keeps_its_planning_time(policy_plan):
    from hetpart.policies.policy_planner import DEFAULT_CHECKPOINT

    meta = json.loads(policy_plan.read_text())["meta"]
    assert meta["planner"] == "policy" and meta["policy_checkpoint"] == str(DEFAULT_CHECKPOINT)
    assert isinstance(meta["plan_time_s"], float) and meta["plan_time_s"] > 0


def test_the_chosen_plans_row_of_a_comparison_has_its_planning_time(policy_plan):
    from hetpart.cli.report_cmd import _compare
    from hetpart.plan import Plan

    plan = Plan.from_dict(json.loads(policy_plan.read_text()))
    rows = _compare(None, None, None, plan, type("P", (), {"tokens_per_s": 1.0, "step_time_s": 1.0,
                                                             "fits_in_memory": True})(), "policy")
    assert rows == [{"planner": "policy", "tokens_per_s": 1.0, "step_time_s": 1.0, "fits_in_memory": True,
                     "plan_time_s": plan.meta["plan_time_s"]}]


def test_a_search_plan_names_no_checkpoint(capsys):
    code, out, err = run_cli(capsys, "plan", "--model", "gpt2-small", "--cluster", "tiny-mixed", "--global-batch", "8",
                             "--seq-len", "128", "--planner", "uniform", "--json")
    assert code == 0, err
    got = json.loads(out)
    assert "checkpoint" not in got["planner"] and "policy_checkpoint" not in got["plan"]["meta"]


def test_a_data_set_with_an_empty_split_says_so():
    from hetpart.costmodel.learned.dataset import DatasetConfig, DatasetNote, build_dataset

    cfg = DatasetConfig(seed=0, scenarios=2, plans_per_scenario=6, max_devices=8, val_share=0.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records = build_dataset(cfg)
    assert not any(r["split"] == "val" for r in records)
    notes = [str(w.message) for w in caught if issubclass(w.category, DatasetNote) and "split" in str(w.message)]
    assert len(notes) == 1 and "no scenario in the val split" in notes[0] and "draw more --scenarios" in notes[0]


@pytest.mark.parametrize("argv, line", [
    (["costmodel", "dataset", "--scenarios", "-3", "--out", "{tmp}/d.pt"],
     "hetpart: error: --scenarios: expected a whole number >= 1, got -3"),
    (["costmodel", "dataset", "--plans-per-scenario", "0", "--out", "{tmp}/d.pt"],
     "hetpart: error: --plans-per-scenario: expected a whole number >= 1, got 0"),
])
def test_errors_name_the_flag_typed(capsys, tmp_path, argv, line):
    code, _, err = run_cli(capsys, *[a.replace("{tmp}", str(tmp_path)) for a in argv])
    assert _one_line_exit_2(code, err) == line


def test_a_bad_tracker_of_run_names_the_flag(capsys, policy_plan):
    code, _, err = run_cli(capsys, "run", str(policy_plan), "--steps", "1", "--tracker", "tensorbord")
    assert _one_line_exit_2(code, err).startswith("hetpart: error: --tracker: unknown kind 'tensorbord'")
