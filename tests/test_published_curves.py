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
    assert 0.0 < row.fraction < 1.0


def test_every_published_architecture_has_a_row_that_sets_it_and_a_source():
    published = {name for name, c in CURVES.items() if c.status.startswith("published")}
    assert published == {"cdna3", "cdna2", "ada"}
    for arch in (*published, "turing"):
        rows = published_rows(arch)
        assert rows and all(r.source and r.where for r in rows)
    assert DEVICE_CURVES["T4-16GB"].status.startswith("published")


def test_precisions_without_a_published_number_keep_their_assumed_fraction():
    ada, cdna3, cdna2 = CURVES["ada"], CURVES["cdna3"], CURVES["cdna2"]
    for precision in ("tf32", "fp8"):
        assert ada.e_peak(precision) == AMPERE.e_max
    assert cdna3.e_peak("tf32") == AMPERE.e_max
    for curve in (ada, cdna3, cdna2):
        assert curve.e_peak("fp32") == AMPERE.e_peak("fp32")
        assert (curve.w0_ref, curve.t0_ref, curve.act_traffic, curve.host_us_per_op) == (
            AMPERE.w0_ref, AMPERE.t0_ref, AMPERE.act_traffic, AMPERE.host_us_per_op)
    assert curve_for(GPU_CATALOG["T4-16GB"]).e_peak("fp32") == VOLTA.e_peak("fp32")


def test_mi300x_runs_fp16_and_fp8_below_its_bf16_fraction():
    mi300x = GPU_CATALOG["MI300X-192GB"]
    bf16, fp16, fp8 = (matmul_efficiency(mi300x, 8192, 8192, p) for p in ("bf16", "fp16", "fp8"))
    assert fp16 / bf16 == pytest.approx(654.0 / 708.0, rel=1e-3)
    assert fp8 / bf16 == pytest.approx((1273.0 / 2614.9) / (708.0 / 1307.4), rel=1e-3)


def test_types_the_published_figures_do_not_speak_for_stay_assumed():
    # the L4 (72 W) keeps the curve it had; the 250-280 W Turing boards keep Volta's
    l4 = curve_for(GPU_CATALOG["L4-24GB"])
    assert l4.status.startswith("assumed") and (l4.e_max, l4.w0_ref) == (AMPERE.e_max, AMPERE.w0_ref)
    for name in ("RTX2080Ti-11GB", "TitanRTX-24GB"):
        curve = curve_for(GPU_CATALOG[name])
        assert curve.status.startswith("assumed") and curve.e_max == VOLTA.e_max


def test_provenance_names_published_and_carried_over_curves():
    kinds = {name: compute_kind(GPU_CATALOG[name])[0] for name in
             ("RTX4090-24GB", "MI300X-192GB", "MI250X-GCD-64GB", "T4-16GB", "L4-24GB", "RTX2080Ti-11GB",
              "A100-80GB", "V100-32GB")}
    assert kinds == {"RTX4090-24GB": "published", "MI300X-192GB": "published", "MI250X-GCD-64GB": "published",
                     "T4-16GB": "published", "L4-24GB": "assumed", "RTX2080Ti-11GB": "assumed",
                     "A100-80GB": "fitted", "V100-32GB": "fitted"}
    # an inline Ada type (a full-rate 350 W L40S) is priced with the Ada curve but not vouched for by it
    l40s = GPUSpec("L40S-48GB", 362.0, 91.6, 48, 864, "nvidia", True, "inline", arch="ada")
    assert curve_for(l40s) is CURVES["ada"] and compute_kind(l40s)[0] == "assumed"
    assert ERROR_BANDS["published"]["rows"] == 0 and "published_gemm" in ERROR_BANDS["published"]["from"]


def test_a_published_figure_sits_near_the_fitted_plateau_where_both_exist():
    # the convention e_max = published best-shape fraction: on A100 and H100 such a figure is 2-6% above
    # the fitted e_max (docs/BENCHMARKS.md, "Matrix efficiency per architecture")
    for arch in ("ampere", "hopper"):
        (row,) = published_rows(arch, role="check")
        assert 1.0 < row.fraction / CURVES[arch].e_max < 1.07


def test_a_gemm_set_is_a_flop_weighted_harmonic_mean():
    from dataclasses import replace

    bf16 = next(r for r in PUBLISHED_GEMM_SETS if r.precision == "bf16")
    assert bf16.over_best == pytest.approx(616.0 / 831.40) and len(bf16.shapes) == 10
    flat = replace(AMPERE, w0_ref=1e-9, t0_ref=1e-9)  # no size terms: every shape at the plateau
    assert modelled_set_over_best(flat, bf16, 1307.4) == pytest.approx(1.0)
    # the CDNA3 curve falls less from the best shape to DeepSeek-V3 shapes than AMD measured (documented)
    assert modelled_set_over_best(CURVES["cdna3"], bf16, 1307.4) > bf16.over_best
