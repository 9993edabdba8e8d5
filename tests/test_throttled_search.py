"""Search and the upper bound on clusters with a throttled device (``slow:``): a tensor-parallel group holding
one is priced at the pace the evaluator's uneven split gives it, and the bound never sits below a baseline."""

from __future__ import annotations

import importlib

import pytest
import yaml

from hetpart import Workload, load_model
from hetpart.cluster import parse_cluster
from hetpart.costmodel.pools import device_pools
from hetpart.policies import plan
from hetpart.policies.search_costs import CostTable
from hetpart.policies.upper_bound import upper_bound

plan_search = importlib.import_module("hetpart.policies.plan_search").plan_search

CLUSTER = """
name: one-slow-v100
nodes: [{count: 3, gpus_per_node: 4, gpu: V100-32GB, intra_node: NVLink2, nic: IB-EDR}]
slow: {"0/2/3": 0.7}
"""


@pytest.fixture(scope="module")
def case():
    return (load_model("llama2-13b", seq_len=2048), parse_cluster(yaml.safe_load(CLUSTER), "one-slow-v100"),
            Workload(16, 2048))


def test_cost_table_slows_device_work_only(case) -> None:
    model, cluster, workload = case
    table = CostTable(model, cluster, "fp16")
    pool = device_pools(cluster)[0]
    full, slow = table.get(pool, 4, 1, "none"), table.get(pool, 4, 1, "none", 0.5)
    ratio = slow.time_s[0, model.num_units] / full.time_s[0, model.num_units]
    # device work doubles; the tensor-parallel all-reduces and the host's dispatch do not
    assert 1.5 < ratio < 2.0
    assert slow.states_gb is full.states_gb


def test_search_gives_a_throttled_group_its_share(case) -> None:
    model, cluster, workload = case
    uniform = plan(model, cluster, workload, "uniform").prediction.tokens_per_s
    found = plan_search(model, cluster, workload, include_baselines=False, speed_types=False, refine_steps=0)
    # its own structures, unclimbed, beat the even cut (5,760 against 5,525 tokens/s when written)
    assert found.tokens_per_s > uniform * 1.02
    last = found.plan.replicas[0].stages[-1]
    assert any(d == "0/2/3" for d in last.devices)
    lengths = [s.layers[1] - s.layers[0] for s in found.plan.replicas[0].stages]
    assert lengths[-1] < max(lengths)


def test_upper_bound_holds_the_baselines(case) -> None:
    model, cluster, workload = case
    bound = upper_bound(model, cluster, workload)["tokens_per_s"]
    for name in ("uniform", "search"):
        assert plan(model, cluster, workload, name).prediction.tokens_per_s <= bound * (1 + 1e-9)
