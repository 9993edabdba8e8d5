"""``python:`` models with dropout run: the sequence check compares in eval mode, the runners train at
rate 0 (as the transformer runners do), and every process draws the same example inputs.

Probe B item 3: a model with ``nn.Dropout(0.1)`` (or ``nn.TransformerEncoderLayer``'s default 0.1)
planned fine and ``hetpart run`` refused it as "not a sequence".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from hetpart.errors import ModelError
from hetpart.plan import Plan, Replica, Stage

os.environ.setdefault("OMP_NUM_THREADS", "1")


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(16)
        self.fc = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 16)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(self.fc2(torch.relu(self.fc(self.ln(x)))))


class _Net(nn.Module):
    def __init__(self, blocks: list[nn.Module]) -> None:
        super().__init__()
        self.emb = nn.Embedding(64, 16)
        self.blocks = nn.Sequential(*blocks)
        self.out = nn.Linear(16, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.blocks(self.emb(x)))


class _SkipsAcross(_Net):
    """Dropout and a residual around the whole block sequence: the units do not compose to the output."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x)
        return self.out(h + self.blocks(h))


def build_dropout():
    """Embedding, two blocks with ``nn.Dropout(0.1)``, a linear head; an unseeded random example."""
    return _Net([_Block(), _Block()]), (torch.randint(0, 64, (2, 8)),)


def build_encoder_layers():
    """Two ``nn.TransformerEncoderLayer`` at their default dropout (0.1, also inside the attention)."""
    layers = [nn.TransformerEncoderLayer(16, 2, 32, batch_first=True) for _ in range(2)]
    return _Net(layers), (torch.randint(0, 64, (2, 8)),)


def build_skips_across():
    return _SkipsAcross([_Block(), _Block()]), (torch.randint(0, 64, (2, 8)),)


@pytest.mark.parametrize("builder", ["build_dropout", "build_encoder_layers"])
def test_a_model_with_dropout_passes_the_sequence_check(builder: str) -> None:
    from hetpart.runtime.models import runnable_spec

    spec = runnable_spec(f"python:tests.test_runtime_s50_dropout:{builder}")
    assert spec.num_units == 4  # embedding, block_0, block_1, head


def test_units_that_do_not_compose_are_still_refused() -> None:
    from hetpart.runtime.models import runnable_spec

    with pytest.raises(ModelError, match=r"_skips_across: running its units one after the other does not give"):
        runnable_spec("python:tests.test_runtime_s50_dropout:build_skips_across")


def test_units_train_at_dropout_rate_zero_in_train_mode() -> None:
    from hetpart.runtime.models import _python_children

    units, _ = _python_children("python:tests.test_runtime_s50_dropout:build_encoder_layers")
    layer = units[1][1]
    assert layer.training is True and layer.dropout1.training is True  # the check's eval mode was undone
    assert layer.dropout.p == 0.0 and layer.dropout1.p == 0.0 and layer.dropout2.p == 0.0
    assert layer.self_attn.dropout == 0.0
    x = torch.randn(2, 8, 16)
    assert torch.equal(layer(x), layer(x))  # train mode, yet deterministic


def test_every_process_draws_the_same_example() -> None:
    from hetpart.runtime.models import _python_children

    spec = "python:tests.test_runtime_s50_dropout:build_dropout"
    torch.manual_seed(1)
    _, first = _python_children(spec)
    torch.manual_seed(2)
    _, second = _python_children(spec)
    assert torch.equal(first[0], second[0])


@pytest.mark.slow  # a 2-process run: `make test-slow`
@pytest.mark.parametrize("builder", ["build_dropout", "build_encoder_layers"])
def test_a_pipeline_of_a_dropout_model_matches_the_reference(builder: str, tmp_path: Path) -> None:
    plan = Plan(global_batch=2, micro_batch=1, seq_len=8, schedule="1f1b", precision="fp16",
                replicas=(Replica(1.0, (Stage((0, 2), ("0/0/0",)), Stage((2, 4), ("1/0/0",)))),),
                meta={"model": f"python:tests.test_runtime_s50_dropout:{builder}", "cluster": "tiny-mixed"})
    plan.save(tmp_path / "plan.json")
    proc = subprocess.run([sys.executable, "-m", "hetpart.cli.app", "run", str(tmp_path / "plan.json"), "--steps",
                           "1", "--warmup", "1", "--time-factor", "50", "--check-gradients", "--json",
                           "--run-dir", str(tmp_path / "ranks")], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    check = json.loads(proc.stdout)["gradient_check"]
    assert check["passed"] is True and check["mismatches"] == []
    assert check["loss"] == pytest.approx(check["reference_loss"], rel=1e-5)
