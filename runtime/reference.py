"""The single-process reference of a training step, for the runtime's correctness gate.

The whole model runs in one process on the whole global batch, with one mean cross-entropy over all
tokens, the same deterministic weights and data as the distributed run, and the same Adam. A plan
executed by :class:`hetpart.runtime.engine.Executor` must give the same loss and the same gradient
for every parameter (up to float rounding), whatever its pipeline cuts, schedule, tensor
parallelism and data-parallel shares.
"""

from __future__ import annotations

import torch
from torch import nn

from hetpart.runtime.engine import loss_fn_for
from hetpart.runtime.models import RunnableSpec, build_units, synthetic_batch

__all__ = ["Reference"]


class Reference:
    """The whole model in one process.

    Args:
        spec: the model (as given to the executor).
        global_batch: sequences per step.
        seq_len: tokens per sequence.
        lr: Adam learning rate (as given to the executor).
    """

    def __init__(self, spec: RunnableSpec, global_batch: int, seq_len: int, lr: float = 1e-3,
                 dtype: torch.dtype = torch.float32):
        self.spec, self.global_batch, self.seq_len = spec, global_batch, seq_len
        self.units = nn.ModuleList(build_units(spec, range(spec.num_units), "cpu", dtype))
        self.params = self._tie()
        self.loss_fn = loss_fn_for(spec, 1.0)
        self.optimizer = torch.optim.Adam(list(self.params.values()), lr=lr)

    def _tie(self) -> dict[str, nn.Parameter]:
        params: dict[str, nn.Parameter] = {}
        for unit in self.units:
            for local, key in unit.canonical_names().items():
                if local.removeprefix("body.") not in unit.tied:
                    params[key] = unit.get_parameter(local)
        for unit in self.units:
            for short, key in unit.tied.items():
                parent, _, leaf = f"body.{short}".rpartition(".")
                setattr(unit.get_submodule(parent), leaf, params[key])
        return params

    def forward_backward(self, step: int) -> float:
        """Loss of the global batch of ``step`` (gradients left in ``.grad``)."""
        for p in self.params.values():
            p.grad = None
        x, targets = synthetic_batch(self.spec, self.global_batch, self.seq_len, step)
        for unit in self.units:
            x = unit(x)
        loss = self.loss_fn(x, targets)
        loss.backward()
        return float(loss.item())

    def gradients(self) -> dict[str, torch.Tensor]:
        """Every parameter's gradient by canonical key."""
        return {k: p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
                for k, p in self.params.items()}

    def step(self, step: int) -> float:
        """One training step; returns the loss before the update."""
        loss = self.forward_backward(step)
        self.optimizer.step()
        return loss
