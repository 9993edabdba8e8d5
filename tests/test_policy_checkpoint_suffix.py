"""`--policy-checkpoint NAME` also reads `NAME.zip`, as stable-baselines3 loads it and as train-policy writes it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hetpart.cli.plan_cmd import _policy_checkpoint
from hetpart.errors import PlanError
from hetpart.policies.policy_planner import DEFAULT_CHECKPOINT


def test_policy_checkpoint_without_zip_is_found(tmp_path: Path, monkeypatch) -> None:
    shutil.copy(DEFAULT_CHECKPOINT, tmp_path / "smoke.zip")
    monkeypatch.chdir(tmp_path)
    assert _policy_checkpoint(Path("smoke"), "policy") == {"checkpoint": str(tmp_path / "smoke.zip")}


def test_a_missing_checkpoint_names_both_files(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PlanError, match=r"none: no such file nor none\.zip"):
        _policy_checkpoint(Path("none"), "policy")
