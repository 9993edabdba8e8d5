"""The uniform grid offers only TP degrees that keep every TP group inside a node, so every grid covers all devices."""

from __future__ import annotations

from hetpart.graph.load import load_model
from hetpart.cluster import parse_cluster
from hetpart.policies.plan_uniform import uniform_grid
from hetpart.workload import Workload


def test_tp_divides_every_nodes_gpus_and_every_grid_covers_the_cluster() -> None:
    cluster = parse_cluster({"name": "odd", "nodes": [
        {"count": 1, "gpus_per_node": 8, "gpu": "A100-80GB", "intra_node": "NVLink3", "nic": "IB-HDR"},
        {"count": 3, "gpus_per_node": 6, "gpu": "V100-32GB", "intra_node": "NVLink2", "nic": "IB-HDR"}]})
    model = load_model("gpt2-small")  # 12 heads: tp 3 and 6 divide them
    grid = list(uniform_grid(model, cluster, Workload(global_batch=26 * 64, seq_len=2048)))
    assert cluster.num_devices == 26
    assert {tp for tp, _, _ in grid} == {1, 2}  # 3 and 6 divide the smallest node's 6 GPUs, not the 8-GPU node's
    assert all(tp * pp * dp == 26 for tp, pp, dp in grid)
