"""``hetpart costmodel correct|train|train-closed --out``: an output that is one of the command's inputs, or that
cannot be created, is refused before any work (exit 2, one line), and nothing is written over the input."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests._cli import cli_json, forbid, run_cli, one_line_exit_2 as _one_line_exit_2

RUNS = Path(__file__).resolve().parents[1] / "experiments" / "data" / "h100_runs.jsonl"




@pytest.fixture
def no_fit(monkeypatch):
    """Fails the test if ``correct`` gets as far as reading the records."""
    import hetpart.records as records

    forbid(monkeypatch, "the records were read", (records, "load_records"))


@pytest.fixture
def no_training(monkeypatch):
    """Fails the test if ``train`` or ``train-closed`` gets as far as reading the data set."""
    import hetpart.costmodel.learned.dataset as dataset

    forbid(monkeypatch, "the data set was read", (dataset, "load_dataset"))


def test_correct_refuses_its_records_as_out(capsys, tmp_path, no_fit):
    records = tmp_path / "r.jsonl"
    shutil.copy(RUNS, records)
    before = records.read_bytes()
    code, _, err = run_cli(capsys, "costmodel", "correct", "--records", str(records), "--out", str(records))
    assert _one_line_exit_2(code, err, f"--out: {records} is the --records file this command reads", "give another path").startswith("hetpart: error: ")
    assert records.read_bytes() == before


def test_correct_refuses_the_same_records_by_another_name(capsys, tmp_path, no_fit):
    records = tmp_path / "r.jsonl"
    shutil.copy(RUNS, records)
    (tmp_path / "sub").mkdir()
    code, _, err = run_cli(capsys, "costmodel", "correct", "--records", str(records), "--out",
                           str(tmp_path / "sub" / ".." / "r.jsonl"))
    assert _one_line_exit_2(code, err, "is the --records file this command reads").startswith("hetpart: error: ")
    assert records.read_bytes() == RUNS.read_bytes()


def test_correct_refuses_an_out_it_cannot_create_before_the_fit(capsys, tmp_path, no_fit):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    code, _, err = run_cli(capsys, "costmodel", "correct", "--records", str(RUNS), "--out",
                           str(blocker / "x.json"))
    assert _one_line_exit_2(code, err, "--out: cannot create", "is not a directory", "give a place you can write").startswith("hetpart: error: ")


def test_correct_refuses_a_folder_as_out(capsys, tmp_path, no_fit):
    code, _, err = run_cli(capsys, "costmodel", "correct", "--records", str(RUNS), "--out", str(tmp_path))
    assert _one_line_exit_2(code, err, f"--out: {tmp_path} is a directory", "correction.json").startswith("hetpart: error: ")


def test_correct_creates_missing_folders_of_out(capsys, tmp_path):
    out = tmp_path / "new" / "deeper" / "c.json"
    got = cli_json(capsys, "costmodel", "correct", "--records", str(RUNS), "--out", str(out), "--json")
    assert got["out"] == str(out) and out.is_file()
    assert got["runs"] == 11


def test_train_closed_refuses_its_dataset_as_out(capsys, tmp_path, no_training):
    data = tmp_path / "d.pt"
    data.write_bytes(b"not really a data set")
    code, _, err = run_cli(capsys, "costmodel", "train-closed", "--dataset", str(data), "--out", str(data))
    assert _one_line_exit_2(code, err, f"--out: {data} is the --dataset file this command reads").startswith("hetpart: error: ")
    assert data.read_bytes() == b"not really a data set"


def test_train_refuses_out_flag_that_is_its_dataset_flag(capsys, tmp_path, no_training):
    data = tmp_path / "d.pt"
    data.write_bytes(b"data")
    code, _, err = run_cli(capsys, "costmodel", "train", "--dataset", str(data), "--out", str(data),
                           "--tracker", "null")
    assert _one_line_exit_2(code, err, f"--out: {data} is the --dataset file this command reads").startswith("hetpart: error: ")
    assert data.read_bytes() == b"data"


def test_train_refuses_out_flag_that_is_the_configs_dataset(capsys, tmp_path, no_training):
    data = tmp_path / "d.pt"
    data.write_bytes(b"data")
    config = tmp_path / "tc.yaml"
    config.write_text(f"dataset: {data}\nepochs: 1\n")
    code, _, err = run_cli(capsys, "costmodel", "train", "--config", str(config), "--out", str(data),
                           "--tracker", "null")
    assert _one_line_exit_2(code, err, f"--out: {data} is the dataset file this command reads").startswith("hetpart: error: ")
    assert data.read_bytes() == b"data"


def test_train_refuses_its_config_as_out(capsys, tmp_path, no_training):
    config = tmp_path / "tc.yaml"
    config.write_text("epochs: 1\n")
    code, _, err = run_cli(capsys, "costmodel", "train", "--config", str(config), "--out", str(config),
                           "--tracker", "null")
    assert _one_line_exit_2(code, err, f"--out: {config} is the --config file this command reads").startswith("hetpart: error: ")
    assert config.read_text() == "epochs: 1\n"


def test_train_config_whose_out_is_its_dataset_is_refused_naming_file_and_keys(capsys, tmp_path, no_training):
    data = tmp_path / "ds" / "d.pt"
    data.parent.mkdir()
    data.write_bytes(b"data")
    config = tmp_path / "tc.yaml"
    config.write_text(f"dataset: {data}\nout: {data}\nepochs: 1\n")
    code, _, err = run_cli(capsys, "costmodel", "train", "--config", str(config), "--tracker", "null")
    _one_line_exit_2(code, err, f"{config}: out: {data} is the dataset file this command reads",
                     "give another path (nothing was written)")
    assert data.read_bytes() == b"data"


def test_train_config_out_over_a_dataset_flag_is_refused(capsys, tmp_path, no_training):
    data = tmp_path / "d.pt"
    data.write_bytes(b"data")
    config = tmp_path / "tc.yaml"
    config.write_text(f"out: {data}\nepochs: 1\n")
    code, _, err = run_cli(capsys, "costmodel", "train", "--config", str(config), "--dataset", str(data),
                           "--tracker", "null")
    assert _one_line_exit_2(code, err, f"{config}: out: {data} is the --dataset file this command reads").startswith("hetpart: error: ")
    assert data.read_bytes() == b"data"
