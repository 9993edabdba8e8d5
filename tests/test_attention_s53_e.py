"""The simulator's side of the attention kernel a 32-bit run gets (commit 1d9aaeb,
:func:`hetpart.costmodel.activations.attention_kernel`): its prediction's provenance names the kernel its own kernel
set priced (``torch``: SDPA's memory-efficient kernel; ``fused``: Transformer Engine's unfused core), its
hardware FLOPs count what the priced kernel recomputes, and the operator counts (``op_counts``) do not change
which attention the engine runs."""

from __future__ import annotations

import pytest

from hetpart import Workload, load_model
from hetpart.cluster import parse_cluster
from hetpart.costmodel import megatron_plan
from hetpart.costmodel.simulator import Simulator
from tests._cli import run_cli

GH = {"name": "gh1", "nodes": [{"count": 1, "gpus_per_node": 4, "gpu": "GH200-96GB", "intra_node": "NVLink4",
                                "nic": "IB-HDR", "nics_per_node": 4}]}
S = 1024


@pytest.fixture(scope="module")
def cluster():
    return parse_cluster(GH)


def _plans(model, cluster, precision: str, recompute: str) -> dict:
    return {a: megatron_plan(model, cluster, Workload(32, S, precision=precision, recompute=recompute, attention=a),
                             tp=1, pp=1, dp=4, micro_batch=8, recompute=recompute) for a in ("fused", "eager")}


def test_the_provenance_names_the_kernel_its_own_kernel_set_priced(cluster) -> None:
    """A tf32 run asking for fused attention: the engine's kernels price the unfused core, the torch kernels SDPA's
    memory-efficient kernel; each prediction says which and why (before: the torch simulator's provenance said
    ``eager`` under ``fused``, the default kernel set's answer, while it priced the fused kernel)."""
    m32 = load_model("gpt2-medium", seq_len=S, precision="tf32")
    plan = _plans(m32, cluster, "tf32", "none")["fused"]
    engine = Simulator(m32, cluster).simulate(plan).provenance["attention"]
    assert (engine["requested"], engine["priced"], engine["kernels"]) == ("fused", "eager", "fused")
    assert "UnfusedDotProductAttention" in engine["kernel"] and "fp16/bf16/fp8" in engine["why"]
    torch = Simulator(m32, cluster, kernels="torch").simulate(plan).provenance["attention"]
    assert (torch["requested"], torch["priced"], torch["kernels"]) == ("fused", "fused", "torch")
    assert torch["kernel"] == "PyTorch SDPA memory-efficient kernel" and "fp32" in torch["why"]
    m16 = load_model("gpt2-medium", seq_len=S, precision="bf16")
    bf16 = Simulator(m16, cluster, kernels="torch").simulate(_plans(m16, cluster, "bf16", "none")["fused"])
    assert (bf16.provenance["attention"]["priced"], bf16.provenance["attention"]["kernels"]) == ("fused", "torch")


def test_hardware_flops_count_the_unfused_cores_recomputation(cluster) -> None:
    """Selective recomputation re-runs the attention core where it is unfused (Korthikanti et al. 2022), nothing
    beyond flash's own backward where it is fused: a tf32 run's hardware FLOPs are those of eager attention
    (gpt2-medium s1024 tf32 on 4 GH200, DP4 mb8: 97.72 -> 101.78 TFLOP/s per device, the model's 97.72), a bf16
    run's the model's."""
    m32 = load_model("gpt2-medium", seq_len=S, precision="tf32")
    sim = Simulator(m32, cluster)
    plans = _plans(m32, cluster, "tf32", "selective")
    fused, eager = (sim.simulate(plans[a]).metrics for a in ("fused", "eager"))
    assert fused == eager
    recomputed = sum(u.recompute_flops["selective"] for u in m32.units)
    assert recomputed > 0
    ratio = fused["hardware_tflops_per_device"] / fused["model_tflops_per_device"]
    assert ratio == pytest.approx((m32.train_flops + recomputed) / m32.train_flops, rel=1e-12)
    m16 = load_model("gpt2-medium", seq_len=S, precision="bf16")
    bf16 = Simulator(m16, cluster).simulate(_plans(m16, cluster, "bf16", "selective")["fused"]).metrics
    assert bf16["hardware_tflops_per_device"] == bf16["model_tflops_per_device"]


def test_operator_counts_do_not_change_the_engines_attention(cluster) -> None:
    """``op_counts="measured"`` (the runtime's operator counts for the host cost) under the engine's kernels still
    prices Transformer Engine's unfused core for a tf32 run, as the memory does (before: SDPA's fused kernel,
    0.1887 s against 0.2079 s eager)."""
    m32 = load_model("gpt2-medium", seq_len=S, precision="tf32")
    plans = _plans(m32, cluster, "tf32", "none")
    sim = Simulator(m32, cluster, op_counts="measured")
    fused, eager = (sim.simulate(plans[a]) for a in ("fused", "eager"))
    assert fused.step_time_s == eager.step_time_s and fused.memory_gb == eager.memory_gb
    torch = Simulator(m32, cluster, kernels="torch")
    assert torch.simulate(plans["fused"]).step_time_s < torch.simulate(plans["eager"]).step_time_s


def test_predict_prints_the_kernel_priced(capsys, tmp_path) -> None:
    path = tmp_path / "gh.yaml"
    path.write_text("name: gh1\nnodes:\n  - {count: 1, gpus_per_node: 4, gpu: GH200-96GB, intra_node: NVLink4, "
                    "nic: IB-HDR, nics_per_node: 4}\n")
    grid = ["predict", "--model", "gpt2-medium", "--cluster", str(path), "--global-batch", "32", "--seq-len",
            str(S), "--tp", "1", "--pp", "1", "--dp", "4", "--micro-batch", "8", "--recompute", "none"]
    code, out, err = run_cli(capsys, *grid, "--precision", "tf32")
    assert code == 0, err
    assert "attention priced eager (asked: fused): unfused core" in " ".join(out.split())
    code, out, err = run_cli(capsys, *grid, "--precision", "bf16")
    assert code == 0, err
    assert "attention priced fused: flash / cuDNN fused attention" in " ".join(out.split())
