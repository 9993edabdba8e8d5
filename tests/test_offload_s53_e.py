"""The simulator prices an offloaded plan's host copies and CPU step with the bytes
:mod:`hetpart.costmodel.offload` states (commit 5a458e4): the gradient crosses PCIe in fp32 whatever the training
dtype (``HOST_GRAD_BYTES``), the parameters come back in the training dtype, and the CPU's Adam step reads the
fp32 gradient (``cpu_step_bytes``: 30 bytes a parameter under fp16, where the device's step moves 28).

What changed per precision: fp16 copies 2 -> 4 bytes a parameter out, 2 back (unchanged), CPU step 28 -> 30;
bf16 and fp8 (gradients already fp32) and fp32 / tf32 (everything fp32) unchanged."""

from __future__ import annotations


import pytest

from hetpart import Plan, Replica, Stage, load_model
from hetpart.catalog.hardware import GPU_CATALOG
from hetpart.cluster import parse_cluster
from hetpart.costmodel import Simulator
from hetpart.costmodel.memory import optimizer_step_bytes
from hetpart.costmodel.offload import cpu_step_bytes, host_copy_bytes, host_link_gbyte_s

S = 256
HOST_GBYTE_S = 80.0  # the cluster file's host memory bandwidth: a round number to price the CPU step against


def _cluster(gpu: str):
    return parse_cluster({"name": "box", "nodes": [
        {"count": 1, "gpus_per_node": 2, "gpu": gpu, "intra_node": "PCIe3", "nic": "Ethernet-25",
         "host_memory_gbyte_s": HOST_GBYTE_S}]}, "box.yaml")


@pytest.fixture(scope="module")
def model():
    return load_model("gpt2-medium", seq_len=S)


def _dp2(model, zero: int, offload: str, precision: str) -> Plan:
    n = model.num_units
    return Plan(global_batch=8, micro_batch=2, seq_len=S, recompute="full", zero=zero, offload=offload,
                precision=precision, replicas=tuple(Replica(0.5, (Stage((0, n), (f"0/0/{i}",), 1),)) for i in range(2)))


@pytest.mark.parametrize("precision, out, back, step", [
    ("fp16", 4.0, 2.0, 30.0),   # the fp32 gradient out (was 2), fp16 weights back; the CPU reads 4-byte gradients
    ("fp32", 4.0, 4.0, 28.0),   # nothing to cast: as before
    ("bf16", 4.0, 2.0, 30.0),   # the gradient was fp32 already: as before
])
def test_the_bytes_per_precision(precision: str, out: float, back: float, step: float) -> None:
    assert host_copy_bytes(precision) == (out, back)
    assert cpu_step_bytes("adam", precision) == step
    assert optimizer_step_bytes("adam", "fp16") == 28.0  # the device's own step reads the fp16 gradient


@pytest.mark.parametrize("gpu, precision", [("T4-16GB", "fp16"), ("T4-16GB", "fp32"), ("RTX4090-24GB", "bf16")])
def test_the_step_prices_the_cpu_step_and_the_copies_in_those_bytes(gpu: str, precision: str) -> None:
    """Level 0, ``--offload optimizer``: each device steps all its parameters on the CPU (the node's bandwidth
    shared by its 2 devices), its fp32 gradient goes out and its updated weights come back over its PCIe link."""
    model = load_model("gpt2-medium", seq_len=S, precision=precision)
    sim = Simulator(model, _cluster(gpu))
    share = model.range_params(0, model.num_units, 1)
    link = host_link_gbyte_s(GPU_CATALOG[gpu]) * 1e9
    out, back = host_copy_bytes(precision)
    want = share * cpu_step_bytes("adam", precision) / (HOST_GBYTE_S * 1e9 / 2) + share * (out + back) / link
    for row in sim.simulate(_dp2(model, 0, "optimizer", precision)).breakdown:
        assert row["optimizer_s"] == pytest.approx(want, rel=1e-9)
    if precision == "fp16":  # the old pricing (2-byte gradient copy, 28-byte CPU step) is 16% less here
        old = share * 28 / (HOST_GBYTE_S * 1e9 / 2) + share * 4 / link
        assert want - old == pytest.approx(share * 2 / (HOST_GBYTE_S * 1e9 / 2) + share * 2 / link, rel=1e-9)


@pytest.mark.parametrize("zero, offload", [(2, "optimizer"), (3, "full")])
def test_the_per_unit_copies_move_the_fp32_gradient_out_and_fp16_weights_back(model, zero: int, offload: str) -> None:
    """Levels 2-3: beside each unit's reduce-scatter its gradient shard goes to the host in fp32 (4 bytes a
    parameter under fp16), and under ``full`` its fp16 parameter shard comes in before its gathers (2)."""
    sim = Simulator(model, _cluster("T4-16GB"))
    plan = _dp2(model, zero, offload, "fp16")
    shard = sim._shard_comm(plan)
    units = sim._unit_comm(plan, shard)
    link = host_link_gbyte_s(GPU_CATALOG["T4-16GB"]) * 1e9
    assert link == 12e9  # Turing's PCIe 3 x16, offload.HOST_LINK_GBYTE_S
    for key, rows in units.items():
        base = {u: (g, s) for u, g, s in shard[key]}
        assert [u for u, *_ in rows] == list(range(model.num_units))
        for u, before, after in rows:
            params = model.range_params(u, u + 1, 1) * 0.5  # each of 2 replicas holds half of every unit
            assert after - base[u][1] == pytest.approx(params * 4 / link, rel=1e-9)
            assert before - base[u][0] == pytest.approx(params * 2 / link if offload == "full" else 0.0, abs=1e-15)
