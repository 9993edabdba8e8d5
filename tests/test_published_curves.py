"""Architectures whose matrix efficiency comes from a published GEMM figure (issue 9): each curve's
constants reproduce the number it cites, precisions without a published number keep what they were
assumed to be, and predictions say which device types rest on a published figure."""

from __future__ import annotations

import pytest

from hetpart.catalog.hardware import GPU_CATALOG
from hetpart.costmodel.efficiency import CURVES, DEVICE_CURVES, curve_for, matmul_efficiency
from hetpart.costmodel.provenance import ERROR_BANDS, compute_kind
from hetpart.costmodel.published_gemm import (PUBLISHED_GEMM_SETS, PUBLISHED_GEMMS, modelled_set_over_best,
                                              published_rows)
from hetpart.hardware import GPUSpec

AMPERE, VOLTA = CURVES["ampere"], CURVES["volta"]


def _curve(row):
    return curve_for(GPU_CATALOG[row.catalog_gpu]) if row.catalog_gpu else CURVES[row.arch]


@pytest.mark.parametrize("row", [r for r in PUBLISHED_GEMMS if r.role == "sets"],
                         ids=lambda r: f"{r.device}-{r.precision}")
def test_each_published_curve_reproduces_the_number_it_cites(row):
    curve = _curve(row)
    assert curve.status.startswith("published:")
    assert curve.e_peak(row.precision) * row.peak_tflops == pytest.approx(row.tflops, rel=1e-3)


@pytest.mark.parametrize("row", [r for r in PUBLISHED_GEMMS if r.catalog_gpu], ids=lambda r: f"{r.device}-{r.precision}")
def test_published_fractions_are_of_the_catalogs_own_peaks(row):
    # a fraction of the wrong peak (sparse, fp16 accumulate, a whole MI250X package) would be off 2x
    assert row.peak_tflops == pytest.approx(GPU_CATALOG[row.catalog_gpu].tflops(row.precision))
    # GeForce boards boost past the reference clock their datasheet peak assumes (a 2080 Ti check row: 1.09)
    assert 0.0 < row.fraction < (1.0 if row.role == "sets" else 1.1)


def test_every_published_architecture_has_a_row_that_sets_it_and_a_source():
    published = {name for name, c in CURVES.items() if c.status.startswith("published")}
    assert published == {"cdna3", "cdna2", "ada"}
    for arch in (*published, "turing"):
        rows = published_rows(arch)
        assert rows and all(r.source and r.where for r in rows)
    for name in ("T4-16GB", "TitanRTX-24GB", "RTX2080Ti-11GB", "L4-24GB"):
        assert DEVICE_CURVES[name].status.startswith("published")


def test_precisions_without_a_published_number_keep_their_assumed_fraction():
    ada, cdna3, cdna2 = CURVES["ada"], CURVES["cdna3"], CURVES["cdna2"]
    assert ada.e_peak("fp8") == AMPERE.e_max and cdna3.e_peak("tf32") == AMPERE.e_max
    for curve in (cdna3, cdna2):
        assert curve.e_peak("fp32") == AMPERE.e_peak("fp32")
    for curve in (ada, cdna3, cdna2):
        assert (curve.w0_ref, curve.t0_ref, curve.act_traffic, curve.host_us_per_op) == (
            AMPERE.w0_ref, AMPERE.t0_ref, AMPERE.act_traffic, AMPERE.host_us_per_op)
    assert curve_for(GPU_CATALOG["L4-24GB"]).e_peak("fp8") == curve_for(GPU_CATALOG["L4-24GB"]).e_max


def test_mi300x_runs_fp16_and_fp8_below_its_bf16_fraction():
    mi300x = GPU_CATALOG["MI300X-192GB"]
    # products large enough that the size terms vanish (fp8 saturates at twice the size: FP8_SIZE_FACTOR)
    bf16, fp16, fp8 = (matmul_efficiency(mi300x, 1e9, 1e9, p) for p in ("bf16", "fp16", "fp8"))
    assert fp16 / bf16 == pytest.approx(654.0 / 708.0, rel=1e-3)
    assert fp8 / bf16 == pytest.approx((1273.0 / 2614.9) / (708.0 / 1307.4), rel=1e-3)


def test_types_without_a_figure_of_their_own_stay_assumed():
    # an RTX 2080 (Turing, no figure of its own) keeps Volta's curve; Pascal and Ascend their assumptions
    rtx2080 = GPUSpec("RTX2080-8GB", 40.3, 10.1, 8, 448, "nvidia", False, "inline", arch="turing")
    for gpu in (rtx2080, GPU_CATALOG["P100-16GB"], GPU_CATALOG["Ascend910B-64GB"]):
        curve = curve_for(gpu)
        assert curve.status.startswith("assumed") and compute_kind(gpu)[0] == "assumed"
    assert curve_for(rtx2080).e_max == VOLTA.e_max


def test_full_rate_boards_under_a_power_cap_reach_less_of_their_peak_than_geforce_boards():
    # what the published figures say (T4, TITAN RTX, L4 accumulate fp32 at full rate under a power cap)
    capped = [curve_for(GPU_CATALOG[n]).e_max for n in ("T4-16GB", "TitanRTX-24GB", "L4-24GB")]
    geforce = [curve_for(GPU_CATALOG[n]).e_max for n in ("RTX2080Ti-11GB", "RTX4090-24GB")]
    assert max(capped) < min(geforce)


def test_provenance_names_published_and_carried_over_curves():
    kinds = {name: compute_kind(GPU_CATALOG[name])[0] for name in
             ("RTX4090-24GB", "MI300X-192GB", "MI250X-GCD-64GB", "T4-16GB", "L4-24GB", "RTX2080Ti-11GB",
              "A100-80GB", "V100-32GB")}
    assert kinds == {"RTX4090-24GB": "published", "MI300X-192GB": "published", "MI250X-GCD-64GB": "published",
                     "T4-16GB": "published", "L4-24GB": "published", "RTX2080Ti-11GB": "published",
                     "A100-80GB": "fitted", "V100-32GB": "fitted"}
    # an inline Ada type (a full-rate 350 W L40S) is priced with the Ada curve but not vouched for by it
    l40s = GPUSpec("L40S-48GB", 362.0, 91.6, 48, 864, "nvidia", True, "inline", arch="ada")
    assert curve_for(l40s) is CURVES["ada"] and compute_kind(l40s)[0] == "assumed"
    assert ERROR_BANDS["published"]["rows"] == 0 and "published_gemm" in ERROR_BANDS["published"]["from"]


def test_a_published_figure_sits_near_the_fitted_plateau_where_both_exist():
    # the convention e_max = published best-shape fraction: on A100 and H100 such a figure is 2-7% above
    # the fitted e_max (docs/BENCHMARKS.md, "Matrix efficiency per architecture")
    for arch in ("ampere", "hopper"):
        rows = published_rows(arch, role="check")
        assert len(rows) == 2 and all(1.0 < r.fraction / CURVES[arch].e_max < 1.08 for r in rows)


def test_a_gemm_set_is_a_flop_weighted_harmonic_mean():
    from dataclasses import replace

    bf16 = next(r for r in PUBLISHED_GEMM_SETS if r.precision == "bf16")
    assert bf16.over_best == pytest.approx(616.0 / 831.40) and len(bf16.shapes) == 10
    flat = replace(AMPERE, w0_ref=1e-9, t0_ref=1e-9)  # no size terms: every shape at the plateau
    assert modelled_set_over_best(flat, bf16, 1307.4) == pytest.approx(1.0)
    # the CDNA3 curve falls less from the best shape to DeepSeek-V3 shapes than AMD measured (documented)
    assert modelled_set_over_best(CURVES["cdna3"], bf16, 1307.4) > bf16.over_best


def test_the_hopper_band_is_the_validation_rows_of_hopper():
    """The H100's error band is what the validation benchmark measures on its held-out Hopper rows."""
    from hetpart.costmodel.provenance import _band
    from hetpart.experiments.bench_validation import gpu_run_rows, load_published, predict_published

    rows = [predict_published(r) for r in load_published() if r.fields["gpu"].startswith("H100") and r.role == "heldout"]
    errors = [r.error_pct for r in rows + gpu_run_rows()]  # the H100's and the H200's
    kind, curve = compute_kind(GPU_CATALOG["H100-80GB"])
    band = _band(kind, curve.split(" ", 1)[0])  # as prediction_provenance reads it
    assert kind == "fitted" and band["held_out"]
    assert band["rows"] == len(errors)
    assert band["mean_abs_pct"] == pytest.approx(sum(map(abs, errors)) / len(errors), abs=0.06)
    assert band["signed_pct"] == pytest.approx([min(errors), max(errors)], abs=0.06)
