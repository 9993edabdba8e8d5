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


def test_fp8_saves_fp8_linear_inputs_and_caches_fp8_weights():
    from hetpart.costmodel.activations import (FP8_WEIGHT_CACHE_BYTES, unit_fp8_cached_params,
                                               unit_fp8_saved_delta)

    model = _llama(1024)
    h, q, kv, f, s = 8192, 8192, 1024, 28672, 1024
    block = [i for i, u in enumerate(model.units) if u.kind == "block"][0]
    # two norm outputs and fc2's input at 1 byte instead of 2, and an fp8 copy of the attention output
    assert unit_fp8_saved_delta(model, "none")[block] == pytest.approx((-(2 * h + f) + q) * s)
    assert unit_fp8_saved_delta(model, "full")[block] == 0.0
    assert unit_fp8_saved_delta(model, "none", "torch")[block] == 0.0
    assert unit_fp8_cached_params(model)[block] == pytest.approx(h * (q + 2 * kv) + q * h + h * 2 * f + f * h)
    assert unit_fp8_cached_params(model)[0] == 0.0 and unit_fp8_cached_params(model, "torch")[block] == 0.0
    assert FP8_WEIGHT_CACHE_BYTES == 2.0


@pytest.mark.parametrize("zero, cached", [(0, True), (1, True), (3, False)])
def test_fp8_stage_memory_is_bf16s_plus_the_cache_less_the_fp8_inputs(zero, cached):
    from hetpart.costmodel.activations import unit_fp8_cached_params, unit_fp8_saved_delta
    from hetpart.costmodel.memory import PrefixTables, stage_memory_gb

    model = _llama(2048)
    n = model.num_units
    args = (model, 0, n, 8, 2, 3.0, "selective")
    bf16 = stage_memory_gb(*args, "bf16", zero=zero)
    fp8 = stage_memory_gb(*args, "fp8", zero=zero)
    cache = sum(unit_fp8_cached_params(model)) * 2.0 / 8 if cached else 0.0
    delta = sum(unit_fp8_saved_delta(model, "selective")) * 2 * 3.0 / 8
    assert delta < 0
    assert (fp8 - bf16) * 1e9 == pytest.approx(cache + delta, rel=1e-9)
    tables = PrefixTables(model)
    assert tables.memory_gb(0, n, 8, 2, 3.0, "selective", precision="fp8", zero=zero) == pytest.approx(fp8, rel=1e-12)
    if cached:  # the encoders' many-stage path (unsharded plans: the simulator prices sharded ones)
        many = tables.memory_gb_many(np.array([0]), np.array([n]), np.array([8]), np.array([2]), np.array([3.0]),
                                     np.array([1]), state_bytes=18.0, fp8=True)
        assert many[0] == pytest.approx(fp8, rel=1e-12)
