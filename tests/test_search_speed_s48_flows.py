"""The search's NIC sharing of typed replicas' rings (:func:`~hetpart.policies.plan_search._typed_flows`, in numpy)
against the plain computation: :func:`~hetpart.costmodel.collectives.nic_flows` over the rings built one member at
a time (:func:`~hetpart.policies.search_reference.typed_flows_reference`), equal to the bit, on seeded random replicas."""

from __future__ import annotations

import importlib
import random

from hetpart import Workload
from hetpart.cluster import parse_cluster
from hetpart.costmodel.pools import divisors, tp_groups
from hetpart.graph.transformer import TransformerConfig, transformer_graph
from hetpart.policies.search_reference import typed_flows_reference

search = importlib.import_module("hetpart.policies.plan_search")

CLUSTER = parse_cluster({"name": "three-pools", "nodes": [
    {"count": 2, "gpus_per_node": 4, "gpu": "A100-80GB", "intra_node": "NVLink3", "nic": "IB-HDR"},
    {"count": 3, "gpus_per_node": 2, "gpu": "V100-32GB", "intra_node": "PCIe3", "nic": "Ethernet-25"},
    {"count": 1, "gpus_per_node": 4, "gpu": "T4-16GB", "intra_node": "PCIe3", "nic": "Ethernet-25"}]})


def _context():
    cfg = TransformerConfig(family="gpt2", num_layers=6, hidden_size=512, num_heads=8, vocab_size=50257,
                            max_positions=1024, tied_embeddings=True)
    model = transformer_graph(cfg, "tiny-h512-l6", 256)
    return search.make_context(model, CLUSTER, Workload(16, 256), search.SearchOptions())


def _replicas(ctx, rng: random.Random) -> tuple[list, list]:
    """Typed replicas of a random subset of pools, each pool at a random (tp, pp), cut at random units."""
    n = ctx.model.num_units
    groups, bounds = [], []
    pools = [p for p in ctx.pools if rng.random() < 0.8] or ctx.pools[:1]
    for pool in pools:
        tp = rng.choice([t for t in (1, 2, 4) if pool.num_devices % t == 0 and t <= pool.gpus_per_node])
        stages = tp_groups(pool, tp)
        pp = rng.choice([d for d in divisors(len(stages)) if d <= n])
        cuts = (0, *sorted(rng.sample(range(1, n), pp - 1)), n)
        for r in range(len(stages) // pp):
            groups.append(stages[r * pp:(r + 1) * pp])
            bounds.append(cuts)
    return groups, bounds


def test_typed_flows_equal_nic_flows_of_the_rings() -> None:
    ctx = _context()
    rng = random.Random(48)
    crossing = 0
    for _ in range(60):
        groups, bounds = _replicas(ctx, rng)
        reference = typed_flows_reference(ctx, groups, bounds)
        assert search._typed_flows(ctx, groups, bounds) == reference
        crossing += bool(reference)
    assert crossing > 30  # most draws have rings that leave a node


def test_typed_flows_of_replicas_inside_one_node_are_empty() -> None:
    ctx = _context()
    pool = next(p for p in ctx.pools if p.gpu.name.startswith("T4"))
    stages = tp_groups(pool, 1)
    groups, bounds = [stages[:2], stages[2:]], [(0, 3, ctx.model.num_units), (0, 5, ctx.model.num_units)]
    assert typed_flows_reference(ctx, groups, bounds) == {}
    assert search._typed_flows(ctx, groups, bounds) == {}


def test_typed_flows_of_replicas_cut_unlike_take_turns() -> None:
    ctx = _context()
    pool = next(p for p in ctx.pools if p.gpu.name.startswith("V100"))
    stages = tp_groups(pool, 1)  # six V100 on three nodes: two replicas of three stages, cut unlike
    n = ctx.model.num_units
    groups, bounds = [stages[:3], stages[3:]], [(0, 2, 4, n), (0, 3, 6, n)]
    flows = search._typed_flows(ctx, groups, bounds)
    assert flows == typed_flows_reference(ctx, groups, bounds)
    assert sorted(flows) == [2, 3, 4]
    assert max(flows.values()) <= 2.0
