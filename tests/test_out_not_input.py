"""An output path that is one of the command's own inputs is refused before any work, the input left intact."""

from __future__ import annotations

import shutil
from importlib import resources
from pathlib import Path

import pytest

from hetpart.errors import SpecError
from tests._cli import run_cli as _run

SMALL = ["--global-batch", "8", "--seq-len", "256", "--planner", "uniform"]


def _cluster(tmp_path: Path) -> Path:
    path = tmp_path / "lab.yaml"
    with resources.as_file(resources.files("hetpart") / "catalog" / "clusters" / "tiny-mixed.yaml") as src:
        shutil.copy(src, path)
    return path


def _refused(capsys, *argv: str) -> str:
    code, out, err = _run(capsys, *argv)
    assert code == 2 and err.count("\n") == 1 and "nothing was written" in err
    return err


def test_plan_out_over_its_cluster_is_refused(capsys, tmp_path: Path) -> None:
    cluster = _cluster(tmp_path)
    before = cluster.read_text()
    err = _refused(capsys, "plan", "--model", "gpt2-small", "--cluster", str(cluster), *SMALL, "--out", str(cluster))
    assert "--out:" in err and "--cluster file" in err
    assert cluster.read_text() == before


def test_export_and_show_over_the_plan_are_refused_and_another_path_works(capsys, tmp_path: Path) -> None:
    cluster = _cluster(tmp_path)
    plan = tmp_path / "plan.json"
    code, _, _ = _run(capsys, "plan", "--model", "gpt2-small", "--cluster", str(cluster), *SMALL, "--out", str(plan))
    assert code == 0
    before = plan.read_text()
    assert "PLAN file" in _refused(capsys, "export", str(plan), "--to", "megatron", "--out", str(plan))
    assert "--html:" in _refused(capsys, "show", str(plan), "--html", str(tmp_path / "." / "plan.json"))
    assert "--cluster file" in _refused(capsys, "export", str(plan), "--to", "megatron", "--out", str(cluster))
    assert plan.read_text() == before
    code, _, _ = _run(capsys, "export", str(plan), "--to", "megatron", "--out", str(tmp_path / "args.txt"))
    assert code == 0 and (tmp_path / "args.txt").read_text()


def test_calibrate_speeds_over_its_cluster_is_refused(capsys, tmp_path: Path) -> None:
    cluster = _cluster(tmp_path)
    runs = tmp_path / "runs.jsonl"
    runs.write_text("")
    before = cluster.read_text()
    err = _refused(capsys, "calibrate", "--cluster", str(cluster), "--speeds-from", str(runs), "--out", str(cluster))
    assert "--cluster file" in err and cluster.read_text() == before


def test_train_policy_out_over_its_config_is_refused(tmp_path: Path) -> None:
    from hetpart.experiments.train_policy import load_config

    config = tmp_path / "mine.yaml"
    config.write_text(f"timesteps: 64\nout: {config}\nruns_dir: {tmp_path / 'runs'}\n")
    with pytest.raises(SpecError, match=r"mine.yaml: out: .*mine.yaml is the training config file"):
        load_config(config)
    assert config.read_text().startswith("timesteps: 64")
