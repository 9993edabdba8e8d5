"""The search's mixed pipelines enumerated per multiset of stages (``_Family``), their orders only when reached,
after the order-free bound (``_order_free_bound_s``): the same points kept as listing every point and sorting."""

from __future__ import annotations

import heapq
import importlib
import itertools
import math

import pytest

from hetpart import Workload
from hetpart.cluster import parse_cluster
from hetpart.graph.transformer import TransformerConfig, transformer_graph
from hetpart.policies.partition import _min_sum, _minimax

search = importlib.import_module("hetpart.policies.plan_search")

# four device types, one node of two GPUs each, a fifth in a second zone behind a slow link: 4! orders of a
# zone's pools, so the order-free bound runs (``ORDER_FREE_WORTH``)
FIVE_TYPES = parse_cluster({"name": "five-types", "nodes": [
    {"count": 1, "gpus_per_node": 2, "gpu": "A100-80GB", "intra_node": "NVLink3", "nic": "RoCE-100", "zone": "a"},
    {"count": 1, "gpus_per_node": 2, "gpu": "H100-80GB", "intra_node": "NVLink4", "nic": "RoCE-100", "zone": "a"},
    {"count": 1, "gpus_per_node": 2, "gpu": "V100-32GB", "intra_node": "NVLink2", "nic": "RoCE-100", "zone": "a"},
    {"count": 1, "gpus_per_node": 2, "gpu": "L4-24GB", "intra_node": "PCIe4", "nic": "Ethernet-25", "zone": "a"},
    {"count": 1, "gpus_per_node": 2, "gpu": "MI300X-192GB", "intra_node": "xGMI", "nic": "RoCE-100", "zone": "b"}],
    "links": [{"zones": ["a", "b"], "bandwidth_gbit_s": 25, "latency_us": 200}]})


def _model(layers: int = 6):
    cfg = TransformerConfig(family="llama", num_layers=layers, hidden_size=2048, num_heads=16, vocab_size=32000,
                            max_positions=2048, ffn_hidden_size=5504, tied_embeddings=False, activation="swiglu",
                            norm="rmsnorm", bias=False, learned_positions=False, dropout=False)
    return transformer_graph(cfg, f"small-llama-l{layers}", 1024)


def _listed_and_sorted(ctx) -> list:
    """The search before families: every point listed, sorted by bound, each skipped once its bound can beat
    neither the ``top_k``-th estimate nor its group's best."""
    points = sorted(search.search_space(ctx), key=lambda t: t[0])
    best, by_group = [], {}
    for i, (bound, key, scorer) in enumerate(points):
        kth = -best[0][0] if len(best) >= ctx.options.top_k else math.inf
        group = search._group(key)
        threshold = max(kth, by_group[group].estimate_s if group in by_group else math.inf)
        if bound >= threshold:
            continue
        scored = scorer(threshold)
        if scored is None or not math.isfinite(scored.estimate_s):
            continue
        if group not in by_group or scored.estimate_s < by_group[group].estimate_s:
            by_group[group] = scored
        heapq.heappush(best, (-scored.estimate_s, i, scored))
        if len(best) > ctx.options.top_k:
            heapq.heappop(best)
    chosen = {id(s): s for _, _, s in best} | {id(s): s for s in by_group.values()}
    return sorted(chosen.values())


@pytest.mark.parametrize("zero,recompute", [(0, "none"), (1, "auto")])
def test_families_keep_the_points_of_every_point_sorted(monkeypatch, zero: int, recompute: str) -> None:
    model, workload = _model(), Workload(16, 1024, recompute=recompute)
    raised = []
    original = search._order_free_bound_s
    monkeypatch.setattr(search, "_order_free_bound_s", lambda ctx, f: raised.append(original(ctx, f)) or raised[-1])
    ctx = search.make_context(model, FIVE_TYPES, workload, search.SearchOptions(), zero)
    got = search._top_scored(ctx)
    want = _listed_and_sorted(search.make_context(model, FIVE_TYPES, workload, search.SearchOptions(), zero))
    # the same estimates and groups; among points of equal estimate (recompute modes that cost nothing here)
    # either may be kept
    assert [s.estimate_s for s in got] == pytest.approx([s.estimate_s for s in want], rel=1e-12)
    assert {search._group(s.key) for s in got} == {search._group(s.key) for s in want}
    assert len({s.key for s in got} ^ {s.key for s in want}) <= 2 * sum(
        1 for a, b in zip(got, got[1:]) if a.estimate_s == b.estimate_s)
    assert any(r > 0 for r in raised)  # the order-free bound ran and raised some families
    families = sum(1 for _ in search._mixed_families(ctx))
    assert len(raised) < families  # and most were never reached


def test_order_free_bound_is_the_least_over_every_order_of_its_stages(monkeypatch) -> None:
    """Memory lifted, on pools of one zone (the bound leaves the links out), it is exactly the least bottleneck
    over every order and split times ``m - 1`` plus the least sum; else it stays below every order's split (its
    stages hold one micro-batch)."""
    model = _model(layers=8)
    monkeypatch.setattr(search, "ORDER_FREE_WORTH", math.inf)  # the bound on every family, worth it or not
    for ignore in (True, False):
        ctx = search.make_context(model, FIVE_TYPES, Workload(32, 1024), search.SearchOptions(ignore_memory=ignore))
        checked = 0
        for bound, family in search._mixed_families(ctx):
            if len(family.subset) < 3 or family.dp != 1 or family.mb not in (1, 4):
                continue
            raised = search._order_free_bound_s(ctx, family)
            assert raised >= bound * (1 - 1e-9)
            per_order = []
            for order in search._orders(ctx, family.subset):
                kind = {p: (k, c) for p, k, c in zip(family.subset, family.kinds, family.counts)}
                stages = [kind[p][0] for p in order for _ in range(kind[p][1])]
                pp = len(stages)
                masks = [c.masked(min(pp - j, family.m), ignore, ctx.zero, 1.0) for j, c in enumerate(stages)]
                per_order.append(masks)
            if ignore and all(p.zone == "a" for p in family.subset):
                least = ((family.m - 1) * min(_minimax(masks) for masks in per_order)
                         + min(_min_sum(masks, math.inf)[0] for masks in per_order))
                assert raised == pytest.approx(least, rel=1e-12)
            else:  # every order, and the split each runs with memory, is above it
                for masks in per_order:
                    found = _min_sum(masks, math.inf)
                    if found is not None:
                        assert raised <= (family.m - 1) * _minimax(masks) + found[0] * (1 + 1e-12)
            checked += 1
        assert checked > 20


def test_families_list_every_order_that_keeps_to_the_links() -> None:
    ctx = search.make_context(_model(), FIVE_TYPES, Workload(16, 1024), search.SearchOptions())
    shapes = list(search._mixed_shapes(ctx))
    assert len(shapes) == len(set(shapes))
    for subset in itertools.combinations(ctx.pools, 3):
        orders = search._orders(ctx, subset)
        zones = [[p.zone for p in o] for o in orders]
        assert all(z.count("b") == 0 or z[0] == "b" or z[-1] == "b" for z in zones)  # the b pool at an end
        assert len(orders) == (6 if all(p.zone == "a" for p in subset) else 4)


def test_masked_matrices_and_pipelines_stay_within_their_byte_budgets(monkeypatch) -> None:
    # a model of 1,000 layers takes 8 MB per range matrix: a cache counted in entries held 32 GB of them, and a
    # 1,000-stage pipeline's matrices 8 GB (the kernel killed the search)
    costs_module = importlib.import_module("hetpart.policies.search_costs")
    monkeypatch.setattr(costs_module, "MASKED_CACHE_BYTES", 200_000)
    ctx = search.make_context(_model(layers=40), FIVE_TYPES, Workload(16, 1024), search.SearchOptions())
    one = ctx.table.get(ctx.pools[0], 1, 1, "none")
    for in_flight in range(1, 30):
        one.masked(in_flight)
    held = sum(a.nbytes for a in costs_module._MASKED.values())
    assert 0 < held <= 200_000 and len(costs_module._MASKED) >= 2
    assert one.masked(29) is one.masked(29)  # the latest stays
    assert search._most_stages(ctx) == ctx.n  # 42 units: every depth fits
    monkeypatch.setattr(search, "MASKS_MAX_BYTES", 8 * (ctx.n + 1) ** 2 * 5)
    assert search._most_stages(ctx) == 5
    deepest = max(len(fam.kinds) and sum(fam.counts) for _, fam in search._mixed_families(ctx))
    assert deepest <= 5


def test_a_search_cut_short_by_its_time_limit_says_so_and_answers_at_least_as_well_as_the_policy() -> None:
    from hetpart.policies.planner import plan
    from hetpart.policies.policy_planner import plan_policy

    model, workload = _model(), Workload(16, 1024)
    whole = plan(model, FIVE_TYPES, workload, "search")
    assert whole.evaluation["complete"] is True
    cut = plan(model, FIVE_TYPES, workload, "search", time_limit_s=1e-9)
    assert cut.evaluation["complete"] is False and cut.evaluation["time_limit_s"] == 1e-9
    assert cut.plan.validate(model, FIVE_TYPES) == []
    assert cut.prediction.tokens_per_s >= plan_policy(model, FIVE_TYPES, workload).tokens_per_s * (1 - 1e-9)
    assert cut.prediction.tokens_per_s <= whole.prediction.tokens_per_s * (1 + 1e-9)


def test_time_limit_flag_is_for_search_only(capsys) -> None:
    from tests._cli import run_cli

    base = ("plan", "--model", "gpt2-small", "--cluster", "tiny-mixed", "--global-batch", "8")
    code, _, err = run_cli(capsys, *base, "--planner", "uniform", "--time-limit", "5")
    assert code == 2 and "--time-limit: only --planner search takes a time limit" in err
    code, _, err = run_cli(capsys, *base, "--time-limit", "-1")
    assert code == 2 and "--time-limit: -1.0 is no number of seconds" in err
