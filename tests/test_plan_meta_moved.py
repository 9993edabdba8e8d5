"""A plan whose recorded cluster or model file is gone names the plan file and its meta field, not a flag."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests._cli import run_cli as _run


@pytest.fixture
def moved(capsys, tmp_path: Path) -> Path:
    plan = tmp_path / "plan.json"
    code, _, err = _run(capsys, "plan", "--model", "gpt2-small", "--cluster", "tiny-mixed", "--global-batch", "8",
                        "--seq-len", "128", "--planner", "uniform", "--out", str(plan))
    assert code == 0, err
    data = json.loads(plan.read_text())
    data["meta"]["cluster"] = str(tmp_path / "gone" / "lab.yaml")
    plan.write_text(json.dumps(data))
    return plan


@pytest.mark.parametrize("command", [["predict", "--plan"], ["export", "--to", "megatron"], ["show"],
                                     ["run", "--steps", "1", "--scale", "tiny"]])
def test_a_moved_cluster_names_the_plan_and_meta_field(capsys, moved: Path, command: list[str]) -> None:
    argv = [command[0], str(moved), *command[1:]] if command[0] != "predict" else ["predict", "--plan", str(moved)]
    code, out, err = _run(capsys, *argv)
    assert code == 2 and err.count("\n") == 1
    assert f"{moved}: meta.cluster: " in err and "no such file" in err and "give --cluster" in err
    assert "--cluster: '" not in err  # not blamed on a flag nobody gave


def test_the_cluster_flag_still_overrides_the_moved_file(capsys, moved: Path) -> None:
    code, out, err = _run(capsys, "predict", "--plan", str(moved), "--cluster", "tiny-mixed", "--json")
    assert code == 0, err
    assert json.loads(out)["metrics"]["step_time_s"] > 0
