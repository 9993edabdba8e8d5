"""Zones linked only in a chain (a-b, b-c, no a-c link): every planner keeps each pipeline crossing and each
gradient sync on a link, and a tied embedding's reduction between the first and last stage too."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from hetpart import Workload, load_model
from hetpart.cluster import parse_cluster
from hetpart.costmodel.evaluator import Evaluator
from hetpart.costmodel.pools import check_zones_connected, zone_path_ok, zones_linked
from hetpart.errors import WorkloadError
from hetpart.graph.transformer import TransformerConfig, transformer_graph
from hetpart.plan import Plan, Replica, Stage
from hetpart.policies.plan_proportional import plan_proportional
from hetpart.policies.plan_search import plan_search
from hetpart.policies.neighbourhood import Neighbourhood, narrow_seeds
from hetpart.policies.policy_planner import plan_policy
from hetpart.policies.structure import Scenario, StructureState

LINKS = [{"zones": ["a", "b"], "bandwidth_gbit_s": 10, "latency_us": 500},
         {"zones": ["b", "c"], "bandwidth_gbit_s": 10, "latency_us": 500}]


def _chain(order: str = "abc"):
    """Three zones of two V100-16GB each, listed in ``order``, linked a-b and b-c only."""
    nodes = [{"count": 1, "gpus_per_node": 2, "gpu": "V100-16GB", "intra_node": "NVLink2", "nic": "Ethernet-25",
              "zone": z} for z in order]
    return parse_cluster({"name": "chain", "nodes": nodes, "links": LINKS}, source="chain.yaml")


def _model(tied: bool, layers: int = 16):
    """A 3.4-3.5B model: its states (about 55 GB) need more than one zone's 29 GB."""
    extra = {} if tied else dict(activation="swiglu", norm="rmsnorm", bias=False, learned_positions=False,
                                 ffn_hidden_size=11008)
    cfg = TransformerConfig(family="gpt2" if tied else "llama", num_layers=layers, hidden_size=4096, num_heads=32,
                            vocab_size=32000, max_positions=4096, tied_embeddings=tied, **extra)
    return transformer_graph(cfg, f"{'tied' if tied else 'untied'}-{layers}", 1024)


def _zones(plan: Plan, cluster) -> list[list[str]]:
    return [[cluster.device(s.devices[0]).zone for s in r.stages] for r in plan.replicas]


def test_zone_helpers_follow_the_links() -> None:
    chain = _chain()
    check_zones_connected(chain)  # reachable through b: planned, not refused
    assert zone_path_ok(chain, "abc") and zone_path_ok(chain, "cba") and zone_path_ok(chain, "aabbc")
    assert not zone_path_ok(chain, "acb") and not zone_path_ok(chain, "aba")  # a-c crossing; a zone twice
    assert not zone_path_ok(chain, "abc", tied=True) and zone_path_ok(chain, "ab", tied=True)
    assert zones_linked(chain, "abb") and not zones_linked(chain, "ac")
    cut = parse_cluster({"name": "cut", "nodes": [
        {"count": 1, "gpus_per_node": 2, "gpu": "V100-16GB", "intra_node": "NVLink2", "nic": "Ethernet-25", "zone": z}
        for z in "abc"], "links": LINKS[:1]}, source="cut.yaml")
    with pytest.raises(WorkloadError, match=r"^cut.yaml: links: zones 'a' and 'c' have no link"):
        check_zones_connected(cut)


@pytest.mark.parametrize("order", ["abc", "cab"])
def test_search_and_policy_run_a_pipeline_along_the_chain(order: str) -> None:
    # Untied: the model needs all three zones, so the pipeline runs a -> b -> c (or back), never across a-c;
    # the cluster's listing order does not decide the pipeline's.
    cluster, model, workload = _chain(order), _model(tied=False), Workload(16, 1024, precision="fp16")
    for found in (plan_search(model, cluster, workload), plan_policy(model, cluster, workload),
                  plan_proportional(model, cluster, workload)):
        assert found.plan.validate(model, cluster) == []
        assert {tuple(z) for z in _zones(found.plan, cluster)} <= {("a", "b", "c"), ("c", "b", "a")}
        assert found.estimate.fits_in_memory and found.tokens_per_s > 0


def test_tied_embeddings_keep_first_and_last_stage_on_linked_zones() -> None:
    cluster, model, workload = _chain(), _model(tied=True), Workload(16, 1024, precision="fp16")
    for found in (plan_search(model, cluster, workload), plan_policy(model, cluster, workload)):
        assert found.plan.validate(model, cluster) == []
        for zones in _zones(found.plan, cluster):
            assert cluster.zones_connected(zones[0], zones[-1])
    # A baseline that must use every pool has no such layout here, and says why.
    with pytest.raises(WorkloadError, match=r"joins zones 'a' and 'c', which have no link.*tied embeddings' reduction included; .--planner search. and .--planner policy. keep to linked zones; where memory is what binds"):
        plan_proportional(model, cluster, workload)
    # The pipeline a -> b -> c is valid for its activations but not for its tied copies: named once, and
    # the simulator is never asked to reduce between a and c.
    stages = ((0, 6), ("0/0/0", "0/0/1")), ((6, 12), ("1/0/0", "1/0/1")), ((12, model.num_units), ("2/0/0", "2/0/1"))
    plan = Plan(workload.global_batch, 1, workload.seq_len,
                (Replica(1.0, tuple(Stage(layers, devices, tp=2) for layers, devices in stages)),), recompute="full",
                precision="fp16")
    problems = plan.validate(model, cluster)
    assert len(problems) == 1 and "the tied weights of 'head' and 'embedding'" in problems[0], problems
    assert "zones 'a' and 'c' have no link" in problems[0]
    assert _model(tied=False).num_units == model.num_units
    assert plan.validate(_model(tied=False), cluster) == []
    assert Evaluator(_model(tied=False), cluster, workload)(plan, split=False) is not None


def _leaves(state):
    if state.done:
        yield state
        return
    allowed = np.flatnonzero(state.action_mask())
    assert len(allowed), (state.phase, state.key())  # the masks never lead into a dead end
    for action in allowed:
        nxt = copy.copy(state)
        nxt.typed = list(state.typed)
        nxt.step(int(action))
        yield from _leaves(nxt)


@pytest.mark.parametrize("tied", [True, False])
def test_policy_masks_keep_every_structure_on_linked_zones(tied: bool) -> None:
    # Every path the policy's masks allow ends in a structure whose plans validate: pools picked along the
    # links, typed replicas only in zones linked to each other, a tied model's first and last zones linked.
    nodes = [{"count": 1, "gpus_per_node": 2, "gpu": gpu, "intra_node": link, "nic": "Ethernet-25", "zone": z}
             for gpu, link, z in (("A100-40GB", "NVLink3", "a"), ("V100-32GB", "NVLink2", "b"),
                                  ("A100-80GB", "NVLink3", "c"))]
    cluster = parse_cluster({"name": "chain-types", "nodes": nodes, "links": LINKS}, source="chain-types.yaml")
    model, workload = _model(tied, layers=4), Workload(8, 1024, precision="fp16")
    leaves = list(_leaves(StructureState(Scenario(model, cluster, workload))))
    assert len(leaves) > 20
    zones_used = set()
    for leaf in leaves:
        scored = leaf.scored()
        assert scored is not None, leaf.key()
        for plan in scored.build():
            assert plan.validate(model, cluster) == [], (leaf.key(), plan.validate(model, cluster))
            zones_used.add(frozenset(cluster.device(d).zone for r in plan.replicas for s in r.stages
                                     for d in s.devices))
    assert frozenset("ab") in zones_used and frozenset("bc") in zones_used
    assert (frozenset("abc") in zones_used) is not tied and frozenset("ac") not in zones_used


def test_policy_seeds_every_pool_alone() -> None:
    # A pool the network and the walks never reach still enters at its best micro-batch: on A100-40GB in
    # zones a and b and 16 A100-80GB in zone c (linked to b only), c alone is best, as search finds.
    nodes = [{"count": 2, "gpus_per_node": 2, "gpu": "A100-40GB", "intra_node": "NVLink3", "nic": "IB-HDR", "zone": "a"},
             {"count": 2, "gpus_per_node": 8, "gpu": "L4-24GB", "intra_node": "PCIe4", "nic": "IB-HDR", "zone": "a"},
             {"count": 2, "gpus_per_node": 2, "gpu": "A100-40GB", "intra_node": "NVLink3", "nic": "IB-HDR", "zone": "b"},
             {"count": 4, "gpus_per_node": 4, "gpu": "A100-80GB", "intra_node": "NVLink3", "nic": "IB-HDR", "zone": "c"}]
    links = [{"zones": ["a", "b"], "bandwidth_gbit_s": 25, "latency_us": 200},
             {"zones": ["b", "c"], "bandwidth_gbit_s": 25, "latency_us": 200}]
    cluster = parse_cluster({"name": "r0", "nodes": nodes, "links": links}, source="r0.yaml")
    model, workload = load_model("gpt3-2.7b", seq_len=2048), Workload(64, 2048, precision="fp16")
    hood = Neighbourhood(Scenario(model, cluster, workload))
    seeds = narrow_seeds(hood)
    assert {p[1] for p in seeds} >= {(i,) for i in range(len(hood.s.pools))}
    assert hood.s.pools[seeds[0][1][0]].key == "A100-80GB@c"  # equally fast: the larger memory first
    found = plan_policy(model, cluster, workload)
    best = plan_search(model, cluster, workload)
    assert found.tokens_per_s >= 0.99 * best.tokens_per_s  # 0.56 before the zone masks and the seeds
