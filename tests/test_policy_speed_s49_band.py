"""The layer split's programs over each middle stage's memory band (``bands``, as :func:`split_layers` passes
them) against their full-step references, bit for bit: values, and the boundaries of :func:`_min_sum` (ties: the
earliest), on seeded random chains with tied times, masks of every width and stages shifted by their sends."""

import math

import numpy as np
import pytest

from hetpart.policies import partition
from tests.test_policy_partition_fast import (_chains, _least_sum_reference, _min_sum_reference,
                                              _minimax_reference)


def _shifted(costs, rng):
    """Some stages moved by a constant (the sends :func:`_split_with_sends` adds), negative ones included."""
    return [c + float(rng.choice([-0.5, 0.0, 0.25])) if rng.random() < 0.4 else c for c in costs]


@pytest.mark.parametrize("seed,longest", [(10, 12), (11, 40), (12, 90)])
def test_the_banded_programs_equal_the_full_ones(seed, longest):
    rng = np.random.default_rng(seed)
    banded = 0
    for costs, caps, _ in _chains(seed, 150, longest):
        costs = _shifted(costs, rng)
        bands = {id(c): partition._band(c) for c in costs[1:-1]}
        banded += sum(rows is not None for _, rows in bands.values())
        assert partition._minimax(costs, bands) == _minimax_reference(costs)
        assert partition._least_sum(costs, bands) == _least_sum_reference(costs)
        for cap in (math.inf, float(caps[len(caps) // 2]), float(caps[0])):
            assert partition._min_sum(costs, cap, bands) == _min_sum_reference(costs, cap)
            assert partition._min_sum(costs, cap, bands) == partition._min_sum(costs, cap)
    assert banded > 100  # the band's steps ran, not only the full ones


def test_ties_pick_the_earliest_boundary_in_the_band():
    units = np.ones(8)  # every split of equal stages ties: the earliest boundaries win
    c = partition.range_cost_matrix(units)
    a, b = np.indices(c.shape)
    c[(b - a) > 3] = math.inf  # no stage holds more than 3 units: a band of width 3
    costs = [c, c, c]
    bands = {id(c): partition._band(c)}
    assert bands[id(c)][1] is not None
    assert partition._min_sum(costs, math.inf, bands) == (8.0, (0, 2, 5, 8))
    assert partition._min_sum(costs, math.inf, bands) == _min_sum_reference(costs, math.inf)


def test_a_finite_time_off_the_ranges_takes_the_full_step():
    c = partition.range_cost_matrix(np.ones(8))
    c[5, 2] = 1.0  # a >= b: no band holds it
    assert partition._band(c)[1] is None


def _band_reference(c):
    """:func:`partition._band` by fancy indexing: each band row read off the matrix, ``inf`` before unit 0."""
    n1 = c.shape[0]
    spans = (np.arange(n1)[None, :] - np.arange(n1)[:, None])[np.isfinite(c)]
    if spans.size and spans.min() <= 0:
        return c, None
    width = int(spans.max()) if spans.size else 1
    if 2 * width > n1:
        return c, None
    rows = np.arange(n1)[None, :] - np.arange(1, width + 1)[:, None]
    band = np.where(rows >= 0, c[np.maximum(rows, 0), np.broadcast_to(np.arange(n1), rows.shape)], math.inf)
    return band, np.maximum(rows, 0)


def test_the_band_equals_its_fancy_indexed_reference():
    rng = np.random.default_rng(13)
    banded = 0
    for costs, _, _ in _chains(13, 200, 90):
        for c in _shifted(costs, rng):
            band, rows = partition._band(c)
            reference, reference_rows = _band_reference(c)
            assert (rows is None) == (reference_rows is None)
            if rows is not None:
                banded += 1
                assert np.array_equal(band, reference) and np.array_equal(rows, reference_rows)
    assert banded > 100
