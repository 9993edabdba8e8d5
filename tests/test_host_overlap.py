"""The H100 measurement behind ``dispatch="overlap"`` (``experiments/data/h100_host_overlap.json``) and the
simulator against it: back-to-back units take the larger of host and device time, not their sum, and the
shipped simulator prices the measured chains within a few percent while the sum would not."""

import json
import math
import statistics

import pytest

from hetpart.costmodel.efficiency import HOST_US_PER_OP
from hetpart.experiments.bench_host_overlap import DATA, predict_chains, section


@pytest.fixture(scope="module")
def data():
    return json.loads(DATA.read_text())


def test_back_to_back_time_is_the_larger_of_host_and_device_not_their_sum(data):
    for kind in ("block", "chain"):
        rows = [r for r in data["rows"] if r["kind"] == kind]
        assert len(rows) == 40
        lap = statistics.median(r["stream_s"] / max(r["host_s"], r["device_s"]) for r in rows)
        total = statistics.median(r["stream_s"] / (r["host_s"] + r["device_s"]) for r in rows)
        assert 0.95 < lap < 1.05 and total < 0.8


def test_the_host_constant_is_the_host_bound_chains_median(data):
    ops = 12 * (32 + 112) + (4 + 10) + (8 + 24)  # 12 blocks, the embedding, the head with its loss
    bound = [r for r in data["rows"] if r["kind"] == "chain" and r["device_s"] < 0.5 * r["host_s"]]
    assert statistics.median(r["stream_s"] for r in bound) / ops * 1e6 == pytest.approx(HOST_US_PER_OP, abs=0.05)


def test_the_simulator_prices_the_chains_that_set_no_constant(data):
    rest = [c for c in predict_chains(data) if not c["host_bound"]]
    assert len(rest) == 20

    def gmean(key):
        return math.exp(statistics.fmean(math.log(c[key]) for c in rest))

    assert 0.9 < gmean("overlap_ratio") < 1.15 and gmean("serial_ratio") > 1.3
    assert "| 14-unit chains with the loss | 40 |" in section().body
