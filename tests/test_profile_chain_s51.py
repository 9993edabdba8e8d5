"""The in-run profile times the whole model back to back once (``time_chain``) and scales the units' own times by
chain / (embedding + (n - 2) blocks + head): a step's units find caches the units before them filled, which
the units timed alone do not. The issue's one-A100 run on a quiet machine: -20.9/-19.5/-29.1% -> -7.6/-14.7/-7.0%."""

from __future__ import annotations

import pytest

from hetpart.runtime.calibrate import chain_factors, profile_from_samples
from hetpart.runtime.models import runnable_spec
from hetpart.runtime.profile import time_chain


def _unit(kind: str, fwd: float, bwd: float) -> dict:
    return {"unit": f"{kind}_0", "micro_batch": 2, "fwd_s": fwd, "bwd_s": bwd, "fwd_range_s": [fwd, fwd],
            "bwd_range_s": [bwd, bwd], "repeats": 10, "activation_gb": None}


def _sample(chain_fwd: float, chain_bwd: float) -> dict:
    units = [_unit("embedding", 1.0, 2.0), _unit("block", 2.0, 4.0), _unit("head", 3.0, 6.0)]
    return {"units": units, "adam_fixed_s": 0.001, "adam_s_per_param": 1e-9, "device": None,
            "chain": {"fwd_s": chain_fwd, "bwd_s": chain_bwd, "units": 4}}


def test_chain_factors_are_the_median_ratio_over_samples():
    # alone: forward 1 + 2 x 2 + 3 = 8, backward 2 + 2 x 4 + 6 = 16
    assert chain_factors([_sample(10.0, 20.0)]) == (1.25, 1.25)
    assert chain_factors([_sample(8.0, 16.0), _sample(12.0, 24.0), _sample(16.0, 48.0)]) == (1.5, 1.5)
    assert chain_factors([dict(_sample(10.0, 20.0), chain=None)]) is None


def test_the_profile_scales_the_units_by_the_chain():
    from hetpart.graph.load import load_model

    spec = runnable_spec("gpt2-small", "tiny")
    graph = load_model("gpt2-small", seq_len=16)
    plain = profile_from_samples(spec, graph, [dict(_sample(8.0, 16.0), chain=None)], ["A100-80GB"])
    scaled = profile_from_samples(spec, graph, [_sample(10.0, 32.0)], ["A100-80GB"])
    for a, b in zip(plain.compute, scaled.compute):
        assert b.fwd_s == pytest.approx(1.25 * a.fwd_s) and b.bwd_s == pytest.approx(2.0 * a.bwd_s)
    assert scaled.meta["chain_factors"]["cpu"] == (1.25, 2.0)


def test_time_chain_runs_the_model_with_its_loss():
    spec = runnable_spec("gpt2-small", "tiny")
    fwd, bwd = time_chain(spec, 2, 16, repeats=2)
    assert fwd > 0.0 and bwd > 0.0


def test_calibrate_scales_a_cpu_profile_by_the_chain_and_skips_a_model_too_large_to_build(monkeypatch):
    from hetpart.runtime import calibrate
    from hetpart.runtime.calibrate import CalibrateOptions, calibrate_profile

    options = CalibrateOptions(micro_batches=(1,), scale="tiny", device="cpu", links=False, tensor_parallel=False,
                               repeats=2, min_repeats=1)
    lines: list[str] = []
    calibrate_profile("tiny-mixed", "gpt2-small", options, say=lines.append)
    assert sum("the whole model back to back, micro-batch 1" in line for line in lines) == 1
    monkeypatch.setattr(calibrate, "_free_bytes", lambda device: 1.0)  # nothing fits: timed alone only
    lines.clear()
    calibrate_profile("tiny-mixed", "gpt2-small", options, say=lines.append)
    assert "  the whole model is too large to time back to back here: units priced as timed alone" in lines
