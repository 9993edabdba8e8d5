"""Probe findings on `train-policy`, `bench` and `costmodel dataset`: the checkpoint reported is the file
written, `resume` is checked (and its settings applied) before anything is made, a suite's seq_len and
`bench --tracker` are refused by their own names before any output, a dropped scenario is redrawn and said."""

from __future__ import annotations

import json
import warnings
import zipfile
from pathlib import Path

import pytest
import yaml

from hetpart.cli.app import main

TINY = {"experiment": "policy/tiny", "runs_dir": "runs", "tracker": "tensorboard", "imitation_scenarios": 1,
        "imitation_epochs": 1, "imitation_max_devices": 8, "timesteps": 8, "n_envs": 1, "n_steps": 4,
        "batch_size": 4, "max_devices": 8, "checkpoint_every": 4, "progress_bar": False, "hidden": 8}


def _config(tmp_path: Path, name: str, **keys) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(TINY | keys))
    return path


def _error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def _saved(checkpoint: Path) -> dict:
    with zipfile.ZipFile(checkpoint) as z:
        return json.loads(z.read("data"))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One tiny training run with ``out:`` lacking a suffix (the probe's tp/tiny.yaml, ~5 s)."""
    tmp = tmp_path_factory.mktemp("tp")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp)
        config = _config(tmp, "tiny.yaml", out="out/mypolicy")
        assert main(["train-policy", "--config", str(config), "--json"]) == 0
    return tmp


def test_train_policy_writes_out_with_zip_added(trained):
    assert (trained / "out" / "mypolicy.zip").is_file() and not (trained / "out" / "mypolicy").exists()
    runs = list((trained / "runs").iterdir())
    assert len(runs) == 1 and (runs[0] / "checkpoints" / "policy_8_steps.zip").is_file()


def test_train_policy_summary_and_hint_name_the_zip(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    config = _config(tmp_path, "tiny.yaml", out="out/mine", imitation_scenarios=0, timesteps=4)
    assert main(["train-policy", "--config", str(config)]) == 0
    line = capsys.readouterr().out
    assert "checkpoint out/mine.zip" in line and "--policy-checkpoint out/mine.zip" in line
    assert (tmp_path / "out" / "mine.zip").is_file()
    # following the hint plans
    assert main(["plan", "--cluster", "tiny-mixed", "--model", "gpt2-small", "--global-batch", "16", "--seq-len",
                 "256", "--planner", "policy", "--policy-checkpoint", "out/mine.zip", "--out", "p.json"]) == 0
    assert (tmp_path / "p.json").is_file()


def test_resume_missing_is_refused_before_anything_is_made(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    config = _config(tmp_path, "resume_missing.yaml", out="out/resumed.zip", resume="tp/nonexistent.zip")
    assert main(["train-policy", "--config", str(config)]) == 2
    err = _error(capsys)
    assert f"{config}: resume:" in err and "tp/nonexistent.zip" in err and ".zip.zip" not in err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "out").exists()


def test_resume_not_a_checkpoint_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.zip").write_text("not a zip")
    config = _config(tmp_path, "r.yaml", out="out/r.zip", resume="notes.zip")
    assert main(["train-policy", "--config", str(config)]) == 2
    err = _error(capsys)
    assert f"{config}: resume:" in err and "not a MaskablePPO checkpoint" in err
    assert not (tmp_path / "runs").exists()


def test_resume_refuses_another_network_size(trained, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    checkpoint = trained / "out" / "mypolicy.zip"
    config = _config(tmp_path, "resume.yaml", out="out/resumed.zip", resume=str(checkpoint), hidden=16, layers=2)
    assert main(["train-policy", "--config", str(config)]) == 2
    err = _error(capsys)
    assert f"{config}: hidden:" in err and "hidden 8" in err and "hidden 16" in err and "layers" not in err.split(":")[1]
    assert not (tmp_path / "runs").exists() and not (tmp_path / "out").exists()


def test_resume_applies_the_training_settings_given(trained, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    checkpoint = trained / "out" / "mypolicy.zip"
    before = _saved(checkpoint)
    assert (before["learning_rate"], before["n_steps"], before["batch_size"]) == (3e-4, 4, 4)
    keys = {k: v for k, v in TINY.items() if k != "hidden"}  # left out: the checkpoint's network size
    (tmp_path / "resume.yaml").write_text(yaml.safe_dump(keys | {
        "out": "out/resumed", "resume": str(checkpoint.with_suffix("")),  # without .zip, as SB3 loads it
        "learning_rate": 0.5, "n_steps": 2, "batch_size": 2}))
    assert main(["train-policy", "--config", "resume.yaml", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    written = Path(summary["checkpoint"])
    assert written == Path("out/resumed.zip") and written.is_file()
    after = _saved(written)
    assert (after["learning_rate"], after["n_steps"], after["batch_size"]) == (0.5, 2, 2)
    assert after["policy_kwargs"]["features_extractor_kwargs"]["hidden"] == 8  # the checkpoint's, kept
    assert after["num_timesteps"] == before["num_timesteps"] + 8


def test_load_config_fills_left_out_training_keys_from_the_checkpoint(trained, tmp_path):
    from hetpart.experiments.train_policy import load_config

    keys = {k: v for k, v in TINY.items() if k not in ("hidden", "n_steps", "batch_size")}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(keys | {"resume": str(trained / "out" / "mypolicy.zip"), "n_epochs": 2}))
    cfg = load_config(path)
    assert (cfg.hidden, cfg.n_steps, cfg.batch_size, cfg.n_epochs) == (8, 4, 4, 2)


def test_out_that_is_a_folder_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "taken.zip").mkdir()
    config = _config(tmp_path, "t.yaml", out="taken.zip")
    assert main(["train-policy", "--config", str(config)]) == 2
    assert f"{config}: out:" in _error(capsys) and not (tmp_path / "runs").exists()


SUITE = """entries:
  - {name: small, cluster: tiny-mixed, model: gpt2-small, global_batch: 16, seq_len: 256}
  - {name: other, cluster: tiny-mixed, model: gpt2-small, global_batch: 16, seq_len: 512}
  - {name: long, cluster: tiny-mixed, model: gpt2-small, global_batch: 16, seq_len: 4096}
"""


def test_bench_refuses_a_seq_len_beyond_the_models_positions_before_planning(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "suite.yaml").write_text(SUITE)
    assert main(["bench", "--suite", "suite.yaml", "--out", "out", "--runs-dir", "runs"]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and "bench: entry" not in captured.err  # nothing planned
    assert err[0].startswith("hetpart: error: suite.yaml: entries[2].seq_len: 4096") and "1024" in err[0]
    assert "--seq-len" not in err[0]
    assert not (tmp_path / "out").exists() and not (tmp_path / "runs").exists()


def test_load_suite_names_the_entry_field(tmp_path):
    from hetpart.errors import SpecError
    from hetpart.experiments.suite import load_suite

    (tmp_path / "suite.yaml").write_text(SUITE)
    with pytest.raises(SpecError, match=r"suite\.yaml: entries\[2\]\.seq_len: 4096 exceeds the 1024"):
        load_suite(tmp_path / "suite.yaml")


@pytest.mark.parametrize("tracker", ["bogus", "", "null,tensorboard"])
def test_bench_tracker_is_checked_by_its_flag_before_anything_is_made(tracker, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "suite.yaml").write_text(SUITE.rsplit("  - {name: long", 1)[0])
    assert main(["bench", "--suite", "suite.yaml", "--out", "out", "--tracker", tracker, "--runs-dir", "runs"]) == 2
    err = _error(capsys)
    assert err.startswith("hetpart: error: --tracker:") and "tensorboard" in err
    assert not (tmp_path / "out").exists() and not (tmp_path / "runs").exists()


def test_bench_out_under_a_file_is_refused_by_its_flag(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "suite.yaml").write_text(SUITE.rsplit("  - {name: long", 1)[0])
    (tmp_path / "afile").write_text("")
    assert main(["bench", "--suite", "suite.yaml", "--out", "afile/x", "--runs-dir", "runs"]) == 2
    assert _error(capsys).startswith("hetpart: error: --out: afile is a file")
    assert not (tmp_path / "runs").exists()


def test_dataset_redraws_a_dropped_scenario_and_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    # seed 0, 2 random plans per scenario on <= 8 GPUs: scenarios 2 and 3 have too few valid plans
    assert main(["costmodel", "dataset", "--scenarios", "3", "--plans-per-scenario", "2", "--max-devices", "8",
                 "--out", "ds.pt", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["scenarios"] == 3
    notes = [line for line in captured.err.splitlines() if line.startswith("hetpart: note:")]
    note = [line for line in notes if "dropped" in line]
    assert len(note) == 1 and "scenario 2 (" in note[0] and "4 needed" in note[0] and "in their place" in note[0]
    # three scenarios, none drawn for validation: said in a note of its own
    assert len(notes) == 2 and "no scenario in the val split of 3" in [n for n in notes if n not in note][0]


def test_dataset_stops_when_scenarios_keep_failing_and_says_how_many_it_kept():
    from hetpart.costmodel.learned.dataset import DatasetConfig, DatasetNote, build_dataset

    cfg = DatasetConfig(seed=0, scenarios=2, plans_per_scenario=1, max_devices=8, neighbour_share=0.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records = build_dataset(cfg)
    notes = [w for w in caught if issubclass(w.category, DatasetNote)]
    assert records == [] and len(notes) == 1
    assert "kept 0 of the 2 asked for after 4 draws" in str(notes[0].message)
