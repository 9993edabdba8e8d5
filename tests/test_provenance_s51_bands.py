"""The step bands ``predict`` prints (:data:`hetpart.costmodel.provenance.ERROR_BANDS`) are what their rows give
today: each copied band recomputed from the data it came from (the ``assumed`` one: test_provenance_s50_band.py).
A change to the simulator that moves a band fails here until the table follows."""

from __future__ import annotations

import pytest

from hetpart.costmodel.provenance import ERROR_BANDS
from hetpart.experiments.bench_profile_truth import measured_band
from hetpart.experiments.bench_validation import ampere_band, hopper_band, signed_band, volta_band


def _same(band: dict, shipped: dict) -> bool:
    return (band["rows"] == shipped["rows"] and band["mean_abs_pct"] == pytest.approx(shipped["mean_abs_pct"], abs=0.05)
            and band["signed_pct"] == pytest.approx(shipped["signed_pct"], abs=0.05))


def test_a_band_is_the_mean_and_range_of_signed_errors() -> None:
    assert signed_band([-4.04, 0.04, 4.89]) == {"mean_abs_pct": 3.0, "signed_pct": [-4.0, 4.9], "rows": 3}


def test_the_ampere_band_is_the_fit_residuals_of_table_5_and_table_1() -> None:
    band = ampere_band()
    assert band["rows"] == 18  # 4 models x 2 recompute modes (Table 5) + 10 models (Table 1)
    assert _same(band, ERROR_BANDS["fitted:ampere"]), band


def test_the_hopper_band_is_the_llama3_rows_and_the_real_h100_and_h200_runs() -> None:
    band = hopper_band()
    assert band["rows"] == 15  # 3 Llama 3 405B rows + 11 H100 runs + 1 H200 run
    assert _same(band, ERROR_BANDS["fitted:hopper"]), band


def test_the_volta_band_is_the_held_out_512_v100_row() -> None:
    band = volta_band()
    assert band["rows"] == 1
    assert _same(band, ERROR_BANDS["fitted:volta"]), band


def test_the_measured_band_is_the_stored_cpu_runs_and_emulated_runs() -> None:
    band = measured_band()
    assert band["rows"] == 43  # 40 real runs of 1-2 ranks (runs A-D) + 3 emulated
    assert _same(band, ERROR_BANDS["measured"]), band
