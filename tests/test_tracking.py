"""The tracker: named runs with their config, TensorBoard events readable back, wandb offline, SB3's logger."""

from __future__ import annotations

import dataclasses
import re

import pytest
import yaml

from hetpart.errors import SpecError
from hetpart.experiments.tracking import (MultiTracker, NullTracker, TensorBoardTracker, make_tracker, run_name,
                                          sb3_logger)


def _scalars(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@dataclasses.dataclass(frozen=True)
class _Config:
    lr: float = 1e-3
    layers: tuple[int, ...] = (64, 64)


def test_tensorboard_run_named_with_config_and_scalars(tmp_path):
    with make_tracker("tensorboard", "costmodel/train", seed=7, config=_Config(), root=tmp_path) as t:
        assert isinstance(t, TensorBoardTracker)
        t.log({"costmodel/val_mape": 12.5, "costmodel/loss": 0.25}, step=1)
        t.log({"costmodel/val_mape": 9.0}, step=2)
    assert re.fullmatch(r"costmodel-train__7__\d{8}-\d{6}", t.name)
    assert t.run_dir == tmp_path / t.name
    saved = yaml.safe_load((t.run_dir / "config.yaml").read_text())
    assert saved["experiment"] == "costmodel/train" and saved["seed"] == 7
    assert saved["config"] == {"lr": 1e-3, "layers": [64, 64]}
    scalars = _scalars(t.run_dir)
    assert scalars["costmodel/val_mape"] == [(1, 12.5), (2, 9.0)]
    assert scalars["costmodel/loss"] == [(1, 0.25)]
    with pytest.raises(RuntimeError, match="after finish"):
        t.log({"x": 1}, step=3)


def test_only_the_owner_rank_logs(tmp_path):
    t = make_tracker("tensorboard", "policy/ppo", seed=0, config={}, root=tmp_path, rank=1)
    assert isinstance(t, NullTracker) and t.run_dir is None
    t.log({"train/loss": 1.0}, step=0)
    t.finish()
    assert not any(tmp_path.iterdir())


def test_two_runs_in_one_second_get_two_folders(tmp_path):
    a = make_tracker("tensorboard", "bench", seed=1, root=tmp_path)
    b = make_tracker("tensorboard", "bench", seed=1, root=tmp_path)
    a.finish(), b.finish()
    assert a.run_dir != b.run_dir and a.run_dir.exists() and b.run_dir.exists()


def test_bad_kinds_and_metrics_are_clear(tmp_path):
    with pytest.raises(SpecError, match="unknown kind 'mlflow'"):
        make_tracker("tensorboard,mlflow", "x", seed=0, root=tmp_path)
    with pytest.raises(SpecError, match="'null' cannot be combined"):
        make_tracker(["null", "wandb"], "x", seed=0, root=tmp_path)
    with make_tracker("tensorboard", "x", seed=0, root=tmp_path) as t, \
            pytest.raises(SpecError, match="metric 'a' = 'high' is not a number"):
        t.log({"a": "high"}, step=0)


def test_run_name_format():
    assert run_name("bench/suite", 3, when=86400) == "bench-suite__3__19700102-000000"


def test_sb3_logger_writes_sb3_keys_into_the_run(tmp_path):
    with make_tracker("tensorboard", "policy/ppo", seed=0, root=tmp_path) as t:
        logger = sb3_logger(t)
        logger.record("rollout/ep_rew_mean", 3.5)
        logger.record("train/loss", 0.125)
        logger.dump(step=64)
        logger.close()
    scalars = _scalars(t.run_dir)
    assert scalars["rollout/ep_rew_mean"] == [(64, 3.5)]
    assert scalars["train/loss"] == [(64, 0.125)]
    assert (t.run_dir / "progress.csv").exists()


@pytest.mark.slow
def test_wandb_offline_run_beside_tensorboard(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    with make_tracker("tensorboard,wandb", "bench/suite", seed=2, config={"a": 1}, root=tmp_path) as t:
        assert isinstance(t, MultiTracker)
        t.log({"bench/tokens_per_s": 1000.0}, step=0)
        logger = sb3_logger(t)  # SB3's records reach wandb too (a forwarding writer beside TensorBoard and CSV)
        assert any(type(f).__name__ == "_ForwardToTracker" for f in logger.output_formats)
        logger.record("rollout/ep_rew_mean", 2.0)
        logger.dump(step=8)
    import os

    assert os.environ["WANDB_MODE"] == "offline"
    offline = list((t.run_dir / "wandb").glob("offline-run-*"))
    assert len(offline) == 1 and list(offline[0].glob("*.wandb"))
    scalars = _scalars(t.run_dir)
    assert scalars["bench/tokens_per_s"] == [(0, 1000.0)] and scalars["rollout/ep_rew_mean"] == [(8, 2.0)]
