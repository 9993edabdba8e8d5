"""Where a run's ranks compute (``hetpart run --device``), and a profile the run cannot use.

One GPU per rank or the CPU: ranks sharing a GPU cannot pass a pipeline's CUDA activations over gloo, and
emulation slows this machine's CPU, so an emulated run computes there. This machine has no GPU: the GPU
side is checked with torch's device count replaced."""

import dataclasses
import json

import pytest
import torch

from hetpart.errors import PlanError, SpecError
from hetpart.runtime.launch import RunOptions, run_device
from tests._cli import run_cli

PLAN = {"global_batch": 4, "micro_batch": 1, "seq_len": 32, "schedule": "1f1b", "recompute": "none", "precision": "fp32",
        "replicas": [{"batch_share": 1.0, "stages": [{"layers": [0, 7], "devices": ["0/0/0"], "tp": 1},
                                                     {"layers": [7, 14], "devices": ["0/0/1"], "tp": 1}]}]}
CLUSTER = "name: two\nnodes:\n  - {count: 1, gpus_per_node: 2, gpu: A100-80GB, intra_node: NVLink3, nic: IB-HDR}\n"


def _gpus(monkeypatch, n: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)


@pytest.mark.parametrize("gpus, ranks, emulate, want", [
    (0, 2, False, "cpu"),   # no GPU
    (2, 2, False, "cuda"),  # one GPU per rank, at its own speed
    (2, 2, True, "cpu"),    # emulation calibrates and slows the CPU
    (1, 2, False, "cpu"),   # two ranks would share one GPU
])
def test_auto_puts_the_ranks_on_gpus_only_one_each_and_not_emulated(monkeypatch, gpus, ranks, emulate, want):
    _gpus(monkeypatch, gpus)
    assert run_device(RunOptions(emulate=emulate), ranks) == want
    assert run_device(RunOptions(emulate=emulate, device="cpu"), ranks) == "cpu"


@pytest.mark.parametrize("gpus, ranks, emulate, match", [
    (0, 1, False, "sees no CUDA device"),
    (1, 2, False, "2 devices and this machine 1 GPU"),
    (2, 2, True, "add --no-emulation"),
])
def test_device_cuda_that_cannot_be_honoured_is_refused(monkeypatch, gpus, ranks, emulate, match):
    _gpus(monkeypatch, gpus)
    with pytest.raises(PlanError, match=match):
        run_device(RunOptions(emulate=emulate, device="cuda"), ranks)


def test_an_unknown_device_is_refused():
    with pytest.raises(PlanError, match="--device: 'tpu'; use auto, cpu, cuda"):
        RunOptions(device="tpu")


def test_run_device_cuda_here_is_one_line_and_exit_2_before_any_process(tmp_path, capsys):
    (tmp_path / "p.json").write_text(json.dumps(PLAN))
    (tmp_path / "c.yaml").write_text(CLUSTER)
    code, out, err = run_cli(capsys, "run", str(tmp_path / "p.json"), "--model", "gpt2-small", "--cluster",
                             str(tmp_path / "c.yaml"), "--no-emulation", "--device", "cuda", "--steps", "1")
    assert code == 2 and out == ""
    assert "--device cuda: torch sees no CUDA device" in err and len(err.strip().splitlines()) == 1


def test_a_profile_measured_in_another_precision_is_refused_not_ignored(tmp_path):
    """The runtime computes in fp32; a bf16 profile (``hetpart calibrate``'s default on a GPU) has no entry the
    prediction can use, and was silently replaced by the analytic price."""
    from hetpart.graph.transformer import transformer_graph
    from hetpart.plan import Plan
    from hetpart.runtime.calibrate import profile_from_samples
    from hetpart.runtime.launch import prepare_run, run_profile
    from hetpart.runtime.models import runnable_spec

    (tmp_path / "c.yaml").write_text(CLUSTER)
    options = RunOptions(steps=1, emulate=False)
    prep = prepare_run(Plan.from_dict(PLAN), "gpt2-small", str(tmp_path / "c.yaml"), options)
    spec = runnable_spec("gpt2-small", "tiny")
    graph = transformer_graph(spec.config, "gpt2-small@tiny", 32, 4)
    sample = {"units": [{"unit": u, "micro_batch": 1, "fwd_s": 1e-3, "bwd_s": 2e-3, "fwd_range_s": [1e-3, 1e-3],
                         "bwd_range_s": [2e-3, 2e-3], "repeats": 3} for u in ("embedding", "block_0", "head")],
              "adam_fixed_s": 1e-4, "adam_s_per_param": 1e-9}
    profile = profile_from_samples(spec, graph, [sample], ["A100-80GB"])
    assert graph.units[1].params == prep.run_graph.units[1].params  # the profile is of the model that runs
    fp32 = tmp_path / "fp32.json"
    profile.save(fp32)
    assert run_profile(prep, dataclasses.replace(options, profile=str(fp32))) is not None
    bf16 = tmp_path / "bf16.json"
    dataclasses.replace(profile, compute=tuple(dataclasses.replace(e, precision="bf16") for e in profile.compute)
                        ).save(bf16)
    with pytest.raises(SpecError, match="measured in bf16, and the run computes in fp32; .*--precision fp32"):
        run_profile(prep, dataclasses.replace(options, profile=str(bf16)))


def test_on_gpus_the_states_are_checked_against_gpu_memory_not_host_memory(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from hetpart.errors import RuntimeFault
    from hetpart.plan import Plan
    from hetpart.runtime.launch import prepare_run

    (tmp_path / "c.yaml").write_text(CLUSTER)
    _gpus(monkeypatch, 2)
    sizes = {"gb": 80}
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(total_memory=sizes["gb"] * 1e9))
    plan = Plan.from_dict(PLAN)
    on_gpus = prepare_run(plan, "gpt2-small", str(tmp_path / "c.yaml"), RunOptions(steps=1, emulate=False))
    on_cpu = prepare_run(plan, "gpt2-small", str(tmp_path / "c.yaml"), RunOptions(steps=1))  # emulated: the CPU
    assert on_gpus.per_process_gb < on_cpu.per_process_gb  # the host holds no model states for a GPU rank
    sizes["gb"] = 1e-4
    with pytest.raises(RuntimeFault, match="the smallest GPU has 0.0 GB"):
        prepare_run(plan, "gpt2-small", str(tmp_path / "c.yaml"), RunOptions(steps=1, emulate=False))
