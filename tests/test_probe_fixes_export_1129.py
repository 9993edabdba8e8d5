"""Regression tests for a probe's findings (2026-11-29) in export, train-policy, plan --planner policy, show
and bench: nothing the plan assumed is dropped by export, the rank placement is always given, train-policy's
--json stdout is the summary alone and its config is checked before any work, a trained checkpoint can be
planned with, show refuses an image format it cannot write, and bench names the suite file's fields."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from hetpart.errors import PlanError
from hetpart.export import export_plan
from hetpart.graph import load_model
from hetpart.plan import Plan, Replica, Stage
from tests._cli import run_cli

V100 = "name: v100x2\nnodes:\n  - {count: 1, gpus_per_node: 2, gpu: V100-32GB, intra_node: NVLink2, nic: IB-EDR}\n"


def _graph():
    return load_model("gpt2-small", seq_len=256)  # embedding, 12 blocks, head: 14 units


def _plan(shares=(0.5, 0.5), **extra) -> Plan:
    """Two replicas of a two-stage pipeline (node 0 and node 1 of a2x4)."""
    replicas = tuple(Replica(share, (Stage((0, 7), (f"{r}/0/0",), 1), Stage((7, 14), (f"{r}/0/1",), 1)))
                     for r, share in enumerate(shares))
    return Plan(global_batch=16, micro_batch=2, seq_len=256, replicas=replicas, recompute="full", **extra)


def _args(text: str) -> dict[str, str | bool]:
    out: dict[str, str | bool] = {}
    for line in text.replace("\\\n", "\n").splitlines():
        name, _, value = line.strip().partition(" ")
        out[name] = value or True
    return out


# ------------------------------------------------------------------------------- 1. optimizer, attention
def test_export_emits_sgd_where_the_engine_has_it_and_names_it_elsewhere() -> None:
    plan = _plan(optimizer="sgd")
    megatron = export_plan(plan, _graph(), "megatron")
    assert _args(megatron.text)["--optimizer"] == "sgd" and megatron.cannot_express == ()
    deepspeed = json.loads(export_plan(plan, _graph(), "deepspeed").text)
    assert deepspeed["optimizer"] == {"type": "SGD", "params": {"momentum": 0.9}}
    assert "zero_allow_untested_optimizer" not in deepspeed  # ZeRO off: no ZeRO check to pass
    sharded = json.loads(export_plan(replace(plan, zero=1, offload="optimizer"), _graph(), "deepspeed").text)
    assert sharded["zero_allow_untested_optimizer"] is True and sharded["zero_force_ds_cpu_optimizer"] is False
    titan = export_plan(plan, _graph(), "torchtitan")
    assert any(p.startswith("optimizer sgd (momentum SGD") and "takes Adam or AdamW" in p for p in titan.cannot_express)
    adam = export_plan(_plan(), _graph(), "megatron")
    assert "--optimizer" not in _args(adam.text) and adam.cannot_express == ()  # Adam is every engine's default


def test_export_names_8bit_adam_and_eager_attention_with_what_the_plan_assumed() -> None:
    plan = _plan(optimizer="adam8bit", attention="eager")
    megatron = export_plan(plan, _graph(), "megatron")
    assert _args(megatron.text)["--attention-backend"] == "unfused"  # Megatron-Core's kernel that stores scores
    assert [p for p in megatron.cannot_express if p.startswith("optimizer adam8bit (8-bit Adam: two 1-byte moments")]
    for target in ("torchtitan", "deepspeed"):
        problems = export_plan(plan, _graph(), target).cannot_express
        assert any(p.startswith("optimizer adam8bit") for p in problems), target
        assert any(p.startswith("attention eager (the plan keeps each layer's attention-score matrix") for p in problems)
    assert "optimizer" not in json.loads(export_plan(plan, _graph(), "deepspeed").text)


def test_export_strict_fails_on_an_optimizer_the_target_cannot_express(capsys, tmp_path) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(V100)
    data = {"global_batch": 4, "micro_batch": 1, "seq_len": 128, "schedule": "1f1b", "recompute": "none",
            "precision": "fp16", "optimizer": "adam8bit", "meta": {"model": "gpt2-small", "cluster": str(cluster)},
            "replicas": [{"batch_share": 1.0, "stages": [{"layers": [0, 14], "devices": ["0/0/0"], "tp": 1}]}]}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    for target in ("megatron", "torchtitan", "deepspeed"):
        code, out, err = run_cli(capsys, "export", str(path), "--to", target, "--strict")
        assert code == 2 and "optimizer adam8bit (8-bit Adam" in err and "Traceback" not in err, target
    code, out, err = run_cli(capsys, "export", str(path), "--to", "megatron")
    assert code == 0 and "warning: megatron cannot express optimizer adam8bit" in err


# ------------------------------------------------------------------------------- 2. rank placement
def test_rank_placement_is_given_also_when_the_shape_has_other_problems() -> None:
    uneven = export_plan(_plan(shares=(0.75, 0.25)), _graph(), "megatron")
    assert uneven.cannot_express  # uneven shares are named ...
    assert "start rank r on device r of [0/0/0,1/0/0,0/0/1,1/0/1]" in uneven.notes[0]  # ... and ranks still placed
    assert "start rank r on device r of" in export_plan(_plan(shares=(0.75, 0.25)), _graph(), "torchtitan").notes[0]
    deeper = Plan(global_batch=16, micro_batch=2, seq_len=256, recompute="full", replicas=(
        Replica(0.5, (Stage((0, 7), ("0/0/0",), 1), Stage((7, 14), ("0/0/1",), 1))),
        Replica(0.5, (Stage((0, 4), ("1/0/0",), 1), Stage((4, 9), ("1/0/1",), 1), Stage((9, 14), ("1/0/2",), 1)))))
    note = export_plan(deeper, _graph(), "megatron").notes[0]
    assert "this plan's replicas differ in depth (2 and 3 stages)" in note and "place each rank by hand" in note


# ------------------------------------------------------------------------------- 3, 4. train-policy
def _policy_config(tmp_path: Path, **extra) -> Path:
    data = {"experiment": "pb", "out": str(tmp_path / "pb.zip"), "runs_dir": str(tmp_path / "runs"),
            "timesteps": 2, "imitation_scenarios": 0, "max_devices": 8, "n_envs": 1, "n_steps": 2, "batch_size": 2,
            "n_epochs": 1, "tracker": "null", "checkpoint_every": 1} | extra
    path = tmp_path / "pb.yaml"
    path.write_text("\n".join(f"{k}: {json.dumps(v)}" for k, v in data.items()) + "\n")
    return path


def test_train_policy_json_is_alone_on_stdout_and_no_checkpoint_folder_warning(capsys, tmp_path) -> None:
    code, out, err = run_cli(capsys, "train-policy", "--config", str(_policy_config(tmp_path)), "--json")
    assert code == 0, err
    summary = json.loads(out)  # no progress bar, no blank line before the object
    assert summary["timesteps"] >= 2 and Path(summary["checkpoint"]).is_file()
    assert "does not exist" not in err and "UserWarning" not in err


@pytest.mark.parametrize("extra, message", [
    ({"timesteps": -5}, "timesteps: must be >= 1, got -5"),
    ({"timesteps": 0}, "timesteps: must be >= 1, got 0"),
    ({"n_envs": 0}, "n_envs: must be >= 1, got 0"),
    ({"imitation_scenarios": -1}, "imitation_scenarios: must be >= 0, got -1"),
    ({"batch_size": 1}, "batch_size: must be >= 2, got 1"),
    ({"tracker": "mlflow"}, "tracker: 'mlflow': use one or more of tensorboard, wandb, null"),
])
def test_train_policy_config_is_checked_before_any_work(capsys, tmp_path, monkeypatch, extra, message) -> None:
    import hetpart.experiments.train_policy as train

    def started(*_a, **_k):
        raise AssertionError("training started")

    monkeypatch.setattr(train, "train_policy", started)
    path = _policy_config(tmp_path, **extra)
    code, out, err = run_cli(capsys, "train-policy", "--config", str(path))
    assert code == 2 and f"{path}: {message}" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


# ------------------------------------------------------------------------------- 5. --policy-checkpoint
def test_plan_takes_a_trained_policy_checkpoint(capsys, tmp_path, monkeypatch) -> None:
    import hetpart.policies as policies
    from hetpart.policies.policy_planner import DEFAULT_CHECKPOINT

    seen = {}

    def fake_plan(*_a, **options):
        seen.update(options)
        raise PlanError("planned no further")

    monkeypatch.setattr(policies, "plan", fake_plan)
    code, _, err = run_cli(capsys, "plan", "-m", "gpt2-small", "-c", "tiny-mixed", "--planner", "policy",
                           "--policy-checkpoint", str(DEFAULT_CHECKPOINT))
    assert code == 2 and seen["checkpoint"] == str(DEFAULT_CHECKPOINT.resolve())
    code, out, err = run_cli(capsys, "train-policy", "--help")
    assert "--policy-checkpoint" in out


@pytest.mark.parametrize("args, message", [
    (["--planner", "policy", "--policy-checkpoint", "nothere.zip"], "--policy-checkpoint: nothere.zip: no such file"),
    (["--policy-checkpoint", "JUNK"], "--policy-checkpoint: only --planner policy uses a checkpoint"),
    (["--planner", "policy", "--policy-checkpoint", "JUNK"], "not a policy checkpoint"),
])
def test_plan_refuses_a_wrong_policy_checkpoint_in_one_line(capsys, tmp_path, args, message) -> None:
    junk = tmp_path / "junk.zip"
    junk.write_text("not a zip")
    args = [str(junk) if a == "JUNK" else a for a in args]
    code, out, err = run_cli(capsys, "plan", "-m", "gpt2-small", "-c", "tiny-mixed", *args)
    assert code == 2 and message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


# ------------------------------------------------------------------------------- 6. show
def _plan_file(tmp_path: Path, layers=(0, 14)) -> Path:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(V100)
    data = {"global_batch": 4, "micro_batch": 1, "seq_len": 128, "schedule": "1f1b", "recompute": "none",
            "precision": "fp16", "meta": {"model": "gpt2-small", "cluster": str(cluster)},
            "replicas": [{"batch_share": 1.0, "stages": [{"layers": list(layers), "devices": ["0/0/0"], "tp": 1}]}]}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("name, what", [("x.txt", "unsupported extension '.txt'"), ("x", "no extension")])
def test_show_refuses_a_gantt_format_it_cannot_write(capsys, tmp_path, name, what) -> None:
    code, out, err = run_cli(capsys, "show", str(_plan_file(tmp_path)), "--gantt", str(tmp_path / name))
    assert code == 2 and f"--gantt: {tmp_path / name}: {what}" in err and ".png, .svg or .pdf" in err


def test_show_names_the_plan_file_of_an_invalid_plan(capsys, tmp_path) -> None:
    path = _plan_file(tmp_path, layers=(0, 3))
    code, out, err = run_cli(capsys, "show", str(path))
    assert code == 2 and f"error: {path}: replicas[0]" in err


# ------------------------------------------------------------------------------- 7. bench
def _suite(tmp_path: Path, *entries: str) -> Path:
    path = tmp_path / "suite.yaml"
    path.write_text("entries:\n" + "".join(f"  - {{{e}}}\n" for e in entries))
    return path


def test_bench_names_the_suite_field_of_a_missing_cluster(capsys, tmp_path) -> None:
    suite = _suite(tmp_path, "name: a, cluster: nothere.yaml, model: gpt2-small, global_batch: 8, seq_len: 256")
    code, out, err = run_cli(capsys, "bench", "--suite", str(suite), "--out", str(tmp_path / "o"))
    assert code == 2 and f"error: {suite}: entries[0].cluster: 'nothere.yaml': no such file" in err
    assert "--cluster" not in err and err.strip().count("\n") == 0 and not err.startswith("\n")


@pytest.mark.parametrize("second, message", [
    ("a", "entries[1].name: 'a' is also entries[0]'s name"),
    ("a ", "both give gantt_a.png"),
])
def test_bench_refuses_entries_of_one_name(capsys, tmp_path, second, message) -> None:
    entry = "cluster: tiny-mixed, model: gpt2-small, global_batch: 8, seq_len: 256"
    suite = _suite(tmp_path, f"name: a, {entry}", f"name: '{second}', {entry}")
    code, out, err = run_cli(capsys, "bench", "--suite", str(suite), "--out", str(tmp_path / "o"))
    assert code == 2 and message in err


def test_bench_prints_a_line_per_entry_and_planner_as_it_starts(capsys, tmp_path) -> None:
    entry = "cluster: tiny-mixed, model: gpt2-small, global_batch: 8, seq_len: 256"
    suite = _suite(tmp_path, f"name: a, {entry}", f"name: b, {entry}")
    code, out, err = run_cli(capsys, "bench", "--suite", str(suite), "--planners", "uniform", "--tracker", "null",
                             "--out", str(tmp_path / "o"), "--json")
    assert code == 0, err
    assert len(json.loads(out)["results"]) == 2
    assert err.splitlines() == ["bench: entry 1/2 a: uniform", "bench: entry 2/2 b: uniform"]
