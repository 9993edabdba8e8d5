"""The search planner: exact layer split and batch shares (vs brute force), cost tables that mirror
the simulator, an exact branch-and-bound, and the search's answer vs every plan of its space."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import numpy as np
import pytest

from hetpart import Workload, load_cluster
from hetpart.cluster import parse_cluster
from hetpart.costmodel.compute import unit_compute_s, unit_tp_comm_s
from hetpart.costmodel.links import achieved_link
from hetpart.costmodel.evaluator import Evaluator, best_of
from hetpart.costmodel.memory import stage_memory_gb
from hetpart.costmodel.pools import device_pools, tp_groups
from hetpart.costmodel.simulator import simulate
from hetpart.policies.partition import (allocate_microbatches, brute_force_allocate, brute_force_split,
                                         range_cost_matrix, split_layers)
from hetpart.policies.plan_search import SearchOptions, plan_search
from hetpart.policies.search_costs import CostTable
from hetpart.policies.search_reference import space_plans
from hetpart.errors import PlanError, WorkloadError
from hetpart.graph.transformer import TransformerConfig, transformer_graph


def tiny_model(hidden: int = 2048, layers: int = 4, seq_len: int = 512, tied: bool = True):
    cfg = TransformerConfig(family="gpt2", num_layers=layers, hidden_size=hidden, num_heads=16, vocab_size=50257,
                            max_positions=1024, tied_embeddings=tied)
    return transformer_graph(cfg, f"tiny-h{hidden}-l{layers}", seq_len)


THREE_TYPES = parse_cluster({"name": "three-small", "nodes": [
    {"count": 1, "gpus_per_node": 2, "gpu": "A100-80GB", "intra_node": "NVLink3", "nic": "Ethernet-25"},
    {"count": 1, "gpus_per_node": 2, "gpu": "V100-32GB", "intra_node": "NVLink2", "nic": "Ethernet-25"},
    {"count": 1, "gpus_per_node": 1, "gpu": "T4-16GB", "intra_node": "PCIe3", "nic": "Ethernet-25"}]})


def _random_costs(rng: np.random.Generator, n: int, pp: int) -> list[np.ndarray]:
    costs = []
    for _ in range(pp):
        c = range_cost_matrix(rng.uniform(0.1, 2.0, n), rng.uniform(0.0, 0.5))
        c[rng.uniform(size=c.shape) < 0.15] = math.inf  # ranges that do not fit in memory
        costs.append(c)
    return costs


def test_layer_split_dp_matches_brute_force_on_random_costs() -> None:
    rng = np.random.default_rng(0)
    checked = 0
    for _ in range(300):
        n = int(rng.integers(2, 10))
        pp = int(rng.integers(1, min(n, 5) + 1))
        m = int(rng.integers(1, 12))
        costs = _random_costs(rng, n, pp)
        fast, slow = split_layers(costs, m), brute_force_split(costs, m)
        assert (fast is None) == (slow is None)
        if fast is not None:
            checked += 1
            assert fast.objective_s == pytest.approx(slow.objective_s, rel=1e-12)
            times = [costs[j][a, b] for j, (a, b) in enumerate(fast.ranges)]
            assert fast.objective_s == pytest.approx((m - 1) * max(times) + sum(times), rel=1e-12)
    assert checked > 200


def test_batch_allocation_matches_brute_force_and_covers_the_batch() -> None:
    rng = random.Random(1)
    for _ in range(300):
        k = rng.randint(1, 4)
        total = rng.randint(k, 13)
        per = [round(rng.uniform(0.1, 2.0), rng.choice([1, 3])) for _ in range(k)]
        fixed = [round(rng.uniform(0.0, 3.0), rng.choice([0, 2])) for _ in range(k)]
        counts = allocate_microbatches(per, fixed, total)
        assert sum(counts) == total and min(counts) >= 1
        worst = max(f + p * c for p, f, c in zip(per, fixed, counts))
        assert worst == pytest.approx(brute_force_allocate(per, fixed, total), rel=1e-12)
    with pytest.raises(ValueError, match="cannot feed"):
        allocate_microbatches([1.0, 1.0, 1.0], [0.0, 0.0, 0.0], 2)


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_cost_table_mirrors_the_simulator_primitives(recompute: str) -> None:
    model = tiny_model(layers=5)
    cluster = load_cluster("tiny-mixed")
    table = CostTable(model, cluster, "bf16")
    rng = random.Random(2)
    for pool in device_pools(cluster):
        for tp in (1, 2):
            costs = table.get(pool, tp, 2, recompute)
            fwd, bwd = unit_compute_s(model, pool.gpu, tp, 2, "bf16", recompute, kernels="fused")
            expect = fwd + bwd
            if tp > 1:
                group = tp_groups(pool, tp)[0]
                link = achieved_link(cluster, *group)  # what collectives reach over the hop
                tpf, tpb = unit_tp_comm_s(model, tp, 2, recompute, link.bandwidth_gbyte_s, link.latency_us)
                expect = expect + tpf + tpb
            for _ in range(20):
                a = rng.randrange(model.num_units)
                b = rng.randrange(a + 1, model.num_units + 1)
                flight = rng.choice([1, 2, 3.5])
                assert costs.time_s[a, b] == pytest.approx(expect[a:b].sum(), rel=1e-12)
                assert costs.memory_gb(a, b, flight) == pytest.approx(
                    stage_memory_gb(model, a, b, tp, 2, flight, recompute), rel=1e-12)


def _random_plans(model, cluster, workload, count: int, seed: int):
    # sharded, the space holds typed points whose replicas are cut unlike with tensor parallelism, which the
    # rules refuse (the evaluator drops them): the bound is checked on the plans that can run
    plans = [p for p in space_plans(model, cluster, workload) if not p.validate(model, cluster)]
    return random.Random(seed).sample(plans, min(count, len(plans)))


def test_branch_and_bound_is_exact_and_its_bound_never_exceeds_the_simulation() -> None:
    model, cluster = tiny_model(hidden=4096), load_cluster("tiny-mixed")
    workload = Workload(8, 512, recompute="auto")
    plans = _random_plans(model, cluster, workload, 250, seed=3)
    full = Evaluator(model, cluster, workload)
    results = [full(p) for p in plans]
    for p, r in zip(plans, results):
        assert full.fits(p) == simulate(model, cluster, p).fits_in_memory  # the filter is the simulator's rule
        if r is not None:
            assert full.lower_bound_s(p) <= r.step_time_s
    assert any(r is None for r in results) and any(r is not None for r in results)  # memory binds
    pruned = Evaluator(model, cluster, workload)
    best = pruned.best(plans)
    assert best.tokens_per_s == pytest.approx(best_of(results).tokens_per_s, rel=1e-12)
    assert pruned.simulations < full.simulations


CASES = [  # (hidden, layers, seq_len, global_batch, recompute): memory binds in most
    (4096, 4, 512, 8, "auto"), (5120, 3, 512, 6, "none"), (5120, 4, 1024, 6, "full"),
    (5120, 5, 256, 12, "selective"), (3072, 3, 1024, 8, "none"),
]


@pytest.mark.parametrize("hidden,layers,seq_len,batch,recompute", CASES)
def test_search_finds_the_simulated_optimum_of_its_space(hidden, layers, seq_len, batch, recompute) -> None:
    """Alpa-style differential test: simulate every plan of the space on a 4-GPU, 2-type cluster."""
    model, cluster = tiny_model(hidden, layers, seq_len), load_cluster("tiny-mixed")
    workload = Workload(batch, seq_len, recompute=recompute)
    evaluate = Evaluator(model, cluster, workload)
    brute = best_of(evaluate(p) for p in space_plans(model, cluster, workload))
    found = plan_search(model, cluster, workload, include_baselines=False)
    assert found.estimate.fits_in_memory and simulate(model, cluster, found.plan).fits_in_memory
    assert found.tokens_per_s == pytest.approx(brute.tokens_per_s, rel=1e-9)
    if recompute != "auto":
        assert found.plan.recompute == recompute


def test_search_finds_the_optimum_on_three_device_types() -> None:
    model = tiny_model(hidden=3072, layers=3, seq_len=512)
    workload = Workload(4, 512, recompute="selective")
    evaluate = Evaluator(model, THREE_TYPES, workload)
    brute = best_of(evaluate(p) for p in space_plans(model, THREE_TYPES, workload))
    found = plan_search(model, THREE_TYPES, workload, include_baselines=False)
    assert found.tokens_per_s == pytest.approx(brute.tokens_per_s, rel=1e-9)


def test_search_beats_every_hand_built_plan_of_a_small_cluster() -> None:
    """Plans a person would write for 2 A100 + 2 V100: data parallel, one pipeline per type, mixed."""
    from hetpart.plan import Plan, Replica, Stage

    model, cluster = tiny_model(hidden=2048, layers=4), load_cluster("tiny-mixed")
    workload = Workload(8, 512, recompute="none")
    n = model.num_units
    hand = [
        Plan(8, 1, 512, tuple(Replica(0.25, (Stage((0, n), (d,)),)) for d in ("0/0/0", "0/0/1", "1/0/0", "1/0/1"))),
        Plan(8, 1, 512, (Replica(1.0, (Stage((0, 4), ("0/0/0", "0/0/1"), 2), Stage((4, n), ("1/0/0", "1/0/1"), 2))),)),
        Plan(8, 2, 512, (Replica(0.75, (Stage((0, n), ("0/0/0", "0/0/1"), 2),)),
                         Replica(0.25, (Stage((0, n), ("1/0/0", "1/0/1"), 2),)))),
        Plan(8, 1, 512, tuple(Replica(0.5, (Stage((0, 2), (v,)), Stage((2, n), (a,))))
                              for a, v in (("0/0/0", "1/0/0"), ("0/0/1", "1/0/1")))),
    ]
    evaluate = Evaluator(model, cluster, workload)
    found = plan_search(model, cluster, workload)
    for p in hand:
        assert not p.validate(model, cluster)
        e = evaluate(p)
        assert e is not None and found.tokens_per_s >= e.tokens_per_s


def test_search_options_and_zone_errors() -> None:
    model = tiny_model()
    cut = parse_cluster({"name": "cut", "nodes": [
        {"count": 1, "gpus_per_node": 2, "gpu": "A100-40GB", "intra_node": "NVLink3", "nic": "IB-HDR", "zone": "a"},
        {"count": 1, "gpus_per_node": 2, "gpu": "A100-40GB", "intra_node": "NVLink3", "nic": "IB-HDR", "zone": "b"}]},
        source="cut.yaml")
    with pytest.raises(WorkloadError, match=r"cut.yaml: links: zones 'a' and 'b' have no link.*add"):
        plan_search(model, cut, Workload(8, 512))
    with pytest.raises(PlanError, match=r"planner 'search': unknown option\(s\) no_such_option; it takes .*top_k"):
        plan_search(model, load_cluster("tiny-mixed"), Workload(8, 512), no_such_option=1)
    quick = plan_search(model, load_cluster("tiny-mixed"), Workload(8, 512), options=SearchOptions(top_k=1),
                        refine_steps=0, include_baselines=False)
    assert quick.estimate.fits_in_memory


def test_interleaved_variant_keeps_each_devices_units_in_round_robin_chunks() -> None:
    from hetpart.policies.refine import interleaved
    from hetpart.plan import Plan, Replica, Stage

    model, cluster = tiny_model(layers=8), load_cluster("tiny-mixed")  # 10 units
    base = Plan(8, 1, 512, (Replica(1.0, (Stage((0, 3), ("1/0/0",)), Stage((3, 7), ("0/0/0",)),
                                          Stage((7, 10), ("0/0/1",)))),))
    two = interleaved(base, 2)
    assert two.schedule == "interleaved" and two.interleave == 2 and not two.validate(model, cluster)
    assert [s.layers for s in two.replicas[0].stages] == [(0, 2), (2, 4), (4, 6), (6, 7), (7, 9), (9, 10)]
    per_device = {}
    for s in two.replicas[0].stages:
        per_device[s.devices] = per_device.get(s.devices, 0) + s.num_layers
    assert per_device == {("1/0/0",): 3, ("0/0/0",): 4, ("0/0/1",): 3}
    assert interleaved(base, 4) is None  # a device holds only 3 units
    assert interleaved(two, 2) is None  # already interleaved


TWO_V100 = parse_cluster({"name": "two-v100", "nodes": [
    {"count": 1, "gpus_per_node": 2, "gpu": "V100-16GB", "intra_node": "NVLink2", "nic": "Ethernet-25"}]})


def _huge_vocab():
    """A 1.05e9-parameter embedding: 16.8 GB of states unsharded, more than a V100-16GB holds, so only
    data parallelism with sharded states fits it (a pipeline cannot split one unit; 15 heads rule out TP 2)."""
    cfg = TransformerConfig(family="gpt2", num_layers=2, hidden_size=1020, num_heads=15, vocab_size=1_030_000,
                            max_positions=1024, tied_embeddings=True)
    return transformer_graph(cfg, "huge-vocab", 128)


def test_search_shards_at_the_lowest_level_where_its_space_fits_and_finds_that_levels_optimum() -> None:
    model, workload = _huge_vocab(), Workload(4, 128, recompute="selective")
    evaluate = Evaluator(model, TWO_V100, workload)
    assert best_of(evaluate(p) for p in space_plans(model, TWO_V100, workload, zero=0)) is None
    brute = best_of(evaluate(p) for p in space_plans(model, TWO_V100, workload, zero=1))
    found = plan_search(model, TWO_V100, workload, include_baselines=False)
    assert found.plan.zero == 1 and found.plan.dp == 2
    assert found.tokens_per_s == pytest.approx(brute.tokens_per_s, rel=1e-9)


@pytest.mark.parametrize("zero", [2, 3])
def test_search_at_a_fixed_level_finds_the_optimum_of_that_level(zero: int) -> None:
    model, cluster = tiny_model(4096, 4, 512), load_cluster("tiny-mixed")
    workload = Workload(8, 512, recompute="auto", zero=zero)
    evaluate = Evaluator(model, cluster, workload)
    brute = best_of(evaluate(p) for p in space_plans(model, cluster, workload))
    found = plan_search(model, cluster, workload, include_baselines=False)
    assert all(p.zero in (0, zero) for p in [found.plan, brute.plan])  # one replica shards nothing
    assert found.tokens_per_s == pytest.approx(brute.tokens_per_s, rel=1e-9)


def test_baselines_shard_everything_where_nothing_fits_otherwise() -> None:
    from hetpart.policies.plan_proportional import plan_proportional
    from hetpart.policies.plan_uniform import plan_uniform

    model, workload = _huge_vocab(), Workload(4, 128, recompute="selective")
    for planner in (plan_uniform, plan_proportional):
        best = planner(model, TWO_V100, workload)
        assert best.plan.zero == 1 and best.estimate.fits_in_memory  # level 3 would gather the embedding whole
    with pytest.raises(WorkloadError):
        plan_uniform(model, TWO_V100, Workload(4, 128, recompute="selective", zero=0))


A100_T4 = parse_cluster({"name": "a100-t4", "nodes": [
    {"count": 1, "gpus_per_node": 1, "gpu": "A100-80GB", "intra_node": "NVLink3", "nic": "Ethernet-100"},
    {"count": 1, "gpus_per_node": 1, "gpu": "T4-16GB", "intra_node": "PCIe3", "nic": "Ethernet-100"}]})


@pytest.mark.parametrize("counts", [(3, 1), (2, 2), (1, 3)])
def test_uneven_shard_fractions_fit_where_even_ones_do_not_and_beat_every_fraction_of_a_grid(counts) -> None:
    """An A100-80GB and a T4-16GB as two ZeRO-1 replicas of a 1.8B model: even shards do not fit the T4;
    the water-filled fractions (for each batch split) fit and are at least as fast as the best fitting
    point of a 1% grid of fractions (brute force: the padded collectives favour the evenest fractions)."""
    from hetpart.costmodel.simulator import Simulator
    from hetpart.plan import Plan, Replica, Stage
    from hetpart.policies.shard_fractions import choose_shard_fractions

    model = tiny_model(hidden=4096, layers=8, seq_len=256)
    sim = Simulator(model, A100_T4)
    base = Plan(global_batch=4, micro_batch=1, seq_len=256, recompute="full", zero=1, replicas=tuple(
        Replica(c / 4, (Stage((0, model.num_units), (d,)),)) for c, d in zip(counts, ("0/0/0", "1/0/0"))))
    assert not sim.simulate(base).fits_in_memory
    chosen = choose_shard_fractions(model, A100_T4, base)
    got = sim.simulate(replace(base, shard_fractions=chosen))
    grid = [sim.simulate(replace(base, shard_fractions=(1 - i / 100, i / 100))) for i in range(1, 100)]
    best = min((p.step_time_s for p in grid if p.fits_in_memory), default=math.inf)
    assert got.fits_in_memory and chosen[1] < 0.5 and got.step_time_s <= best * (1 + 1e-12)



def test_typed_replicas_hold_uneven_fractions_by_default_where_the_runtime_runs_them() -> None:
    """The search's default lets a data-parallel group of an A100-80GB and a T4-16GB hold water-filled
    fractions at levels 1-2 (hetpart's distributed optimizer runs them), next to the same plan with even
    shards (padded collectives can cost more than the memory saves); at level 3 (FSDP2: equal torch.chunk
    shards) it keeps them even, and ``uneven_shards=False`` keeps every level even."""
    from hetpart.policies.plan_search import SearchOptions, make_context, typed_structures
    from hetpart.rules import uneven_shard_problems

    model = tiny_model(hidden=4096, layers=8, seq_len=256)
    wl = Workload(4, 256, recompute="full")

    def built(zero: int, **options) -> list:
        ctx = make_context(model, A100_T4, wl, SearchOptions(**options), zero)
        return [p for _, _, score in typed_structures(ctx) for s in [score(math.inf)] if s is not None for p in s.build()]

    from hetpart.policies.shard_fractions import choose_shard_fractions

    for zero in (1, 2):
        plans = built(zero)
        uneven, even = plans[0::2], plans[1::2]  # each point: its water-filled plan, then the same plan even
        assert plans and len(uneven) == len(even)
        assert all(p.shard_fractions is not None and p.shard_fractions[1] < 0.5 for p in uneven)
        assert all(replace(u, shard_fractions=None) == e for u, e in zip(uneven, even))
        assert all(uneven_shard_problems(p) == [] for p in plans)
        assert all(p.shard_fractions is None for p in built(zero, uneven_shards=False))
    even = replace(plans[0], shard_fractions=None)
    assert choose_shard_fractions(model, A100_T4, even) is not None
    assert choose_shard_fractions(model, A100_T4, replace(even, zero=3)) is None
    assert choose_shard_fractions(model, A100_T4, replace(even, shard_group=2)) is None


A100_4090 = parse_cluster({"name": "a100-4090", "nodes": [
    {"count": 1, "gpus_per_node": 1, "gpu": "A100-80GB", "intra_node": "NVLink3", "nic": "IB-NDR"},
    {"count": 1, "gpus_per_node": 1, "gpu": "RTX4090-24GB", "intra_node": "PCIe4", "nic": "IB-NDR"}]})


def test_search_with_uneven_fractions_finds_the_optimum_of_its_space_and_beats_even_shards() -> None:
    """An A100-80GB and an RTX 4090-24GB, a 1.8B-parameter model at ZeRO-1 without recompute: every plan
    of the space (mixed pipelines, typed replicas with every split and batch allocation, each also with its
    water-filled fractions) simulated; the search returns the best, it holds uneven fractions, and it is
    faster than the search kept to even shards (which finds the optimum of the even plans)."""
    model = tiny_model(hidden=4096, layers=8, seq_len=512)
    workload = Workload(32, 512, recompute="none", zero=1)  # 16: one 2-stage pipeline wins (padded vocabulary)
    evaluate = Evaluator(model, A100_4090, workload)
    plans = list(space_plans(model, A100_4090, workload))
    brute = best_of(evaluate(p) for p in plans)
    brute_even = best_of(evaluate(p) for p in plans if p.shard_fractions is None)
    # the space as searched, without the hill-climb's interleaving (which may go beyond it: 25,368 > 24,808)
    found = plan_search(model, A100_4090, workload, include_baselines=False, refine_steps=0)
    even = plan_search(model, A100_4090, workload, include_baselines=False, uneven_shards=False, refine_steps=0)
    assert found.tokens_per_s == pytest.approx(brute.tokens_per_s, rel=1e-9)
    assert even.tokens_per_s == pytest.approx(brute_even.tokens_per_s, rel=1e-9)
    assert found.plan.shard_fractions is not None and found.plan.shard_fractions[1] < 0.5
    assert found.tokens_per_s > even.tokens_per_s * 1.02


def test_allowing_uneven_fractions_never_ends_below_the_search_without_them() -> None:
    """gpt3-2.7b on 2 A100-80GB + 2 RTX 4090-24GB: the best candidate before the hill-climb is a typed plan,
    while the mixed pipeline climbs higher (to its interleaved variant); the climb starts from the best of
    each family, so the search with uneven fractions allowed was 1.6% below the one without, and is not."""
    from hetpart import load_model

    cluster = parse_cluster({"name": "a100-4090-2x2", "nodes": [
        {"count": 1, "gpus_per_node": 2, "gpu": "A100-80GB", "intra_node": "NVLink3", "nic": "IB-NDR"},
        {"count": 1, "gpus_per_node": 2, "gpu": "RTX4090-24GB", "intra_node": "PCIe4-host", "nic": "IB-NDR"}]})
    model, workload = load_model("gpt3-2.7b", seq_len=2048), Workload(32, 2048, zero=1)
    uneven = plan_search(model, cluster, workload)
    even = plan_search(model, cluster, workload, uneven_shards=False)
    assert uneven.tokens_per_s >= even.tokens_per_s * (1 - 1e-12)


def test_search_searches_levels_0_and_1_and_keeps_the_faster(monkeypatch) -> None:
    """Where the workload leaves the level open, level 1 (optimizer states sharded: the same bytes moved,
    less held) is searched beside level 0 and the faster plan kept: gpt2-xl on the public A100 + V100
    cluster gains a larger micro-batch there. Forked or in turn, the same plan."""
    import importlib

    from hetpart import load_model

    search = importlib.import_module("hetpart.policies.plan_search")
    model, cluster = load_model("gpt2-xl", seq_len=1024), load_cluster("a100-v100-16")
    both = plan_search(model, cluster, Workload(256, 1024))
    level0 = plan_search(model, cluster, Workload(256, 1024, zero=0))
    level1 = plan_search(model, cluster, Workload(256, 1024, zero=1))
    assert level0.plan.zero == 0 and level1.plan.zero == 1
    assert both.tokens_per_s >= max(level0.tokens_per_s, level1.tokens_per_s) * (1 - 1e-9)
    # +1.3% with the engine's op counts; +0.22% since the tied copies sync as Megatron syncs them (130,210 against
    # 129,918 tokens/s): what holds is that the faster level is kept
    assert both.plan.zero == 1 and both.tokens_per_s > 1.001 * level0.tokens_per_s
    monkeypatch.setattr(search, "PARALLEL_LEVELS", False)
    assert plan_search(model, cluster, Workload(256, 1024)).plan == both.plan
    monkeypatch.setattr(search, "LEVEL_ONE_MAX_DEVICES", 8)  # beyond it: level 0 where it fits, as before
    assert plan_search(model, cluster, Workload(256, 1024)).plan == level0.plan


def test_lower_bound_is_shared_by_every_order_of_the_same_stages() -> None:
    # The bound does not depend on the stages' order, so the orders of the same pools share one cache entry
    # (per order it took 58 of the 82 s of a search over five device types).
    import itertools

    from hetpart.policies.plan_search import _bound_parts, make_context

    model = tiny_model()
    ctx = make_context(model, THREE_TYPES, Workload(8, 512), SearchOptions())
    kinds = [ctx.table.get(p, 1, 1, "none") for p in ctx.pools]
    stages = [kinds[0], kinds[0], kinds[1], kinds[2]]
    parts = {_bound_parts(ctx, list(order)) for order in itertools.permutations(stages)}
    assert len(parts) == 1 and len(ctx.bound_cache) == 1
    slowest, floor = parts.pop()
    assert 0 < slowest <= floor
