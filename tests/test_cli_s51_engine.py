"""The engine options a plan records (``meta.engine``) price it in ``predict --plans`` as in ``--plan``, and an
engine flag given on the command line always wins over them, default values included (the user-journey probe
of 2026-12-01: ``--plans`` gave +49% against ``--plan`` for the same plan, and ``--op-counts engine`` was
silently ignored on a plan made with ``--op-counts measured``)."""

from __future__ import annotations

import json
from pathlib import Path

from tests._cli import cli_json, run_cli
from tests.test_cli_s50_engine_meta import CLUSTER, OPTIONS, _plan  # the same plan and cluster


def _lines(tmp_path: Path, out: Path) -> Path:
    """The plan twice as JSONL, with a blank line between (answers carry their input line)."""
    one = json.dumps(json.loads(out.read_text()))
    path = tmp_path / "plans.jsonl"
    path.write_text(f"{one}\n\n{one}\n")
    return path


def test_plans_lines_are_priced_with_their_recorded_engine_options(capsys, tmp_path: Path) -> None:
    out, planned = _plan(capsys, tmp_path, *OPTIONS)
    plans = _lines(tmp_path, out)
    code, stdout, err = run_cli(capsys, "predict", "--plans", str(plans), "--jobs", "1", "--json")
    assert code == 0, err
    answers = [json.loads(line) for line in stdout.splitlines()]
    assert [a["line"] for a in answers] == [1, 3]
    assert [a["metrics"]["tokens_per_s"] for a in answers] == [planned, planned]
    single = cli_json(capsys, "predict", "--plan", str(out), "--json")["metrics"]["tokens_per_s"]
    assert single == planned


def test_an_explicit_default_flag_overrides_the_recorded_options(capsys, tmp_path: Path) -> None:
    out, planned = _plan(capsys, tmp_path, *OPTIONS)
    (tmp_path / "d").mkdir()
    plain_out, plain = _plan(capsys, tmp_path / "d")  # the same input priced with the defaults
    assert plain != planned
    back = ["--no-overlap-p2p", "--overlap-grad-reduce", "--op-counts", "engine"]
    got = cli_json(capsys, "predict", "--plan", str(out), *back, "--json")
    assert got["metrics"]["tokens_per_s"] == plain
    assert got["predictor_version"] == cli_json(capsys, "predict", "--plan", str(plain_out), "--json")["predictor_version"]
    counts = cli_json(capsys, "predict", "--plan", str(out), "--op-counts", "engine", "--json")["predictor_version"]
    assert "op-counts" not in counts and "overlap-p2p" in counts
    shown = cli_json(capsys, "show", str(out), *back, "--json")["metrics"]["tokens_per_s"]
    assert shown == plain
    code, stdout, err = run_cli(capsys, "predict", "--plans", str(_lines(tmp_path, out)), "--jobs", "1", *back, "--json")
    assert code == 0 and [json.loads(line)["metrics"]["tokens_per_s"] for line in stdout.splitlines()] == [plain] * 2


def test_plans_note_a_changed_cluster_once(capsys, tmp_path: Path) -> None:
    out, _ = _plan(capsys, tmp_path)
    plans = _lines(tmp_path, out)
    (tmp_path / "c.yaml").write_text(CLUSTER.replace("A100-80GB", "A100-40GB"))
    code, _, err = run_cli(capsys, "predict", "--plans", str(plans), "--jobs", "1", "--json")
    assert code == 0
    assert err.count("hetpart: note:") == 1 and f"{plans}: lines 1, 3 were planned on cluster pair" in err


def test_records_still_refuse_engine_flags_given_at_their_defaults(capsys, tmp_path: Path) -> None:
    (tmp_path / "r.jsonl").write_text("")
    code, stdout, err = run_cli(capsys, "predict", "--records", str(tmp_path / "r.jsonl"), "--op-counts", "engine")
    assert code == 2 and "drop --op-counts" in err
