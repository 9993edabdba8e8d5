"""The search's gradient rings' facts kept per ring (``plan_search._ring_facts``) against the same facts computed
afresh for every ring, and ``_sync_lines`` over many rings at once against one computed with an empty cache every
time, on seeded random rings of a two-zone cluster (rings repeated across calls, as the walk's layouts repeat them)."""

from __future__ import annotations

import importlib
from collections import Counter

import numpy as np

from hetpart import Workload, load_model
from hetpart.cluster import parse_cluster
from tests.test_walk_speed_rings import CLUSTER

plan_search = importlib.import_module("hetpart.policies.plan_search")  # the package attribute is the function


def _context(cluster):
    return plan_search.make_context(load_model("gpt2-medium", seq_len=1024), cluster, Workload(64, 1024),
                                     plan_search.SearchOptions())


def test_ring_facts_equal_the_facts_computed_afresh() -> None:
    cluster = parse_cluster(CLUSTER)
    ctx = _context(cluster)
    rng = np.random.default_rng(49)
    ids = [d.id for d in cluster.devices]
    rings = [list(rng.choice(ids, size=int(rng.integers(1, 12)), replace=False)) for _ in range(200)]
    for ring in rings + rings[:50]:
        nodes, counts, leaves, kind, zones = plan_search._ring_facts(ctx, ring)
        own = [cluster.device(d).group for d in ring]
        rows, index = plan_search._place_rows(ctx), ctx.device_index
        fresh = [rows[index[d]][0] for d in ring]
        assert nodes == fresh and counts == list(Counter(fresh).items()) and leaves == (len(set(fresh)) > 1)
        assert kind == plan_search._ring_kind(rows, index, ring)
        assert zones == [("zone", cluster.zones.index(cluster.groups[g].zone)) for g in own]


def test_sync_lines_of_many_rings_equal_those_of_an_empty_cache() -> None:
    cluster = parse_cluster(CLUSTER)
    ctx = _context(cluster)
    rng = np.random.default_rng(50)
    ids = [d.id for d in cluster.devices]
    pool = [list(rng.choice(ids, size=int(rng.integers(2, 9)), replace=False)) for _ in range(40)]
    used = set()
    for _ in range(60):
        rings = [pool[i] for i in rng.choice(len(pool), size=int(rng.integers(1, 7)), replace=False)]
        tps = [int(rng.choice([1, 2, 4])) for _ in rings]
        used.update(tuple(r) for r in rings)
        got = plan_search._sync_lines(ctx, rings, tps, None)
        assert got == plan_search._sync_lines(_context(cluster), rings, tps, None)
    assert sum(k[0] == "ring" for k in ctx.sync_cache) == len(used)  # each ring's facts computed once
