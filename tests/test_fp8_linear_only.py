"""fp8 runs quantize the linear layers' products only: the attention core and the output head stay bf16
(Transformer Engine's recipes, Megatron-LM's defaults); provenance calls fp8 compute assumed where the curve has
no fp8 figure of its own."""

from __future__ import annotations

import numpy as np
import pytest

from hetpart.catalog.hardware import GPU_CATALOG
from hetpart.cluster import parse_cluster
from hetpart.costmodel.compute import fp8_bf16_flops, unit_attention_core_s, unit_compute_s
from hetpart.costmodel.efficiency import curve_for
from hetpart.costmodel.provenance import prediction_provenance
from hetpart.graph.transformer import TransformerConfig, transformer_graph
from hetpart.plan import Plan

H100 = GPU_CATALOG["H100-80GB"]


def _llama(seq: int = 4096):
    cfg = TransformerConfig(family="llama", num_layers=4, hidden_size=4096, num_heads=32, vocab_size=32000,
                            max_positions=seq)
    return transformer_graph(cfg, "llama-4l", seq)


def _device_bound(model, precision: str, recompute: str = "none"):
    """Per-unit device times at a micro-batch large enough that the host's dispatch is hidden."""
    f, b = unit_compute_s(model, H100, 1, 8, precision, recompute)
    return f, b


def test_the_head_runs_bf16_and_blocks_land_between_the_two_rates() -> None:
    model = _llama()
    head = [i for i, u in enumerate(model.units) if u.kind == "head"][0]
    blocks = [i for i, u in enumerate(model.units) if u.kind == "block"]
    f16, b16 = _device_bound(model, "bf16")
    f8, b8 = _device_bound(model, "fp8")
    assert f8[head] == pytest.approx(f16[head]) and b8[head] == pytest.approx(b16[head])
    for i in blocks:
        assert 0.5 * f16[i] < f8[i] < f16[i] and 0.5 * b16[i] < b8[i] < b16[i]


def test_the_bf16_share_of_a_block_is_its_attention_core() -> None:
    model = _llama()
    block = [i for i, u in enumerate(model.units) if u.kind == "block"][0]
    core = model.units[block].recompute_flops["selective"]
    fwd, bwd = fp8_bf16_flops(model, "none", "fused")
    assert fwd[block] == core and bwd[block] == pytest.approx(2.5 * core)  # gradients + recomputed scores
    fwd_full, bwd_full = fp8_bf16_flops(model, "full", "fused")
    assert bwd_full[block] == pytest.approx(3.5 * core)  # and the recomputed forward's core
    _, bwd_eager = fp8_bf16_flops(model, "selective", "eager")
    assert bwd_eager[block] == pytest.approx(3.0 * core)
    assert np.all(fwd <= np.array([u.fwd_flops for u in model.units]))


def test_the_core_time_under_fp8_is_the_bf16_core_time() -> None:
    model = _llama()
    assert np.allclose(unit_attention_core_s(model, H100, 1, 2, "fp8")[0], unit_attention_core_s(model, H100, 1, 2, "bf16")[0])


def test_fp8_speedup_on_a_long_sequence_stays_well_under_two() -> None:
    model = _llama(8192)
    f16, b16 = _device_bound(model, "bf16")
    f8, b8 = _device_bound(model, "fp8")
    speedup = (f16.sum() + b16.sum()) / (f8.sum() + b8.sum())
    assert 1.2 < speedup < 1.8
    assert curve_for(H100).e_peak("fp8") == pytest.approx(1523.0 / 1979.0, abs=1e-4)  # the published fp8 plateau


def _provenance(gpu: str, precision: str) -> dict:
    cluster = parse_cluster({"name": "one", "nodes": [{"count": 1, "gpus_per_node": 1, "gpu": gpu,
                                                       "intra_node": "PCIe5", "nic": "Ethernet-10"}]})
    plan = Plan.from_dict({"global_batch": 1, "micro_batch": 1, "seq_len": 128, "schedule": "1f1b", "recompute": "none",
                           "precision": precision,
                           "replicas": [{"batch_share": 1.0, "stages": [{"layers": [0, 6], "devices": ["0/0/0"], "tp": 1}]}]})
    return prediction_provenance(cluster, plan, None)["device_types"][gpu]


def test_fp8_compute_is_assumed_where_the_curve_has_no_fp8_figure() -> None:
    assert _provenance("H100-80GB", "bf16")["compute"] == "fitted"
    hopper = _provenance("H100-80GB", "fp8")  # a published fp8 GEMM sweep; the fit and its band are bf16's
    assert hopper["compute"] == "published" and "published fp8 GEMM sweep" in hopper["curve"]
    assert _provenance("MI300X-192GB", "fp8")["compute"] == "published"
    ada = _provenance("RTX4090-24GB", "fp8")
    assert ada["compute"] == "assumed" and "no fp8 figure" in ada["curve"]
