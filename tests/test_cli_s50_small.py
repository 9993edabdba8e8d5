"""A user-journey probe's small findings, pinned: the DeepSpeed TP note on stages of unequal width, the count of
a plan's broken rules not shown, ``predict --plan --global-batch`` naming the flag, and the gym env refusing a
scenario of names when it is made (it failed at ``reset()``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetpart.plan import Plan, Replica, Stage
from tests._cli import cli_json, run_cli, one_line_exit_2 as _one_line_exit_2




def _write(tmp_path: Path, plan: Plan, name: str = "plan.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(plan.to_dict() | {"meta": {"model": "gpt2-small", "cluster": "tiny-mixed"}}))
    return path


def _uneven_pipeline() -> Plan:
    """gpt2-small (14 units) on tiny-mixed: stage 0 at tp 2 on the two A100s, stages 1 and 2 on a V100 each."""
    stages = (Stage((0, 5), ("0/0/0", "0/0/1"), 2), Stage((5, 10), ("1/0/0",), 1), Stage((10, 14), ("1/0/1",), 1))
    return Plan(global_batch=16, micro_batch=2, seq_len=256, replicas=(Replica(1.0, stages),), precision="fp16")


def test_deepspeed_tp_note_gives_each_stages_gpus_when_they_differ(capsys, tmp_path):
    got = cli_json(capsys, "export", str(_write(tmp_path, _uneven_pipeline())), "--to", "deepspeed", "--json")
    said = [p for p in got["cannot_express"] if p.startswith("tensor parallelism (tp 2): DeepSpeed's")]
    assert len(said) == 1
    assert said[0].endswith("while plain DeepSpeed makes every GPU of a stage a data-parallel rank and needs as many "
                            "in each stage; these stages hold 2, 1 and 1 GPUs")
    assert "all 1 GPUs" not in said[0]


def test_deepspeed_tp_note_on_even_stages_counts_the_gpus_of_a_stage(capsys, tmp_path):
    stages = (Stage((0, 7), ("0/0/0", "0/0/1"), 2), Stage((7, 14), ("1/0/0", "1/0/1"), 2))
    plan = Plan(global_batch=16, micro_batch=2, seq_len=256, replicas=(Replica(1.0, stages),), precision="fp16")
    got = cli_json(capsys, "export", str(_write(tmp_path, plan)), "--to", "deepspeed", "--json")
    said = [p for p in got["cannot_express"] if p.startswith("tensor parallelism (tp 2): DeepSpeed's")]
    assert len(said) == 1
    assert said[0].endswith("while plain DeepSpeed makes all 2 GPUs of a stage data-parallel ranks: "
                            "gradient_accumulation_steps 4 there")


def test_broken_rules_not_listed_are_counted(capsys, tmp_path):
    stages = tuple(Stage((2 * i, 2 * i + 2), (f"9/9/{i}",), 1) for i in range(7))
    plan = Plan(global_batch=16, micro_batch=2, seq_len=256, replicas=(Replica(1.0, stages),), precision="fp16")
    path = _write(tmp_path, plan, "bad.json")
    code, _, err = run_cli(capsys, "show", str(path))
    line = _one_line_exit_2(code, err, f"{path}: replicas[0].stages[0].devices: '9/9/0' does not exist", "(+6 more: ")
    assert line.endswith("replicas[0].stages[3].devices: '9/9/3' does not exist in cluster 'tiny-mixed' (4 devices); "
                         "and 3 not shown)")
    assert "'9/9/4'" not in line


def test_broken_rules_all_listed_say_nothing_is_hidden(capsys, tmp_path):
    stages = tuple(Stage((7 * i, 7 * i + 7), (f"9/9/{i}",), 1) for i in range(2))
    plan = Plan(global_batch=16, micro_batch=2, seq_len=256, replicas=(Replica(1.0, stages),), precision="fp16")
    path = _write(tmp_path, plan, "bad.json")
    code, _, err = run_cli(capsys, "show", str(path))
    line = _one_line_exit_2(code, err, "(+1 more: replicas[0].stages[1].devices: '9/9/1' does not exist")
    assert "not shown" not in line


def test_predict_plan_with_another_global_batch_names_the_flag(capsys, tmp_path):
    path = _write(tmp_path, _uneven_pipeline())
    code, _, err = run_cli(capsys, "predict", "--plan", str(path), "--global-batch", "128")
    line = _one_line_exit_2(code, err, f"--global-batch: 128 but {path} was planned for 16 sequences per step",
                            "drop --global-batch", "hetpart plan ... --global-batch 128")
    assert "workload:" not in line


def test_predict_plan_with_its_own_global_batch_still_prices_it(capsys, tmp_path):
    path = _write(tmp_path, _uneven_pipeline())
    got = cli_json(capsys, "predict", "--plan", str(path), "--global-batch", "16", "--json")
    assert got["metrics"]["tokens_per_s"] > 0


@pytest.mark.parametrize("scenario", [("gpt2-small", "tiny-mixed", None), ("gpt2-small",), "gpt2-small"])
def test_env_refuses_a_scenario_that_is_not_built_objects_when_made(scenario):
    import gymnasium as gym

    import hetpart.envs  # noqa: F401  registers hetpart/Partition-v0
    from hetpart.errors import SpecError

    with pytest.raises(SpecError, match=r"^scenario: expected \(ModelGraph, Cluster, Workload\), got .*; build them "
                                        r"with hetpart\.load_model"):
        gym.make("hetpart/Partition-v0", scenario=scenario)


def test_env_takes_a_built_scenario_given_as_a_list():
    from hetpart import load_cluster, load_model
    from hetpart.envs import PartitionEnv
    from hetpart.workload import Workload

    env = PartitionEnv(scenario=[load_model("gpt2-small", seq_len=256), load_cluster("tiny-mixed"), Workload(16, 256)])
    obs, _ = env.reset(seed=0)
    assert isinstance(env.fixed, tuple) and len(env.fixed) == 3
    assert obs is not None
