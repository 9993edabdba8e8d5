"""The layer split's dynamic programs against their full-step references, bit for bit: the first stage's step
read off row 0, the last stage's off column n, and the capped steps over the memory band alone give what the
step over every row gives, on seeded random chains (times with ties, memory masks of every width)."""

import math

import numpy as np
import pytest

from hetpart.policies import partition
from hetpart.policies.partition import range_cost_matrix


def _start(n1: int) -> np.ndarray:
    best = np.full(n1, math.inf)
    best[0] = 0.0
    return best


def _minimax_reference(costs):
    best = _start(costs[0].shape[0])
    for c in costs:
        best = np.maximum(best[:, None], c).min(axis=0)
    return float(best[-1])


def _least_sum_reference(costs):
    best = _start(costs[0].shape[0])
    for c in costs:
        best = (best[:, None] + c).min(axis=0)
    return float(best[-1])


def _min_sum_reference(costs, cap):
    n1 = costs[0].shape[0]
    best, choices = _start(n1), []
    for c in costs:
        total = best[:, None] + np.where(c <= cap, c, math.inf)
        arg = total.argmin(axis=0)
        best = total[arg, np.arange(n1)]
        choices.append(arg)
    if not math.isfinite(best[-1]):
        return None
    bounds = [n1 - 1]
    for arg in reversed(choices):
        bounds.append(int(arg[bounds[-1]]))
    return float(best[-1]), tuple(reversed(bounds))


def _min_sums_reference(costs, caps):
    n1 = costs[0].shape[0]
    best = np.full((len(caps), n1), math.inf)
    best[:, 0] = 0.0
    for c in costs:
        best = (best[:, :, None] + np.where(c[None] <= caps[:, None, None], c[None], math.inf)).min(axis=1)
    return best[:, -1]


def _chains(seed: int, count: int, longest: int):
    """Seeded stage matrices: unit times with ties or not, each stage slower or faster, ranges longer than a
    random reach masked out (memory), some pipelines of one shared matrix (one pool)."""
    rng = np.random.default_rng(seed)
    for trial in range(count):
        n = int(rng.integers(1, longest + 1))
        pp = int(rng.integers(1, min(n, 10) + 1))
        units = rng.choice([0.5, 1.0, 2.0], size=n) if trial % 2 else rng.random(n)
        costs = []
        for j in range(pp):
            c = range_cost_matrix(units * (1 + 0.25 * (j % 3)), overhead=float(rng.choice([0.0, 0.1])))
            if rng.random() < 0.7:
                reach = int(rng.integers(1, n + 1))
                a, b = np.indices(c.shape)
                c[(b - a) > reach] = math.inf
            costs.append(c)
        if rng.random() < 0.3:
            costs = [costs[0]] * pp
        finite = np.concatenate([c[np.isfinite(c)] for c in costs])
        caps = np.sort(rng.choice(finite, size=16)) if finite.size else np.array([1.0])
        yield costs, caps, int(rng.integers(1, 64))


@pytest.mark.parametrize("seed,longest", [(0, 12), (1, 40), (2, 90)])
def test_the_dynamic_programs_equal_their_full_step_references(seed, longest):
    banded = 0
    capped = partition._capped

    def counting(c, caps):
        nonlocal banded
        out = capped(c, caps)
        banded += out[1] is not None
        return out

    partition._capped = counting
    try:
        for costs, caps, _ in _chains(seed, 150, longest):
            assert partition._minimax(costs) == _minimax_reference(costs)
            assert partition._least_sum(costs) == _least_sum_reference(costs)
            for cap in (math.inf, float(caps[len(caps) // 2]), float(caps[0])):
                assert partition._min_sum(costs, cap) == _min_sum_reference(costs, cap)
            assert np.array_equal(partition._min_sums(costs, caps), _min_sums_reference(costs, caps))
    finally:
        partition._capped = capped
    assert banded > 0  # the band's step ran, not only the full one


def test_the_split_is_the_brute_force_optimum_on_banded_chains():
    for costs, _, m in _chains(3, 60, 9):
        split, brute = partition.split_layers(costs, m), partition.brute_force_split(costs, m)
        assert (split is None) == (brute is None)
        if split is not None:
            assert split.objective_s == pytest.approx(brute.objective_s, rel=1e-12)
