"""`hetpart predict`'s inputs: `--plans` answers each line as `--plan` answers that plan (precision choice,
workload flags, errors naming the line); 0 is no size; the grid and a plan file are exclusive; `auto` is a
planner's; an interleaved plan needs 2 or more model chunks per device."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests._cli import cli_json, run_cli

MODEL = ["--model", "gpt2-small", "--cluster", "tiny-mixed"]  # tiny-mixed: 0/0/* A100-40GB, 1/0/* V100-16GB
GRID = ["--tp", "1", "--pp", "2", "--dp", "2", "--micro-batch", "1"]


def _plan(devices=(("0/0/0", "1/0/0"), ("0/0/1", "1/0/1")), **fields) -> dict:
    """gpt2-small (14 units) as two replicas of two stages; no precision key unless given."""
    stages = lambda pipe: [{"layers": [0, 7], "devices": [pipe[0]], "tp": 1},  # noqa: E731
                           {"layers": [7, 14], "devices": [pipe[1]], "tp": 1}]
    plan = {"global_batch": 8, "micro_batch": 2, "seq_len": 256, "schedule": "1f1b", "recompute": "none",
            "replicas": [{"batch_share": 1 / len(devices), "stages": stages(pipe)} for pipe in devices]}
    return plan | fields


A100_ONLY = (("0/0/0", "0/0/1"),)


def _error(capsys, *argv: str) -> str:
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == "", (code, out, err)
    assert err.startswith("hetpart: error: ") and err.count("\n") == 1 and "Traceback" not in err
    return err


def _write(path: Path, *plans: dict) -> Path:
    path.write_text("".join(json.dumps(p) + "\n" for p in plans))
    return path


def _one(capsys, tmp_path: Path, plan: dict, *flags: str) -> dict:
    """What `predict --plan` answers for ``plan``: {"metrics"} or {"error"}."""
    path = tmp_path / "one.json"
    path.write_text(json.dumps(plan))
    code, out, err = run_cli(capsys, "predict", *MODEL, "--plan", str(path), *flags, "--json")
    return {"metrics": json.loads(out)["metrics"]} if code == 0 else {"error": err}


def _batch(capsys, path: Path, *flags: str) -> list[dict]:
    code, out, err = run_cli(capsys, "predict", *MODEL, "--plans", str(path), *flags, "--json")
    assert code == 0, err
    answers = [json.loads(line) for line in out.splitlines()]
    assert all(isinstance(a.pop("line"), int) for a in answers)  # each answer names its input line
    return answers


# ------------------------------------------------------------------------------------------- 1. --plans
def test_a_line_without_precision_is_priced_in_what_plan_chooses(capsys, tmp_path):
    """No precision key beside V100s: `--plan` prices fp16; `--plans` priced bf16, which V100s lack."""
    plan = _plan()
    lines = _batch(capsys, _write(tmp_path / "p.jsonl", plan))
    assert lines == [_one(capsys, tmp_path, plan)]
    assert lines == _batch(capsys, _write(tmp_path / "fp16.jsonl", _plan(precision="fp16")))


def test_each_line_takes_its_own_precision_and_errors_name_the_line(capsys, tmp_path):
    plans = [_plan(precision="fp16"), _plan(precision="bf16"), _plan(precision="fp8"), _plan(A100_ONLY),
             _plan(A100_ONLY, precision="bf16")]
    lines = _batch(capsys, _write(tmp_path / "mixed.jsonl", *plans))
    assert len(lines) == 5
    assert lines[0] == _one(capsys, tmp_path, plans[0])
    assert set(lines[1]) == {"error"} and lines[1]["error"].startswith(f"{tmp_path / 'mixed.jsonl'}:2: precision: bf16")
    assert "V100-16GB" in lines[1]["error"]
    assert set(lines[2]) == {"error"} and lines[2]["error"].startswith(f"{tmp_path / 'mixed.jsonl'}:3: precision: fp8")
    assert "bf16 (or fp16)" not in lines[2]["error"] and "fp16" in lines[2]["error"]  # no bf16 advice beside V100s
    assert lines[3] == _one(capsys, tmp_path, plans[3])  # A100s alone: bf16, as --plan chooses
    assert lines[3] == lines[4]


def test_a_bad_first_line_is_its_own_error_not_the_whole_command(capsys, tmp_path):
    path = _write(tmp_path / "p.jsonl", _plan(precision="bf16"), _plan())
    lines = _batch(capsys, path)
    assert lines[0]["error"].startswith(f"{path}:1: precision: bf16 is not supported by V100-16GB")
    assert lines[1] == _one(capsys, tmp_path, _plan())


@pytest.mark.parametrize("flags", [["--precision", "fp32"], ["--recompute", "full"], ["--zero", "1"],
                                   ["--optimizer", "sgd"], ["--attention", "eager"], ["--offload", "optimizer"],
                                   ["--global-batch", "16"], ["--seq-len", "128"], ["--precision", "bf16"]])
def test_the_workload_flags_act_on_every_line_as_on_one_plan(capsys, tmp_path, flags):
    plans = [_plan(), _plan(A100_ONLY, precision="fp16")]
    lines = _batch(capsys, _write(tmp_path / "p.jsonl", *plans), *flags)
    for number, (plan, line) in enumerate(zip(plans, lines), 1):
        one = _one(capsys, tmp_path, plan, *flags)
        if "error" in one:  # the same refusal, naming the line
            message = one["error"].removeprefix("hetpart: error: ").strip().replace(str(tmp_path / "one.json"), "")
            assert set(line) == {"error"} and line["error"].startswith(f"{tmp_path / 'p.jsonl'}:{number}: ")
            assert line["error"].endswith(message[-40:])  # the same fix
        else:
            assert line == one
    if flags == ["--precision", "fp32"]:
        assert lines != _batch(capsys, _write(tmp_path / "q.jsonl", *plans))  # it is not ignored


# ------------------------------------------------------------------------------------------- 2. zero sizes
@pytest.mark.parametrize("flag", ["--global-batch", "--seq-len"])
def test_zero_is_no_size(capsys, tmp_path, flag):
    err = _error(capsys, "predict", *MODEL, *GRID, flag, "0")
    assert f"{flag}: must be a whole number" in err and "got 0" in err
    path = tmp_path / "p.json"
    path.write_text(json.dumps(_plan()))
    err = _error(capsys, "predict", *MODEL, "--plan", str(path), flag, "0")
    assert f"{flag}: must be a whole number" in err and "plan for 0" not in err
    code, out, err = run_cli(capsys, "predict", *MODEL, "--plans", str(_write(tmp_path / "p.jsonl", _plan())), flag,
                             "0", "--json")
    assert code == 2 and f"{flag}: must be a whole number" in json.loads(out)["error"]


# ------------------------------------------------------------------------------------------- 3. plan xor grid
@pytest.mark.parametrize("extra", [GRID, ["--micro-batch", "4"], ["--schedule", "gpipe"], ["--interleave", "2"]])
def test_a_plan_file_and_the_grid_are_not_both_taken(capsys, tmp_path, extra):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(_plan()))
    err = _error(capsys, "predict", *MODEL, "--plan", str(path), *extra)
    assert "give --plan or the --tp/--pp/--dp grid, not both" in err and extra[0] in err
    err = _error(capsys, "predict", *MODEL, "--plans", str(_write(tmp_path / "p.jsonl", _plan())), *extra)
    assert "give --plans or the --tp/--pp/--dp grid, not both" in err


def test_records_take_no_workload_or_plan_options(capsys, tmp_path):
    err = _error(capsys, "predict", "--records", str(tmp_path / "runs.jsonl"), "--global-batch", "8", *MODEL)
    assert "--records" in err and "--global-batch" in err and "--model" in err


# ------------------------------------------------------------------------------------------- 4. recompute auto
def test_recompute_auto_is_a_planners_choice(capsys, tmp_path):
    err = _error(capsys, "predict", "--model", "gpt2-large", "--cluster", "tiny-mixed", "--tp", "1", "--pp", "1",
                 "--dp", "4", "--micro-batch", "4", "--global-batch", "64", "--recompute", "auto")
    assert "--recompute: 'auto' lets a planner choose" in err and "none, selective or full" in err
    path = tmp_path / "p.json"
    path.write_text(json.dumps(_plan()))
    assert "'auto' lets a planner choose" in _error(capsys, "predict", *MODEL, "--plan", str(path), "--recompute",
                                                    "auto")
    ok = cli_json(capsys, "predict", *MODEL, *GRID, "--global-batch", "8", "--seq-len", "128", "--recompute", "full",
                  "--json")
    assert ok["metrics"]["tokens_per_s"] > 0


# ------------------------------------------------------------------------------------------- 5. interleave
def test_interleaved_needs_two_chunks_per_device(capsys, tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(_plan(schedule="interleaved")))  # no interleave key: 1 chunk
    err = _error(capsys, "predict", *MODEL, "--plan", str(path))
    assert f"{path}: interleave: schedule 'interleaved' needs interleave >= 2" in err
    line = _batch(capsys, _write(tmp_path / "p.jsonl", _plan(schedule="interleaved")))[0]
    assert "needs interleave >= 2" in line["error"]
    assert "--interleave" in _error(capsys, "predict", *MODEL, *GRID, "--global-batch", "8", "--seq-len", "128",
                                    "--schedule", "interleaved")
    assert "--interleave" in _error(capsys, "predict", *MODEL, *GRID, "--global-batch", "8", "--seq-len", "128",
                                    "--schedule", "interleaved", "--interleave", "1")
    two = cli_json(capsys, "predict", *MODEL, "--tp", "1", "--pp", "2", "--dp", "1", "--micro-batch", "1",
                   "--global-batch", "8", "--seq-len", "128", "--schedule", "interleaved", "--interleave", "2", "--json")
    assert two["metrics"]["tokens_per_s"] > 0


def test_plan_validate_refuses_interleaved_with_one_chunk():
    from hetpart import load_cluster, load_model
    from hetpart.plan import Plan

    model, cluster = load_model("gpt2-small", seq_len=256), load_cluster("tiny-mixed")
    one = Plan.from_dict(_plan(schedule="interleaved"))
    assert one.validate(model, cluster)[0].startswith("interleave: schedule 'interleaved' needs interleave >= 2")
    assert Plan.from_dict(_plan()).validate(model, cluster) == []
