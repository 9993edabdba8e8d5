"""Probe C (2026-11-30), findings 3, 8 and 9: long commands (train-policy, costmodel dataset/train/train-closed,
loop) refuse an output they cannot write before any work, one line and exit code 2; train-policy writes into
its run's folder when the config names no ``out`` and never replaces the shipped policy unless told to; an
empty train-policy config is refused; loop checks its cluster before what imports torch; a checkpoint named
without ``.zip`` is found as stable-baselines3 finds it."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest
import yaml

from tests._cli import forbid, run_cli, one_line_exit_2 as _one_line_exit_2

TINY = {"experiment": "policy/tiny", "tracker": "null", "imitation_scenarios": 0, "timesteps": 4, "n_envs": 1,
        "n_steps": 4, "batch_size": 4, "max_devices": 8, "checkpoint_every": 4, "progress_bar": False, "hidden": 8}
"""A training of a few seconds (no imitation, 4 PPO steps)."""
UNWRITABLE = "/proc/nope"
"""A folder nobody can create, root included (the probe's path)."""
needs_proc = pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs Linux's /proc")




def _config(tmp_path: Path, **keys) -> Path:
    path = tmp_path / "tp.yaml"
    path.write_text(yaml.safe_dump(TINY | keys))
    return path


@pytest.fixture
def no_training(monkeypatch):
    """Fails the test if train-policy gets as far as making its run (tracker, environments, network)."""
    import hetpart.experiments.tracking as tracking

    forbid(monkeypatch, "the training started", (tracking, "make_tracker"))


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ------------------------------------------------------------------------ 3. the shipped checkpoint
def test_train_policy_without_out_writes_into_its_run_folder_not_the_shipped_policy(tmp_path, monkeypatch, capsys):
    from hetpart.policies.policy_planner import DEFAULT_CHECKPOINT

    before = _digest(DEFAULT_CHECKPOINT)
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, "train-policy", "--config", str(_config(tmp_path)), "--json")
    assert code == 0, err
    summary = yaml.safe_load(out)
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1 and runs[0].name.startswith("policy-tiny__0__")
    assert summary["checkpoint"] == str(Path("runs") / runs[0].name / "policy.zip")
    assert (runs[0] / "policy.zip").is_file() and not (tmp_path / "policies").exists()
    assert _digest(DEFAULT_CHECKPOINT) == before


@pytest.mark.parametrize("spelling", ["absolute", "through the hetpart/ link", "without .zip"])
def test_train_policy_refuses_the_shipped_checkpoint_as_out(spelling, tmp_path, capsys, no_training):
    from hetpart.policies.policy_planner import DEFAULT_CHECKPOINT

    top = Path(__file__).resolve().parents[1]
    out = {"absolute": str(DEFAULT_CHECKPOINT.resolve()),
           "through the hetpart/ link": str(top / "hetpart" / "policies" / "checkpoints" / "policy.zip"),
           "without .zip": str(DEFAULT_CHECKPOINT.resolve().with_suffix(""))}[spelling]
    config = _config(tmp_path, out=out)
    code, _, err = run_cli(capsys, "train-policy", "--config", str(config))
    line = _one_line_exit_2(code, err)
    assert all(part in line for part in (
        f"{config}: out: ",
        "is the shipped policy",
        "--replace-shipped",
    )), line


def test_replace_shipped_lets_the_shipped_checkpoint_be_out(tmp_path):
    from hetpart.experiments.train_policy import load_config
    from hetpart.policies.policy_planner import DEFAULT_CHECKPOINT

    config = _config(tmp_path, out=str(DEFAULT_CHECKPOINT))
    assert load_config(config, replace_shipped=True).out == str(DEFAULT_CHECKPOINT)


def test_a_config_built_in_code_is_refused_the_shipped_checkpoint_too(no_training):
    from hetpart.errors import SpecError
    from hetpart.experiments.train_policy import PolicyTrainConfig, train_policy
    from hetpart.policies.policy_planner import DEFAULT_CHECKPOINT

    with pytest.raises(SpecError, match=r"^config: out: .* is the shipped policy"):
        train_policy(PolicyTrainConfig(out=str(DEFAULT_CHECKPOINT)))


def test_an_empty_out_is_refused_with_the_default_named(tmp_path, capsys, no_training):
    config = _config(tmp_path, out="")
    code, _, err = run_cli(capsys, "train-policy", "--config", str(config))
    line = _one_line_exit_2(code, err)
    assert all(part in line for part in (
        f"{config}: out: empty",
        "leave out: out to write policy.zip in the run's folder",
    )), line


# --------------------------------------------------------------------------- 9. an empty config
@pytest.mark.parametrize("text", ["", "# only a comment\n"])
def test_train_policy_refuses_an_empty_config(text, tmp_path, capsys, no_training):
    config = tmp_path / "empty.yaml"
    config.write_text(text)
    code, _, err = run_cli(capsys, "train-policy", "--config", str(config))
    line = _one_line_exit_2(code, err)
    assert all(part in line for part in (
        f"{config}: empty config",
        "known: experiment, seed, out,",
        "'{}'",
    )), line


def test_an_empty_mapping_still_means_every_default(tmp_path):
    from hetpart.experiments.train_policy import PolicyTrainConfig, load_config

    config = tmp_path / "defaults.yaml"
    config.write_text("{}\n")
    assert load_config(config) == PolicyTrainConfig()


# ----------------------------------------------------------------- 8. outputs checked up front
@needs_proc
def test_train_policy_refuses_an_out_it_cannot_create(tmp_path, capsys, no_training):
    config = _config(tmp_path, out=f"{UNWRITABLE}/x")
    code, _, err = run_cli(capsys, "train-policy", "--config", str(config))
    line = _one_line_exit_2(code, err)
    assert f"{config}: out: cannot create {UNWRITABLE}/x.zip: /proc is not writable" in line, line


def test_train_policy_refuses_an_out_under_a_file_and_a_runs_dir_under_a_file(tmp_path, capsys, no_training):
    (tmp_path / "afile").write_text("")
    config = _config(tmp_path, out=str(tmp_path / "afile" / "p.zip"))
    code, _, err = run_cli(capsys, "train-policy", "--config", str(config))
    line = _one_line_exit_2(code, err)
    assert all(part in line for part in (
        f"{config}: out: cannot create",
        f"{tmp_path / 'afile'} is not a directory",
    )), line
    config = _config(tmp_path, out=str(tmp_path / "p.zip"), runs_dir=str(tmp_path / "afile" / "runs"))
    code, _, err = run_cli(capsys, "train-policy", "--config", str(config))
    line = _one_line_exit_2(code, err)
    assert all(part in line for part in (
        f"{config}: runs_dir: cannot create",
        "is not a directory",
    )), line


@needs_proc
@pytest.mark.parametrize("argv", [
    ["dataset", "--scenarios", "2", "--plans-per-scenario", "2", "--max-devices", "8", "--out", f"{UNWRITABLE}/ds"],
    ["train-closed", "--out", f"{UNWRITABLE}/closed.npz"],
    ["train", "--out", f"{UNWRITABLE}/surrogate.pt"],
])
def test_costmodel_commands_refuse_an_out_they_cannot_create(argv, capsys, monkeypatch):
    import hetpart.costmodel.learned.dataset as dataset

    forbid(monkeypatch, "the data set was built or read", (dataset, "build_dataset"), (dataset, "load_dataset"))
    code, _, err = run_cli(capsys, "costmodel", *argv)
    line = _one_line_exit_2(code, err)
    assert all(part in line for part in (
        f"--out: cannot create {argv[-1]}: /proc is not writable",
        "give a place you can write",
    )), line


def test_costmodel_dataset_refuses_a_directory_as_out(tmp_path, capsys, monkeypatch):
    import hetpart.costmodel.learned.dataset as dataset

    forbid(monkeypatch, "the data set was built", (dataset, "build_dataset"))
    code, _, err = run_cli(capsys, "costmodel", "dataset", "--scenarios", "2", "--out", str(tmp_path))
    line = _one_line_exit_2(code, err)
    assert f"--out: {tmp_path} is a directory; give a file name such as {tmp_path / 'dataset.pt'}" in line, line


@pytest.fixture
def loop_cheap_checks_only(monkeypatch):
    """Fails the test if the loop reaches its model check (which imports torch) or anything after it."""
    import hetpart.experiments.loop as loop

    forbid(monkeypatch, "the loop reached its torch-importing checks", (loop, "_check_runnable"),
           (loop, "cpu_cluster"))


@needs_proc
def test_loop_refuses_an_out_it_cannot_create_before_anything_else(capsys, loop_cheap_checks_only):
    code, _, err = run_cli(capsys, "loop", "--cluster", "tiny-mixed", "--model", "gpt2-small",
                           "--runs-per-iteration", "3", "--out", f"{UNWRITABLE}/l")
    line = _one_line_exit_2(code, err)
    assert f"--out: cannot create {UNWRITABLE}/l/state.json: /proc is not writable" in line, line


def test_loop_refuses_an_out_under_a_file(tmp_path, capsys, loop_cheap_checks_only):
    (tmp_path / "afile").write_text("")
    code, _, err = run_cli(capsys, "loop", "--cluster", "tiny-mixed", "--model", "gpt2-small",
                           "--runs-per-iteration", "3", "--out", str(tmp_path / "afile" / "l"))
    line = _one_line_exit_2(code, err)
    assert all(part in line for part in (
        "--out: cannot create",
        f"{tmp_path / 'afile'} is not a directory",
    )), line


# -------------------------------------------------------------------------- 9. cheap checks first
def test_loop_refuses_an_unknown_cluster_before_its_model_check(tmp_path, capsys, loop_cheap_checks_only):
    code, _, err = run_cli(capsys, "loop", "--cluster", "nope", "--model", "gpt2-small", "--runs-per-iteration", "3",
                           "--out", str(tmp_path / "l"))
    line = _one_line_exit_2(code, err)
    assert all(part in line for part in (
        "--cluster: unknown cluster 'nope'",
        "tiny-mixed",
    )), line
    assert not (tmp_path / "l").exists()


def test_loop_ground_real_is_refused_before_its_model_check(tmp_path, capsys, monkeypatch, loop_cheap_checks_only):
    import hetpart.experiments.loop as loop

    monkeypatch.setattr(loop, "_cuda_devices", lambda: [])
    code, _, err = run_cli(capsys, "loop", "--cluster", "tiny-mixed", "--ground", "real", "--model", "gpt2-small",
                           "--runs-per-iteration", "3", "--out", str(tmp_path / "l"))
    line = _one_line_exit_2(code, err)
    assert all(part in line for part in (
        "--ground real: needs the cluster's GPUs",
        "no CUDA device",
    )), line


def test_no_gpu_driver_means_no_cuda_device_without_importing_torch(monkeypatch):
    import hetpart.experiments.loop as loop

    monkeypatch.setattr(loop, "_GPU_DRIVER_FILES", ("/no/such/driver",))
    monkeypatch.delitem(sys.modules, "torch", raising=False)  # as in a fresh `hetpart loop` process
    assert loop._cuda_devices() == []
    assert "torch" not in sys.modules


# ----------------------------------------------------------------- 9. a checkpoint without .zip
def test_checkpoint_file_tries_zip_as_stable_baselines3_does(tmp_path):
    from hetpart.policies.registry import checkpoint_file

    (tmp_path / "smoke.zip").write_bytes(b"PK")
    assert checkpoint_file(tmp_path / "smoke") == tmp_path / "smoke.zip"
    assert checkpoint_file(tmp_path / "smoke.zip") == tmp_path / "smoke.zip"
    assert checkpoint_file(tmp_path / "other") is None
