"""Sharded data parallelism, probe_a (s51) findings: the level-2/3 gradient reduce-scatter moves the gradient
bytes the rest of the model reduces in (fp32 under bf16), the parameter gather the training dtype."""

from __future__ import annotations

import pytest

from hetpart import Plan, Replica, Stage, load_model
from hetpart.cluster import parse_cluster
from hetpart.costmodel.collectives import reduce_scatter_time_s
from hetpart.costmodel.sharding_reference import reference_unit_params
from hetpart.costmodel.simulator import Simulator

S = 128
PAIR = {"name": "pair", "nodes": [{"count": 2, "gpus_per_node": 1, "gpu": "A100-80GB", "intra_node": "NVLink3",
                   "nic": "Ethernet-25"}]}


def _plan(zero: int, precision: str = "bf16") -> Plan:
    return Plan(global_batch=8, micro_batch=1, seq_len=S, zero=zero, precision=precision, replicas=(
        Replica(0.5, (Stage((0, 14), ("0/0/0",)),)), Replica(0.5, (Stage((0, 14), ("0/1/0",)),))))


@pytest.mark.parametrize("precision, grad_bytes", [("bf16", 4), ("fp16", 2)])
def test_reduce_scatter_moves_grad_bytes_and_the_gather_parameter_bytes(precision, grad_bytes):
    model, cluster = load_model("gpt2-small", seq_len=S), parse_cluster(PAIR)
    members = ["0/0/0", "0/1/0"]
    rows = Simulator(model, cluster)._shard_comm(_plan(3, precision))[(0, 0)]
    assert len(rows) == 14
    for unit, gather, scatter in rows:
        params = reference_unit_params(model, unit, 1, [(0, 14)])  # the head's tied copy: the embedding's weight
        assert gather == pytest.approx(reduce_scatter_time_s(params * 2, members, cluster), rel=1e-9)
        assert scatter == pytest.approx(reduce_scatter_time_s(params * grad_bytes, members, cluster), rel=1e-9)


def test_level_three_keeps_megatron_fsdp_bytes_per_parameter():
    """Megatron-FSDP (the fused engine's level 3) shards the bf16 weight, the fp32 main weight, the fp32 main
    gradient and Adam's moments: 18 bytes per parameter over the shard group, not 16."""
    from hetpart.costmodel.offload import device_state_parts
    from hetpart.costmodel.sharding import state_bytes

    parts = device_state_parts(*state_bytes("bf16"), 3, 0.125, "none")
    assert parts == pytest.approx((0.25, 0.5, 1.5))
    assert sum(parts) * 8 == pytest.approx(18.0)


def test_level_three_prefetches_the_running_units_neighbour_not_the_largest():
    from hetpart.costmodel.sharding import gathered_working_bytes, working_set_bytes

    units = [10.0, 1.0, 1.0, 10.0]  # embedding, two blocks, head
    # backward of the head: itself and the block before it gathered, its whole gradient alive
    assert gathered_working_bytes(units, 2.0, 4.0) == pytest.approx(2 * 11 + 4 * 10)
    assert working_set_bytes(10.0, "bf16", 3, [units]) == pytest.approx(62.0)
    assert working_set_bytes(10.0, "bf16", 3) == pytest.approx(80.0)  # without the units: the upper bound
    assert working_set_bytes(10.0, "bf16", 3, [units[:2], units[2:]]) == pytest.approx(62.0)
    assert working_set_bytes(10.0, "bf16", 2, [units]) == pytest.approx(40.0)  # level 2: one unit's gradient


def test_fused_level_three_memory_uses_the_neighbour(monkeypatch):
    import hetpart.costmodel.simulator as simulator
    from hetpart.costmodel.sharding import sharded_delta_gb, state_bytes

    model = load_model("llama3-8b", seq_len=S)
    cluster = parse_cluster({"name": "h", "nodes": [{"count": 1, "gpus_per_node": 8, "gpu": "H100-80GB",
                                                     "intra_node": "NVLink4", "nic": "IB-NDR"}]})
    devices = [f"0/0/{i}" for i in range(8)]
    plan = Plan(global_batch=8, micro_batch=1, seq_len=S, zero=3,
                replicas=tuple(Replica(1 / 8, (Stage((0, model.num_units), (d,)),)) for d in devices))
    sim = Simulator(model, cluster)
    units = sim._chunk_unit_params((0, model.num_units), 1)
    w, g, _ = state_bytes("bf16")
    largest = max(units)
    assert units[-1] == largest and units[-2] < largest / 2  # the head (and norm) is the largest, a block its neighbour
    saved = (largest * (2 * w + g) - max(w * (units[0] + units[1]) + g * units[0],
                                         w * (units[-1] + units[-2]) + g * units[-1])) / 1e9
    assert saved > 0.4
    fused = sim.simulate(plan).memory_gb[devices[0]]
    monkeypatch.setattr(simulator, "sharded_delta_gb", lambda *a: sharded_delta_gb(*a[:7]))  # the largest, twice
    old_rule = Simulator(model, cluster).simulate(plan).memory_gb[devices[0]]
    assert old_rule - fused == pytest.approx(saved, rel=1e-9)
