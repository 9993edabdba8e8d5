"""A device declared faster than its type (``slow:`` factor above 1) counts its factor in MFU's peak and in the
roofline; a throttled one keeps its datasheet peak in MFU and computes its factor less in the roofline."""

from __future__ import annotations

import pytest

from hetpart.cluster import parse_cluster
from hetpart.costmodel.roofline import roofline_tokens_per_s
from hetpart.costmodel.simulator import Simulator
from hetpart.graph.transformer import TransformerConfig, transformer_graph
from hetpart.plan import Plan

NODE = {"count": 1, "gpus_per_node": 2, "gpu": "A100-80GB", "intra_node": "NVLink3", "nic": "IB-HDR"}


def _model():
    cfg = TransformerConfig(family="gpt2", num_layers=4, hidden_size=2048, num_heads=16, vocab_size=50257,
                            max_positions=1024)
    return transformer_graph(cfg, "tiny-h2048", 1024)


def _cluster(speed: float | None):
    spec = {"name": "pair", "nodes": [NODE]}
    if speed is not None:
        spec["slow"] = {"0/0/0": speed, "0/0/1": speed}
    return parse_cluster(spec)


def _metrics(speed: float | None) -> dict:
    model = _model()
    plan = Plan.from_dict({"global_batch": 16, "micro_batch": 8, "seq_len": 1024, "schedule": "1f1b",
                           "recompute": "none", "replicas": [
                               {"batch_share": 0.5, "stages": [{"layers": [0, 6], "devices": ["0/0/0"], "tp": 1}]},
                               {"batch_share": 0.5, "stages": [{"layers": [0, 6], "devices": ["0/0/1"], "tp": 1}]}]})
    return Simulator(model, _cluster(speed)).predict(plan).metrics


def test_mfu_of_a_faster_device_is_taken_against_its_factored_peak() -> None:
    plain, fast = _metrics(None), _metrics(4.0)
    assert fast["step_time_s"] < plain["step_time_s"]
    assert fast["mfu"] <= 1.0
    # MFU = model FLOP/s per device / (datasheet peak x 4): the achieved rate over the declared capability
    peak = 312e12 * 4.0
    assert fast["mfu"] == pytest.approx(fast["model_tflops_per_device"] * 1e12 / peak, rel=1e-9)


def test_mfu_of_a_throttled_device_keeps_the_datasheet_peak() -> None:
    slow = _metrics(0.5)
    assert slow["mfu"] == pytest.approx(slow["model_tflops_per_device"] * 1e12 / 312e12, rel=1e-9)
    assert slow["mfu"] < _metrics(None)["mfu"]


def test_roofline_counts_each_device_speed_and_bounds_the_fast_plan() -> None:
    model = _model()
    plain, fast, slow = (roofline_tokens_per_s(model, _cluster(s)) for s in (None, 4.0, 0.5))
    assert fast == pytest.approx(4.0 * plain) and slow == pytest.approx(0.5 * plain)
    assert _metrics(4.0)["tokens_per_s"] <= fast


def test_the_compute_floor_counts_each_device_speed() -> None:
    import importlib

    from hetpart import Workload

    floor = importlib.import_module("hetpart.policies.plan_search")._compute_floor_s
    model, workload = _model(), Workload(16, 1024)
    plain, fast, slow = (floor(model, _cluster(s), workload) for s in (None, 4.0, 0.5))
    assert fast == pytest.approx(plain / 4.0) and slow == pytest.approx(plain / 0.5)
    assert fast <= _metrics(4.0)["step_time_s"]  # a floor of what the faster devices reach
