"""ZeRO-Offload's host keeps the gradient it steps from in fp32 whatever the training dtype (DeepSpeed's
stage_1_and_2.py: the ``.grad`` of its fp32 master partition), and the CPU's Adam step reads it so: under fp16 the host
held 2 bytes of gradient per parameter before, 4 now; bf16 is unchanged (its gradients were fp32 already)."""

from __future__ import annotations

import pytest

from hetpart import load_model
from hetpart.cluster import parse_cluster
from hetpart.costmodel.memory import optimizer_step_bytes, state_split
from hetpart.costmodel.offload import HOST_GRAD_BYTES, cpu_step_bytes, host_copy_bytes, host_state_bytes
from hetpart.costmodel.simulator import Simulator
from hetpart.plan import Plan, Replica, Stage


@pytest.mark.parametrize("precision,host_optimizer,host_full", [("bf16", 16.0, 18.0), ("fp16", 16.0, 18.0)])
def test_the_host_keeps_an_fp32_gradient(precision, host_optimizer, host_full) -> None:
    w, g, opt = state_split(precision)
    assert HOST_GRAD_BYTES == 4.0
    assert host_state_bytes(w, g, opt, 1.0, "optimizer") == host_optimizer
    assert host_state_bytes(w, g, opt, 0.25, "full") == host_full / 4
    assert host_state_bytes(w, g, opt, 1.0, "none") == 0.0


def test_the_copies_and_the_cpu_step_move_the_fp32_gradient() -> None:
    assert host_copy_bytes("bf16") == (4.0, 2.0)  # the gradient out in fp32, the updated weights back in bf16
    assert host_copy_bytes("fp16") == (4.0, 2.0)
    assert host_copy_bytes("fp32") == (4.0, 4.0)
    assert cpu_step_bytes("adam", "bf16") == optimizer_step_bytes("adam", "bf16") == 30.0
    assert cpu_step_bytes("adam", "fp16") == optimizer_step_bytes("adam", "fp16") + 2.0 == 30.0


def test_an_fp16_plans_host_memory_counts_four_bytes_of_gradient() -> None:
    model = load_model("gpt2-medium", seq_len=256)
    cluster = parse_cluster({"name": "box", "nodes": [{"count": 1, "gpus_per_node": 2, "gpu": "T4-16GB",
                                                       "intra_node": "PCIe3", "nic": "Ethernet-10"}]})
    n = model.num_units
    for zero, per_param in ((1, 16.0), (2, 16.0)):
        plan = Plan(global_batch=8, micro_batch=2, seq_len=256, zero=zero, offload="optimizer", precision="fp16",
                    replicas=tuple(Replica(0.5, (Stage((0, n), (f"0/0/{i}",)),)) for i in range(2)))
        params = model.range_params(0, n, 1)
        host = Simulator(model, cluster).simulate(plan).metrics["host_memory_gb"]
        assert host == pytest.approx(2 * params / 2 * per_param / 1e9, rel=1e-9)  # two devices' halves on one node
