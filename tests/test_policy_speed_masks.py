"""The policy's memory masks, fast path against the plain computation: :meth:`StageCosts.first_unfit` against the
first False of :meth:`StageCosts.fits_from`'s row, and :func:`greedy_fits` against its row-at-a-time reference,
on small models and clusters at every sharding level, with and without offload (the same answers, bit for bit)."""

from __future__ import annotations

import itertools
import random

import pytest

from hetpart import load_cluster
from hetpart.costmodel.pools import device_pools
from hetpart.graph.transformer import TransformerConfig, transformer_graph
from hetpart.policies import search_costs
from hetpart.policies.search_costs import CostTable
from hetpart.policies.structure import greedy_fits


def _model(layers: int, hidden: int = 2048, tied: bool = True):
    cfg = TransformerConfig(family="gpt2", num_layers=layers, hidden_size=hidden, num_heads=16, vocab_size=50257,
                            max_positions=1024, tied_embeddings=tied)
    return transformer_graph(cfg, f"tiny-h{hidden}-l{layers}", 512)


def _first_false(costs, first: int, stop: int, flight: float, zero: int, fraction: float) -> int:
    """The plain computation: the row of :meth:`fits_from`, its first False (``stop`` when none)."""
    ok = costs.fits_from(first, stop, flight, zero, fraction)
    return first + 1 + int(ok.argmin()) if not ok.all() else stop


def _greedy_fits_rows(costs, num_microbatches: int, zero: int = 0, fraction: float = 1.0) -> bool:
    """:func:`greedy_fits` as it read whole rows (the reference)."""
    pp, a = len(costs), 0
    n = costs[0].states_gb.shape[0] - 1
    if pp > n:
        return False
    for j, c in enumerate(costs):
        last = n - (pp - 1 - j)
        ok = c.fits_from(a, last + 1, min(pp - j, num_microbatches), zero, fraction)
        if not ok[0]:
            return False
        first_bad = int(ok.argmin())
        a = a + (first_bad if first_bad else len(ok))
    return a == n


def _tables(offload: str):
    """Cost tables of two small models on two small clusters, under ``offload``."""
    for layers, hidden, tied, cluster in ((5, 2048, True, "tiny-mixed"), (30, 4096, False, "tiny-mixed"),
                                          (12, 2048, True, "consumer-mix")):
        cl = load_cluster(cluster)
        yield CostTable(_model(layers, hidden, tied), cl, "bf16", offload=offload), cl


@pytest.mark.parametrize("offload", ["none", "optimizer"])
def test_first_unfit_is_the_rows_first_false(offload: str, monkeypatch) -> None:
    rng = random.Random(7)
    checked = unfit = 0
    for scan in (0, 3, 24):  # every range one at a time, a few then the row, the row alone
        monkeypatch.setattr(search_costs, "SCAN_RANGES", scan)
        for table, cluster in _tables(offload):
            n = table.model.num_units
            for pool in device_pools(cluster):
                for tp, mb, rc in itertools.product((1, 2), (1, 4, 16), ("none", "full")):
                    costs = table.get(pool, tp, mb, rc)
                    for _ in range(12):
                        first = rng.randrange(n)
                        stop = rng.randrange(first + 1, n + 2)
                        flight = rng.choice([1, 2, 5, 17, 3.5])
                        zero = rng.choice([0, 1, 2, 3])
                        fraction = rng.choice([1.0, 0.5, 0.25, 0.0])
                        got = costs.first_unfit(first, stop, flight, zero, fraction)
                        assert got == _first_false(costs, first, stop, flight, zero, fraction)
                        checked += 1
                        unfit += got < stop
    assert checked > 500 and 0 < unfit < checked  # ranges that fit and ranges that do not, both checked


@pytest.mark.parametrize("offload", ["none", "optimizer"])
def test_greedy_fits_matches_its_row_reference(offload: str) -> None:
    rng = random.Random(11)
    answers = []
    for table, cluster in _tables(offload):
        n = table.model.num_units
        pools = device_pools(cluster)
        for _ in range(150):
            pp = rng.randrange(1, min(n, 24) + 2)
            mb, rc = rng.choice([1, 4, 16]), rng.choice(["none", "selective", "full"])
            costs = [table.get(rng.choice(pools), rng.choice([1, 2]), mb, rc) for _ in range(pp)]
            m, zero = rng.randrange(1, 40), rng.choice([0, 1, 2, 3])
            fraction = rng.choice([1.0, 1 / pp, 0.0])
            got = greedy_fits(costs, m, zero, fraction)
            assert got == _greedy_fits_rows(costs, m, zero, fraction)
            answers.append(got)
    assert True in answers and False in answers


def _best_pp_reference(hood, pool: int, tp: int, mb: int, rc: str):
    """:meth:`Neighbourhood._best_pp` splitting every depth that fits (the reference)."""
    from hetpart.policies.neighbourhood import QUICK_STAGES

    best, rate = None, 0.0
    for pp in hood.s.pp_options(pool, tp):
        if hood.s.pool_fits(pool, tp, pp, mb, rc):
            pace = hood.s.pool_rate(pool, tp, pp, mb, rc, pp > QUICK_STAGES)
            if pace is not None and pace > rate:
                best, rate = pp, pace
    return best


@pytest.mark.parametrize("cluster, layers, batch", [("tiny-mixed", 6, 16), ("consumer-mix", 24, 64),
                                                    ("a100-v100-16", 40, 128)])
def test_best_depth_skips_only_depths_that_cannot_win(cluster: str, layers: int, batch: int) -> None:
    from hetpart import Workload
    from hetpart.policies.neighbourhood import Neighbourhood
    from hetpart.policies.structure import Scenario

    scenario = Scenario(_model(layers), load_cluster(cluster), Workload(batch, 512))
    hood = Neighbourhood(scenario)
    chosen = []
    for pool, tps in enumerate(scenario.tps):
        for tp, mb, rc in itertools.product(tps, (1, 2, 4), scenario.modes):
            got = hood._best_pp(pool, tp, mb, rc)
            assert got == _best_pp_reference(hood, pool, tp, mb, rc)
            for pp in scenario.pp_options(pool, tp):  # the ceiling is one: no split beats it
                pace = scenario.pool_rate(pool, tp, pp, mb, rc, pp > 8) if scenario.pool_fits(pool, tp, pp, mb, rc) \
                    else None
                if pace is not None:
                    assert pace <= scenario.pool_rate_ceiling(pool, tp, pp, mb, rc)
            chosen.append(got)
    assert any(c is not None for c in chosen)
