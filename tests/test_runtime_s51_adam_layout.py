"""The ranks of ``hetpart run`` time Adam on the tensors their optimizer steps (:func:`hetpart.runtime.calibrate.
_adam_layout`): the intercept holds the per-tensor cost a sharding level keeps, the slope the per-parameter one."""

from __future__ import annotations

import importlib
import math
from types import SimpleNamespace

import torch

from hetpart.runtime.models import runnable_spec

calibrate = importlib.import_module("hetpart.runtime.calibrate")  # the package's `calibrate` is measure's function


def test_the_layout_timing_gives_a_line_and_refuses_what_would_not_fit(monkeypatch) -> None:
    fixed, per_param = calibrate._adam_layout([(8, 4), (16,), (3, 3)], "cpu")
    assert fixed >= 0.0 and per_param >= 0.0
    assert math.isfinite(fixed) and math.isfinite(per_param) and fixed + per_param * 57 > 0.0
    monkeypatch.setattr(calibrate, "_free_bytes", lambda device: 1000.0)  # 1 kB free: states of 57 params x 24 B
    assert calibrate._adam_layout([(8, 4), (16,), (3, 3)], "cpu") is None
    assert calibrate._adam_layout([], "cpu") is None


def test_measure_here_times_adam_on_the_shapes_it_is_given_else_on_one_unit_of_each_kind(monkeypatch) -> None:
    seen: list = []
    monkeypatch.setattr(calibrate, "_adam_layout", lambda shapes, device, tick=None: seen.append(list(shapes)) or (1.0, 2.0))
    monkeypatch.setattr(calibrate, "_adam", lambda spec, device, tick=None: (3.0, 4.0))
    spec = runnable_spec("gpt2-small", "tiny")
    sample = calibrate.measure_here(spec, 1, 16, repeats=1, adam_shapes=[(4, 2), (5,)])
    assert seen == [[(4, 2), (5,)]]
    assert (sample["adam_fixed_s"], sample["adam_s_per_param"]) == (1.0, 2.0)
    sample = calibrate.measure_here(spec, 1, 16, repeats=1)
    assert (sample["adam_fixed_s"], sample["adam_s_per_param"]) == (3.0, 4.0)
    monkeypatch.setattr(calibrate, "_adam_layout", lambda shapes, device, tick=None: None)  # would not fit
    sample = calibrate.measure_here(spec, 1, 16, repeats=1, adam_shapes=[(4, 2)])
    assert (sample["adam_fixed_s"], sample["adam_s_per_param"]) == (3.0, 4.0)


def test_a_rank_profiles_adam_on_its_executors_parameters(monkeypatch) -> None:
    from hetpart.runtime import worker

    seen: dict = {}

    def fake(spec, micro_batch, seq_len, **kw):
        seen.update(kw, micro_batch=micro_batch, seq_len=seq_len)
        return {"units": []}

    monkeypatch.setattr(calibrate, "measure_here", fake)
    spec = runnable_spec("gpt2-small", "tiny")
    executor = SimpleNamespace(device=torch.device("cpu"),
                               params={"a": torch.zeros(6, 4), "b": torch.zeros(7), "c": torch.zeros(2, 3, 1)})
    job = {"profile_units": True, "runnable": spec.to_dict()}
    out = worker._unit_profile(job, SimpleNamespace(micro_batch=2, seq_len=16), SimpleNamespace(progress=lambda: None),
                               executor)
    assert out == {"units": []}
    assert seen["adam_shapes"] == [(6, 4), (7,), (2, 3, 1)]
    assert (seen["micro_batch"], seen["seq_len"], seen["device"]) == (2, 16, "cpu")
    assert worker._unit_profile({"profile_units": False}, None, None, executor) is None
