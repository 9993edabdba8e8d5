"""``hetpart export``: a probe's findings (2026-11-30), pinned.

* the global-batch advice counts the data-parallel ranks of the config shown: replicas of other TP widths make
  another grid on the plan's devices (the probe's advice, 24 or 36, broke the printed Megatron-LM config);
* ZeRO 0 with the optimizer offloaded: Megatron-LM's CPU offload needs the precision-aware and distributed
  optimizers, DeepSpeed's ``offload_optimizer`` a ZeRO stage of 1 to 3; both are shown and named;
* groups that mix GPU vendors (no NCCL/RCCL communicator spans both) are named;
* torchtitan's older split points give one stage per point also when the last stage holds the head alone;
* a ``python:`` model is refused for what it is, not as "not a transformer".
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from hetpart.cluster import load_cluster
from hetpart.export import export_plan
from hetpart.graph import load_model
from hetpart.plan import Plan, Replica, Stage
from tests._cli import run_cli
from tests.test_export import _megatron_args

tomllib = pytest.importorskip("tomllib")  # Python 3.11+


def _graph():
    return load_model("gpt2-small", seq_len=256)  # embedding, 12 blocks, head: 14 units


def _tp_differ(shares=(0.5, 0.25, 0.25), global_batch=32) -> Plan:
    """The probe's plan on tiny-mixed: replica 0 at tp 2 on the two A100s, replicas 1 and 2 at tp 1 on a V100 each."""
    devices = (("0/0/0", "0/0/1"), ("1/0/0",), ("1/0/1",))
    replicas = tuple(Replica(share, (Stage((0, 14), d, len(d)),)) for share, d in zip(shares, devices))
    return Plan(global_batch=global_batch, micro_batch=4, seq_len=256, replicas=replicas, precision="fp16")


def _write(tmp_path: Path, plan: Plan, model: str, cluster: str) -> Path:
    data = plan.to_dict() | {"meta": {"model": model, "cluster": cluster}}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    return path


# ------------------------------------------------------------------------------ 4. the batch of the config shown
def test_the_batch_advice_counts_the_grid_the_config_makes_on_the_plans_devices() -> None:
    plan = _tp_differ()  # 4 devices as tp 2: dp 2, and 32 = 4 x 2 x 4 adds up
    for target in ("megatron", "torchtitan", "deepspeed"):
        problems = export_plan(plan, _graph(), target).cannot_express
        assert not [p for p in problems if "global batch of" in p], target
    titan = tomllib.loads(export_plan(plan, _graph(), "torchtitan").text)
    assert titan["parallelism"]["data_parallel_replicate_degree"] == 2
    assert titan["parallelism"]["tensor_parallel_degree"] == 2
    ds = export_plan(plan, _graph(), "deepspeed")
    assert ds.data["config"]["gradient_accumulation_steps"] == 4  # 32 = micro 4 x 4 x dp 2
    assert ("the batch figures shown count 2 data-parallel ranks of tp 2, as Megatron-DeepSpeed does, while plain "
            "DeepSpeed makes all 4 GPUs of a stage data-parallel ranks: gradient_accumulation_steps 2 there"
            in [p for p in ds.cannot_express if p.startswith("tensor parallelism (tp 2)")][0])


def test_a_batch_the_grid_does_not_divide_is_named_with_the_configs_dp() -> None:
    plan = _tp_differ(shares=(0.6, 0.2, 0.2), global_batch=20)  # 12/4/4 sequences; dp 2 x micro-batch 4 = 8
    said = [p for p in export_plan(plan, _graph(), "megatron").cannot_express if "global batch of" in p]
    assert said == ["a global batch of 20 sequences over 2 data-parallel replicas of micro-batch 4 (the config's dp: "
                    "the plan's 4 devices over tp 2 x pp 1; the plan has 3 replicas) (the engines need a multiple of "
                    "8: the config shown does not add up to 20 and is refused or trains on fewer): set the global "
                    "batch to 16 or 24 there"]


def test_replicas_that_fill_no_grid_say_how_many_devices_the_config_runs_on() -> None:
    plan = replace(_tp_differ(shares=(0.5, 0.5), global_batch=8), replicas=_tp_differ().replicas[:2])  # 3 devices
    problems = export_plan(plan, _graph(), "megatron").cannot_express
    assert ("the plan's 3 devices as one grid of 2-device replicas (replica 0's tp 2, pp 1): the engines need a "
            "multiple of 2; the config shown runs 1 data-parallel rank on 2 of them") in problems


def test_alike_replicas_keep_their_count_as_dp_with_per_stage_tp_inside() -> None:
    def replica(node: int) -> Replica:  # a one-GPU stage, then a two-GPU one (6 devices: 3 x tp 1 would be dp 3)
        return Replica(0.5, (Stage((0, 7), (f"{node}/0/0",), 1), Stage((7, 14), (f"{node}/0/1", f"{node}/0/2"), 2)))

    plan = Plan(global_batch=8, micro_batch=2, seq_len=256, replicas=(replica(0), replica(1)))
    titan = tomllib.loads(export_plan(plan, _graph(), "torchtitan").text)
    assert titan["parallelism"]["data_parallel_replicate_degree"] == 2 and titan["training"]["local_batch_size"] == 4


def test_the_cli_prints_no_advice_that_breaks_the_printed_config(capsys, tmp_path) -> None:
    path = _write(tmp_path, _tp_differ(), "gpt2-small", "tiny-mixed")
    code, out, err = run_cli(capsys, "export", str(path), "--to", "megatron")
    assert code == 0, err
    assert "--tensor-model-parallel-size 2 \\\n" in out and "--global-batch-size 32 \\\n" in out
    assert "multiple of 12" not in err and "24 or 36" not in err and "global batch of" not in err


# ----------------------------------------------------------------------------- 5. ZeRO 0 + optimizer offload
def _dp(n: int, **extra) -> Plan:
    devices = ("0/0/0", "0/0/1", "1/0/0", "1/0/1")[:n]
    return Plan(global_batch=4 * n, micro_batch=4, seq_len=256, precision="fp16",
                replicas=tuple(Replica(1 / n, (Stage((0, 14), (d,)),)) for d in devices), **extra)


def test_megatron_offload_gives_what_megatron_core_requires_and_names_zero_0() -> None:
    result = export_plan(_dp(4, zero=0, offload="optimizer"), _graph(), "megatron")
    args = _megatron_args(result.text)
    assert args["--optimizer-cpu-offload"] is True and args["--use-precision-aware-optimizer"] is True
    assert args["--optimizer-offload-fraction"] == "1.0" and args["--use-distributed-optimizer"] is True
    assert ("offload optimizer at ZeRO 0 (every replica keeps the whole optimizer state in host memory): Megatron-LM's "
            "--optimizer-cpu-offload needs --use-precision-aware-optimizer, which needs --use-distributed-optimizer "
            "(ZeRO-1); shown: the distributed optimizer, sharded over the 4 data-parallel ranks, each offloading and "
            "stepping 1/4 of it: less host memory and CPU work per rank than planned") in result.cannot_express
    sharded = export_plan(_dp(4, zero=1, offload="optimizer"), _graph(), "megatron")
    assert sharded.cannot_express == () and _megatron_args(sharded.text)["--use-precision-aware-optimizer"] is True
    one = export_plan(_dp(1, zero=0, offload="optimizer"), _graph(), "megatron")  # ZeRO-1 over one rank: the same
    assert one.cannot_express == ()
    assert any("over one data-parallel rank, which shards nothing: the same state as planned" in n for n in one.notes)


def test_megatron_offload_with_sgd_is_named_not_printed() -> None:
    result = export_plan(_dp(2, zero=1, offload="optimizer", optimizer="sgd"), _graph(), "megatron")
    args = _megatron_args(result.text)
    assert args["--optimizer"] == "sgd" and "--optimizer-cpu-offload" not in args
    assert ("offload optimizer with optimizer sgd: Megatron-LM's --optimizer-cpu-offload needs "
            "--use-precision-aware-optimizer, which Megatron-Core takes with adam only; shown: sgd on the GPU, holding "
            "the optimizer state in device memory, more than planned") in result.cannot_express


def test_deepspeed_offload_at_zero_0_is_written_at_stage_1_and_named() -> None:
    result = export_plan(_dp(4, zero=0, offload="optimizer"), _graph(), "deepspeed")
    zero = result.data["config"]["zero_optimization"]
    assert zero == {"stage": 1, "offload_optimizer": {"device": "cpu", "pin_memory": True}}
    assert json.loads(result.text)["zero_optimization"]["stage"] == 1
    assert ("offload optimizer at ZeRO 0 (every replica keeps the whole optimizer state in host memory): DeepSpeed's "
            "offload_optimizer is valid for ZeRO stages 1-3 only (at stage 0 no ZeRO optimizer runs to offload); "
            "shown: stage 1, the optimizer state sharded over the 4 data-parallel ranks, each offloading and stepping "
            "1/4 of it: less host memory and CPU work per rank than planned") in result.cannot_express
    sgd = json.loads(export_plan(_dp(4, zero=0, offload="optimizer", optimizer="sgd"), _graph(), "deepspeed").text)
    assert sgd["zero_allow_untested_optimizer"] is True  # stage 1 runs SGD only when allowed
    assert export_plan(_dp(1, zero=0, offload="optimizer"), _graph(), "deepspeed").cannot_express == ()


# ------------------------------------------------------------------------------------------- 6. mixed vendors
def test_groups_that_mix_vendors_are_named_on_every_target() -> None:
    cluster = load_cluster("nvidia-amd")  # group 0: A100-80GB (nvidia), group 1: MI250X-GCD-64GB (amd)
    dp = Plan(global_batch=8, micro_batch=4, seq_len=256,
              replicas=(Replica(0.5, (Stage((0, 14), ("0/0/0",)),)), Replica(0.5, (Stage((0, 14), ("1/0/0",)),))))
    for target in ("megatron", "torchtitan", "deepspeed"):
        problems = export_plan(dp, _graph(), target, cluster).cannot_express
        assert ("data-parallel (the gradient all-reduce) groups that mix GPU vendors (amd MI250X-GCD-64GB, nvidia "
                "A100-80GB): each vendor's collective library (NVIDIA's NCCL, AMD's RCCL) connects its own GPUs only, "
                "so no single NCCL/RCCL communicator spans both, while the engines create one backend (nccl) for "
                "every group; run these groups over gloo through host memory, or one vendor per job") in problems
    pipe = Plan(global_batch=8, micro_batch=4, seq_len=256,
                replicas=(Replica(1.0, (Stage((0, 7), ("0/0/0",)), Stage((7, 14), ("1/0/0",)))),))
    said = [p for p in export_plan(pipe, _graph(), "megatron", cluster).cannot_express if "mix GPU vendors" in p]
    assert len(said) == 1 and said[0].startswith("pipeline (the sends between stages) groups that mix GPU vendors")
    nvidia = replace(dp, replicas=(dp.replicas[0], Replica(0.5, (Stage((0, 14), ("0/0/1",)),))))
    assert not [p for p in export_plan(nvidia, _graph(), "megatron", cluster).cannot_express if "vendor" in p]


def test_the_cli_names_mixed_vendors(capsys, tmp_path) -> None:
    plan = Plan(global_batch=8, micro_batch=4, seq_len=256,
                replicas=(Replica(0.5, (Stage((0, 14), ("0/0/0",)),)), Replica(0.5, (Stage((0, 14), ("1/0/0",)),))))
    path = _write(tmp_path, plan, "gpt2-small", "nvidia-amd")
    code, _, err = run_cli(capsys, "export", str(path), "--to", "megatron")
    assert code == 0 and ("hetpart: warning: megatron cannot express data-parallel (the gradient all-reduce) groups "
                          "that mix GPU vendors (amd MI250X-GCD-64GB, nvidia A100-80GB)") in err


# -------------------------------------------------------------------------- 7. torchtitan's older split points
def test_older_split_points_give_a_stage_of_the_head_alone() -> None:
    devices = ("0/0/0", "0/0/1", "1/0/0", "1/0/1")
    splits = ((0, 4), (4, 8), (8, 13), (13, 14))  # the last stage: the head alone
    plan = Plan(global_batch=8, micro_batch=1, seq_len=256, precision="fp16",
                replicas=(Replica(1.0, tuple(Stage(r, (d,)) for r, d in zip(splits, devices))),))
    text = export_plan(plan, _graph(), "torchtitan").text
    config = tomllib.loads(text)
    assert config["parallelism"]["module_fqns_per_model_part"][-1] == ["norm", "output"]
    assert '# older torchtitan: pipeline_parallel_split_points = ["layers.3", "layers.7", "layers.12"]\n' in text
    assert ("# layers.12 is one past the last layer: older torchtitan's pipeline_llama_manual_split keeps a stage's "
            "layers by name, from its split point to the next, so the stage before keeps the layers to the end and the "
            "last stage holds norm and output alone\n") in text
    embedding_alone = replace(plan, replicas=(Replica(1.0, (Stage((0, 1), ("0/0/0",)), Stage((1, 14), ("0/0/1",)))),))
    text = export_plan(embedding_alone, _graph(), "torchtitan").text
    assert '# older torchtitan: pipeline_parallel_split_points = ["layers.0"]\n' in text and "one past" not in text


# ---------------------------------------------------------------------------------------- 9a. python: models
def test_a_python_model_is_refused_for_what_it_is(capsys, tmp_path) -> None:
    graph = load_model("python:tests.fixtures.toy:build")  # embedding, 2 blocks, head
    plan = Plan(global_batch=2, micro_batch=1, seq_len=graph.seq_len, precision="fp16",
                replicas=(Replica(1.0, (Stage((0, graph.num_units), ("0/0/0",)),)),))
    path = _write(tmp_path, plan, "python:tests.fixtures.toy:build", "tiny-mixed")
    code, out, err = run_cli(capsys, "export", str(path), "--to", "torchtitan")
    assert code == 2 and out == "" and "Traceback" not in err and "not a transformer" not in err
    assert ("export: model python:tests.fixtures.toy:build is a python: model, which cannot be exported: Megatron-LM, "
            "torchtitan and DeepSpeed build their own transformer from shape arguments (layers, hidden size, heads, "
            "vocabulary), and a traced module gives hetpart its units, not these; describe the model as a Hugging "
            "Face config.json and plan with that, or run this plan with 'hetpart run'") in err
