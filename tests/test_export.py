"""``hetpart export``: each target's output uses the engine's documented argument and config names, and
says what of the plan it cannot express.

Names checked against the engines' sources: Megatron-LM ``megatron/training/arguments.py``
(``_add_distributed_args``, ``_add_training_args``), torchtitan ``torchtitan/config/job_config.py``
(``Training``, ``Parallelism``, ``ActivationCheckpoint``), DeepSpeed's config JSON
(``train_batch_size``, ``train_micro_batch_size_per_gpu``, ``gradient_accumulation_steps``,
``zero_optimization.stage``, ``bf16.enabled``) and ``deepspeed.pipe.PipelineModule``.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from hetpart.cluster import load_cluster
from hetpart.errors import PlanError
from hetpart.export import _ds_partition_uniform, export_plan
from hetpart.graph import load_model
from hetpart.plan import Plan, Replica, Stage
from tests._cli import run_cli

MEGATRON_ARGS = {"--swiglu", "--normalization", "--disable-bias-linear", "--position-embedding-type",
                 "--untie-embeddings-and-output-weights", "--attention-dropout", "--hidden-dropout",
                 "--tensor-model-parallel-size", "--pipeline-model-parallel-size",
                 "--num-layers-per-virtual-pipeline-stage", "--decoder-first-pipeline-num-layers",
                 "--decoder-last-pipeline-num-layers", "--pipeline-model-parallel-layout", "--micro-batch-size",
                 "--global-batch-size", "--seq-length", "--num-layers", "--hidden-size", "--num-attention-heads",
                 "--ffn-hidden-size", "--max-position-embeddings", "--recompute-granularity", "--recompute-method",
                 "--recompute-num-layers", "--bf16", "--fp16", "--group-query-attention", "--num-query-groups",
                 "--use-distributed-optimizer"}
TITAN_KEYS = {"training": {"local_batch_size", "global_batch_size", "seq_len", "mixed_precision_param"},
              "parallelism": {"data_parallel_replicate_degree", "data_parallel_shard_degree", "tensor_parallel_degree",
                              "pipeline_parallel_degree", "pipeline_parallel_schedule",
                              "pipeline_parallel_microbatch_size", "module_fqns_per_model_part"},
              "activation_checkpoint": {"mode"}}
DS_KEYS = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "zero_optimization",
           "bf16", "fp16"}


tomllib = pytest.importorskip("tomllib")  # Python 3.11+


def _graph():
    return load_model("gpt2-small", seq_len=256)  # embedding, 12 blocks, head: 14 units


def _plan(splits, tp=1, shares=(0.5, 0.5), schedule="1f1b", interleave=1, recompute="selective", precision="bf16"):
    """Replicas of a pipeline on node 0 (replica 0) and node 1 (replica 1) of a2x4."""
    replicas = []
    for r, share in enumerate(shares):
        pp = len(splits) // interleave
        groups = [tuple(f"{r}/0/{k * tp + t}" for t in range(tp)) for k in range(pp)]
        stages = tuple(Stage(rng, groups[k % pp], tp) for k, rng in enumerate(splits))
        replicas.append(Replica(share, stages))
    return Plan(global_batch=16, micro_batch=2, seq_len=256, replicas=tuple(replicas), schedule=schedule,
                recompute=recompute, interleave=interleave, precision=precision)


def _megatron_args(text: str) -> dict[str, str | bool]:
    out: dict[str, str | bool] = {}
    for line in text.replace("\\\n", "\n").splitlines():
        name, _, value = line.strip().partition(" ")
        out[name] = value or True
    return out


def test_megatron_uses_its_documented_arguments() -> None:
    even = export_plan(_plan([(0, 7), (7, 14)]), _graph(), "megatron")
    args = _megatron_args(even.text)
    assert set(args) <= MEGATRON_ARGS
    assert args["--tensor-model-parallel-size"] == "1" and args["--pipeline-model-parallel-size"] == "2"
    assert args["--micro-batch-size"] == "2" and args["--global-batch-size"] == "16" and args["--seq-length"] == "256"
    assert args["--recompute-granularity"] == "selective" and args["--bf16"] is True
    assert not even.cannot_express and "start rank r on device r of [0/0/0,1/0/0,0/0/1,1/0/1]" in even.notes[0]
    # 2 + 4 + 4 + 2 decoder layers: first/last differ, the middle is even
    ends = _megatron_args(export_plan(_plan([(0, 3), (3, 7), (7, 11), (11, 14)]), _graph(), "megatron").text)
    assert ends["--decoder-first-pipeline-num-layers"] == "2" and ends["--decoder-last-pipeline-num-layers"] == "2"
    # 3 + 6 + 3 layers over... an uneven middle needs the general layout
    layout = _megatron_args(export_plan(_plan([(0, 2), (2, 5), (5, 11), (11, 14)]), _graph(), "megatron").text)
    assert layout["--pipeline-model-parallel-layout"] == '"Et|ttt|tttttt|ttL"'
    vpp = _megatron_args(export_plan(_plan([(0, 4), (4, 7), (7, 10), (10, 14)], schedule="interleaved", interleave=2),
                                     _graph(), "megatron").text)
    assert vpp["--num-layers-per-virtual-pipeline-stage"] == "3" and vpp["--pipeline-model-parallel-size"] == "2"


def test_megatron_names_what_it_cannot_express() -> None:
    uneven = export_plan(_plan([(0, 7), (7, 14)], shares=(0.75, 0.25)), _graph(), "megatron")
    assert any(p.startswith("uneven data-parallel replicas (batch shares 0.750, 0.250)") for p in uneven.cannot_express)
    plan = _plan([(0, 7), (7, 14)], tp=2)
    mixed = Plan(global_batch=16, micro_batch=2, seq_len=256, replicas=(Replica(1.0, (
        Stage((0, 7), ("0/0/0", "0/0/1"), 2), Stage((7, 14), ("0/0/2",), 1))),), recompute="full")
    result = export_plan(mixed, _graph(), "megatron")
    assert any(p.startswith("per-stage tensor parallelism (tp 1, 2)") for p in result.cannot_express)
    assert _megatron_args(result.text)["--recompute-granularity"] == "full"
    assert export_plan(plan, _graph(), "megatron").cannot_express == ()


def test_megatron_builds_the_model_the_plan_was_made_for() -> None:
    """A Llama exported as its sizes alone built a GPT-2-style model (GELU, LayerNorm, biases, learned positions,
    tied embeddings) of other parameters and FLOPs; an encoder or a ReLU model is named as not expressed."""
    llama = load_model("llama3-8b", seq_len=256)
    plan = Plan(global_batch=16, micro_batch=2, seq_len=256, recompute="selective",
                replicas=(Replica(1.0, (Stage((0, llama.num_units), ("0/0/0",), 1),)),))
    result = export_plan(plan, llama, "megatron")
    args = _megatron_args(result.text)
    assert set(args) <= MEGATRON_ARGS
    assert args["--swiglu"] is True and args["--normalization"] == "RMSNorm" and args["--disable-bias-linear"] is True
    assert args["--position-embedding-type"] == "rope" and args["--untie-embeddings-and-output-weights"] is True
    assert args["--num-query-groups"] == "8" and args["--ffn-hidden-size"] == "14336"
    assert "--swiglu" not in _megatron_args(export_plan(_plan([(0, 7), (7, 14)]), _graph(), "megatron").text)
    for name, what in (("bert-large", "an encoder (BERT"), ("opt-350m", "ReLU activation (OPT)")):
        graph = load_model(name, seq_len=256)
        other = Plan(global_batch=16, micro_batch=2, seq_len=256, recompute="selective",
                     replicas=(Replica(1.0, (Stage((0, graph.num_units), ("0/0/0",), 1),)),))
        assert any(p.startswith(what) for p in export_plan(other, graph, "megatron").cannot_express), name


def test_torchtitan_uses_its_documented_config_keys() -> None:
    result = export_plan(_plan([(0, 5), (5, 14)], recompute="full"), _graph(), "torchtitan")
    config = tomllib.loads(result.text)
    for section, keys in config.items():
        assert set(keys) <= TITAN_KEYS[section], section
    par = config["parallelism"]
    assert par["pipeline_parallel_degree"] == 2 and par["data_parallel_replicate_degree"] == 2
    assert par["pipeline_parallel_schedule"] == "1F1B" and par["tensor_parallel_degree"] == 1
    assert par["module_fqns_per_model_part"][0] == ["tok_embeddings", "layers.0", "layers.1", "layers.2", "layers.3"]
    assert par["module_fqns_per_model_part"][1][-2:] == ["norm", "output"]
    assert config["training"] == {"local_batch_size": 8, "global_batch_size": 16, "seq_len": 256,
                                  "mixed_precision_param": "bfloat16"}
    assert config["activation_checkpoint"] == {"mode": "full"}
    assert 'pipeline_parallel_split_points = ["layers.4"]' in result.text
    fp16 = export_plan(_plan([(0, 5), (5, 14)], precision="fp16", shares=(0.75, 0.25)), _graph(), "torchtitan")
    assert len(fp16.cannot_express) == 2 and "precision fp16" in fp16.cannot_express[1]


def test_deepspeed_uses_its_documented_config_and_partition_methods() -> None:
    uniform = [(0, 7), (7, 14)]  # deepspeed's partition_uniform(14, 2) = [0, 7, 14]
    result = export_plan(_plan(uniform, recompute="full"), _graph(), "deepspeed")
    config = json.loads(result.text)
    assert set(config) <= DS_KEYS
    assert config == {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
                      "zero_optimization": {"stage": 0}, "bf16": {"enabled": True}}
    assert result.data["pipeline_module"] == {"num_stages": 2, "partition_method": "uniform",
                                              "activation_checkpoint_interval": 1}
    assert result.cannot_express == ()
    custom = export_plan(_plan([(0, 3), (3, 14)], tp=2), _graph(), "deepspeed")
    assert any("layer boundaries [0, 3, 14]" in p and "partition_method takes uniform, parameters or type:REGEX" in p
               for p in custom.cannot_express)
    assert any(p.startswith("tensor parallelism (tp 2)") for p in custom.cannot_express)
    assert any(p.startswith("selective recomputation") for p in custom.cannot_express)


def test_deepspeed_uniform_partition_matches_its_definition() -> None:
    assert _ds_partition_uniform(14, 4) == [0, 4, 8, 11, 14]
    assert _ds_partition_uniform(3, 4) == [0, 1, 2, 3, 3]


def test_export_cli(capsys, tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    code, _, err = run_cli(capsys, "plan", "-m", "gpt2-small", "-c", "tiny-mixed", "--global-batch", "8",
                           "--seq-len", "256", "--out", str(plan))
    assert code == 0, err
    code, out, err = run_cli(capsys, "export", str(plan), "--to", "megatron", "--out", str(tmp_path / "args.txt"))
    assert code == 0 and "--tensor-model-parallel-size" in out and "--pipeline-model-parallel-size" in out
    assert (tmp_path / "args.txt").read_text().startswith("--tensor-model-parallel-size")
    code, out, err = run_cli(capsys, "export", str(plan), "--to", "deepspeed", "--json")
    assert code == 0 and json.loads(out)["target"] == "deepspeed"
    code, out, err = run_cli(capsys, "export", str(plan), "--to", "fairscale")
    assert code == 2 and "--to: unknown target 'fairscale'; use one of megatron, torchtitan, deepspeed" in err


def test_export_checks_the_plan_against_its_model_and_cluster_as_predict_does(capsys, tmp_path: Path) -> None:
    """An impossible plan (overlapping layers, a device the cluster lacks) has no launch arguments: exit 2, one
    line naming the file and the field, one JSON object under --json."""
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({
        "global_batch": 8, "micro_batch": 2, "seq_len": 128, "precision": "fp16",
        "meta": {"model": "gpt2-small", "cluster": "tiny-mixed"},
        "replicas": [{"batch_share": 0.5, "stages": [{"layers": [0, 7], "devices": ["5/0/0"], "tp": 1},
                                                     {"layers": [6, 14], "devices": ["1/0/0"], "tp": 1}]},
                     {"batch_share": 0.5, "stages": [{"layers": [0, 7], "devices": ["0/0/1"], "tp": 1},
                                                     {"layers": [7, 14], "devices": ["1/0/1"], "tp": 1}]}]}))
    for target in ("megatron", "torchtitan", "deepspeed"):
        code, out, err = run_cli(capsys, "export", str(bad), "--to", target, "--json")
        assert code == 2 and err.count("\n") == 1
        assert f"{bad}: replicas[0].stages[1].layers: starts at 6, expected 7 (overlaps the previous stage)" in err
        assert "'5/0/0' does not exist in cluster 'tiny-mixed'" in json.loads(out)["error"]
    # A plan that does not name its cluster is checked against --cluster, as predict's is.
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"global_batch": 8, "micro_batch": 2, "seq_len": 128, "precision": "fp16",
                                "meta": {"model": "gpt2-small"},
                                "replicas": [{"batch_share": 1.0, "stages": [
                                    {"layers": [0, 7], "devices": ["0/0/0"], "tp": 1},
                                    {"layers": [7, 14], "devices": ["1/0/0"], "tp": 1}]}]}))
    code, _, err = run_cli(capsys, "export", str(bare), "--to", "megatron")
    assert code == 2 and "--cluster missing and the plan does not record it; give --cluster" in err
    code, out, err = run_cli(capsys, "export", str(bare), "--to", "megatron", "--cluster", "tiny-mixed")
    assert code == 0 and "--pipeline-model-parallel-size 2" in out, err
    code, _, err = run_cli(capsys, "export", str(bare), "--to", "megatron", "--cluster", "a100-8")
    assert code == 2 and f"{bare}: replicas[0].stages[1].devices: '1/0/0' does not exist in cluster 'a100-8'" in err


def test_export_refuses_a_model_without_transformer_layers() -> None:
    graph = load_model("python:tests.fixtures.toy:build")
    plan = Plan(global_batch=4, micro_batch=1, seq_len=graph.seq_len,
                replicas=(Replica(1.0, (Stage((0, graph.num_units), ("0/0/0",)),)),))
    with pytest.raises(PlanError, match=r"export: model python:tests.fixtures.toy:build is a python: model, which "
                                        r"cannot be exported"):
        export_plan(plan, graph, "megatron")
    assert load_cluster("tiny-mixed").num_devices == 4


def test_a_batch_the_replicas_do_not_divide_is_named_with_the_nearest_that_work() -> None:
    """Three replicas of micro-batch 2 and 16 sequences (shares 6:6:4): every engine's global batch is dp x micro-batch
    x accumulation steps, so no config adds up to 16; each target says so with the nearest batches that do (a probe
    found 6 replicas of 64 exported silently as torchtitan 6 x 10 = 60, DeepSpeed 48)."""
    plan = replace(_plan([(0, 14)], shares=(0.375, 0.375, 0.25)), replicas=tuple(
        Replica(share, (Stage((0, 14), (f"{r // 2}/0/{r % 2}",), 1),)) for r, share in enumerate((0.375, 0.375, 0.25))))
    for target in ("megatron", "torchtitan", "deepspeed"):
        said = [p for p in export_plan(plan, _graph(), target).cannot_express if "global batch of 16" in p]
        assert len(said) == 1 and "multiple of 6" in said[0] and "set the global batch to 12 or 18" in said[0], target
    even = _plan([(0, 14)])  # 2 replicas x micro-batch 2 divide 16
    assert not any("global batch of" in p for p in export_plan(even, _graph(), "megatron").cannot_express)
