"""A tied weight is gathered and reduce-scattered once per stage at levels 1-3 (``Simulator._shard_comm``): a head's
copy of its token embedding is the embedding's weight on a stage that holds both, and a weight of its own only on a
stage without the embedding (Megatron's last pipeline stage keeps its own copy of the word embeddings). Before,
each unit gathered ``params_per_device`` of itself alone, so gpt2-small on one stage gathered 163.0 M parameters
a step: the model's 124.4 M and the head's 38.6 M copy again."""

from __future__ import annotations

import pytest

from hetpart import Plan, Replica, Stage, load_model
from hetpart.cluster import parse_cluster
from hetpart.costmodel.simulator import Simulator

S = 128
NODES = {"name": "two", "nodes": [{"count": 2, "gpus_per_node": 2, "gpu": "A100-80GB", "intra_node": "NVLink3",
                                   "nic": "Ethernet-25"}]}


@pytest.fixture(scope="module")
def model():
    return load_model("gpt2-small", seq_len=S)


def _plan(cuts: list[list[int]], zero: int) -> Plan:
    """One replica per node, replica ``r`` cut at ``cuts[r]`` (its stages on the node's devices in order)."""
    return Plan(global_batch=8, micro_batch=1, seq_len=S, zero=zero, recompute="none", replicas=tuple(
        Replica(0.5, tuple(Stage((a, b), (f"0/{r}/{j}",)) for j, (a, b) in enumerate(zip(c[:-1], c[1:]))))
        for r, c in enumerate(cuts)))


def _gathered(sim: Simulator, plan: Plan) -> float:
    """Parameters the plan's shard rings gather once each (their all-gathers' bytes over the bf16 width)."""
    sizes: list[float] = []
    price = sim._reduce_scatter_s

    def spy(nbytes, ring):
        sizes.append(nbytes)
        return price(nbytes, ring)

    sim._reduce_scatter_s = spy
    sim._shard_comm(plan)
    sim._reduce_scatter_s = price
    return sum(sizes[0::2]) / 2  # per unit a gather (2 bytes a parameter) then a reduce-scatter


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_one_stage_gathers_the_model_once(model, zero: int) -> None:
    sim = Simulator(model, parse_cluster(NODES))
    n = model.num_units
    copy = model.units[n - 1].shared_params
    assert copy == 50257 * 768
    assert _gathered(sim, _plan([[0, n], [0, n]], zero)) == pytest.approx(model.num_params, rel=1e-12)  # 124.4 M
    # a pipeline's last stage keeps its own copy: gathered there as a weight of its own
    assert _gathered(sim, _plan([[0, 6, n], [0, 6, n]], zero)) == pytest.approx(model.num_params + copy, rel=1e-12)


def test_replicas_cut_unlike_gather_the_copy_where_one_holds_it_apart(model) -> None:
    """A ring whose holders' stages all hold the embedding gathers no copy; one with a stage holding the head without
    it gathers the copy (that stage's own weight)."""
    sim = Simulator(model, parse_cluster(NODES))
    n = model.num_units
    copy = model.units[n - 1].shared_params
    unlike = _plan([[0, 6, n], [0, n]], 2)
    assert _gathered(sim, unlike) == pytest.approx(model.num_params + copy, rel=1e-12)
    alone = dict((u, g) for u, g, _ in sim._shard_comm(_plan([[0, n], [0, n]], 2))[(0, 0)])[n - 1]
    apart = dict((u, g) for u, g, _ in sim._shard_comm(unlike)[(0, 1)])[n - 1]
    assert apart > 50 * alone  # the 38.6 M-parameter copy against the final norm's 1,536


def test_the_unit_by_unit_reference_agrees(model) -> None:
    from hetpart.costmodel.sharding_reference import reference_unit_gather_s, reference_unit_scatter_s

    cluster = parse_cluster(NODES)
    sim = Simulator(model, cluster)
    n = model.num_units
    for cuts in ([[0, n], [0, n]], [[0, 6, n], [0, 6, n]], [[0, 6, n], [0, n]]):
        plan = _plan(cuts, 2)
        for (r, _k), rows in sim._shard_comm(plan).items():
            for u, gather, scatter in rows:
                assert gather == pytest.approx(reference_unit_gather_s(model, cluster, plan, r, u), rel=1e-9)
                assert scatter == pytest.approx(reference_unit_scatter_s(model, cluster, plan, r, u), rel=1e-9)
