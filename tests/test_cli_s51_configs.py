"""The training configs (``train-policy --config``, ``costmodel train --config``) are read as cluster and suite
YAML are (:mod:`hetpart._yaml`): a binary or non-UTF-8 file, a repeated key or a file over 1 MiB is one line and
exit code 2 (the user-journey probe of 2026-12-01: an internal UnicodeDecodeError, exit 1, and ``timesteps:
256`` then ``timesteps: 128`` silently trained 128). A data set the config names but that is missing is named
with the config file and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._cli import one_line_exit_2, run_cli

COMMANDS = {"train-policy": ["train-policy", "--config"], "costmodel train": ["costmodel", "train", "--config"]}


@pytest.mark.parametrize("command", COMMANDS)
def test_a_binary_config_is_one_line(capsys, tmp_path: Path, command: str) -> None:
    config = tmp_path / "c.yaml"
    config.write_bytes(b"PK\x03\x04\xff\xfe\x00binary")
    code, _, err = run_cli(capsys, *COMMANDS[command], str(config))
    assert one_line_exit_2(code, err, str(config), "not UTF-8 text")


@pytest.mark.parametrize("command", COMMANDS)
def test_a_repeated_key_is_refused(capsys, tmp_path: Path, command: str) -> None:
    config = tmp_path / "c.yaml"
    key = "timesteps" if command == "train-policy" else "epochs"
    config.write_text(f"{key}: 256\n{key}: 128\n")
    code, _, err = run_cli(capsys, *COMMANDS[command], str(config))
    assert one_line_exit_2(code, err, str(config), f"duplicate key '{key}' at line 2")


@pytest.mark.parametrize("command", COMMANDS)
def test_a_config_over_one_mebibyte_is_refused(capsys, tmp_path: Path, command: str) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("# padding\n" * 120_000)
    code, _, err = run_cli(capsys, *COMMANDS[command], str(config))
    assert one_line_exit_2(code, err, str(config), "byte limit for YAML input")


def test_a_missing_data_set_names_the_config_and_its_key(capsys, tmp_path: Path, monkeypatch) -> None:
    config = tmp_path / "cfg" / "train.yaml"
    config.parent.mkdir()
    config.write_text(f"dataset: ds.pt\nout: {tmp_path / 's.pt'}\n")
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(capsys, "costmodel", "train", "--config", str(config), "--tracker", "null")
    assert one_line_exit_2(code, err, f"{config}: dataset: ds.pt: no such file", "hetpart costmodel dataset")
    (config.parent / "ds.pt").write_bytes(b"")  # beside the config: relative paths are the working directory's
    code, _, err = run_cli(capsys, "costmodel", "train", "--config", str(config), "--tracker", "null")
    assert one_line_exit_2(code, err, "read from the working directory", str(config.parent / "ds.pt"))
