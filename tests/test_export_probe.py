"""``hetpart export``: what a probe found dropped or mis-stated, pinned.

* hybrid sharding (``shard_group``) and uneven ``shard_fractions``: torchtitan's HSDP degrees, Megatron-LM's
  ``--num-distributed-optimizer-instances``, DeepSpeed's MiCS ``mics_shard_size`` (ZeRO-3 only), uneven shards
  named everywhere;
* torchtitan's ``local_batch_size`` (samples per forward; ``global / (local x dp)`` accumulation steps): the
  plan's micro-batch without a pipeline;
* a Megatron-LM stage without decoder layers (embedding or head alone): the layout, never ``... 0``;
* GPipe on Megatron-LM named;
* ``--strict --out``: a refused export writes nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetpart.export import export_plan
from hetpart.graph import load_model
from hetpart.plan import Plan, Replica, Stage
from tests._cli import run_cli
from tests.test_export import _megatron_args

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

DEVICES = ("0/0/0", "0/0/1", "1/0/0", "1/0/1")  # tiny-mixed


def _graph():
    return load_model("gpt2-small", seq_len=256)  # embedding, 12 blocks, head: 14 units


def _dp4(zero=3, shard_group=0, shard_fractions=None) -> Plan:
    """Four one-device replicas of the whole model, micro-batch 4 of a global 16 (one micro-batch each)."""
    replicas = tuple(Replica(0.25, (Stage((0, 14), (d,)),)) for d in DEVICES)
    return Plan(global_batch=16, micro_batch=4, seq_len=256, replicas=replicas, precision="bf16", zero=zero,
                shard_group=shard_group, shard_fractions=shard_fractions)


def _pipeline(splits, schedule="1f1b", global_batch=16, micro_batch=4) -> Plan:
    stages = tuple(Stage(rng, (DEVICES[k],)) for k, rng in enumerate(splits))
    return Plan(global_batch=global_batch, micro_batch=micro_batch, seq_len=256, replicas=(Replica(1.0, stages),),
                schedule=schedule, precision="fp16")


# ------------------------------------------------------------------------------------------ hybrid sharding
def test_torchtitan_expresses_hybrid_sharding_as_replicate_and_shard_degrees() -> None:
    result = export_plan(_dp4(zero=3, shard_group=2), _graph(), "torchtitan")
    par = tomllib.loads(result.text)["parallelism"]
    assert par["data_parallel_replicate_degree"] == 2 and par["data_parallel_shard_degree"] == 2
    assert result.data["parallelism"]["data_parallel_shard_degree"] == 2
    assert result.cannot_express == ()
    full = tomllib.loads(export_plan(_dp4(zero=3), _graph(), "torchtitan").text)["parallelism"]
    assert full["data_parallel_replicate_degree"] == 1 and full["data_parallel_shard_degree"] == 4


def test_megatron_expresses_hybrid_sharding_as_distributed_optimizer_instances() -> None:
    result = export_plan(_dp4(zero=1, shard_group=2), _graph(), "megatron")
    args = _megatron_args(result.text)
    assert args["--use-distributed-optimizer"] is True and args["--num-distributed-optimizer-instances"] == "2"
    assert result.cannot_express == ()
    zero3 = export_plan(_dp4(zero=3, shard_group=2), _graph(), "megatron")
    assert _megatron_args(zero3.text)["--num-distributed-optimizer-instances"] == "2"
    assert len(zero3.cannot_express) == 1 and zero3.cannot_express[0].startswith("ZeRO stage 3: Megatron-LM's")
    plain = _megatron_args(export_plan(_dp4(zero=1), _graph(), "megatron").text)
    assert "--num-distributed-optimizer-instances" not in plain


def test_deepspeed_expresses_zero3_hybrid_sharding_with_mics_and_names_it_below_stage_3() -> None:
    result = export_plan(_dp4(zero=3, shard_group=2), _graph(), "deepspeed")
    config = json.loads(result.text)
    assert config["zero_optimization"] == {"stage": 3, "mics_shard_size": 2}
    assert result.cannot_express == ()
    assert any("deepspeed.zero.MiCS_Init" in n for n in result.notes)
    zero1 = export_plan(_dp4(zero=1, shard_group=2), _graph(), "deepspeed")
    assert json.loads(zero1.text)["zero_optimization"] == {"stage": 1}
    assert zero1.cannot_express == (
        "hybrid sharding (shard_group 2: ZeRO-1 states sharded inside groups of 2 replicas, replicated across the 2 "
        "groups): DeepSpeed's hierarchical sharding (MiCS, mics_shard_size) is ZeRO-3 only; shown: stage 1 over "
        "all 4 data-parallel ranks",)
    plain = json.loads(export_plan(_dp4(zero=3), _graph(), "deepspeed").text)
    assert plain["zero_optimization"] == {"stage": 3}


@pytest.mark.parametrize("target", ["megatron", "torchtitan", "deepspeed"])
def test_uneven_shard_fractions_are_named_by_every_target(target: str) -> None:
    result = export_plan(_dp4(zero=1, shard_fractions=(0.35, 0.35, 0.15, 0.15)), _graph(), target)
    uneven = [p for p in result.cannot_express if p.startswith("uneven shards (shard_fractions 0.350 x2, 0.150 x2)")]
    assert len(uneven) == 1 and "shown: even shards" in uneven[0]
    even = export_plan(_dp4(zero=1, shard_fractions=(0.25, 0.25, 0.25, 0.25)), _graph(), target)
    assert not any(p.startswith("uneven shards") for p in even.cannot_express)


# ------------------------------------------------------------------------------------------ torchtitan batches
def test_torchtitan_local_batch_is_the_micro_batch_without_a_pipeline() -> None:
    """torchtitan runs local_batch_size samples per forward and accumulates global / (local x dp) of them."""
    result = export_plan(_dp4(zero=3), _graph(), "torchtitan")
    training = tomllib.loads(result.text)["training"]
    assert training["local_batch_size"] == 4 and training["global_batch_size"] == 16  # 16 / (4 x 4): 1 step
    one = export_plan(_pipeline([(0, 14)], global_batch=16, micro_batch=2), _graph(), "torchtitan")
    assert tomllib.loads(one.text)["training"]["local_batch_size"] == 2  # 8 accumulation steps of 2
    # A pipeline splits the local batch into pipeline_parallel_microbatch_size micro-batches: all of a replica's.
    piped = tomllib.loads(export_plan(_pipeline([(0, 7), (7, 14)], micro_batch=2), _graph(), "torchtitan").text)
    assert piped["training"]["local_batch_size"] == 16
    assert piped["parallelism"]["pipeline_parallel_microbatch_size"] == 2
    # GPipe without a pipeline holds every micro-batch's activations at once: one forward of them all.
    gpipe = export_plan(_pipeline([(0, 14)], schedule="gpipe", micro_batch=2), _graph(), "torchtitan")
    assert tomllib.loads(gpipe.text)["training"]["local_batch_size"] == 16


# ------------------------------------------------------------------------------------------ Megatron-LM
def test_megatron_takes_the_layout_for_an_embedding_or_head_alone_on_its_stage() -> None:
    alone = export_plan(_pipeline([(0, 1), (1, 14)]), _graph(), "megatron")
    args = _megatron_args(alone.text)
    assert args["--pipeline-model-parallel-layout"] == '"E|ttttttttttttL"'
    assert "--decoder-first-pipeline-num-layers" not in args and "--decoder-last-pipeline-num-layers" not in args
    assert alone.cannot_express == ()
    head = _megatron_args(export_plan(_pipeline([(0, 13), (13, 14)]), _graph(), "megatron").text)
    assert head["--pipeline-model-parallel-layout"] == '"Etttttttttttt|L"'
    assert "--decoder-first-pipeline-num-layers" not in head and "--decoder-last-pipeline-num-layers" not in head
    # both ends empty around an even middle
    ends = _megatron_args(export_plan(_pipeline([(0, 1), (1, 7), (7, 13), (13, 14)]), _graph(), "megatron").text)
    assert ends["--pipeline-model-parallel-layout"] == '"E|tttttt|tttttt|L"'
    # ends with layers keep the simpler arguments
    some = _megatron_args(export_plan(_pipeline([(0, 3), (3, 14)]), _graph(), "megatron").text)
    assert some["--decoder-first-pipeline-num-layers"] == "2" and some["--decoder-last-pipeline-num-layers"] == "10"


def test_megatron_names_gpipe() -> None:
    result = export_plan(_pipeline([(0, 7), (7, 14)], schedule="gpipe"), _graph(), "megatron")
    assert len(result.cannot_express) == 1
    assert result.cannot_express[0].startswith("schedule gpipe (every forward before any backward")
    assert "shown: 1F1B" in result.cannot_express[0]
    assert export_plan(_pipeline([(0, 7), (7, 14)]), _graph(), "megatron").cannot_express == ()


# ------------------------------------------------------------------------------------------ the CLI
def _plan_file(tmp_path: Path, schedule: str) -> Path:
    path = tmp_path / f"{schedule}.json"
    path.write_text(json.dumps({
        "global_batch": 16, "micro_batch": 4, "seq_len": 256, "schedule": schedule, "precision": "fp16",
        "meta": {"model": "gpt2-small", "cluster": "tiny-mixed"},
        "replicas": [{"batch_share": 1.0, "stages": [{"layers": [0, 7], "devices": ["0/0/0"], "tp": 1},
                                                     {"layers": [7, 14], "devices": ["0/0/1"], "tp": 1}]}]}))
    return path


def test_strict_refusal_writes_no_out_file(capsys, tmp_path: Path) -> None:
    out = tmp_path / "args.txt"
    code, stdout, err = run_cli(capsys, "export", str(_plan_file(tmp_path, "gpipe")), "--to", "megatron",
                                "--strict", "--out", str(out))
    assert code == 2 and "--strict: megatron cannot express: schedule gpipe" in err
    assert not out.exists() and stdout == ""
    code, stdout, err = run_cli(capsys, "export", str(_plan_file(tmp_path, "1f1b")), "--to", "megatron",
                                "--strict", "--out", str(out))
    assert code == 0, err
    assert out.read_text().startswith("--tensor-model-parallel-size 1")
