"""Typed replicas' pool configurations: split in order of a bound on their rate (``_pool_configs``), they are the
configurations of splitting every one (``pool_configs_reference``); on a cluster of one pool none is split where
every typed point would be skipped (``_uneven_replicas``), and the same typed points come out where some is kept."""

from __future__ import annotations

import importlib
import random

import pytest

from hetpart import Workload
from hetpart.cluster import parse_cluster
from hetpart.graph.transformer import TransformerConfig, transformer_graph
from hetpart.policies.common import microbatch_options, recompute_modes
from hetpart.policies.search_reference import pool_configs_reference

search = importlib.import_module("hetpart.policies.plan_search")

GPUS = [("A100-80GB", "NVLink3"), ("V100-32GB", "NVLink2"), ("T4-16GB", "PCIe3"), ("H100-80GB", "NVLink4")]


def _model(layers: int, hidden: int = 2048):
    cfg = TransformerConfig(family="gpt2", num_layers=layers, hidden_size=hidden, num_heads=16, vocab_size=50257,
                            max_positions=1024, tied_embeddings=True)
    return transformer_graph(cfg, f"tiny-h{hidden}-l{layers}", 1024)


def _cluster(rng: random.Random, types: int):
    nodes = [{"count": rng.choice([1, 2, 3]), "gpus_per_node": rng.choice([1, 2, 4, 6]), "gpu": gpu,
              "intra_node": link, "nic": "RoCE-100"} for gpu, link in rng.sample(GPUS, types)]
    return parse_cluster({"name": "random", "nodes": nodes})


def _described(configs) -> list[tuple]:
    return [(c.pool.key, c.tp, c.pp, c.split.bounds, c.rate, c.fixed_s) for c in configs]


@pytest.mark.parametrize("seed", range(6))
def test_pool_configs_are_the_reference_configs_in_its_order(seed: int) -> None:
    rng = random.Random(seed)
    model = _model(rng.choice([4, 6, 9]), rng.choice([2048, 4096]))
    cluster = _cluster(rng, rng.choice([1, 2]))
    workload = Workload(rng.choice([12, 16, 24]), 1024)
    compared = 0
    for zero in (0, 1):
        for ignore in (False, True):
            options = search.SearchOptions(ignore_memory=ignore, configs_per_pool=rng.choice([1, 2, 4]))
            ctx = search.make_context(model, cluster, workload, options, zero)
            for pool in ctx.pools:
                for mb in microbatch_options(workload.global_batch, 4):
                    for rc in recompute_modes(workload):
                        total = workload.global_batch // mb
                        got = _described(search._pool_configs(ctx, pool, mb, rc, total))
                        want = _described(pool_configs_reference(ctx, pool, mb, rc, total))
                        assert got == want
                        compared += len(want)
    assert compared > 0


def test_one_pool_splits_no_configuration_when_every_replica_count_divides_the_batch() -> None:
    cluster = parse_cluster({"name": "eight", "nodes": [
        {"count": 2, "gpus_per_node": 4, "gpu": "A100-80GB", "intra_node": "NVLink3", "nic": "RoCE-100"}]})
    ctx = search.make_context(_model(4), cluster, Workload(16, 1024), search.SearchOptions(), 0)
    pool = ctx.pools[0]
    assert search._uneven_replicas(ctx, pool, 16) is False  # 8 devices: 1, 2, 4 or 8 replicas
    assert search._uneven_replicas(ctx, pool, 4) is False  # 8 replicas are more than 4 micro-batches
    assert list(search.typed_structures(ctx)) == []


@pytest.mark.parametrize("gpus,batch", [(6, 16), (3, 8), (8, 16)])
def test_one_pool_lists_the_typed_points_of_listing_every_configuration(monkeypatch, gpus: int, batch: int) -> None:
    cluster = parse_cluster({"name": "one-pool", "nodes": [
        {"count": 1, "gpus_per_node": gpus, "gpu": "V100-32GB", "intra_node": "NVLink2", "nic": "RoCE-100"}]})
    ctx = search.make_context(_model(6), cluster, Workload(batch, 1024), search.SearchOptions(), 0)
    got = [(bound, key) for bound, key, _ in search.typed_structures(ctx)]
    monkeypatch.setattr(search, "_uneven_replicas", lambda *_: True)
    want = [(bound, key) for bound, key, _ in search.typed_structures(ctx)]
    assert got == want
    # 6 and 3 GPUs: 3 (or 6) replicas cannot share 16 (or 8) micro-batches evenly; 8 GPUs always can
    assert (len(want) > 0) == (gpus != 8)
