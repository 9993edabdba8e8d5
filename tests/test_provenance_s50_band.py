"""The ``assumed`` error band that ``predict`` prints is what the stored H100 unit profile gives today (it was set
on 2026-11-24, before the per-operator host cost was measured, and nothing recomputed it: 80.9% printed, 27.3% true)."""

from __future__ import annotations

import pytest

from hetpart.costmodel.provenance import ERROR_BANDS
from hetpart.experiments.bench_gpu_profile import assumed_band


def test_the_assumed_band_is_the_one_the_unit_profile_gives() -> None:
    band, shipped = assumed_band(), ERROR_BANDS["assumed"]
    assert band["rows"] == shipped["rows"] == 240
    assert band["mean_abs_pct"] == pytest.approx(shipped["mean_abs_pct"], abs=0.05)
    assert band["signed_pct"] == pytest.approx(shipped["signed_pct"], abs=0.05)
