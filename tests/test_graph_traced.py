"""Traced model graphs (``hetpart.graph.trace``) and the analytic-vs-traced check.

Small GPT-2 and Llama models are built from configs with transformers (no weights, no network),
traced through one training step on fake tensors, and compared with the analytic formulas of
``hetpart.graph.transformer`` for the same config.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from hetpart import load_model
from hetpart.cli.app import main
from hetpart.errors import ModelError
from hetpart.graph.hf_config import hf_config_to_transformer
from hetpart.graph.trace import trace_module
from hetpart.graph.transformer import transformer_graph
from tests.fixtures.toy import HIDDEN, VOCAB, ToyLM

REPO = Path(__file__).resolve().parents[1]
SEQ, BATCH = 64, 2
REL = 0.02


def _ids(batch: int = BATCH, seq: int = SEQ) -> torch.Tensor:
    return torch.zeros(batch, seq, dtype=torch.long, device="meta")


def _traced_and_analytic(model_cls, config, name: str):
    with torch.device("meta"):
        model = model_cls(config)
    ids = _ids()
    traced = trace_module(model, {"input_ids": ids, "labels": ids}, name=name, seq_len=SEQ)
    analytic = transformer_graph(hf_config_to_transformer(config.to_dict(), name), name, SEQ)
    return traced, analytic


@pytest.fixture(scope="module")
def gpt2():
    config = GPT2Config(n_embd=256, n_layer=3, n_head=4, n_positions=128, vocab_size=1000,
                        activation_function="gelu_pytorch_tanh", attn_implementation="eager")
    return _traced_and_analytic(GPT2LMHeadModel, config, "tiny-gpt2")


@pytest.fixture(scope="module")
def llama():
    config = LlamaConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=344, vocab_size=1000, max_position_embeddings=256,
                         attn_implementation="sdpa")
    return _traced_and_analytic(LlamaForCausalLM, config, "tiny-llama"), config


def test_gpt2_traced_matches_korthikanti(gpt2) -> None:
    """GPT-2, traced, agrees with the analytic FLOPs, parameters and activation bytes within 2%.

    Chosen so that the comparison is meaningful: eager attention (the ``s x s`` scores are real tensors)
    with dropout active (embd/attn/resid_pdrop 0.1, training mode), which is exactly the layer
    Korthikanti et al. count (``34 s h + 5 a s^2`` bytes); ``gelu_pytorch_tanh`` is GPT-2's ``gelu_new``
    as one fused op (HF's ``gelu_new`` is written out elementwise and would keep four extra ``s x 4h``
    tensors); batch 2, because at batch 1 reshaping the query for the batched matmul is a view that
    keeps the whole fused QKV output alive (+4 s h bytes), which no batch above 1 does. The tracer
    runs dropout as the fused GPU kernel (a 1-byte mask). Head dim 64 equals seq_len 64 here, so the
    attention scores must be told apart from K^T and V by data flow, not by shape alone.
    """
    traced, analytic = gpt2
    assert [u.name for u in traced.units] == [u.name for u in analytic.units]
    assert traced.num_params == analytic.num_params
    assert traced.train_flops == pytest.approx(analytic.train_flops, rel=REL)
    for t, a in zip(traced.units, analytic.units):
        assert t.kind == a.kind
        assert t.params == a.params and t.shared_params == a.shared_params, t.name
        assert t.fwd_flops == pytest.approx(a.fwd_flops, rel=REL), t.name
        assert t.bwd_flops == pytest.approx(a.bwd_flops, rel=REL), t.name
        assert t.out_act_bytes == pytest.approx(a.out_act_bytes, rel=REL), t.name
        assert t.width == a.width
        for mode in ("none", "selective", "full"):
            assert t.act_bytes[mode] == pytest.approx(a.act_bytes[mode], rel=REL), (t.name, mode)
            assert t.recompute_flops[mode] == pytest.approx(a.recompute_flops[mode], rel=REL), (t.name, mode)
    s, h, a_heads = SEQ, 256, 4
    assert traced.units[1].act_bytes["none"] == pytest.approx(34 * s * h + 5 * a_heads * s * s, rel=REL)


def test_gpt2_tied_embedding_is_owned_once(gpt2) -> None:
    traced, _ = gpt2
    head = traced.units[-1]
    assert head.shared_params == 1000 * 256 and traced.arch == {"tied_owner": "embedding"}
    assert traced.range_params(0, traced.num_units) == traced.num_params
    assert traced.range_params(traced.num_units - 1, traced.num_units) == head.params + head.shared_params


def test_llama_gqa_traced_matches_analytic(llama) -> None:
    """Llama with grouped-query attention, traced, agrees with the analytic numbers within 2%.

    Attention runs as ``sdpa``, which on (fake) CPU tensors is the CPU flash kernel (its FLOP formulas
    are registered by the tracer) with K/V kept at the KV-head width: what a Llama trains with. Flash
    attention keeps no ``s x s`` scores, so the traced ``none`` is compared with the analytic
    ``selective`` (which drops them), and two differences that are right are added, not hidden:

    - HF's ``LlamaRMSNorm`` is written in Python: per norm it keeps a float32 copy of its input
      (``4 s h``), the float32 ``rsqrt`` (``4 s``) and the normalised 16-bit tensor (``2 s h``) where a
      fused RMSNorm (Megatron, Korthikanti) keeps the 16-bit input (``2 s h``): ``+4 s h + 4 s`` per norm.
    - the flash kernel keeps its float32 log-sum-exp (``4 a s``), and its backward recomputes
      ``Q K^T`` (torch's flash formula counts it: ``+2 s^2 h`` backward FLOPs per layer).
    """
    (traced, analytic), config = llama
    s, h, a_heads = SEQ, config.hidden_size, config.num_attention_heads
    norm_extra = 4 * s * h + 4 * s
    assert traced.num_params == analytic.num_params
    for t, a in zip(traced.units, analytic.units):
        assert (t.name, t.params, t.shared_params) == (a.name, a.params, a.shared_params)
        assert t.fwd_flops == pytest.approx(a.fwd_flops, rel=REL), t.name
        flash_recompute = 2 * s * s * h if t.kind == "block" else 0
        assert t.bwd_flops == pytest.approx(a.bwd_flops + flash_recompute, rel=REL), t.name
        assert t.out_act_bytes == pytest.approx(a.out_act_bytes, rel=REL), t.name
    blocks = [(t, a) for t, a in zip(traced.units, analytic.units) if t.kind == "block"]
    for t, a in blocks:
        expected = a.act_bytes["selective"] + 2 * norm_extra + 4 * a_heads * s
        assert t.act_bytes["none"] == pytest.approx(expected, rel=REL), t.name
        assert t.act_bytes["selective"] == t.act_bytes["none"] and t.recompute_flops["selective"] == 0.0
        assert t.act_bytes["full"] == pytest.approx(a.act_bytes["full"], rel=REL)
    assert traced.units[0].act_bytes["none"] == pytest.approx(analytic.units[0].act_bytes["none"], rel=REL)
    assert traced.units[-1].act_bytes["none"] == pytest.approx(
        analytic.units[-1].act_bytes["none"] + norm_extra, rel=REL)


def _toy(batch: int = 1, seq: int = 32):
    with torch.device("meta"):
        return ToyLM(), torch.zeros(batch, seq, dtype=torch.long)


def test_toy_units_and_counts_from_shapes() -> None:
    model, ids = _toy()
    graph = trace_module(model, ids, name="toy", seq_len=32)
    assert [u.name for u in graph.units] == ["embedding", "block_0", "block_1", "head"]
    assert graph.num_params == sum(p.numel() for p in model.parameters())
    s, h, f, v = 32, HIDDEN, 4 * HIDDEN, VOCAB
    block = graph.units[1]
    assert block.fwd_flops == 2 * 2 * s * h * f and block.bwd_flops == 2 * block.fwd_flops
    assert graph.units[-1].fwd_flops == 2 * s * h * v
    assert block.out_act_bytes == 2 * s * h and graph.units[-1].out_act_bytes == 2 * s * v  # logits
    assert block.act_bytes["full"] == 2 * s * h and block.recompute_flops["full"] == block.fwd_flops
    # LayerNorm input and its fp16 mean/rstd, up input, GELU input, down input; no attention scores
    assert block.act_bytes["none"] == 2 * s * h + 2 * 2 * s + 2 * s * h + 2 * s * f + 2 * s * f
    assert block.act_bytes["selective"] == block.act_bytes["none"] and block.recompute_flops["selective"] == 0


def test_numbers_are_per_sequence_and_follow_precision() -> None:
    one = trace_module(*_toy(batch=1), name="toy", seq_len=32)
    three = trace_module(*_toy(batch=3), name="toy", seq_len=32)
    fp32 = trace_module(*_toy(batch=1), name="toy", seq_len=32, precision="fp32")
    for a, b, c in zip(one.units, three.units, fp32.units):
        assert (a.fwd_flops, a.bwd_flops, a.act_bytes) == (b.fwd_flops, b.bwd_flops, b.act_bytes)
        assert c.out_act_bytes == 2 * a.out_act_bytes and c.fwd_flops == a.fwd_flops
    assert (one.dtype_bytes, fp32.dtype_bytes) == (2, 4)


def test_units_argument_names_the_units() -> None:
    model, ids = _toy()
    graph = trace_module(model, ids, name="toy", seq_len=32, units=["embed", "blocks.0", ["blocks.1", "norm", "out"]])
    assert [(u.name, u.kind) for u in graph.units] == [("embed", "module"), ("blocks.0", "module"),
                                                       ("blocks.1+norm+out", "module")]
    assert graph.num_params == sum(p.numel() for p in model.parameters())
    assert graph.units[2].fwd_flops == 2 * 2 * 32 * HIDDEN * 4 * HIDDEN + 2 * 32 * HIDDEN * VOCAB
    with pytest.raises(ModelError, match=r"units: 'blocks\.7': no such submodule; names look like: embed"):
        trace_module(model, ids, name="toy", seq_len=32, units=["embed", "blocks.7"])
    with pytest.raises(ModelError, match=r"units: 'blocks\.0' overlaps 'blocks'; name disjoint submodules"):
        trace_module(model, ids, name="toy", seq_len=32, units=["blocks", "blocks.0"])


def test_modules_without_repeated_blocks_split_at_top_level_children() -> None:
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    graph = trace_module(model, torch.zeros(4, 10, 16), name="mlp", seq_len=10, precision="fp32")
    assert [u.name for u in graph.units] == ["0", "1", "2"]
    assert [u.params for u in graph.units] == [16 * 32 + 32, 0, 32 * 8 + 8]
    assert [u.fwd_flops for u in graph.units] == [2 * 10 * 16 * 32, 0, 2 * 10 * 32 * 8]
    # the input needs no gradient, so the first layer computes no input gradient
    assert [u.bwd_flops for u in graph.units] == [2 * 10 * 16 * 32, 0, 2 * 2 * 10 * 32 * 8]
    stack = trace_module(nn.Sequential(*(nn.Linear(16, 16) for _ in range(3))), torch.zeros(1, 10, 16),
                         name="stack", seq_len=10)
    assert [(u.name, u.kind) for u in stack.units] == [("block_0", "block"), ("block_1", "block"), ("block_2", "block")]
    single = trace_module(nn.Linear(16, 4), torch.zeros(1, 10, 16), name="lin", seq_len=10)
    assert [u.name for u in single.units] == ["lin"] and single.units[0].fwd_flops == 2 * 10 * 16 * 4


def test_bad_modules_and_inputs_are_model_errors() -> None:
    model, ids = _toy()
    with pytest.raises(ModelError, match=r"example_inputs: expected a tensor, a tuple of arguments or a dict"):
        trace_module(model, "ids", name="toy", seq_len=32)
    with pytest.raises(ModelError, match=r"--precision: 'int8' is not one of bf16, fp16, fp32"):
        trace_module(model, ids, name="toy", seq_len=32, precision="int8")
    with pytest.raises(ModelError, match=r"output holds no tensor that needs a gradient"):
        trace_module(model.requires_grad_(False), ids, name="toy", seq_len=32)


@pytest.mark.parametrize(("spec", "message"), [
    ("python:tests.fixtures.toy:build_fails",
     r"python:tests\.fixtures\.toy:build_fails: calling build_fails\(\) failed \(RuntimeError: weights file not found\)"),
    ("python:tests.fixtures.toy:not_a_model", r"not_a_model\(\) must return \(torch\.nn\.Module, example_inputs\), got str"),
    ("python:tests.fixtures.toy:missing", r"module 'tests\.fixtures\.toy' has no function 'missing'"),
    ("python:tests.fixtures.nowhere:build", r"importing tests\.fixtures\.nowhere failed \(ModuleNotFoundError"),
    ("python:tests.fixtures.toy", r"expected python:MODULE:FUNCTION"),
    ("python:tests.fixtures.data_dependent:build", r"tracing one training step failed .*shapes alone"),
])
def test_python_spec_errors_are_one_clear_line(spec: str, message: str, capsys) -> None:
    with pytest.raises(ModelError, match=message):
        load_model(spec, seq_len=16)
    assert main(["inspect", "model", spec, "--seq-len", "16"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err


_NAME = st.text(alphabet=st.characters(codec="ascii", exclude_categories=("Cc",)), max_size=20)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["python:tests.fixtures.", "python:tests.fixtures.toy:", "python:", "python::"]), _NAME, _NAME)
def test_malformed_python_specs_fail_cleanly(prefix: str, first: str, second: str) -> None:
    """Garbage after ``python:`` (kept inside the test fixtures, so no other module is ever imported)
    gives one ModelError line or, for a real builder, a graph; never another exception."""
    spec = prefix + first + (":" + second if prefix.endswith(".") else "")
    try:
        graph = load_model(spec, seq_len=8)
    except ModelError as err:
        assert "\n" not in str(err) and str(err).startswith(("python:", "--model"))
    else:
        assert graph.num_units >= 1


def test_python_spec_passes_seq_len() -> None:
    graph = load_model("python:tests.fixtures.toy:build", seq_len=16, precision="fp32")
    assert graph.seq_len == 16 and graph.dtype_bytes == 4 and graph.source == "python:tests.fixtures.toy:build"
    assert graph.units[1].out_act_bytes == 4 * 16 * HIDDEN
    fixed = load_model("python:tests.fixtures.toy:build_fixed", seq_len=16)
    assert fixed.seq_len == 24 and fixed.units[1].out_act_bytes == 2 * 24 * HIDDEN  # per sequence of the batch of 2


def test_a_seq_len_the_example_inputs_do_not_have_is_refused(capsys, tmp_path: Path) -> None:
    """The example inputs of a builder without a seq_len parameter fix the length: a --seq-len the user gave
    that differs is an error naming both lengths and the fix, never silently replaced."""
    with pytest.raises(ModelError, match=r"build_fixed: --seq-len 16 does not match the 24 tokens of build_fixed\(\)'s "
                                         r"example inputs .*make the example inputs 16 tokens long .*or drop --seq-len"):
        load_model("python:tests.fixtures.toy:build_fixed", seq_len=16, exact_seq_len=True)
    assert load_model("python:tests.fixtures.toy:build_fixed", seq_len=24, exact_seq_len=True).seq_len == 24
    assert load_model("python:tests.fixtures.toy:build", seq_len=16, exact_seq_len=True).seq_len == 16
    code = main(["plan", "--model", "python:tests.fixtures.toy:build_fixed", "--cluster", "tiny-mixed",
                 "--global-batch", "8", "--seq-len", "4096", "--json"])
    out, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and "--seq-len 4096 does not match the 24 tokens" in err
    assert "--seq-len 4096" in json.loads(out)["error"]
    plan = tmp_path / "p.json"
    assert main(["plan", "--model", "python:tests.fixtures.toy:build_fixed", "--cluster", "tiny-mixed",
                 "--global-batch", "8", "--out", str(plan), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["seq_len"] == 24  # no --seq-len: the inputs' length
    code = main(["predict", "--plan", str(plan), "--seq-len", "32", "--json"])  # the plan's 24 tokens, said first
    assert code == 2 and f"--seq-len: 32 but {plan} was planned for 24 tokens" in capsys.readouterr().err


def test_a_builder_that_exits_or_parses_argv_is_one_clear_line(capsys, monkeypatch, tmp_path: Path) -> None:
    """sys.exit() in a builder, or an argparse that would read hetpart's own options, is a builder failure like
    any other: one line, exit 2, one JSON object; the builder sees only its module's name in sys.argv."""
    (tmp_path / "exiting.py").write_text(
        "import argparse, sys, torch\n"
        "def exits():\n    sys.exit(3)\n"
        "def parses():\n"
        "    p = argparse.ArgumentParser(); p.add_argument('--hidden', type=int, default=8); a = p.parse_args()\n"
        "    return torch.nn.Linear(a.hidden, a.hidden), (torch.zeros(2, 4, a.hidden),)\n"
        "def requires():\n"
        "    p = argparse.ArgumentParser(); p.add_argument('--hidden', type=int, required=True); p.parse_args()\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["hetpart", "inspect", "model", "python:exiting:parses", "--json"])
    assert main(["inspect", "model", "python:exiting:parses", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["num_params"] == 8 * 8 + 8
    assert sys.argv[0] == "hetpart"  # given back
    for func, why in (("exits", r"SystemExit: 3"), ("requires", r"SystemExit: 2: exiting: error: the following "
                                                                r"arguments are required: --hidden")):
        code = main(["inspect", "model", f"python:exiting:{func}", "--json"])
        out, err = capsys.readouterr()
        assert code == 2 and err.count("\n") == 1 and "usage:" not in err
        assert re.search(rf"python:exiting:{func}: calling {func}\(\) failed \({why}\); fix the function",
                         json.loads(out)["error"])
    (tmp_path / "exits_on_import.py").write_text("import sys\nsys.exit('no GPU here')\n")
    code = main(["inspect", "model", "python:exits_on_import:build", "--json"])
    out, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1
    assert json.loads(out)["error"] == ("python:exits_on_import:build: importing exits_on_import failed (SystemExit: "
                                        "no GPU here); fix the module")


def test_inputs_that_do_not_fit_the_module_give_one_line_and_no_torch_log(tmp_path: Path) -> None:
    """FakeTensorMode logs a traceback for an op that fails on fake tensors; hetpart's one line is all."""
    (tmp_path / "misfit.py").write_text("import torch\n"
                                        "def build():\n    return torch.nn.Linear(16, 16), (torch.randn(2, 8),)\n")
    cli = Path(sys.executable).parent / "hetpart"
    proc = subprocess.run([str(cli), "inspect", "model", "python:misfit:build", "--json"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "tracing one training step failed" in proc.stderr, proc.stderr
    assert "tracing one training step failed" in json.loads(proc.stdout)["error"]


def test_cli_inspect_python_model_json() -> None:
    """The contract's command, run as a user would from the repository root (user code is opt-in)."""
    cli = Path(sys.executable).parent / "hetpart"  # the console script: the repository is not on its sys.path
    proc = subprocess.run([str(cli), "inspect", "model", "python:tests.fixtures.toy:build", "--seq-len", "32",
                           "--json"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    model, _ = _toy()
    assert data["num_params"] == sum(p.numel() for p in model.parameters())
    assert data["num_units"] == 4 and [u["name"] for u in data["units"]] == ["embedding", "block_0", "block_1", "head"]
    assert data["units"][1]["fwd_flops"] == 2 * 2 * 32 * HIDDEN * 4 * HIDDEN
    assert sum(u["params"] for u in data["units"]) == data["num_params"]
