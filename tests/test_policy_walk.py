"""The policy's refinement: the quick layer split (vs brute force) and the walk over structures."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from hetpart import Workload, load_cluster, load_model
from hetpart.policies.partition import brute_force_split, minimax_split, range_cost_matrix


def _memory_capped_costs(rng: np.random.Generator, n: int, pp: int) -> list[np.ndarray]:
    """Additive stage times, and memory that caps how many units a stage holds (as in real tables)."""
    costs = []
    for _ in range(pp):
        c = range_cost_matrix(rng.uniform(0.1, 2.0, n) * rng.uniform(0.5, 2.0))
        if rng.random() < 0.4:
            most = int(rng.integers(1, n + 1))
            for a in range(n + 1):
                c[a, a + most + 1:] = math.inf
        costs.append(c)
    return costs


def _smallest_bottleneck(costs: list[np.ndarray]) -> float:
    n = costs[0].shape[0] - 1
    return min(max(float(c[a, b]) for c, a, b in zip(costs, (0, *cuts), (*cuts, n)))
               for cuts in itertools.combinations(range(1, n), len(costs) - 1))


def test_quick_split_is_a_real_split_never_below_the_optimum_and_nearly_always_minimax() -> None:
    rng = np.random.default_rng(3)
    checked = minimax = 0
    for _ in range(300):
        n = int(rng.integers(2, 9))
        pp = int(rng.integers(1, n + 1))
        m = int(rng.integers(1, 9))
        costs = _memory_capped_costs(rng, n, pp)
        exact, quick = brute_force_split(costs, m), minimax_split(costs, m, tolerance=1e-12)
        if quick is None:
            continue
        assert exact is not None
        checked += 1
        times = [float(costs[j][a, b]) for j, (a, b) in enumerate(quick.ranges)]
        assert quick.bounds[0] == 0 and quick.bounds[-1] == n and all(t < math.inf for t in times)
        assert quick.objective_s == pytest.approx((m - 1) * max(times) + sum(times), rel=1e-12)
        assert quick.objective_s >= exact.objective_s * (1 - 1e-12)
        minimax += quick.bottleneck_s <= _smallest_bottleneck(costs) * (1 + 1e-9)
    assert checked > 200 and minimax >= 0.9 * checked


@pytest.fixture(scope="module")
def walk_case():
    from hetpart.policies.neighbourhood import Neighbourhood
    from hetpart.policies.structure import Scenario

    model, cluster = load_model("gpt2-small", seq_len=256), load_cluster("tiny-mixed")
    return Neighbourhood(Scenario(model, cluster, Workload(16, 256)))


def test_walk_never_ends_worse_than_its_start_and_prices_only_valid_points(walk_case) -> None:
    from hetpart.policies.neighbourhood import improve

    hood = walk_case
    s = hood.s
    start = ("mixed", (0,), (s.tps[0][0],), 1, 1, s.modes[-1])  # one pool, narrowest TP, most recompute
    assert hood.valid(start) and hood.price(start) is not None
    found = improve(hood, [start], deadline=math.inf)
    best = min(found.values())
    assert best.estimate_s <= hood.price(start).estimate_s
    assert len(found) > 1 and all(hood.valid(p) for p in found)
    for point, scored in found.items():  # the walk's prices are the search's own (exact below QUICK_STAGES)
        assert hood.exact(point).estimate_s <= scored.estimate_s * (1 + 1e-12)
    assert improve(hood, [start], deadline=math.inf).keys() == found.keys()  # deterministic


def test_walk_reaches_the_search_estimate_on_a_small_case(walk_case) -> None:
    """From a poor start the walk finds a point as good, by the search's estimate, as the best the
    search itself ranks first (both families, every structure)."""
    from hetpart.policies.neighbourhood import improve
    from hetpart.policies.plan_search import _top_scored

    hood = walk_case
    s = hood.s
    start = ("mixed", (0,), (s.tps[0][0],), 1, 1, s.modes[-1])
    found = improve(hood, [start], deadline=math.inf)
    searched = _top_scored(s.ctx)[0]
    assert min(found.values()).estimate_s <= searched.estimate_s * 1.02
