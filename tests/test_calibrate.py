"""``hetpart calibrate`` on this machine's CPU, end to end, with a 2-layer model; and its bad input."""

import json
import os

import pytest

from hetpart.costmodel.profile import load_profile
from hetpart.runtime.calibrate import bind_device_types
from hetpart.costmodel.profile import DeviceClass
from hetpart.errors import PlanError
from tests._cli import run_cli

pytestmark = pytest.mark.slow  # multi-process runs: `make test-slow` (CI runs it after `make test`)

CLUSTER = """name: two-a100
nodes:
  - {count: 1, gpus_per_node: 2, gpu: A100-80GB, intra_node: NVLink3, nic: Ethernet-10}
"""
TWO_LAYERS = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 64, "vocab_size": 512}


@pytest.mark.slow
def test_calibrate_measures_the_cpu_and_predict_uses_it(tmp_path, capsys):
    (tmp_path / "c.yaml").write_text(CLUSTER)
    (tmp_path / "config.json").write_text(json.dumps(TWO_LAYERS))
    model, cluster, out = str(tmp_path / "config.json"), str(tmp_path / "c.yaml"), tmp_path / "p.json"
    code, stdout, err = run_cli(capsys, "calibrate", "--cluster", cluster, "--model", model, "--micro-batches", "1,2",
                                "--seq-len", "32", "--repeats", "3", "--out", str(out), "--json")
    assert code == 0, err
    summary = json.loads(stdout)
    assert summary["device_types"] == {"A100-80GB": {"device": "cpu", "stand_in": True}}
    assert "stands in for it" in err and "p2p: latency" in err  # progress on stderr
    profile = load_profile(out)
    assert sorted({(e.unit, e.micro_batch) for e in profile.compute}) == [
        ("block", 1), ("block", 2), ("embedding", 1), ("embedding", 2), ("head", 1), ("head", 2)]
    for e in profile.compute:
        assert e.device == "cpu" and e.precision == "fp32" and e.seq_len == 32 and e.repeats == 3
        assert e.fwd_range_s[0] <= e.fwd_s <= e.fwd_range_s[1] and e.bwd_range_s[0] <= e.bwd_s <= e.bwd_range_s[1]
        assert e.activation_gb > 0
    assert {(e.kind, e.backend, e.scope) for e in profile.links} == {("p2p", "gloo", "any"), ("allreduce", "gloo", "any")}
    assert all(e.bandwidth_gbyte_s > 0 and len(e.sweep) == 8 for e in profile.links)
    assert profile.devices["cpu"].adam_s_per_param > 0
    # every unit kind run tensor-parallel two ways by the runtime's engine: a block's Megatron f and g
    # (two all-reduces of one micro-batch's fp32 activations each way), the embedding and head run whole
    if (os.cpu_count() or 1) >= 2:
        assert "measuring tensor parallelism" in err
        tp = {(e.unit, e.micro_batch, e.engine): e for e in profile.tensor_parallel}
        assert sorted(tp) == sorted({(e.unit, e.micro_batch, "dtensor") for e in profile.compute}
                                    | {(e.unit, e.micro_batch, "megatron") for e in profile.compute if e.unit == "block"})
        for (unit, mb, _), e in tp.items():
            calls = 2 if unit == "block" else 0
            assert (e.tp, e.backend, e.collectives_fwd, e.collectives_bwd) == (2, "gloo", calls, calls)
            assert e.collective_bytes == (mb * 32 * 64 * 4 if calls else 0)
            assert e.fwd_s > 0 and e.bwd_s > 0 and (e.collective_fwd_s > 0) == bool(calls)
    common = ["--model", model, "--cluster", cluster, "--global-batch", "4", "--seq-len", "32", "--tp", "1", "--pp", "2",
              "--dp", "1", "--micro-batch", "2", "--recompute", "none", "--json"]
    code, stdout, err = run_cli(capsys, "predict", *common, "--profile", str(out))
    assert code == 0, err
    with_profile = json.loads(stdout)
    prov = with_profile["provenance"]["device_types"]["A100-80GB"]
    assert prov["compute"] == "measured" and prov["stand_in"] and prov["units_measured"] == "4 of 4"
    # the stand-in prices the plan on this machine: stage 0 (embedding + first block) computes 2 micro-batches of 2
    measured = {e.unit: e.fwd_s + e.bwd_s for e in profile.compute if e.micro_batch == 2}
    stage0 = next(b for b in with_profile["breakdown"] if b["stage"] == 0)
    assert stage0["layers"] == [[0, 2]]
    assert stage0["compute_s"] == pytest.approx(2 * (measured["embedding"] + measured["block"]))


@pytest.mark.parametrize("args, match", [
    (["--micro-batches", "1,x"], "--micro-batches: '1,x'; give whole numbers"),
    (["--micro-batches", "0"], "--micro-batches: 0; give whole numbers >= 1"),
    (["--precision", "int8"], "--precision: 'int8'; calibrate measures"),
    (["--seq-len", "4096"], "--seq-len: 4096 is more than"),
    (["--model", "python:os:getcwd"], "python: models are not supported yet"),
    (["--tp-degrees", "2,four"], "--tp-degrees: '2,four'; give whole numbers >= 2"),
    (["--tp-degrees", "1"], "--tp-degrees: 1; give whole numbers >= 2"),
])
def test_calibrate_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, match):
    import re

    (tmp_path / "c.yaml").write_text(CLUSTER)
    (tmp_path / "config.json").write_text(json.dumps(TWO_LAYERS))
    base = {"--cluster": str(tmp_path / "c.yaml"), "--model": str(tmp_path / "config.json"),
            "--out": str(tmp_path / "p.json"), "--no-links": None}
    for flag, value in zip(args[::2], args[1::2]):
        base[flag] = value
    argv = ["calibrate"] + [x for k, v in base.items() for x in ((k,) if v is None else (k, v))]
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and len(err.strip().splitlines()) == 1 and re.search(match, err), err


def test_cuda_devices_bind_to_their_catalog_types_and_others_are_stand_ins():
    classes = {"NVIDIA A100-SXM4-80GB": DeviceClass("NVIDIA A100-SXM4-80GB", "cuda"),
               "NVIDIA H100 80GB HBM3": DeviceClass("NVIDIA H100 80GB HBM3", "cuda")}
    b = bind_device_types(["A100-80GB", "H100-80GB", "V100-32GB"], classes)
    assert b["A100-80GB"].device == "NVIDIA A100-SXM4-80GB" and not b["A100-80GB"].stand_in
    assert b["H100-80GB"].device == "NVIDIA H100 80GB HBM3" and not b["H100-80GB"].stand_in
    assert b["V100-32GB"].stand_in


def test_the_adam_timing_keeps_to_the_memory_at_hand(monkeypatch):
    """llama3-8b's embedding, block and head hold 1.27 B parameters, 30 GB of Adam timing states: on a machine
    with less free, calibrate times two blocks instead (it was killed for memory on a 24 GB machine)."""
    import importlib

    from hetpart.runtime.models import runnable_spec

    calibrate = importlib.import_module("hetpart.runtime.calibrate")  # the package re-exports a function of that name

    spec = runnable_spec("llama3-8b", None)
    assert calibrate._free_bytes("cpu") > 0  # Linux: MemAvailable
    monkeypatch.setattr(calibrate, "_free_bytes", lambda device: 23e9)
    assert calibrate._adam_units(spec, "cpu") == [1, 2]
    monkeypatch.setattr(calibrate, "_free_bytes", lambda device: 64e9)
    assert calibrate._adam_units(spec, "cpu") == [0, 1, spec.num_units - 1]
    monkeypatch.setattr(calibrate, "_free_bytes", lambda device: None)
    assert calibrate._adam_units(spec, "cpu") == [0, 1, spec.num_units - 1]


@pytest.mark.slow
def test_tensor_parallelism_the_runtime_would_refuse_or_that_fails_is_skipped_not_fatal(tmp_path, monkeypatch):
    """A model that two ranks cannot split is not measured (one line why); a measurement that fails leaves
    the rest of the profile, said so, instead of losing the minutes already measured."""
    import torch.multiprocessing

    from hetpart.runtime.calibrate import CalibrateOptions, calibrate_profile

    (tmp_path / "c.yaml").write_text(CLUSTER)
    odd = dict(TWO_LAYERS, n_embd=48, n_head=3)
    (tmp_path / "odd.json").write_text(json.dumps(odd))
    said: list[str] = []
    options = CalibrateOptions(micro_batches=(1,), seq_len=16, repeats=3, links=False)
    profile = calibrate_profile(str(tmp_path / "c.yaml"), str(tmp_path / "odd.json"), options, say=said.append)
    assert profile.compute and not profile.tensor_parallel
    assert any("tensor parallelism 2: not measured: 2 does not divide the 3 attention heads" in line for line in said)

    (tmp_path / "even.json").write_text(json.dumps(TWO_LAYERS))

    def broken(*args, **kwargs):
        raise torch.multiprocessing.ProcessRaisedException("RuntimeError: a rank failed", 1, 123)

    monkeypatch.setattr(torch.multiprocessing, "start_processes", broken)
    said.clear()
    profile = calibrate_profile(str(tmp_path / "c.yaml"), str(tmp_path / "even.json"), options, say=said.append)
    assert profile.compute and not profile.tensor_parallel
    assert any("tensor parallelism 2: not measured: RuntimeError: a rank failed" in line for line in said)

    # a rank that dies after rank 0 wrote every row (at exit) loses nothing: the rows are kept
    row = {"unit": "block_0", "micro_batch": 1, "fwd_s": 0.002, "bwd_s": 0.003, "fwd_range_s": [0.002, 0.002],
           "bwd_range_s": [0.003, 0.003], "repeats": 3, "collective_fwd_s": 0.0005, "collective_bwd_s": 0.0005,
           "collectives_fwd": 2, "collectives_bwd": 2, "collective_bytes": 8192.0, "engine": "dtensor"}

    def written_then_died(fn, args, **kwargs):
        from pathlib import Path

        Path(args[-1]).write_text(json.dumps([row]))
        raise torch.multiprocessing.ProcessExitedException("process 1 terminated with signal SIGABRT", 1, 123, -6)

    monkeypatch.setattr(torch.multiprocessing, "start_processes", written_then_died)
    said.clear()
    profile = calibrate_profile(str(tmp_path / "c.yaml"), str(tmp_path / "even.json"), options, say=said.append)
    assert [(e.unit, e.micro_batch, e.fwd_s, e.engine) for e in profile.tensor_parallel] == [("block", 1, 0.002, "dtensor")]
    assert not any("not measured" in line for line in said)


def test_every_degree_there_are_devices_for_is_measured(tmp_path, monkeypatch):
    """Each default degree that the cores (or CUDA devices) hold a process each for and that divides the
    model's heads and MLP is timed over that many processes; the rest are said and skipped."""
    import torch.multiprocessing

    from hetpart.runtime import launch
    from hetpart.runtime.calibrate import CalibrateOptions, calibrate_profile

    (tmp_path / "c.yaml").write_text(CLUSTER)
    (tmp_path / "m.json").write_text(json.dumps(dict(TWO_LAYERS, n_embd=48, n_head=4)))
    spawned: list[int] = []

    def timed(fn, args, nprocs, **kwargs):  # what rank 0 writes: one row of the degree it ran
        from pathlib import Path

        spawned.append(nprocs)
        Path(args[-1]).write_text(json.dumps([{
            "unit": "block_0", "micro_batch": 1, "fwd_s": 0.001 * nprocs, "bwd_s": 0.002, "fwd_range_s": [0.001, 0.001],
            "bwd_range_s": [0.002, 0.002], "repeats": 3, "collective_fwd_s": 0.0005, "collective_bwd_s": 0.0005,
            "collectives_fwd": 2, "collectives_bwd": 2, "collective_bytes": 8192.0, "engine": "dtensor"}]))

    monkeypatch.setattr(torch.multiprocessing, "start_processes", timed)
    monkeypatch.setattr(launch, "host_cores", lambda: 4)
    said: list[str] = []
    options = CalibrateOptions(micro_batches=(1,), seq_len=16, repeats=3, links=False, device="cpu")
    profile = calibrate_profile(str(tmp_path / "c.yaml"), str(tmp_path / "m.json"), options, say=said.append)
    assert spawned == [2, 4]  # 8 needs eight cores: a default beyond the machine goes unsaid
    assert [(e.tp, e.fwd_s) for e in profile.tensor_parallel] == [(2, 0.002), (4, 0.004)]
    spawned.clear()
    said.clear()
    options = CalibrateOptions(micro_batches=(1,), seq_len=16, repeats=3, links=False, device="cpu", tp_degrees=(3, 8))
    profile = calibrate_profile(str(tmp_path / "c.yaml"), str(tmp_path / "m.json"), options, say=said.append)
    assert spawned == [] and not profile.tensor_parallel
    assert any("tensor parallelism 3: not measured: 3 does not divide the 4 attention heads" in line for line in said)
    assert any("tensor parallelism 8: 4 core(s), 8 needed; not measured" in line for line in said)
    with pytest.raises(PlanError, match="--tp-degrees"):
        CalibrateOptions(tp_degrees=(1,))
