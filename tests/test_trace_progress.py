"""A long trace says what it is doing and can be cut short (``hetpart.graph.trace``).

Tracing Hugging Face's Mamba through ``python:MODULE:FUNCTION`` (its sequential scan: seq_len small ops per layer,
512 x 64 layers, each dispatched on fake tensors) ran past 10 minutes without a word. Now a trace prints a progress
line on stderr every ``PROGRESS_EVERY_S`` seconds (never on stdout), stops at ``HETPART_TRACE_LIMIT_S`` with one
error line naming the fixes, and ``HETPART_TRACE_BLOCKS=K`` traces the first K identical blocks and copies the last.
The model here is a toy scan of the same kind (a Python loop over tokens in every block)."""

from __future__ import annotations

import json
import re
import warnings

import pytest
import torch
from torch import nn

import hetpart.graph.trace as trace
from hetpart.errors import ModelError
from hetpart.graph.load import ModelNote
from hetpart.graph.trace import trace_module, trace_python_spec
from tests._cli import run_cli

SEQ, HIDDEN, VOCAB, LAYERS = 8, 16, 32, 4
SPEC = "python:tests.test_trace_progress:build"


class ScanBlock(nn.Module):
    """A gated recurrence run token by token, as a selective scan's slow path."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(HIDDEN)
        self.proj = nn.Linear(HIDDEN, 2 * HIDDEN)
        self.out = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u, gate = self.proj(self.norm(x)).chunk(2, dim=-1)
        state = torch.zeros_like(u[:, 0])
        outs = []
        for t in range(x.shape[1]):
            state = state * torch.sigmoid(gate[:, t]) + u[:, t]
            outs.append(state)
        return x + self.out(torch.stack(outs, dim=1))


class ScanModel(nn.Module):
    def __init__(self, layers: int = LAYERS, odd: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList(ScanBlock() for _ in range(layers))
        if odd:  # a last block of other shapes: not identical
            self.layers[-1].out = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.head = nn.Linear(HIDDEN, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.layers:
            x = block(x)
        return nn.functional.cross_entropy(self.head(x).flatten(0, 1), ids.flatten())


def build(seq_len: int = SEQ):
    return ScanModel(), torch.zeros(2, seq_len, dtype=torch.long)


def _trace(model: nn.Module | None = None):
    return trace_module(model or ScanModel(), torch.zeros(2, SEQ, dtype=torch.long), name="scan", seq_len=SEQ)


def test_a_long_trace_prints_progress_on_stderr_only(capsys, monkeypatch) -> None:
    monkeypatch.setattr(trace, "PROGRESS_EVERY_S", 0.0)  # every look at the clock reports
    monkeypatch.delenv("HETPART_TRACE_LIMIT_S", raising=False)
    graph = _trace()
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) >= 3 and all(line.startswith("hetpart: tracing scan: ") for line in lines)
    assert " operators, forward in block_" in err and f" of {LAYERS} blocks" in err and "backward in " in err
    assert "HETPART_TRACE_BLOCKS=2" in lines[0] and "HETPART_TRACE_BLOCKS" not in lines[1]  # the hint once
    assert graph.num_units == LAYERS + 2


def test_a_short_trace_says_nothing(capsys) -> None:
    _trace()
    assert capsys.readouterr() == ("", "")  # PROGRESS_EVERY_S (15 s) not reached


def test_the_time_limit_stops_the_trace_with_the_fixes(monkeypatch) -> None:
    monkeypatch.setenv("HETPART_TRACE_LIMIT_S", "0.000001")
    with pytest.raises(ModelError) as info:
        _trace()
    text = str(info.value)
    assert re.match(rf"scan: tracing stopped after 0 s \(64 operators, forward in block_\d of {LAYERS} blocks\): ", text)
    assert "--seq-len" in text and "HETPART_TRACE_BLOCKS=2" in text and "HETPART_TRACE_LIMIT_S=" in text
    assert "\n" not in text
    monkeypatch.setenv("HETPART_TRACE_LIMIT_S", "soon")
    with pytest.raises(ModelError, match=r"^scan: HETPART_TRACE_LIMIT_S: 'soon' is not a number >= 0; give seconds"):
        _trace()


def test_the_cli_keeps_json_on_stdout_and_one_error_line(capsys, monkeypatch) -> None:
    monkeypatch.setattr(trace, "PROGRESS_EVERY_S", 0.0)
    code, out, err = run_cli(capsys, "inspect", "model", SPEC, "--seq-len", str(SEQ), "--json")
    assert code == 0
    assert json.loads(out)["num_units"] == LAYERS + 2  # exactly one JSON object on stdout
    assert err.count(f"hetpart: tracing {SPEC}: ") >= 3
    monkeypatch.setenv("HETPART_TRACE_LIMIT_S", "0.000001")
    monkeypatch.setattr(trace, "PROGRESS_EVERY_S", 1e9)
    code, out, err = run_cli(capsys, "inspect", "model", SPEC, "--seq-len", str(SEQ))
    assert code == 2 and out == ""
    assert err.startswith(f"hetpart: error: {SPEC}: tracing stopped after ") and err.count("\n") == 1


def test_tracing_two_identical_blocks_and_copying_gives_the_full_trace(monkeypatch) -> None:
    monkeypatch.delenv("HETPART_TRACE_BLOCKS", raising=False)
    full = trace_python_spec(SPEC, seq_len=SEQ)
    monkeypatch.setenv("HETPART_TRACE_BLOCKS", "2")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        two = trace_python_spec(SPEC, seq_len=SEQ)
    notes = [str(w.message) for w in caught if issubclass(w.category, ModelNote)]
    assert notes == [f"{SPEC}: traced 2 of {LAYERS} blocks (HETPART_TRACE_BLOCKS); block_2 .. block_{LAYERS - 1} "
                     "copy block_1's numbers (right for identical blocks, not for blocks that compute differently "
                     "by index)"]
    assert [u.to_dict() for u in two.units] == [u.to_dict() for u in full.units]
    assert two.num_params == full.num_params == sum(p.numel() for p in ScanModel().parameters())
    assert two.train_flops == full.train_flops and two.tied_owner == full.tied_owner
    model = ScanModel()
    before = list(model.layers)
    trace_module(model, torch.zeros(2, SEQ, dtype=torch.long), name="scan", seq_len=SEQ)
    assert list(model.layers) == before  # the module's blocks are put back
    monkeypatch.setenv("HETPART_TRACE_BLOCKS", "1")
    assert _trace().train_flops == full.train_flops


def test_blocks_that_differ_are_not_copied(monkeypatch) -> None:
    monkeypatch.setenv("HETPART_TRACE_BLOCKS", "2")
    with pytest.raises(ModelError, match=r"^scan: HETPART_TRACE_BLOCKS: layers\[3\] has other parameters than "
                                         r"layers\[0\]; the blocks are not identical"):
        _trace(ScanModel(odd=True))
    monkeypatch.setenv("HETPART_TRACE_BLOCKS", "two")
    with pytest.raises(ModelError, match=r"HETPART_TRACE_BLOCKS: 'two' is not a whole number >= 0"):
        _trace()
    monkeypatch.setenv("HETPART_TRACE_BLOCKS", str(LAYERS + 1))  # more than the model has: all traced
    assert _trace().num_units == LAYERS + 2
