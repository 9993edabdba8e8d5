"""The search's gradient rings share their NCCL lines by kind (``plan_search._ring_kind``): the shared lines must be
exactly the lines of each ring's own members."""

from __future__ import annotations

import importlib

import numpy as np

from hetpart import Workload, load_model
from hetpart.cluster import parse_cluster
from hetpart.costmodel.collectives import allreduce_lines

plan_search = importlib.import_module("hetpart.policies.plan_search")  # the package attribute is the function

CLUSTER = {"name": "rings", "nodes": [
    {"count": 3, "gpus_per_node": 8, "gpu": "V100-32GB", "intra_node": "NVLink2-cube-mesh", "nic": "IB-EDR", "zone": "east"},
    {"count": 4, "gpus_per_node": 4, "gpu": "A100-40GB", "intra_node": "PCIe4", "nic": "Ethernet-100",
     "zone": "east"},
    {"count": 2, "gpus_per_node": 8, "gpu": "H100-80GB", "intra_node": "NVLink4", "nic": "IB-NDR", "zone": "west"}],
    "links": [{"zones": ["east", "west"], "bandwidth_gbit_s": 100, "latency_us": 2000}]}


def test_rings_of_one_kind_share_lines_equal_to_each_rings_own() -> None:
    cluster = parse_cluster(CLUSTER)
    model = load_model("gpt2-medium", seq_len=1024)
    rng = np.random.default_rng(7)
    ids = [d.id for d in cluster.devices]
    for collective in ("allreduce", "reduce_scatter"):
        ctx = plan_search.make_context(model, cluster, Workload(64, 1024), plan_search.SearchOptions())
        rings = [list(rng.choice(ids, size=int(rng.integers(2, 12)), replace=False)) for _ in range(300)]
        # the same places on other nodes: every ring moved by one node of its first member's group
        rings += [[f"{g}/{(int(n) + 1) % 2}/{i}" for g, n, i in (d.split("/") for d in ring)] for ring in rings[:100]]
        # inside one node and across two, the places differ: a cube-mesh wires some pairs only
        rings += [[f"0/{n}/{a}", f"0/{n}/{b}"] for n in (0, 1) for a in range(8) for b in range(a + 1, 8)]
        rings += [[f"0/0/{a}", f"0/1/{a}", f"0/1/{b}", f"0/0/{b}"] for a in range(8) for b in range(a + 1, 8)]
        for ring in rings:
            tp = int(rng.choice([1, 2, 4]))
            got = plan_search._sync_lines(ctx, [ring], [tp], None, collective)
            own = tuple((line.fixed_s, line.per_byte_s) for line in allreduce_lines(ring, cluster, tp,
                                                                                     collective=collective))
            assert got == [own], ring
        kinds = {k for k in ctx.sync_cache if k[0] == "lines"}
        assert len(kinds) < len(rings)  # some rings did share their lines
