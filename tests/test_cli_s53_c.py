"""User-journey defects of the CLI found by the probe of 2026-12-01 (helper c of session s53): ``plan --out`` and
``export --out`` replacing a file they did not write (a run-records store, a cluster YAML)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetpart.records import EXAMPLE_LINE
from tests._cli import cli_json, one_line_exit_2, run_cli

SMALL = ["--model", "gpt2-small", "--cluster", "tiny-mixed", "--global-batch", "8", "--seq-len", "128",
         "--planner", "uniform", "--no-bound"]


def _plan(capsys, tmp_path: Path) -> Path:
    path = tmp_path / "plan.json"
    code, _, err = run_cli(capsys, "plan", *SMALL, "--out", str(path))
    assert code == 0, err
    return path


# ----------------------------------------------------------------------------- 1. --out over another file
def test_plan_out_refuses_a_records_store_and_an_unrelated_file(capsys, tmp_path: Path) -> None:
    records = tmp_path / "runs.jsonl"
    records.write_text(EXAMPLE_LINE + "\n")
    code, _, err = run_cli(capsys, "plan", *SMALL, "--out", str(records))
    one_line_exit_2(code, err, f"--out: {records} holds hetpart run records", "choose another path")
    assert records.read_text() == EXAMPLE_LINE + "\n"
    cluster = tmp_path / "mine.yaml"
    cluster.write_text("name: mine\nnodes: []\n")
    code, _, err = run_cli(capsys, "plan", *SMALL, "--out", str(cluster))
    one_line_exit_2(code, err, f"--out: {cluster} exists and is not a plan JSON", "move that file away")
    assert cluster.read_text() == "name: mine\nnodes: []\n"


def test_plan_out_replaces_an_earlier_plan_and_an_empty_file(capsys, tmp_path: Path) -> None:
    path = _plan(capsys, tmp_path)
    before = json.loads(path.read_text())
    code, _, err = run_cli(capsys, "plan", *[a if a != "8" else "16" for a in SMALL], "--out", str(path))
    assert code == 0, err
    assert (before["global_batch"], json.loads(path.read_text())["global_batch"]) == (8, 16)
    empty = tmp_path / "empty.json"
    empty.touch()
    code, _, err = run_cli(capsys, "plan", *SMALL, "--out", str(empty))
    assert code == 0 and json.loads(empty.read_text())["global_batch"] == 8, err


@pytest.mark.parametrize("target", ["megatron", "torchtitan", "deepspeed"])
def test_export_out_replaces_its_own_export_only(capsys, tmp_path: Path, target: str) -> None:
    plan = _plan(capsys, tmp_path)
    out = tmp_path / f"out.{target}"
    code, printed, err = run_cli(capsys, "export", str(plan), "--to", target, "--out", str(out))
    assert code == 0 and out.read_text() and printed.startswith(out.read_text()), err
    code, _, err = run_cli(capsys, "export", str(plan), "--to", target, "--out", str(out))  # a rerun replaces it
    assert code == 0, err
    other = {"megatron": "deepspeed", "torchtitan": "megatron", "deepspeed": "torchtitan"}[target]
    code, _, err = run_cli(capsys, "export", str(plan), "--to", other, "--out", str(out))
    one_line_exit_2(code, err, f"--out: {out} exists and is not a {other} export")
    records = tmp_path / "runs.jsonl"
    records.write_text(EXAMPLE_LINE + "\n")
    code, _, err = run_cli(capsys, "export", str(plan), "--to", target, "--out", str(records))
    one_line_exit_2(code, err, f"--out: {records} holds hetpart run records")
    assert records.read_text() == EXAMPLE_LINE + "\n"
