"""FLOPs the trace must not lose (``hetpart.graph.trace``): grouped matmuls (the experts of a mixture of experts,
which transformers 5 runs through ``aten._grouped_mm``), and a refusal where weight matrices are multiplied only by
ops torch's FLOP counter does not know (before, a Mixtral given as ``python:`` counted 1.9 of 10.4 GFLOP per token
and predicted MFU above 100% of what was real)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import hetpart.graph.trace as trace
from hetpart._torch_compat import grouped_mm
from hetpart.errors import ModelError
from hetpart.graph.load import ModelNote
from hetpart.graph.trace import trace_module

SEQ, TOKENS, HIDDEN, FFN, EXPERTS = 16, 32, 64, 96, 4


class Experts(nn.Module):
    """Tokens already sorted by expert, one grouped matmul up and one down (as transformers' grouped_mm
    experts), plus a dense projection the counter always knew."""

    def __init__(self) -> None:
        super().__init__()
        self.dense = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.up = nn.Parameter(torch.empty(EXPERTS, HIDDEN, FFN))
        self.down = nn.Parameter(torch.empty(EXPERTS, FFN, HIDDEN))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.dense(x).reshape(TOKENS, HIDDEN)
        offs = torch.arange(1, EXPERTS + 1, dtype=torch.int32) * (TOKENS // EXPERTS)
        h = grouped_mm(h, self.up, offs)
        # squared: the gradient reaching the matmul is then a real tensor, not the sum's expanded ones
        return grouped_mm(torch.relu(h), self.down, offs).pow(2).sum()


def _expected_train_flops() -> float:
    """Forward 2 x tokens x (hidden^2 + 2 hidden ffn); backward twice that (input and weight gradients), less the
    dense layer's input gradient (the inputs need none)."""
    fwd = 2 * TOKENS * (HIDDEN * HIDDEN + 2 * HIDDEN * FFN)
    return 3 * fwd - 2 * TOKENS * HIDDEN * HIDDEN


def _inputs() -> torch.Tensor:
    return torch.zeros(TOKENS // SEQ, SEQ, HIDDEN)


def test_grouped_matmuls_count_every_expert_pass_forward_and_backward():
    graph = trace_module(Experts(), _inputs(), name="experts", seq_len=SEQ, precision="bf16")
    assert graph.train_flops * (TOKENS // SEQ) == pytest.approx(_expected_train_flops(), rel=1e-9)
    assert graph.fwd_flops * (TOKENS // SEQ) == pytest.approx(2 * TOKENS * (HIDDEN * HIDDEN + 2 * HIDDEN * FFN),
                                                              rel=1e-9)


def test_weights_only_an_unknown_op_multiplies_refuse_the_trace(monkeypatch):
    op = next(op for op in trace._EXTRA_FLOP_FORMULAS if "grouped_mm" in str(op))
    monkeypatch.delitem(trace._EXTRA_FLOP_FORMULAS, op)
    with pytest.raises(ModelError) as caught:
        trace_module(Experts(), _inputs(), name="experts", seq_len=SEQ, precision="bf16")
    said = str(caught.value)
    assert "aten._grouped_mm" in said and "up" in said and "down" in said
    assert "too fast" in said


def test_a_weight_scaled_before_its_matmul_still_counts():
    """Ops on parameters alone (weight normalisation: a gain times a direction) pass the parameters on; the
    matmul that then reads the product counts them: no refusal."""

    class Normed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.direction = nn.Parameter(torch.empty(HIDDEN, HIDDEN))
            self.gain = nn.Parameter(torch.empty(HIDDEN, 1))

        def forward(self, x):
            return nn.functional.linear(x, self.direction * self.gain).sum()

    graph = trace_module(Normed(), _inputs(), name="normed", seq_len=SEQ, precision="fp32")
    assert graph.fwd_flops * (TOKENS // SEQ) == pytest.approx(2 * TOKENS * HIDDEN * HIDDEN, rel=1e-9)


def test_an_fp16_trace_that_only_bf16_kernels_take_is_traced_in_bf16_with_a_note():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        graph = trace_module(Experts(), _inputs(), name="experts", seq_len=SEQ, precision="fp16")
    assert graph.dtype_bytes == 2
    assert graph.train_flops * (TOKENS // SEQ) == pytest.approx(_expected_train_flops(), rel=1e-9)
    notes = [str(w.message) for w in seen if issubclass(w.category, ModelNote)]
    assert any("traced in bf16" in n and "BF16" in n for n in notes), notes


def test_a_tiny_mixtral_counts_its_active_experts():
    """transformers' Mixtral (top-2 of 4 experts) built from a config: forward FLOPs per token are twice the
    parameters a token passes through (attention, its two experts' MLPs, the router, the LM head), plus the
    attention scores."""
    from transformers import MixtralConfig, MixtralForCausalLM

    cfg = MixtralConfig(vocab_size=128, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                        max_position_embeddings=SEQ, tie_word_embeddings=False)
    with torch.device("meta"):
        model = MixtralForCausalLM(cfg)
    graph = trace_module(model, (torch.zeros(1, SEQ, dtype=torch.long, device="meta"),), name="mixtral",
                         seq_len=SEQ)
    kv = HIDDEN // 4 * 2
    per_layer = (2 * HIDDEN * HIDDEN + 2 * HIDDEN * kv  # q, o; k, v
                 + 2 * 3 * HIDDEN * FFN  # two experts: gate, up, down
                 + HIDDEN * 4)  # router
    active = 2 * per_layer + HIDDEN * 128  # + LM head
    scores = 2 * 2 * SEQ * HIDDEN * 2  # QK^T and PV per token, two layers (no causal discount in the counter)
    assert graph.fwd_flops / SEQ == pytest.approx(2 * active + scores, rel=0.02)
