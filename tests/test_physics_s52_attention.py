"""A 32-bit run's attention under the engine's fused kernels is the unfused core (scores materialised), not
FlashAttention: flash and cuDNN fused attention take fp16/bf16/fp8 only (probe_a s52 finding 1). Under hetpart's
torch kernels SDPA's memory-efficient kernel takes fp32 (no score matrix)."""

from __future__ import annotations

from hetpart import Workload, load_model
from hetpart.cluster import parse_cluster
from hetpart.costmodel import megatron_plan
from hetpart.costmodel.activations import attention_kernel, effective_attention, unit_saved_bytes
from hetpart.costmodel.compute import unit_compute_s, unit_ops
from hetpart.costmodel.provenance import attention_entry
from hetpart.costmodel.simulator import Simulator
from hetpart.catalog.hardware import GPU_CATALOG

GH = {"name": "gh1", "nodes": [{"count": 1, "gpus_per_node": 4, "gpu": "GH200-96GB", "intra_node": "NVLink4",
                                "nic": "IB-HDR", "nics_per_node": 4}]}


def test_attention_kernel_rules():
    assert effective_attention("fused", 4, "fused") == "eager"
    assert effective_attention("fused", 4, "torch") == "fused"
    assert effective_attention("fused", 2, "fused") == "fused"
    assert effective_attention("eager", 2, "fused") == "eager"
    priced, kernel, why = attention_kernel("fused", 4, "fused")
    assert priced == "eager"
    assert "UnfusedDotProductAttention" in kernel
    assert "fp16/bf16/fp8" in why
    assert attention_kernel("fused", 4, "torch")[1] == "PyTorch SDPA memory-efficient kernel"


def test_fp32_saved_bytes_follow_the_unfused_core():
    m32 = load_model("gpt2-medium", seq_len=1024, precision="tf32")
    m16 = load_model("gpt2-medium", seq_len=1024, precision="bf16")
    assert unit_saved_bytes(m32, "none", "fused", "fused") == unit_saved_bytes(m32, "none", "eager", "fused")
    assert unit_saved_bytes(m16, "none", "fused", "fused") != unit_saved_bytes(m16, "none", "eager", "fused")
    assert unit_saved_bytes(m32, "none", "fused", "torch") != unit_saved_bytes(m32, "none", "eager", "torch")


def test_fp32_compute_and_ops_follow_the_unfused_core():
    m32 = load_model("gpt2-medium", seq_len=1024, precision="tf32")
    gpu = GPU_CATALOG["GH200-96GB"]
    fused = unit_compute_s(m32, gpu, 1, 8, "tf32", "none", attention="fused", kernels="fused")
    eager = unit_compute_s(m32, gpu, 1, 8, "tf32", "none", attention="eager", kernels="fused")
    assert list(fused[0]) == list(eager[0])
    assert list(fused[1]) == list(eager[1])
    assert [list(a) for a in unit_ops(m32, "fused", "fused")] == [list(a) for a in unit_ops(m32, "fused", "eager")]
    torch_fused = unit_compute_s(m32, gpu, 1, 8, "tf32", "none", attention="fused", kernels="torch")
    torch_eager = unit_compute_s(m32, gpu, 1, 8, "tf32", "none", attention="eager", kernels="torch")
    assert sum(torch_fused[0]) < sum(torch_eager[0])


def _attention_plans(precision: str):
    """gpt2-medium on four GH200 (DP 4, micro-batch 8) in ``precision``, one plan per attention setting."""
    cluster = parse_cluster(GH)
    model = load_model("gpt2-medium", seq_len=1024, precision=precision)
    plans = {a: megatron_plan(model, cluster, Workload(32, 1024, precision=precision, recompute="none", attention=a),
                              tp=1, pp=1, dp=4, micro_batch=8, recompute="none") for a in ("fused", "eager")}
    return model, cluster, plans


def test_tf32_prediction_prices_the_unfused_core_and_says_so():
    m32, cluster, plans = _attention_plans("tf32")
    sim = Simulator(m32, cluster)
    fused, eager = sim.simulate(plans["fused"]), sim.simulate(plans["eager"])
    assert fused.step_time_s == eager.step_time_s
    assert fused.memory_gb == eager.memory_gb
    entry = attention_entry(plans["fused"], "fused")
    assert entry["requested"] == "fused"
    assert entry["priced"] == "eager"
    assert attention_entry(plans["fused"], "torch")["priced"] == "fused"
    assert fused.provenance["attention"]["priced"] == "eager"
    torch_sim = Simulator(m32, cluster, kernels="torch")
    assert torch_sim.simulate(plans["fused"]).step_time_s < torch_sim.simulate(plans["eager"]).step_time_s


def test_bf16_prediction_keeps_flash_attention():
    m16, cluster, plans = _attention_plans("bf16")
    sim = Simulator(m16, cluster)
    assert sim.simulate(plans["fused"]).step_time_s < sim.simulate(plans["eager"]).step_time_s
    assert sim.simulate(plans["fused"]).provenance["attention"]["priced"] == "fused"
