"""HETHUB's upper bound: per-type sums, memory lifting, the roofline, and plans against the bounds."""

from __future__ import annotations

import pytest

from hetpart import Workload, load_cluster
from hetpart.cluster import parse_cluster
from hetpart.costmodel.pools import type_subcluster
from hetpart.costmodel.roofline import roofline_tokens_per_s
from hetpart.policies import plan, plan_search, upper_bound
from hetpart.graph.transformer import TransformerConfig, transformer_graph


def tiny_model(hidden: int, layers: int = 4, seq_len: int = 512):
    cfg = TransformerConfig(family="gpt2", num_layers=layers, hidden_size=hidden, num_heads=16, vocab_size=50257,
                            max_positions=1024)
    return transformer_graph(cfg, f"tiny-h{hidden}", seq_len)


def test_bound_is_the_sum_over_types_of_each_type_alone() -> None:
    model, cluster, workload = tiny_model(2048), load_cluster("tiny-mixed"), Workload(8, 512)
    ub = upper_bound(model, cluster, workload)
    assert set(ub["per_type"]) == {"A100-40GB", "V100-16GB"}
    assert ub["tokens_per_s"] == pytest.approx(sum(t["tokens_per_s"] for t in ub["per_type"].values()))
    alone = plan_search(model, type_subcluster(cluster, "A100-40GB"), workload, include_baselines=False)
    assert ub["per_type"]["A100-40GB"]["tokens_per_s"] == pytest.approx(alone.tokens_per_s)
    assert ub["per_type"]["A100-40GB"]["devices"] == 2 and not ub["per_type"]["A100-40GB"]["memory_lifted"]
    assert ub["definition"].startswith("HETHUB's theoretical upper bound") and ub["definition"].endswith(".")
    best = plan(model, cluster, workload, "search").prediction.tokens_per_s
    assert best <= ub["memory_lifted_tokens_per_s"] <= ub["roofline_tokens_per_s"]
    assert ub["tokens_per_s"] <= ub["memory_lifted_tokens_per_s"]


def test_a_type_that_cannot_hold_the_model_alone_counts_with_memory_lifted() -> None:
    model = tiny_model(5120, layers=6)  # ~2.2B parameters: 35 GB of states, more than two V100-16GB hold
    cluster, workload = load_cluster("tiny-mixed"), Workload(8, 512)
    ub = upper_bound(model, cluster, workload)
    v100 = ub["per_type"]["V100-16GB"]
    assert v100["memory_lifted"] and v100["tokens_per_s"] > 0
    assert v100["tokens_per_s"] == pytest.approx(v100["memory_lifted_tokens_per_s"])
    assert not ub["per_type"]["A100-40GB"]["memory_lifted"]


def test_roofline_sums_peak_times_best_efficiency() -> None:
    model = tiny_model(2048)
    one = parse_cluster({"name": "one", "nodes": [{"count": 1, "gpus_per_node": 1, "gpu": "A100-80GB",
                                                   "intra_node": "NVLink3", "nic": "IB-HDR"}]})
    eight = load_cluster("a100-8")
    r1, r8 = roofline_tokens_per_s(model, one), roofline_tokens_per_s(model, eight)
    assert r8 == pytest.approx(8 * r1)
    assert 0 < r1 < 312e12 / model.flops_per_token  # below the datasheet peak


def test_type_subcluster_keeps_only_that_type_and_its_links() -> None:
    cluster = load_cluster("h100-a100-two-zones")
    sub = type_subcluster(cluster, "A100-80GB")
    assert sub.gpu_types == ["A100-80GB"] and sub.num_devices == 16 and sub.zone_links == ()
    with pytest.raises(ValueError, match="no T4-16GB"):
        type_subcluster(cluster, "T4-16GB")


def test_a_type_split_over_unlinked_zones_counts_each_part() -> None:
    chain = parse_cluster({"name": "chain", "nodes": [
        {"count": 1, "gpus_per_node": 2, "gpu": "A100-40GB", "intra_node": "NVLink3", "nic": "IB-HDR", "zone": "a"},
        {"count": 1, "gpus_per_node": 2, "gpu": "V100-16GB", "intra_node": "NVLink2", "nic": "IB-HDR", "zone": "b"},
        {"count": 1, "gpus_per_node": 2, "gpu": "A100-40GB", "intra_node": "NVLink3", "nic": "IB-HDR", "zone": "c"}],
        "links": [{"zones": ["a", "b"], "bandwidth_gbit_s": 100}, {"zones": ["b", "c"], "bandwidth_gbit_s": 100}]})
    model, workload = tiny_model(2048), Workload(8, 512)
    ub = upper_bound(model, chain, workload)  # A100s in a and c cannot talk without b's link
    half = plan_search(model, type_subcluster(chain, "A100-40GB", {"a"}), workload, include_baselines=False)
    assert ub["per_type"]["A100-40GB"]["tokens_per_s"] == pytest.approx(2 * half.tokens_per_s)
    assert ub["per_type"]["A100-40GB"]["devices"] == 4
