"""Zones linked only in a chain (a-b, b-c, no a-c link): every planner keeps each pipeline crossing and each
gradient sync on a link, and a tied embedding's reduction between the first and last stage too."""

from __future__ import annotations

import pytest

from hetpart import Workload
from hetpart.cluster import parse_cluster
from hetpart.costmodel.evaluator import Evaluator
from hetpart.costmodel.pools import check_zones_connected, zone_path_ok, zones_linked
from hetpart.errors import WorkloadError
from hetpart.graph.transformer import TransformerConfig, transformer_graph
from hetpart.plan import Plan, Replica, Stage
from hetpart.policies.plan_proportional import plan_proportional
from hetpart.policies.plan_search import plan_search
from hetpart.policies.policy_planner import plan_policy

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
    with pytest.raises(WorkloadError, match=r"joins zones 'a' and 'c', which have no link.*tied embeddings included"):
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
