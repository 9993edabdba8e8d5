"""The in-run profile times the head with the loss a training step computes on it (token cross-entropy over the
vocabulary, forward and backward), as the step runs it: the isolated head left the loss out, and the runtime's
prediction of a one-A100 run was 27-32% fast on a quiet machine (20-29% with it)."""

from __future__ import annotations

import torch

from hetpart.runtime import profile as profile_module
from hetpart.runtime.engine import loss_fn_for
from hetpart.runtime.models import runnable_spec, synthetic_batch


def test_the_head_is_timed_with_the_steps_loss(monkeypatch):
    spec = runnable_spec("gpt2-small", "tiny")
    calls = {"loss": 0}
    real = profile_module._head_loss

    def counted(*args):
        loss = real(*args)

        def wrapped(out):
            calls["loss"] += 1
            return loss(out)
        return wrapped

    monkeypatch.setattr(profile_module, "_head_loss", counted)
    rows = profile_module.profile_units(spec, [2], 16, "fp32", "cpu", warmup=1, repeats=3)
    assert [r.unit.split("_")[0] for r in rows] == ["embedding", "block", "head"]
    assert calls["loss"] == 4  # the head's warm-up and three repeats; no other unit


def test_the_head_loss_is_the_engines():
    spec = runnable_spec("gpt2-small", "tiny")
    loss = profile_module._head_loss(spec, 2, 16, torch.device("cpu"))
    _, targets = synthetic_batch(spec, 2, 16)
    logits = torch.randn(2, 16, spec.config.vocab_size)
    assert torch.equal(loss(logits), loss_fn_for(spec, 1.0)(logits, targets))
