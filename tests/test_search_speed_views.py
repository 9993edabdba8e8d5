"""Search speed-ups that must not change a value: a view of the cluster met twice is searched once
(:attr:`~hetpart.policies.plan_search.SearchOptions.views`), and the layer split's shortcuts
(:func:`~hetpart.policies.partition.split_layers`: the bound tried before the least sum, the caps' bands cut
once) against the plain computation."""

from __future__ import annotations

import importlib
import math

import numpy as np

from hetpart import Workload
from hetpart.cluster import parse_cluster
from hetpart.costmodel.evaluator import Evaluator
from hetpart.costmodel.pools import fewer_nodes, speed_typed
from hetpart.graph.transformer import TransformerConfig, transformer_graph
from hetpart.policies import partition
from hetpart.policies.partition import brute_force_split, split_layers

search = importlib.import_module("hetpart.policies.plan_search")

CLUSTER = parse_cluster({"name": "slow-two-types", "nodes": [
    {"count": 1, "gpus_per_node": 2, "gpu": "A100-80GB", "intra_node": "NVLink3", "nic": "IB-HDR"},
    {"count": 2, "gpus_per_node": 1, "gpu": "V100-32GB", "intra_node": "PCIe3", "nic": "Ethernet-25"}],
    "slow": {"0/0/1": 0.5}})


def _model():
    cfg = TransformerConfig(family="gpt2", num_layers=4, hidden_size=1024, num_heads=16, vocab_size=50257,
                            max_positions=1024, tied_embeddings=True)
    return transformer_graph(cfg, "tiny-h1024-l4", 512)


def test_two_paths_to_one_view_share_its_key() -> None:
    model, workload = _model(), Workload(8, 512)
    options = search.SearchOptions(time_limit_s=0)
    root = Evaluator(model, CLUSTER, workload)
    typed, to_real = speed_typed(CLUSTER)
    on_typed = Evaluator(model, typed, workload, False, search._OnReal(root.predictor, to_real, CLUSTER))
    typed_half = fewer_nodes(typed, 1)
    half = fewer_nodes(CLUSTER, 1)
    half_typed, half_to_real = speed_typed(half)
    on_half = Evaluator(model, half, workload, False, root.predictor)
    a = search._view_key(model, typed_half, workload, options,
                         Evaluator(model, typed_half, workload, False, on_typed.predictor))
    b = search._view_key(model, half_typed, workload, options,
                         Evaluator(model, half_typed, workload, False,
                                   search._OnReal(on_half.predictor, half_to_real, half)))
    assert typed_half.name != half_typed.name
    assert a == b
    # another view (the whole speed-typed cluster) has a key of its own
    assert search._view_key(model, typed, workload, options, on_typed) != a


class _Forgets(dict):
    """A memo of views that keeps nothing: every view is searched again, as before the memo."""

    def __setitem__(self, key, value) -> None:
        return None


def test_the_memo_of_views_gives_the_search_it_replaces(monkeypatch) -> None:
    model, workload = _model(), Workload(8, 512)
    searched = []
    real = search.plan_search

    def counting(model, cluster, workload, **kwargs):
        searched.append(search._view_key(model, cluster, workload, kwargs["options"], kwargs["evaluator"]))
        return real(model, cluster, workload, **kwargs)

    monkeypatch.setattr(search, "plan_search", counting)
    kept = real(model, CLUSTER, workload, time_limit_s=0, walk=False)
    once = list(searched)
    searched.clear()
    again = real(model, CLUSTER, workload, options=search.SearchOptions(time_limit_s=0, walk=False, views=_Forgets()))
    assert len(set(once)) == len(once)  # no view searched twice
    assert len(searched) > len(once)  # without the memo one view is searched twice
    assert len(set(searched)) == len(once)  # the same views
    assert kept.plan == again.plan
    assert kept.tokens_per_s == again.tokens_per_s


def _chains(seed: int, count: int):
    """Random stage matrices as the search builds them (range sums, memory as ``inf`` past a width, the same
    matrix for stages of one pool), some shifted below zero as the sends moved out of them can."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        n = int(rng.integers(2, 9))
        pp = int(rng.integers(1, min(n, 5) + 1))
        kinds = [partition.range_cost_matrix(rng.uniform(0.1, 2.0, n)) for _ in range(2)]
        width = int(rng.integers(1, n + 1))
        for c in kinds:
            c[np.arange(n + 1)[None, :] - np.arange(n + 1)[:, None] > width] = math.inf
        costs = [kinds[int(rng.integers(0, 2))] for _ in range(pp)]
        if rng.random() < 0.3:
            costs = [c - 0.5 if j == 0 else c for j, c in enumerate(costs)]
        yield costs, int(rng.integers(1, 40)), float(rng.uniform(2.0, 60.0))


def test_the_split_is_the_brute_force_optimum_under_every_threshold() -> None:
    compared = cut = 0
    for costs, m, threshold in _chains(7, 400):
        brute = brute_force_split(costs, m)
        for give_up in (math.inf, threshold):
            got = split_layers(costs, m, give_up_above=give_up)
            want = brute if brute is not None and brute.objective_s < give_up else None
            assert (got is None) == (want is None)
            if got is not None:
                assert math.isclose(got.objective_s, want.objective_s, rel_tol=1e-12, abs_tol=1e-12)
                compared += 1
            else:
                cut += brute is not None
    assert compared > 100 and cut > 20  # both ways ran


def test_min_sums_over_bands_cut_once_equal_bands_cut_per_call() -> None:
    for costs, _, _ in _chains(11, 200):
        finite = np.concatenate([c[np.isfinite(c)] for c in costs])
        caps = np.sort(np.unique(finite))[:16]
        bands = {id(c): partition._band(c) for c in costs[1:-1]}
        assert np.array_equal(partition._min_sums(costs, caps, bands), partition._min_sums(costs, caps))
