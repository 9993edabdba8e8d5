"""Stored peak-memory measurements of real CPU runs (``experiments/data/cpu_memory_runs_mmap.jsonl``, written by
``make bench BENCH=memory-validation``) re-predicted by today's simulator: issue 10's target (sharded plans
within 5% of what the runtime measures) and issue 9's (never more than 5% below a measurement)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetpart.experiments.bench_memory import CASES, compare
from hetpart.records import load_records

RECORDS = Path(__file__).resolve().parents[1] / "experiments" / "data" / "cpu_memory_runs_mmap.jsonl"


@pytest.fixture(scope="module")
def rows() -> list[tuple[str, dict]]:
    records = load_records(RECORDS)
    # these resident-set records were made for the benchmark's first seven cases (the later ones are live-tensor
    # records only: test_memory_owner_records.py)
    assert len(records) == 7 and len(CASES) >= 7, "the stored records no longer match the benchmark's cases"
    return [(label, row) for (label, scale, _), rec in zip(CASES, records) if scale == "small"
            for row in compare(rec)]


def test_sharded_plans_are_predicted_within_five_percent_of_the_measured_peak(rows) -> None:
    sharded = [(label, r["ratio"]) for label, r in rows if r["zero"]]
    assert len(sharded) == 8
    for label, ratio in sharded:
        assert 0.95 <= ratio <= 1.05, f"{label}: predicted / measured {ratio:.3f}"


def test_no_small_run_is_predicted_more_than_five_percent_under_its_measurement(rows) -> None:
    for label, r in rows:
        assert r["ratio"] >= 0.95, f"{label} rank {r['rank']}: predicted / measured {r['ratio']:.3f}"
