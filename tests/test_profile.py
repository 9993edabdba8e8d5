"""Per-unit profiles measured on the device at hand (here the CPU): structure and sanity of the timings."""

import pytest

from hetpart.runtime.models import runnable_spec
from hetpart.runtime.profile import profile_units


def test_profile_units_times_every_unit_kind_and_micro_batch():
    spec = runnable_spec("gpt2-small", "tiny")
    rows = profile_units(spec, [1, 2], seq_len=16, precision="fp32", device="cpu", warmup=1, repeats=3)
    assert [(r.unit, r.micro_batch) for r in rows] == [
        ("embedding", 1), ("embedding", 2), ("block_0", 1), ("block_0", 2), ("head", 1), ("head", 2)]
    for r in rows:
        assert 0 < r.fwd_range_s[0] <= r.fwd_s <= r.fwd_range_s[1]
        assert 0 < r.bwd_range_s[0] <= r.bwd_s <= r.bwd_range_s[1]
        assert r.precision == "fp32" and r.seq_len == 16 and r.repeats == 3
        assert r.peak_memory_gb is None  # measured on GPUs only
    assert rows[0].to_dict()["unit"] == "embedding"


def test_profile_units_refuses_unknown_precision():
    with pytest.raises(ValueError, match="precision 'int4'"):
        profile_units(runnable_spec("gpt2-small", "tiny"), [1], 16, precision="int4")


def _sample(name: str, kind: str, fwd: float) -> dict:
    units = [{"unit": u, "micro_batch": 2, "fwd_s": fwd, "bwd_s": 2 * fwd, "fwd_range_s": [fwd, fwd],
              "bwd_range_s": [2 * fwd, 2 * fwd], "repeats": 3, "activation_gb": 0.001}
             for u in ("embedding", "block_0", "head")]
    return {"units": units, "adam_fixed_s": 1e-4, "adam_s_per_param": 1e-9,
            "device": {"name": name, "kind": kind, "description": f"{kind}: {name}"}}


def test_a_gpu_run_is_priced_by_its_gpu_not_by_this_cpu():
    """The ranks of a run on a GPU time their units there (measure_here's ``device``): the profile's class is
    the GPU's and the cluster's type of that model binds to it, not to this CPU as a stand-in. (A run on one
    H200 was predicted at 77.65 s a step from CPU timings; it measured 0.469 s.)"""
    from hetpart.graph.transformer import transformer_graph
    from hetpart.runtime.calibrate import profile_from_samples

    spec = runnable_spec("gpt2-small", "tiny")
    graph = transformer_graph(spec.config, "gpt2-small@tiny", 32, 4)
    gpu = profile_from_samples(spec, graph, [_sample("NVIDIA H200", "cuda", 1e-3), _sample("NVIDIA H200", "cuda", 3e-3)],
                               ["H200-141GB"])
    assert gpu.device_types["H200-141GB"].device == "NVIDIA H200"
    assert not gpu.device_types["H200-141GB"].stand_in
    assert gpu.devices["NVIDIA H200"].kind == "cuda"
    assert {e.device for e in gpu.compute} == {"NVIDIA H200"}
    assert [e.fwd_s for e in gpu.compute if e.unit == "block"] == [pytest.approx(2e-3)]  # the median of the two
    # ranks on this CPU (or samples from before the device was recorded): this CPU, a stand-in for every type
    cpu = profile_from_samples(spec, graph, [{k: v for k, v in _sample("cpu", "cpu", 1e-3).items() if k != "device"}],
                               ["H200-141GB", "V100-32GB"])
    assert {b.device for b in cpu.device_types.values()} == {"cpu"}
    assert all(b.stand_in for b in cpu.device_types.values())


def test_measure_here_names_the_device_it_measured_on():
    from hetpart.runtime.calibrate import measure_here

    sample = measure_here(runnable_spec("gpt2-small", "tiny"), 1, 16, repeats=1)
    assert sample["device"]["kind"] == "cpu" and sample["device"]["name"] == "cpu"
    assert {u["unit"].split("_")[0] for u in sample["units"]} == {"embedding", "block", "head"}


def test_the_gpu_warm_up_runs_a_block_for_its_time_and_leaves_no_gradient():
    import time

    import torch

    from hetpart.runtime.models import build_units
    from hetpart.runtime.profile import GPU_WARMUP_S, _warm_gpu

    spec = runnable_spec("gpt2-small", "tiny")
    unit = build_units(spec, [1])[0]
    started = time.perf_counter()
    _warm_gpu(unit, spec, 1, 2, 16, torch.device("cpu"), torch.float32)  # the CUDA-only path, on this CPU
    assert time.perf_counter() - started >= GPU_WARMUP_S
    assert all(p.grad is None for p in unit.parameters())
