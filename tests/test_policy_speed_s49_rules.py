"""The runtime rules' node count of a tensor-parallel group, read off device ids, against the cluster's own
``node_key`` of every device, on every node group shape of a few clusters, unknown ids included."""

import random

from hetpart.cluster import Cluster, parse_cluster
from hetpart import rules


def _cluster() -> Cluster:
    return parse_cluster({"name": "mix", "nodes": [
        {"gpu": "A100-80GB", "gpus_per_node": 8, "count": 3, "intra_node": "NVLink3", "nic": "IB-HDR"},
        {"gpu": "V100-32GB", "gpus_per_node": 4, "count": 2, "intra_node": "PCIe3", "nic": "IB-HDR"},
        {"gpu": "A100-80GB", "gpus_per_node": 1, "count": 11, "intra_node": "PCIe4", "nic": "IB-HDR"}]})


def test_nodes_equal_the_devices_node_keys():
    cluster = _cluster()
    ids = [d.id for d in cluster.devices] + ["9/0/0", "0/7/1", "junk"]
    rng = random.Random(49)
    for _ in range(400):
        group = rng.sample(ids, rng.randint(1, 12))
        keys = {cluster.device(d).node_key for d in group if cluster.has_device(d)}
        assert len(rules._nodes(cluster, group)) == len(keys)
    assert rules._nodes(cluster, ["0/0/1", "0/0/7", "0/1/0", "1/1/2", "2/10/0", "nope"]) == {"0/0", "0/1", "1/1", "2/10"}
