"""The breakdown's remainder terms: float cancellation leaves no -5e-17 (zero_comm_s is 0.0 when the micro-batch's
parts make it up), and what sharded collectives really add stays."""

import pytest

from hetpart import load_model
from hetpart.cluster import parse_cluster
from hetpart.costmodel import Simulator, megatron_plan
from hetpart.costmodel.simulator import _rest_s
from hetpart.workload import Workload

MIXED = {"name": "m", "nodes": [
    {"count": 1, "gpus_per_node": 4, "gpu": "H100-80GB", "intra_node": "NVLink4", "nic": "IB-NDR"},
    {"count": 1, "gpus_per_node": 4, "gpu": "MI250X-GCD-64GB", "intra_node": "xGMI", "nic": "IB-NDR"}]}


def test_a_remainder_within_rounding_is_zero():
    assert 0.1 + 0.2 - 0.3 != 0.0  # what the subtraction alone leaves
    assert _rest_s([(0.1 + 0.2, 0.3)]) == 0.0
    assert _rest_s([(1.0, 0.75), (2.0, 2.0)]) == 0.25
    assert _rest_s([]) == 0.0


@pytest.mark.parametrize("shape", [dict(tp=1, pp=2, dp=4), dict(tp=2, pp=2, dp=2), dict(tp=1, pp=8, dp=1)])
def test_no_sharded_collective_means_zero_comm_is_exactly_zero(shape):
    # these shapes left -2e-17 to +4e-17 in zero_comm_s before
    cluster = parse_cluster(MIXED, "m")
    model = load_model("gpt2-small", seq_len=512, precision="bf16")
    for zero in (0, 1):
        plan = megatron_plan(model, cluster, Workload(64, 512, precision="bf16", zero=zero), micro_batch=2,
                             zero=zero, **shape)
        assert {b["zero_comm_s"] for b in Simulator(model, cluster).simulate(plan).breakdown} == {0.0}


def test_zero_3_gathers_still_show():
    cluster = parse_cluster(MIXED, "m")
    model = load_model("gpt2-small", seq_len=512, precision="bf16")
    plan = megatron_plan(model, cluster, Workload(64, 512, precision="bf16", zero=3), micro_batch=2, zero=3,
                         tp=1, pp=2, dp=4)
    assert min(b["zero_comm_s"] for b in Simulator(model, cluster).simulate(plan).breakdown) > 1e-6
