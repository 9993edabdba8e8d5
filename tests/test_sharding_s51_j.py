"""Sharded data parallelism, probe_a (s51) findings: the level-2/3 gradient reduce-scatter moves the gradient
bytes the rest of the model reduces in (fp32 under bf16), the parameter gather the training dtype."""

from __future__ import annotations

import pytest

from hetpart import Plan, Replica, Stage, load_model
from hetpart.cluster import parse_cluster
from hetpart.costmodel.collectives import reduce_scatter_time_s
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
        params = model.range_params(unit, unit + 1, 1)
        assert gather == pytest.approx(reduce_scatter_time_s(params * 2, members, cluster), rel=1e-9)
        assert scatter == pytest.approx(reduce_scatter_time_s(params * grad_bytes, members, cluster), rel=1e-9)
