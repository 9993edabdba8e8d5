"""Search uses part of a pool: ``dp`` replicas take ``groups // dp`` tensor-parallel groups each, the rest sit out."""

from __future__ import annotations

import pytest

from hetpart import Workload
from hetpart.cluster import parse_cluster
from hetpart.costmodel.evaluator import Evaluator, best_of
from hetpart.costmodel.pools import device_pools
from hetpart.graph.transformer import TransformerConfig, transformer_graph
from hetpart.policies.idle import idle_devices, idle_lines
from hetpart.policies.plan_search import (SearchOptions, _mixed_groups, _mixed_shapes, make_context, pipeline_depths,
                                          plan_search, replica_counts)
from hetpart.policies.search_reference import space_plans

THREE_A100 = parse_cluster({"name": "three-a100", "nodes": [
    {"count": 1, "gpus_per_node": 3, "gpu": "A100-80GB", "intra_node": "NVLink3", "nic": "Ethernet-25"}]})
A100_V100 = parse_cluster({"name": "three-a100-two-v100", "nodes": [
    {"count": 1, "gpus_per_node": 3, "gpu": "A100-80GB", "intra_node": "NVLink3", "nic": "Ethernet-25"},
    {"count": 1, "gpus_per_node": 2, "gpu": "V100-32GB", "intra_node": "NVLink2", "nic": "Ethernet-25"}]})
OWN_SPACE = {"walk": False, "refine_steps": 0, "fewer_nodes": False, "include_baselines": False}
"""The search's own space only: no walk, climb, fewer-nodes views or baselines (they reach plans outside it)."""


def _model(layers: int = 4):
    cfg = TransformerConfig(family="gpt2", num_layers=layers, hidden_size=2048, num_heads=16, vocab_size=50257,
                            max_positions=1024, tied_embeddings=True)
    return transformer_graph(cfg, f"tiny-h2048-l{layers}", 512)


def _used(plan) -> set[str]:
    return {d for r in plan.replicas for s in r.stages for d in s.devices}


def _whole_pools(plan, cluster) -> bool:
    """Every pool the plan touches, it uses whole (the space before partial pools)."""
    used = _used(plan)
    return all(not used & set(p.devices) or set(p.devices) <= used for p in device_pools(cluster))


def test_replica_counts_and_pipeline_depths_include_the_floors() -> None:
    assert replica_counts([480], 2048) == [1, 2, 4, 8, 16, 32, 64, 128, 256]  # 64 x 7 of 480 groups among them
    assert replica_counts([6, 4], 8) == [1, 2, 4]  # 2: 3 + 2 groups each; 4: 1 + 1 each, 2 + 0 idle
    assert replica_counts([3], 6) == [1, 3]  # 2 replicas of one group each: 3 take the same share, none idle
    assert replica_counts([4], 8) == [1, 2, 4]  # the divisors where they divide: nothing idle
    assert pipeline_depths(12, 12) == [1, 2, 3, 4, 6, 12]
    assert pipeline_depths(14, 8) == [1, 2, 3, 4, 7]  # 7: 2 replicas; 5 and 6 leave a stage of each idle
    assert pipeline_depths(480, 8) == [1, 2, 3, 4, 5, 6, 7, 8]  # 7: 68 replicas, 4 groups idle


def test_mixed_groups_leave_the_pools_last_groups_idle_in_both_placements() -> None:
    ctx = make_context(_model(), THREE_A100, Workload(2, 512), SearchOptions())
    pool = ctx.pools[0]
    assert [s for s in _mixed_shapes(ctx) if s[2] == 2] == [((pool,), (1,), 2)]  # 2 replicas of 1 of 3 groups
    for placement in ("pp", "dp"):
        replicas = _mixed_groups((pool,), (1,), 2, placement)
        assert replicas == [[("0/0/0",)], [("0/0/1",)]]


def test_reference_space_holds_the_partial_plans() -> None:
    plans = list(space_plans(_model(), THREE_A100, Workload(2, 512), zero=0))
    partial = [p for p in plans if not _whole_pools(p, THREE_A100)]
    assert len(partial) > 0
    assert {frozenset(_used(p)) for p in partial} == {frozenset({"0/0/0", "0/0/1"})}
    assert all(p.validate(_model(), THREE_A100) == [] for p in partial)


@pytest.mark.parametrize("cluster,batch", [(THREE_A100, 2), (A100_V100, 4)])
def test_search_finds_the_brute_force_optimum_which_leaves_an_a100_idle(cluster, batch) -> None:
    """Brute force over the reference space: the best plan runs two one-GPU replicas on two of the three A100s
    (batch 2 or 4: three replicas share it unevenly, the slowest paces the step, and a 3-stage pipeline
    idles in its bubble); the best
    plan of whole pools is slower, and the search's own space reaches the optimum."""
    model, workload = _model(), Workload(batch, 512)
    evaluate = Evaluator(model, cluster, workload)
    priced = [(evaluate(p), p) for p in space_plans(model, cluster, workload)]
    brute = best_of(e for e, _ in priced)
    whole = best_of(e for e, p in priced if _whole_pools(p, cluster))
    assert _used(brute.plan) == {"0/0/0", "0/0/1"}
    assert brute.plan.dp == 2
    assert brute.tokens_per_s > 1.1 * whole.tokens_per_s  # 1.32x and 1.17x
    found = plan_search(model, cluster, workload, **OWN_SPACE)
    assert found.tokens_per_s == pytest.approx(brute.tokens_per_s, rel=1e-9)
    assert _used(found.plan) == {"0/0/0", "0/0/1"}
    assert found.plan.validate(model, cluster) == []
    found.plan.check(model, cluster, source="test")  # the runtime's rules: raises on a plan it does not run
    default = plan_search(model, cluster, workload)  # the walk, climb and views only add candidates
    assert default.tokens_per_s >= found.tokens_per_s


def test_the_runtime_places_ranks_on_the_used_devices_only() -> None:
    from hetpart.runtime.launch import node_ranks

    found = plan_search(_model(), THREE_A100, Workload(2, 512), **OWN_SPACE)
    assert sorted(found.plan.devices) == ["0/0/0", "0/0/1"]
    assert node_ranks(found.plan.devices, THREE_A100) == [[0, 1]]  # two ranks on the one node, none for 0/0/2


def test_idle_devices_say_which_sit_out_and_why() -> None:
    found = plan_search(_model(), THREE_A100, Workload(2, 512), **OWN_SPACE)
    summary = idle_devices(found.plan, THREE_A100)
    assert summary["devices"] == 1 and summary["of"] == 3
    assert summary["by_pool"][0]["ids"] == "0/0/2"
    assert summary["by_pool"][0]["why"] == ("the batch's 2 sequences give each of the 2 replicas one: another "
                                            "replica would have none")
    assert idle_lines(found.plan, THREE_A100)[0] == "  idle: 1 of 3 devices"
    on_v100 = plan_search(_model(), A100_V100, Workload(4, 512), **OWN_SPACE)
    pools = {p["gpu"]: p for p in idle_devices(on_v100.plan, A100_V100)["by_pool"]}
    assert pools["V100-32GB"]["why"] == ("no device of this type in the plan: the plans the planner priced with them "
                                        "were slower")
    assert pools["A100-80GB"]["why"] == ("the replicas share the batch's 4 sequences evenly, and the next count that "
                                        "divides them needs 2 more of this type than the 1 left over")
