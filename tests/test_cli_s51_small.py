"""Small defects of the user-journey probe of 2026-12-01: the corrected predictor's messages (no correction
loaded said "out of distribution: no reason given"; a junk HETPART_CORRECTION named neither the variable nor a
fix) and train-policy's ``out:`` replacing an unrelated file with its checkpoint."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests._cli import cli_json, one_line_exit_2, run_cli

GRID = ["predict", "--model", "gpt2-small", "--cluster", "tiny-mixed", "--global-batch", "8", "--seq-len", "128",
        "--tp", "1", "--pp", "1", "--dp", "2", "--micro-batch", "1", "--predictor", "corrected"]


def test_corrected_without_a_correction_says_none_is_loaded(capsys, monkeypatch) -> None:
    monkeypatch.delenv("HETPART_CORRECTION", raising=False)
    got = cli_json(capsys, *GRID, "--json")["metrics"]["uncertainty"]
    assert got["out_of_distribution"] is True
    assert got["out_of_distribution_reasons"][0].startswith("no correction loaded, so the simulator's step stands "
                                                            "(set HETPART_CORRECTION to a file")
    code, out, _ = run_cli(capsys, *GRID)
    assert code == 0 and "no reason given" not in out and "no correction loaded" in out


def test_a_junk_correction_names_the_variable_and_the_fix(capsys, monkeypatch, tmp_path: Path) -> None:
    junk = tmp_path / "junk.zip"
    junk.write_bytes(b"junkjunk")
    monkeypatch.setenv("HETPART_CORRECTION", str(junk))
    code, _, err = run_cli(capsys, *GRID)
    assert one_line_exit_2(code, err, f"HETPART_CORRECTION={junk}: not JSON",
                           "set it to a file 'hetpart costmodel correct --out' wrote, or unset it")


def test_train_policy_out_replaces_only_a_checkpoint(capsys, tmp_path: Path) -> None:
    from hetpart.experiments.train_policy import load_config, shipped_checkpoint

    unrelated = tmp_path / "notes.yaml"
    unrelated.write_text("keep: me\n")
    config = tmp_path / "p.yaml"
    config.write_text(f"out: {unrelated}\nruns_dir: {tmp_path / 'runs'}\ntimesteps: 64\n")
    code, _, err = run_cli(capsys, "train-policy", "--config", str(config))
    assert one_line_exit_2(code, err, f"{config}: out: {unrelated} exists and is not a policy checkpoint")
    assert unrelated.read_text() == "keep: me\n"
    earlier = tmp_path / "mine.zip"  # a checkpoint of an earlier run: a rerun replaces it
    shutil.copy(shipped_checkpoint(), earlier)
    config.write_text(f"out: {earlier}\nruns_dir: {tmp_path / 'runs'}\ntimesteps: 64\n")
    assert load_config(config).out == str(earlier)
