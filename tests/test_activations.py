"""Saved activations: the measured kernel set reproduces the runtime's measured bytes, the fused set is
Korthikanti's accounting for fused kernels, and the memory model counts them."""

import json
from pathlib import Path

import pytest

from hetpart import load_model
from hetpart.costmodel.activations import TORCH_BLOCK, TORCH_HEAD, unit_kept_bytes, unit_saved_bytes
from hetpart.graph.model_graph import ModelGraph
from hetpart.graph.transformer import transformer_graph

DATA = Path(__file__).resolve().parents[1] / "experiments" / "data" / "activation_bytes.json"


@pytest.fixture(scope="module")
def data():
    return json.loads(DATA.read_text())


def _graph(row: dict) -> ModelGraph:
    from hetpart.experiments.measure_activations import _config

    from dataclasses import replace

    cfg = _config(row["family"], row["h"], row["heads"], row["kv"] // (row["h"] // row["heads"]), row["f"], row["seq"])
    if row["family"] == "gpt":  # hetpart's own GPT block: what the runtime runs OPT and BERT shapes with
        cfg = replace(cfg, family="opt")
    return transformer_graph(cfg, "measured", row["seq"], 4 if row["precision"] == "fp32" else 2)


def test_stored_fit_reproduces_every_measurement_and_the_costmodel_carries_it(data):
    from hetpart.experiments.measure_activations import fit

    refit = fit(data["rows"])
    assert len(refit) == 36 and all(g["max_rel_residual"] < 1e-3 and g["shapes"] >= 10 for g in refit.values())
    for name, g in refit.items():
        unit, family, prec, att, rc = name.split("/")
        coef = {k: v for k, v in g["per_token"].items() if abs(v) > 1e-3}
        if unit == "head":
            got = TORCH_HEAD[(family, prec)]
        elif rc == "full":
            got = {"h": 4 if prec == "fp32" else 2}
        else:
            got = {("d" if k == "d/b" else k): v for k, v in TORCH_BLOCK[(family, prec, att, rc)].items()}
            coef = {("d" if k == "d/b" else k): v for k, v in coef.items()}
        assert coef.keys() == got.keys(), name
        assert all(coef[k] == pytest.approx(got[k], abs=0.1) for k in got), name


def test_torch_kernels_predict_each_measured_unit(data):
    """The memory model's per-unit bytes (per sequence, times the micro-batch) are the measured ones; the
    rotary tables, shared by a micro-batch, are counted per sequence (a few bytes over for b > 1)."""
    for row in data["rows"]:
        graph = _graph(row)
        index = 1 if row["unit"] == "block" else graph.num_units - 1
        att = "fused" if row["attention"] == "sdpa" else "eager"
        got = unit_saved_bytes(graph, row["recompute"], att, "torch")[index] * row["micro_batch"]
        over = (row["micro_batch"] - 1) * 8 * row["d"] * row["seq"]  # rotary tables counted per sequence
        assert row["saved_bytes"] - 64 <= got <= row["saved_bytes"] + over + 64, row


def test_a_fresh_measurement_matches_the_stored_one(data):
    from hetpart.experiments.measure_activations import measure_unit

    stored = next(r for r in data["rows"] if (r["family"], r["precision"], r["attention"], r["recompute"], r["unit"])
                  == ("llama", "bf16", "sdpa", "none", "block"))
    shape = (stored["h"], stored["heads"], stored["kv"] // stored["d"], stored["f"], stored["seq"], stored["micro_batch"])
    assert measure_unit("llama", "bf16", "sdpa", "none", shape)["saved_bytes"] == stored["saved_bytes"]


def test_fused_kernels_count_megatron_llama_and_korthikanti_gpt():
    s = 256
    llama = load_model("llama3-8b", seq_len=s)
    cfg = llama.config
    h, kv, f, a = cfg.hidden_size, cfg.kv_dim, cfg.ffn, cfg.num_heads
    # fused norm+linear keeps norm input and output, flash q/k/v/out + fp32 lse, bias-SwiGLU its input, fc2 its input
    assert unit_saved_bytes(llama, "none")[1] == (12 * h + 4 * kv + 6 * f + 4 * a) * s
    assert unit_saved_bytes(llama, "full")[1] == 2 * h * s
    gpt2 = load_model("gpt2-small", seq_len=s)  # with dropout: Korthikanti's 34 s h + 5 a s^2
    h, a = 768, 12
    assert unit_saved_bytes(gpt2, "none", "eager")[1] == (34 * h + 5 * a * s) * s
    assert unit_saved_bytes(gpt2, "selective", "eager")[1] == 34 * h * s
    # the runtime's modules save more than fused kernels: GPT-2's composed tanh-GELU, Llama's fp32 norm copies
    assert unit_saved_bytes(gpt2, "none", kernels="torch")[1] > unit_saved_bytes(gpt2, "none")[1]
    assert unit_saved_bytes(llama, "none", kernels="torch")[1] > unit_saved_bytes(llama, "none")[1]


def _pipeline_plan(micro_batch: int, recompute: str = "none", schedule: str = "1f1b"):
    from hetpart import Plan, Replica, Stage

    return Plan(global_batch=8, micro_batch=micro_batch, seq_len=32, schedule=schedule, recompute=recompute,
                precision="fp32", replicas=(Replica(1.0, (Stage((0, 7), ("0/0/0",), 1), Stage((7, 14), ("0/0/1",), 1))),))


@pytest.fixture(scope="module")
def tiny():
    from hetpart.runtime.models import runnable_spec

    cfg = runnable_spec("gpt2-small", "tiny").config
    return transformer_graph(cfg, "gpt2-small@tiny", 32, 4)


@pytest.mark.parametrize("kernels", ["fused", "torch"])
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_memory_grows_with_the_micro_batch(tiny, kernels, recompute):
    from hetpart import load_cluster
    from hetpart.costmodel import Simulator

    sim = Simulator(tiny, load_cluster("tiny-mixed"), kernels=kernels)
    peaks = [max(sim.simulate(_pipeline_plan(b, recompute)).memory_gb.values()) for b in (1, 2, 4, 8)]
    assert all(a < b for a, b in zip(peaks, peaks[1:])), peaks


def test_the_runtime_stage_peak_is_states_activations_and_the_running_units_working_set(tiny):
    """hetpart's runtime frees the gradients at each step's start: a stage that runs every forward before its
    first backward peaks at rest + max(k A, G + (k - 1) A) + W, the last stage (forward, then backward, then
    forward again) at rest + G + A + W with W its head's fp32 loss gradients (8 V bytes per token) and A
    counting the logits the pipeline keeps until their backward (unit_kept_bytes); plus torch's per-micro-batch
    receive buffers (pipeline_recv_buffer_bytes)."""
    from hetpart import load_cluster
    from hetpart.costmodel import Simulator
    from hetpart.costmodel.memory import PrefixTables, pipeline_recv_buffer_bytes

    b, s = 2, 32
    plan = _pipeline_plan(b)  # 2 micro-batches: stage 0 holds both before its first backward
    pred = Simulator(tiny, load_cluster("tiny-mixed"), kernels="torch").simulate(plan)
    t = PrefixTables(tiny, "torch")
    saved = unit_kept_bytes(tiny, "none", "fused", "torch")  # with the logits the last stage holds
    cfg = tiny.config
    for (a, z), dev, k in (((0, 7), "0/0/0", 2), ((7, 14), "0/0/1", 1)):
        params = t.params_per_device(a, z, 1)
        rest, grads = params * 12, params * 4  # fp32 weights and Adam moments; gradients
        one = sum(saved[a:z]) * b
        work = max(2 * 4 * cfg.ffn * s if tiny.units[u].kind == "block" else
                   8 * cfg.vocab_size * s if tiny.units[u].kind == "head" else 0 for u in range(a, z)) * b
        late = k >= plan.num_microbatches(0)
        want = rest + (max(k * one, grads + (k - 1) * one) if late else grads + k * one) + work
        want += pipeline_recv_buffer_bytes(tiny, [(0, 7), (7, 14)], a // 7, 2, b, plan.num_microbatches(0), k)
        assert pred.memory_gb[dev] * 1e9 == pytest.approx(want, rel=1e-9)


def test_runtime_level_one_keeps_the_parameter_shards_beside_the_gathered_copy(tiny):
    """hetpart's runtime runs ZeRO-1 on FSDP2 without resharding after the forward: on top of the
    simulator's level-1 account (whole weights and gradients, sharded optimizer) each device keeps its
    shard of the weights (w f per parameter); Megatron's distributed optimizer (kernels 'fused') does not."""
    from hetpart import Plan, Replica, Stage, load_cluster
    from hetpart.costmodel import Simulator
    from hetpart.costmodel.memory import PrefixTables

    def plan(zero):
        return Plan(global_batch=8, micro_batch=2, seq_len=32, schedule="1f1b", recompute="none", precision="fp32",
                    zero=zero, replicas=(Replica(0.5, (Stage((0, 14), ("0/0/0",), 1),)),
                                         Replica(0.5, (Stage((0, 14), ("0/0/1",), 1),))))
    cluster = load_cluster("tiny-mixed")
    params = PrefixTables(tiny).params_per_device(0, 14, 1)
    tied = tiny.units[-1].shared_params  # the runtime shards no tied weight (test_tied_unsharded.py)
    assert (params, tied) == (872320, 270336)
    for kernels, sharded in (("torch", params - tied), ("fused", params)):
        extra = 4 * 0.5 * sharded if kernels == "torch" else 0.0
        sim = Simulator(tiny, cluster, kernels=kernels)
        zero0, zero1 = (sim.simulate(plan(z)).memory_gb["0/0/0"] * 1e9 for z in (0, 1))
        assert zero0 - zero1 == pytest.approx(8 * 0.5 * sharded - extra, rel=1e-9)  # Adam's 8 fp32 bytes halved
