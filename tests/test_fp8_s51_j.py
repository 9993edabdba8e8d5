"""fp8 pricing (probe_a s51, item 1): fp8 products saturate at twice a 16-bit product's size, Hopper's fp8 plateau
is a published figure of its own, and Transformer Engine's casts and transposes cost HBM time."""

from __future__ import annotations

import numpy as np
import pytest

from hetpart.catalog.hardware import GPU_CATALOG
from hetpart.costmodel.compute import FP8_CAST_BYTES, fp8_cast_bytes, unit_compute_s
from hetpart.costmodel.efficiency import FP8_SIZE_FACTOR, curve_for, matmul_efficiency
from hetpart.graph.transformer import TransformerConfig, transformer_graph

H100 = GPU_CATALOG["H100-80GB"]


def _llama(seq: int = 4096):
    cfg = TransformerConfig(family="llama", num_layers=2, hidden_size=8192, num_heads=64, num_kv_heads=8,
                            vocab_size=32000, max_positions=seq, ffn_hidden_size=28672, activation="swiglu")
    return transformer_graph(cfg, "llama-2l", seq)


def test_fp8_gains_less_than_twofold_on_narrow_products():
    narrow = matmul_efficiency(H100, 1024, 4096, "fp8") * 1979 / (matmul_efficiency(H100, 1024, 4096, "bf16") * 989)
    wide = matmul_efficiency(H100, 16384, 16384, "fp8") * 1979 / (matmul_efficiency(H100, 16384, 16384, "bf16") * 989)
    assert FP8_SIZE_FACTOR == 2.0
    # 0.7696 / (1 + 838/1024 + 240/4096) against 0.7834 / (1 + 419/1024 + 120/4096), at twice the peak
    assert narrow == pytest.approx(2 * (0.7696 / (1 + 838 / 1024 + 240 / 4096)) / (0.7834 / (1 + 419 / 1024 + 120 / 4096)),
                                   rel=1e-3)
    assert 1.4 < narrow < 1.6 and 1.8 < wide < 1.95


def test_hoppers_fp8_plateau_is_the_published_sweeps():
    assert curve_for(H100).e_peak("fp8") == pytest.approx(1523.0 / 1979.0, abs=1e-4)


def test_te_cast_bytes_per_block_token():
    model = _llama(1024)
    fwd, bwd = fp8_cast_bytes(model)
    h, q, kv, f, s = 8192, 8192, 1024, 28672, 1024
    block = [i for i, u in enumerate(model.units) if u.kind == "block"][0]
    assert fwd[block] == pytest.approx((1 * 2 * h + 4 * (q + f)) * s)
    assert bwd[block] == pytest.approx(4 * (q + 2 * kv + h + 2 * f + h) * s)
    assert fwd[0] == 0 and bwd[-1] == 0  # embedding and head: no TE casts
    full_f, full_b = fp8_cast_bytes(model, "full")
    assert full_b[block] == pytest.approx(bwd[block] + fwd[block])
    assert FP8_CAST_BYTES == {"norm_linear_input": 1.0, "linear_input": 4.0, "output_grad": 4.0}


def test_fp8_unit_time_pays_the_casts_at_hbm_speed(monkeypatch):
    import hetpart.costmodel.compute as compute

    model = _llama(4096)
    f8, b8 = unit_compute_s(model, H100, 8, 4, "fp8", "none", dispatch="serial")
    zero = (np.zeros(model.num_units), np.zeros(model.num_units))
    monkeypatch.setattr(compute, "fp8_cast_bytes", lambda *a: zero)
    f0, b0 = unit_compute_s(model, H100, 8, 4, "fp8", "none", dispatch="serial")
    fwd, bwd = fp8_cast_bytes(model)
    assert f8 - f0 == pytest.approx(fwd * 4 / 8 / 3350e9, rel=1e-9)
    assert b8 - b0 == pytest.approx(bwd * 4 / 8 / 3350e9, rel=1e-9)
