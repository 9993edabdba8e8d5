"""What ``hetpart run`` measures: peak memory as live tensor bytes, one key for measured and predicted memory,
``--scale tiny`` models that keep their family, and ``--check-gradients``.

One real run (2 CPU processes through the CLI, about a minute on the shared 2-core machine); the rest is
pure functions and one process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hetpart.plan import Plan, Replica, Stage

pytestmark = pytest.mark.slow  # multi-process runs: `make test-slow` (CI runs it after `make test`)

os.environ.setdefault("OMP_NUM_THREADS", "1")


# ------------------------------------------------------------------------------------ live tensor bytes
def test_live_tensor_bytes_count_allocations_frees_and_the_state_held() -> None:
    from hetpart.runtime.live_memory import LiveTensorBytes

    held = torch.zeros(250)  # 1,000 bytes before the mode starts
    with LiveTensorBytes().hold([held, held[10:]]) as mem:  # a view shares its storage: counted once
        x = torch.ones(1000)  # + 4,000
        y = x * 2  # + 4,000
        del x
        z = y.view(10, 100).t()  # a view: nothing new
        w = torch.empty(500, dtype=torch.float64)  # + 4,000 after x's 4,000 went
        del y, z, w
    assert mem.peak_bytes == 1000 + 8000 + 0  # x and y together; w came after x was freed
    assert mem.live_bytes == 1000


def test_live_tensor_bytes_see_the_backward_and_the_optimizer() -> None:
    from hetpart.runtime.live_memory import LiveTensorBytes

    torch.manual_seed(0)
    lin = torch.nn.Linear(256, 256, bias=False)  # 262,144 bytes of weight
    opt = torch.optim.Adam(lin.parameters())
    x = torch.randn(64, 256)  # 65,536 bytes
    lin(x).sum().backward()
    opt.step()  # the moments exist: weight, gradient, 2 moments, the step count
    with LiveTensorBytes().hold([lin.weight, lin.weight.grad, x, *opt.state[lin.weight].values()]) as mem:
        start = mem.live_bytes
        lin.weight.grad = None
        lin(x).sum().backward()
        opt.step()
    assert start == 4 * 262144 + 65536 + 4  # the step count: a 4-byte float tensor
    assert mem.live_bytes == start  # the new gradient replaced the old one
    assert mem.peak_bytes >= start + 64 * 256 * 4  # at least the output saved for the backward


# ------------------------------------------------------------------------------------ memory keys
def test_predicted_memory_is_keyed_by_the_plans_gpu_names() -> None:
    from hetpart import load_cluster
    from hetpart.runtime.emulation import emulated_cluster
    from hetpart.runtime.measure import by_real_gpu

    real = load_cluster("tiny-mixed")
    plan = Plan(global_batch=4, micro_batch=1, seq_len=32, schedule="1f1b",
                replicas=(Replica(1.0, (Stage((0, 8), ("0/0/0",)), Stage((8, 14), ("1/0/0",)))),))
    emu = emulated_cluster(real, plan, peak_tflops=0.02, time_factor=500.0, memory_gbyte_s=5.0)
    predicted = {"step_time_s": 1.0, "peak_memory_gb": {"emu-A100-40GB": 0.5, "emu-V100-16GB": 0.25},
                 "fits_in_memory": True}
    out = by_real_gpu(predicted, emu, real)
    assert out["peak_memory_gb"] == {"A100-40GB": 0.5, "V100-16GB": 0.25}
    assert out["step_time_s"] == 1.0 and predicted["peak_memory_gb"]["emu-A100-40GB"] == 0.5  # a copy


# ------------------------------------------------------------------------------------ --scale tiny
def _mistral(tmp_path: Path) -> Path:
    path = tmp_path / "mistral-7b.json"
    path.write_text(json.dumps({
        "model_type": "mistral", "architectures": ["MistralForCausalLM"], "hidden_size": 4096,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
        "vocab_size": 32000, "max_position_embeddings": 32768, "sliding_window": 4096,
        "tie_word_embeddings": False, "rms_norm_eps": 1e-5, "hidden_act": "silu"}))
    return path


def test_tiny_models_keep_their_family(tmp_path: Path) -> None:
    from hetpart.catalog.models import MODEL_CATALOG
    from hetpart.graph.load import resolve_transformer
    from hetpart.runtime.models import scaled_config

    mistral_full = resolve_transformer(str(_mistral(tmp_path)))[1]
    llama3, mistral = (scaled_config(c, "tiny") for c in (MODEL_CATALOG["llama3-8b"], mistral_full))
    assert llama3 != mistral  # they ran the same shrunken model
    assert (llama3.vocab_size, mistral.vocab_size) == (2048, 512)  # 128,256 and 32,000 tokens at width 4,096
    assert mistral.sliding_windows == mistral_full.sliding_windows != ()
    for full, tiny in ((MODEL_CATALOG["llama3-8b"], llama3), (mistral_full, mistral)):
        assert full.num_heads // full.kv_heads == tiny.num_heads // tiny.kv_heads == 4  # GQA 32:8
        assert tiny.ffn / tiny.hidden_size == pytest.approx(full.ffn / full.hidden_size, rel=0.05)
        assert (tiny.tied_embeddings, tiny.norm, tiny.activation, tiny.bias) == \
            (full.tied_embeddings, full.norm, full.activation, full.bias)
    gpt2 = scaled_config(MODEL_CATALOG["gpt2-small"], "tiny")
    assert gpt2.vocab_size == 4224  # 50,257 x 64 / 768 = 4,188, in tiles of 64
    assert (gpt2.tied_embeddings, gpt2.norm, gpt2.learned_positions) == (True, "layernorm", True)


def test_tiny_keeps_heads_wider_than_the_width_over_heads() -> None:
    from dataclasses import replace

    from hetpart.catalog.models import MODEL_CATALOG
    from hetpart.runtime.models import scaled_config

    wide = replace(MODEL_CATALOG["llama2-7b"], head_size=256)  # queries 32 x 256 = 2x the width (Gemma-like)
    tiny = scaled_config(wide, "tiny")
    assert tiny.q_dim == 2 * tiny.hidden_size and tiny.head_size % 2 == 0
    assert scaled_config(MODEL_CATALOG["llama2-7b"], "tiny").head_size == 0


# ------------------------------------------------------------------------------------ a real run
@pytest.fixture(scope="module")
def checked_run(tmp_path_factory: pytest.TempPathFactory):
    """A 2-stage pipeline of the tiny gpt2-small on tiny-mixed, emulated, with --check-gradients."""
    tmp = tmp_path_factory.mktemp("measures")
    plan = Plan(global_batch=4, micro_batch=1, seq_len=1024, schedule="1f1b", precision="fp16",
                replicas=(Replica(1.0, (Stage((0, 8), ("0/0/0",)), Stage((8, 14), ("1/0/0",)))),),
                meta={"model": "gpt2-small", "cluster": "tiny-mixed"})
    plan.save(tmp / "plan.json")
    proc = subprocess.run([sys.executable, "-m", "hetpart.cli.app", "run", str(tmp / "plan.json"), "--steps", "1",
                           "--warmup", "1", "--time-factor", "50", "--check-gradients", "--json",
                           "--run-dir", str(tmp / "ranks")], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout), tmp


def test_run_measures_live_tensor_bytes_under_the_predictions_keys(checked_run) -> None:
    summary, _ = checked_run
    m, p = summary["measured"], summary["predicted"]
    assert m["memory_method"] == "live_tensors"
    assert set(m["peak_memory_gb"]) == set(p["peak_memory_gb"]) == {"A100-40GB", "V100-16GB"}
    params = {"A100-40GB": 0, "V100-16GB": 0}
    assert set(m["rss_peak_delta_gb"]) == set(params)
    for rank in m["ranks"]:
        # at least the fp32 weights, gradients and two Adam moments of the stage (1 MB and more each)
        assert rank["peak_memory_gb"] > 4e-3, rank
    for gpu, gb in m["peak_memory_gb"].items():
        assert gb == max(r["peak_memory_gb"] for r in m["ranks"] if r["device"] == ("0/0/0" if gpu == "A100-40GB"
                                                                                      else "1/0/0"))


def test_check_gradients_passes_on_a_correct_run(checked_run) -> None:
    summary, _ = checked_run
    check = summary["gradient_check"]
    assert check["passed"] is True and check["mismatches"] == [] and check["step"] == 0
    assert check["loss"] == pytest.approx(check["reference_loss"], rel=1e-5)
    assert [g["group"] for g in check["groups"]] == ["embedding", *(f"block_{i}" for i in range(12)), "head"]
    assert all(g["mismatched"] == 0 and g["max_abs_error"] < 1e-5 for g in check["groups"])
    assert check["tolerance"] == {"loss_rtol": 1e-5, "grad_rtol": 1e-4, "grad_atol": 1e-6}


def test_check_gradients_names_a_wrong_gradient(checked_run) -> None:
    from hetpart.runtime.gradcheck import check_gradients, gradients_path
    from hetpart.runtime.models import runnable_spec

    _, tmp = checked_run
    run_dir = tmp / "ranks"
    path = gradients_path(run_dir, 1)
    saved = torch.load(path, weights_only=True)
    key = "block_10.mlp.c_fc.weight"
    saved["grads"][key]["grad"][0, 0] += 1e-3
    path.write_bytes(b"")
    torch.save(saved, path)
    spec = runnable_spec("gpt2-small", "tiny")
    plan = Plan(global_batch=4, micro_batch=1, seq_len=32, schedule="1f1b",
                replicas=(Replica(1.0, (Stage((0, 8), ("0/0/0",)), Stage((8, 14), ("1/0/0",)))),))
    check = check_gradients(spec, plan, run_dir, 2)
    assert not check.passed
    assert check.mismatches == [f"{key} (rank 1): 1 of {saved['grads'][key]['grad'].numel()} elements outside the "
                                "tolerance, max abs error 1.00e-03"]
    block = next(g for g in check.groups if g["group"] == "block_10")
    assert block["mismatched"] == 1 and block["max_abs_error"] == pytest.approx(1e-3, rel=1e-3)


def test_check_gradients_is_refused_over_several_machines(tmp_path: Path) -> None:
    from hetpart.cli.app import main

    plan = Plan(global_batch=4, micro_batch=1, seq_len=1024, schedule="1f1b", precision="fp16",
                replicas=(Replica(1.0, (Stage((0, 8), ("0/0/0",)), Stage((8, 14), ("1/0/0",)))),),
                meta={"model": "gpt2-small", "cluster": "tiny-mixed"})
    plan.save(tmp_path / "plan.json")
    assert main(["run", str(tmp_path / "plan.json"), "--check-gradients", "--nnodes", "2",
                 "--master-addr", "127.0.0.1"]) == 2


def test_a_mismatch_exits_1_with_one_json_object(tmp_path: Path, monkeypatch, capsys) -> None:
    """The reference's loss moved by 1.0: the check fails, stdout is the run's object with an error, exit 1."""
    from hetpart.cli.app import main
    from hetpart.runtime.reference import Reference

    right = Reference.forward_backward
    monkeypatch.setattr(Reference, "forward_backward", lambda self, step: right(self, step) + 1.0)
    plan = Plan(global_batch=2, micro_batch=1, seq_len=1024, schedule="1f1b", precision="fp16",
                replicas=(Replica(0.5, (Stage((0, 14), ("0/0/0",)),)), Replica(0.5, (Stage((0, 14), ("1/0/0",)),))),
                meta={"model": "gpt2-small", "cluster": "tiny-mixed"})
    plan.save(tmp_path / "plan.json")
    code = main(["run", str(tmp_path / "plan.json"), "--steps", "1", "--warmup", "0", "--no-emulation",
                 "--check-gradients", "--json", "--log-every", "0"])
    out = capsys.readouterr()
    summary = json.loads(out.out)
    assert code == 1
    assert summary["kind"] == "gradient_mismatch" and summary["gradient_check"]["passed"] is False
    assert summary["error"].startswith("--check-gradients: the run differs from the single-process reference at "
                                       "step 0: loss: ")
    assert summary["gradient_check"]["mismatches"][0].startswith("loss: ")
    assert all(g["mismatched"] == 0 for g in summary["gradient_check"]["groups"])  # the gradients still agree
    assert out.err.strip().splitlines()[-1].startswith("hetpart: error: --check-gradients: ")
