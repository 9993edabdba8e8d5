"""The allocator benchmark (issue 10's fit margin): its loop runs on the CPU, its summary reads the rows right,
and it refuses to measure without CUDA (the statistics it needs are the CUDA caching allocator's)."""

from __future__ import annotations

import pytest

from hetpart.experiments import bench_allocator as ba


def test_the_stage_loop_runs_every_quick_case_on_cpu():
    rows = ba.worker(ba.QUICK_CASES, "cpu")
    assert [(r["model"], r["recompute"], r["in_flight"]) for r in rows] == [(c[0], c[5], c[4]) for c in ba.QUICK_CASES]
    for r in rows:
        assert r["params"] > 0 and r["blocks"] == ba.BLOCKS and r["steps"] == ba.STEPS
        assert r["peak_allocated_bytes"] is None and r["reserved_over_allocated"] is None  # no CUDA statistics


def test_summary_is_reserved_over_allocated_per_setting():
    rows = [{"alloc_conf": "", "reserved_over_allocated": x} for x in (1.10, 1.02, 1.04)]
    rows += [{"alloc_conf": "expandable_segments:True", "reserved_over_allocated": 1.01},
             {"alloc_conf": "expandable_segments:True", "reserved_over_allocated": None}]
    s = ba.summarize(rows)
    assert s["default"]["cases"] == 3 and s["default"]["median"] == pytest.approx(0.04)
    assert s["default"]["max"] == pytest.approx(0.10) and s["default"]["min"] == pytest.approx(0.02)
    assert s["expandable_segments:True"] == {"cases": 1, "median": pytest.approx(0.01), "max": pytest.approx(0.01),
                                             "min": pytest.approx(0.01)}


def test_measuring_needs_cuda(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    assert ba.main(["--measure"]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err
    assert ba.main(["--worker"]) == 2
