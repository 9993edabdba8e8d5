"""Probe s46, findings 2, 7, 10 and 11: `inspect model` shows the activation bytes the planners charge,
model-name suggestions by family, `inspect cluster` refuses unlinked zones as `plan` does, and the tables
and figures print single-unit stages and one replica plainly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetpart import Workload, load_cluster, load_model, plotting
from hetpart._validate import closest_name
from hetpart.catalog.models import MODEL_CATALOG
from hetpart.costmodel.megatron import megatron_plan
from hetpart.costmodel.memory import stage_memory_gb
from hetpart.plan import units_text
from tests._cli import cli_json, run_cli

PHI3 = {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192,
        "num_attention_heads": 32, "num_key_value_heads": 32, "num_hidden_layers": 32, "vocab_size": 32064,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "hidden_act": "silu"}


@pytest.mark.parametrize("attention", ["fused", "eager"])
def test_inspect_model_shows_what_the_memory_model_charges(capsys, tmp_path: Path, attention: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(PHI3))
    data = cli_json(capsys, "inspect", "model", str(path), "--seq-len", "2048", "--attention", attention, "--json")
    assert data["memory_model"] == {"attention": attention, "kernels": "fused", "precision": "bf16"}
    model = load_model(str(path), seq_len=2048)
    for i in (0, 1, model.num_units - 1):
        for mode in ("none", "selective", "full"):
            # one more micro-batch in flight costs the stage exactly the unit's saved bytes
            more = [stage_memory_gb(model, i, i + 1, 1, 1, k, mode, attention=attention, working_set=False)
                    for k in (1, 2)]
            assert data["units"][i]["saved_bytes"][mode] == pytest.approx((more[1] - more[0]) * 1e9, rel=1e-9)
    # the probe's figures for one block and sequence: 201.6 MB fused, 469.8 MB eager (was 503.32M)
    expected = {"fused": 201_588_736, "eager": 469_762_048}[attention]
    assert data["units"][1]["saved_bytes"]["none"] == expected
    code, out, _ = run_cli(capsys, "inspect", "model", str(path), "--seq-len", "2048", "--attention", attention)
    assert code == 0 and f"as plan and predict charge them: {attention} attention" in out.replace("\n", " ")
    assert {"fused": "201.59M/201.59M/12.58M", "eager": "469.76M/201.33M/12.58M"}[attention] in out


def test_inspect_model_refuses_an_unknown_attention_as_plan_does(capsys) -> None:
    code, _, err = run_cli(capsys, "inspect", "model", "gpt2-small", "--attention", "flash")
    assert code == 2 and "--attention: unknown attention kernel 'flash'; use fused, eager" in err


@pytest.mark.parametrize(("typed", "meant"), [("GPT-2", "gpt2-small"), ("gpt2", "gpt2-small"), ("Llama-3", "llama3-8b"),
                                              ("LLaMA2-70B", "llama2-70b"), ("lama2-7b", "llama2-7b"),
                                              ("OPT", "opt-350m"), ("gpt3 13b", "gpt3-13b")])
def test_model_suggestions_follow_the_family(typed: str, meant: str) -> None:
    assert closest_name(typed, MODEL_CATALOG) == meant


def test_unknown_model_line_suggests_gpt2_small(capsys) -> None:
    code, _, err = run_cli(capsys, "inspect", "model", "GPT-2")
    assert code == 2 and "unknown model 'GPT-2'; did you mean 'gpt2-small'?" in err


def test_inspect_cluster_refuses_unlinked_zones_with_plans_line(capsys, tmp_path: Path) -> None:
    path = tmp_path / "nolink.yaml"
    path.write_text("name: x\nnodes:\n"
                    "  - {count: 1, gpus_per_node: 2, gpu: A100-40GB, intra_node: NVLink3, nic: IB-HDR, zone: a}\n"
                    "  - {count: 1, gpus_per_node: 2, gpu: V100-16GB, intra_node: NVLink2, nic: IB-HDR, zone: b}\n")
    code, _, inspect_err = run_cli(capsys, "inspect", "cluster", str(path))
    plan_code, _, plan_err = run_cli(capsys, "plan", "-m", "gpt2-small", "-c", str(path), "--planner", "uniform")
    assert code == plan_code == 2 and inspect_err == plan_err
    assert "links: zones 'a' and 'b' have no link" in inspect_err


def test_single_unit_stages_and_one_replica_read_plainly(capsys, tmp_path: Path) -> None:
    model, cluster = load_model("gpt2-small", seq_len=256), load_cluster("tiny-mixed")
    data = megatron_plan(model, cluster, Workload(8, 256), tp=1, pp=2, dp=1, micro_batch=1).to_dict()
    data["replicas"][0]["stages"][0]["layers"], data["replicas"][0]["stages"][1]["layers"] = [0, 13], [13, 14]
    path, page = tmp_path / "plan.json", tmp_path / "r.html"
    path.write_text(json.dumps(data))
    code, out, _ = run_cli(capsys, "show", str(path), "--html", str(page))
    assert code == 0 and "13 (head)" in out and "0-12 (embedding..block_11)" in out and "13-13" not in out
    html = page.read_text()
    assert "<td>13 (head)</td>" in html and "head..head" not in html
    assert "1 replica," in html and "1 replicas" not in html
    assert units_text((12, 13), model) == "12 (block_11)" and units_text((0, 12)) == "0-11"
    plan = megatron_plan(model, cluster, Workload(8, 256), tp=1, pp=2, dp=1, micro_batch=1)
    title = plotting.cluster_figure(plan, cluster).axes[0].get_title()
    assert "tiny-mixed: 4 devices, 1 replica;" in title
    assert plotting.replicas_text(1) == "1 replica" and plotting.replicas_text(4) == "4 replicas"
