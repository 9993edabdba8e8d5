"""``hetpart run --check-gradients``: the runtime's correctness gate on the run a user made.

Before its first step every rank runs one more forward and backward of that step's global batch, with the
gradient synchronisation and without the optimizer, on the weights the run starts from (emulation delays
off), and writes its loss share and every gradient it holds (a shard under tensor parallelism or ZeRO) to
``rank{r}.grads.pt`` in the run directory (:func:`save_gradients`). After the run, :func:`check_gradients`
runs the whole model in this process on the same batch (:class:`hetpart.runtime.reference.Reference`) and
compares: the loss, and every rank's part of every parameter's gradient, with the tolerances of the
runtime's gate tests (``tests/test_runtime_gate.py``), as ``torch.testing.assert_close`` applies them.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["LOSS_RTOL", "GRAD_RTOL", "GRAD_ATOL", "GradientCheck", "save_gradients", "check_gradients",
           "gradients_path"]

LOSS_RTOL = 1e-5
"""Relative tolerance of the loss."""
GRAD_RTOL = 1e-4
"""Relative tolerance of a gradient element: ``|got - want| <= GRAD_ATOL + GRAD_RTOL * |want|``."""
GRAD_ATOL = 1e-6
"""Absolute tolerance of a gradient element."""


@dataclass(frozen=True)
class GradientCheck:
    """The outcome of the check (the ``gradient_check`` of ``hetpart run --json``)."""

    passed: bool
    step: int
    """The step whose batch was checked: the run's first (after a resume from a checkpoint, the reference
    first replays the steps before it with Adam, so a checkpoint that another plan, seed or model wrote
    cannot match)."""
    loss: float
    """The run's global loss of that step."""
    reference_loss: float
    loss_rel_error: float
    groups: list[dict[str, Any]]
    """Per unit (``embedding``, ``block_0``, ..., ``head``), in model order: ``group``, ``params`` (how many),
    ``max_abs_error``, ``max_rel_error`` (the worst parameter's largest error over its reference gradient's
    largest magnitude; parameters whose reference gradient stays within ``GRAD_ATOL`` of zero count by their
    absolute error only), ``worst`` (that parameter) and ``mismatched`` (elements outside the tolerance)."""
    mismatches: list[str] = field(default_factory=list)
    """One line per parameter (and rank) outside the tolerance, and for the loss."""
    tolerance: dict[str, float] = field(default_factory=lambda: {"loss_rtol": LOSS_RTOL, "grad_rtol": GRAD_RTOL,
                                                                "grad_atol": GRAD_ATOL})
    reference: str = "the whole model in one process on the same global batch (hetpart.runtime.reference)"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def gradients_path(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / f"rank{rank}.grads.pt"


def save_gradients(executor, run_dir: Path, step: int) -> None:
    """One forward and backward of ``step``'s batch with the gradient synchronisation, no optimizer step; this
    rank's loss share and gradients to :func:`gradients_path`. Every rank must call it (collectives)."""
    import torch

    local = executor.forward_backward(step)
    loss = executor.global_loss(local)
    executor.sync_gradients()
    grads = {key: {"grad": g.grad.detach().cpu(), "tp": g.tp, "tp_index": g.tp_index, "tp_dim": g.tp_dim,
                   "offset": g.offset}
             for key, g in executor.local_gradients().items()}
    torch.save({"step": step, "loss": loss, "grads": grads}, gradients_path(run_dir, executor.rank))


def check_gradients(runnable, plan, run_dir: Path, world: int) -> GradientCheck:
    """Compare the ranks' files (:func:`save_gradients`) with the single-process reference."""
    import torch

    from hetpart.runtime.engine import LocalGrad
    from hetpart.runtime.reference import Reference

    saved = [torch.load(gradients_path(run_dir, r), weights_only=True) for r in range(world)]
    step = int(saved[0]["step"])
    ref = Reference(runnable, plan.global_batch, plan.seq_len)
    for earlier in range(step):  # a resumed run: its checkpoint's weights, made by the same steps
        ref.step(earlier)
    want_loss = ref.forward_backward(step)
    expected = ref.gradients()
    got_loss = float(saved[0]["loss"])
    loss_err = abs(got_loss - want_loss) / max(abs(want_loss), 1e-30)
    mismatches = [f"loss: {got_loss!r} against the reference's {want_loss!r} (relative error {loss_err:.2e} > "
                  f"{LOSS_RTOL:g})"] if loss_err > LOSS_RTOL or not math.isfinite(got_loss) else []
    stats: dict[str, dict[str, Any]] = {}
    seen: set[str] = set()
    for rank, data in enumerate(saved):
        for key, g in data["grads"].items():
            local = LocalGrad(g["grad"].float(), int(g["tp"]), int(g["tp_index"]), g["tp_dim"], g["offset"])
            want = local.of(expected[key]).float()
            diff = (local.grad - want).abs()
            bad = int((diff > GRAD_ATOL + GRAD_RTOL * want.abs()).sum()) if diff.numel() else 0
            bad += int((~torch.isfinite(local.grad)).sum())
            abs_err = float(diff.max()) if diff.numel() else 0.0
            scale = float(want.abs().max()) if want.numel() else 0.0
            # a gradient that is zero but for rounding (a key bias: softmax ignores a shift of the keys) has no
            # relative error worth the name; its absolute error still counts
            rel_err = abs_err / scale if scale > GRAD_ATOL else 0.0
            group = stats.setdefault(key.split(".")[0], {"group": key.split(".")[0], "params": set(),
                                                         "max_abs_error": 0.0, "max_rel_error": 0.0, "worst": key,
                                                         "mismatched": 0})
            group["params"].add(key)
            if rel_err > group["max_rel_error"]:
                group["max_rel_error"], group["worst"] = rel_err, key
            group["max_abs_error"] = max(group["max_abs_error"], abs_err)
            group["mismatched"] += bad
            seen.add(key)
            if bad:
                mismatches.append(f"{key} (rank {rank}): {bad} of {diff.numel()} elements outside the tolerance, "
                                  f"max abs error {abs_err:.2e}")
    missing = sorted(set(expected) - seen)
    if missing:
        mismatches.append(f"no rank holds the gradient of {len(missing)} parameters: {', '.join(missing[:5])}")
    order = {name.split(".")[0]: i for i, name in enumerate(expected)}
    groups = [dict(g, params=len(g["params"])) for g in sorted(stats.values(), key=lambda g: order.get(g["group"], 0))]
    return GradientCheck(passed=not mismatches, step=step, loss=got_loss, reference_loss=want_loss,
                         loss_rel_error=loss_err, groups=groups, mismatches=mismatches)
