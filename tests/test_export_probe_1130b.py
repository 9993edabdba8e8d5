"""``hetpart export``: the s46 probe's findings (2026-11-30), pinned.

* a plan whose stages differ in TP width: the config shown is one grid of the engine (tp x pp x dp = the ranks
  it launches, torchtitan's degrees and DeepSpeed's accumulation steps from the same dp), and the warning says
  how many ranks that grid launches on how many of the plan's devices (the probe: tp 1 x pp 3 x dp 8 on 32
  devices, 24 ranks, with no word of the 8 left over);
* the rank note says what keeps the plan off one grid: its stages' TP widths, or its replicas' depths or widths
  (the probe: "replicas differ" for a plan of one replica);
* ``--json`` gives Megatron-LM's layout as the bare string; the shell quotes belong to the command text alone.
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


def _graph():
    return load_model("gpt2-small", seq_len=256)  # embedding, 12 blocks, head: 14 units


def _narrow_then_wide(node: int, share: float = 1.0) -> Replica:
    """A one-GPU stage, then a two-GPU one (tp 1, tp 2): three devices of node ``node``."""
    return Replica(share, (Stage((0, 7), (f"{node}/0/0",), 1), Stage((7, 14), (f"{node}/0/1", f"{node}/0/2"), 2)))


def _write(tmp_path: Path, plan: Plan) -> Path:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan.to_dict() | {"meta": {"model": "gpt2-small", "cluster": "tiny-mixed"}}))
    return path


def _said(problems, start: str) -> str:
    found = [p for p in problems if p.startswith(start)]
    assert len(found) == 1, problems
    return found[0]


# ------------------------------------------------------------------------ 5. degrees that add up to a grid
def test_alike_replicas_with_per_stage_tp_export_one_grid_and_say_its_ranks() -> None:
    plan = Plan(global_batch=8, micro_batch=2, seq_len=256, replicas=(_narrow_then_wide(0, 0.5),
                                                                     _narrow_then_wide(1, 0.5)))
    titan = export_plan(plan, _graph(), "torchtitan")
    par = tomllib.loads(titan.text)["parallelism"]
    ranks = (par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"]
             * par["tensor_parallel_degree"] * par["pipeline_parallel_degree"])
    assert ranks == 4 and par["data_parallel_replicate_degree"] == 2  # tp 1 x pp 2 x dp 2, not the plan's 6
    said = ("per-stage tensor parallelism (tp 1, 2): one TP degree for all stages there; shown: tp 1 on every stage "
            "(the plan: tp 1, 2 in each of its 2 replicas), a grid of tp 1 x pp 2 x dp 2 = 4 ranks, which launches 4 "
            "ranks on the plan's 6 devices and leaves 2 of them idle (the tensor-parallel ranks its stages wider "
            "than tp 1 add); a plan of one TP degree (hetpart plan --planner uniform) exports as a grid of all its "
            "devices")
    assert _said(titan.cannot_express, "per-stage tensor parallelism") == said
    megatron = export_plan(plan, _graph(), "megatron")
    args = _megatron_args(megatron.text)
    assert args["--tensor-model-parallel-size"] == "1" and args["--pipeline-model-parallel-size"] == "2"
    assert said in megatron.cannot_express
    deepspeed = export_plan(plan, _graph(), "deepspeed")
    config = deepspeed.data["config"]
    assert config["gradient_accumulation_steps"] == 2  # 8 = micro-batch 2 x 2 steps x the grid's dp 2
    assert config["train_batch_size"] == config["train_micro_batch_size_per_gpu"] * 2 * 2
    assert said in deepspeed.cannot_express


def test_a_wider_first_stage_says_the_grid_needs_more_devices_than_the_plan_has() -> None:
    wide_first = Replica(1.0, (Stage((0, 7), ("0/0/0", "0/0/1"), 2), Stage((7, 14), ("0/0/2",), 1)))
    plan = Plan(global_batch=8, micro_batch=2, seq_len=256, replicas=(wide_first,))
    said = _said(export_plan(plan, _graph(), "megatron").cannot_express, "per-stage tensor parallelism")
    assert said.endswith("shown: tp 2 on every stage (the plan: tp 2, 1 in its one replica), a grid of tp 2 x pp 2 "
                         "x dp 1 = 4 ranks, which launches 4 ranks, 1 more than the plan's 3 devices (its stages "
                         "narrower than tp 2 run at tp 2 there); a plan of one TP degree (hetpart plan --planner "
                         "uniform) exports as a grid of all its devices")


def test_replicas_of_one_tp_degree_name_no_grid_count() -> None:
    plan = Plan(global_batch=8, micro_batch=2, seq_len=256, replicas=(
        Replica(0.5, (Stage((0, 14), ("0/0/0", "0/0/1"), 2),)), Replica(0.5, (Stage((0, 14), ("1/0/0", "1/0/1"), 2),))))
    result = export_plan(plan, _graph(), "megatron")
    assert not [p for p in result.cannot_express if "grid" in p or "tensor parallelism" in p]
    assert result.notes[0].endswith("start rank r on device r of [0/0/0-1,1/0/0-1] (hetpart ids group/node/gpu)")


# ------------------------------------------------------------------- 6. the rank note names what differs
def test_the_rank_note_of_one_replica_names_its_stages_tp_widths() -> None:
    plan = Plan(global_batch=8, micro_batch=2, seq_len=256, replicas=(_narrow_then_wide(0),))
    note = export_plan(plan, _graph(), "megatron").notes[0]
    assert note == ("Megatron-LM places ranks on one grid of equal replicas with one TP degree on every stage; this "
                    "plan's stages differ in tensor-parallel width (tp 1, 2), so no rank order runs it as planned: "
                    "place each rank by hand (hetpart show --full lists every stage's devices)")
    assert "replicas differ" not in note
    two = Plan(global_batch=8, micro_batch=2, seq_len=256, replicas=(_narrow_then_wide(0, 0.5),
                                                                    _narrow_then_wide(1, 0.5)))
    assert ("this plan's stages differ in tensor-parallel width (tp 1, 2 in each of its 2 replicas)"
            in export_plan(two, _graph(), "torchtitan").notes[0])


def test_the_rank_note_of_replicas_of_other_widths_counts_them() -> None:
    plan = Plan(global_batch=32, micro_batch=4, seq_len=256, replicas=(
        Replica(0.5, (Stage((0, 14), ("0/0/0", "0/0/1"), 2),)), Replica(0.25, (Stage((0, 14), ("1/0/0",), 1),)),
        Replica(0.25, (Stage((0, 14), ("1/0/1",), 1),))))
    note = export_plan(plan, _graph(), "megatron").notes[0]
    assert "this plan's replicas differ in tensor-parallel width (tp 2 in 1 replica; tp 1 in 2 replicas)" in note


def test_the_cli_warns_of_the_grid_and_names_the_stages(capsys, tmp_path) -> None:
    plan = Plan(global_batch=8, micro_batch=2, seq_len=256, precision="fp16", replicas=(
        Replica(1.0, (Stage((0, 7), ("1/0/0",), 1), Stage((7, 14), ("0/0/0", "0/0/1"), 2))),))
    code, out, err = run_cli(capsys, "export", str(_write(tmp_path, plan)), "--to", "megatron")
    assert code == 0, err
    assert "--tensor-model-parallel-size 1 \\\n--pipeline-model-parallel-size 2 \\\n" in out
    assert "this plan's stages differ in tensor-parallel width (tp 1, 2), so no rank order" in out
    assert ("a grid of tp 1 x pp 2 x dp 1 = 2 ranks, which launches 2 ranks on the plan's 3 devices and leaves 1 of "
            "them idle") in err


# ------------------------------------------------------------------------------ 11. --json's layout value
def test_json_gives_the_layout_bare_and_the_command_text_quotes_it(capsys, tmp_path) -> None:
    plan = Plan(global_batch=8, micro_batch=2, seq_len=256, precision="fp16", replicas=(
        Replica(1.0, (Stage((0, 1), ("0/0/0",)), Stage((1, 14), ("0/0/1",)))),))  # the embedding alone first
    result = export_plan(plan, _graph(), "megatron")
    assert result.data["--pipeline-model-parallel-layout"] == "E|ttttttttttttL"
    assert '--pipeline-model-parallel-layout "E|ttttttttttttL" \\\n' in result.text
    code, out, err = run_cli(capsys, "export", str(_write(tmp_path, plan)), "--to", "megatron", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["data"]["--pipeline-model-parallel-layout"] == "E|ttttttttttttL"
    assert '--pipeline-model-parallel-layout "E|ttttttttttttL"' in data["text"]
