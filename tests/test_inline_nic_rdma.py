"""An inline NIC without ``rdma`` is read from its figures: a kernel-bypass latency or a training fabric's rate is RDMA,
so `{bandwidth_gbit_s: 400, latency_us: 1}` prices as the catalog's IB-NDR, not as a TCP socket capped at 4.7 GB/s."""

from __future__ import annotations

import pytest

from hetpart.cluster import parse_cluster
from hetpart.errors import SpecError
from hetpart.graph.load import load_model
from hetpart.costmodel.megatron import megatron_plan
from hetpart.costmodel.simulator import simulate
from hetpart.workload import Workload


def _cluster(nic) -> object:
    return parse_cluster({"name": "t", "nodes": [
        {"count": 2, "gpus_per_node": 4, "gpu": "H100-80GB", "intra_node": "NVLink4", "nic": nic}]})


@pytest.mark.parametrize(("nic", "rdma"), [
    ({"bandwidth_gbit_s": 400, "latency_us": 1}, True),   # the contract's own shape of an inline NIC
    ({"bandwidth_gbit_s": 200, "latency_us": 2}, True),
    ({"bandwidth_gbit_s": 400, "latency_us": 25}, False),  # a kernel-stack latency: TCP
    ({"bandwidth_gbit_s": 400}, True),                     # no latency: a 400 Gbit/s fabric
    ({"bandwidth_gbit_s": 25}, False),
    ({"bandwidth_gbit_s": 400, "latency_us": 1, "rdma": False}, False),  # said outright wins
    ({"bandwidth_gbit_s": 10, "latency_us": 30, "rdma": True}, True),
])
def test_inline_nic_transport_follows_its_figures(nic, rdma) -> None:
    assert _cluster(nic).groups[0].nic.rdma is rdma


def test_a_wrong_rdma_value_is_refused_in_one_line() -> None:
    with pytest.raises(SpecError, match=r"nodes\[0\]\.nic\.rdma"):
        _cluster({"bandwidth_gbit_s": 400, "rdma": "maybe"})


def test_an_inline_400_gbit_nic_prices_as_ib_ndr() -> None:
    model, workload = load_model("gpt2-medium", seq_len=1024), Workload(global_batch=64, seq_len=1024)
    steps = {}
    for name, nic in (("catalog", "IB-NDR"), ("inline", {"bandwidth_gbit_s": 400, "latency_us": 1.5})):
        cluster = _cluster(nic)
        plan = megatron_plan(model, cluster, workload, tp=1, pp=1, dp=8, micro_batch=8)
        steps[name] = simulate(model, cluster, plan, workload).step_time_s
    assert steps["inline"] == pytest.approx(steps["catalog"], rel=1e-9)
