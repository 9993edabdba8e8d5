"""A plan made with ``--profile`` records the profile (its path and digest, ``meta.profile``); ``show`` and
``predict --plan``/``--plans`` price it with that profile again, or, where the file is gone or changed, say in
one note that they re-price it without (the user-journey probe of 2026-12-01: 39,150 tokens/s planned, 133,834
shown, without a word)."""

from __future__ import annotations

import json
from pathlib import Path

from hetpart import load_cluster
from tests._cli import cli_json, run_cli
from tests.test_profile_model import CLUSTER, _model, analytic_profile
from tests.test_profile_scope_entries import _cpu


def _setup(tmp_path: Path) -> tuple[list[str], Path, Path]:
    (tmp_path / "c.yaml").write_text(CLUSTER)
    profile = tmp_path / "prof.json"
    _cpu(analytic_profile(_model(), load_cluster(str(tmp_path / "c.yaml")))).save(profile)
    common = ["--model", "gpt2-small", "--cluster", str(tmp_path / "c.yaml"), "--global-batch", "8", "--seq-len",
              "64", "--recompute", "none", "--planner", "uniform", "--no-bound"]
    return common, profile, tmp_path / "p.json"


def test_show_and_predict_price_a_plan_with_its_recorded_profile(capsys, tmp_path: Path) -> None:
    common, profile, out = _setup(tmp_path)
    plain = cli_json(capsys, "plan", *common, "--json")["metrics"]["tokens_per_s"]
    planned = cli_json(capsys, "plan", *common, "--profile", str(profile), "--out", str(out), "--json")
    tps = planned["metrics"]["tokens_per_s"]
    assert tps < plain / 2  # the CPU standing in for the A100s is slow
    record = json.loads(out.read_text())["meta"]["profile"]
    assert record["path"] == str(profile.resolve()) and len(record["sha256"]) == 16
    for argv in (["show", str(out), "--json"], ["predict", "--plan", str(out), "--json"]):
        code, stdout, err = run_cli(capsys, *argv)
        assert code == 0 and "note" not in err and json.loads(stdout)["metrics"]["tokens_per_s"] == tps, argv
    lines = tmp_path / "p.jsonl"
    lines.write_text(json.dumps(json.loads(out.read_text())) + "\n")
    code, stdout, err = run_cli(capsys, "predict", "--plans", str(lines), "--jobs", "1", "--json")
    assert code == 0 and json.loads(stdout)["metrics"]["tokens_per_s"] == tps, err


def test_a_gone_or_changed_profile_is_one_note_and_the_plan_is_priced_without_it(capsys, tmp_path: Path) -> None:
    common, profile, out = _setup(tmp_path)
    plain = cli_json(capsys, "plan", *common, "--json")["metrics"]["tokens_per_s"]
    cli_json(capsys, "plan", *common, "--profile", str(profile), "--out", str(out), "--json")
    profile.write_text(profile.read_text() + "\n")  # the same entries, other bytes: it may have been re-measured
    code, stdout, err = run_cli(capsys, "predict", "--plan", str(out), "--json")
    assert code == 0 and json.loads(stdout)["metrics"]["tokens_per_s"] == plain
    assert err.count("\n") == 1 and "that file changed since" in err and err.startswith("hetpart: note: ")
    profile.unlink()
    code, stdout, err = run_cli(capsys, "show", str(out), "--json")
    assert code == 0 and json.loads(stdout)["metrics"]["tokens_per_s"] == plain
    assert err.count("\n") == 1 and f"priced with the profile {profile.resolve()}, but that file is gone" in err
    code, stdout, err = run_cli(capsys, "predict", "--plan", str(out), "--predictor", "learned", "--json")
    assert code == 0 and "the 'learned' predictor takes no profile" in err
