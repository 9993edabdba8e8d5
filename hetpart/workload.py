"""The training workload a plan serves: batch, sequence length, precision, recomputation, optimizer."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from hetpart._validate import show
from hetpart.errors import WorkloadError
from hetpart.vocabulary import (ATTENTIONS, DTYPE_BYTES, OFFLOAD_CHOICES, OPTIMIZERS, PRECISIONS, RECOMPUTE_CHOICES,
                                Attention, OffloadChoice, Optimizer, Precision, Recompute)

__all__ = ["Precision", "Recompute", "Optimizer", "Attention", "Workload", "DTYPE_BYTES", "default_precision",
           "cluster_precision", "check_precision"]


@dataclass(frozen=True)
class Workload:
    """What one training step does."""

    global_batch: int
    """Sequences per optimizer step, over all data-parallel replicas."""
    seq_len: int
    """Tokens per sequence."""
    precision: Precision = "bf16"
    """Compute precision of matrix products (mixed precision with fp32 master weights unless fp32)."""
    recompute: Recompute = "auto"
    """Activation recomputation; ``auto`` lets the planner choose per plan."""
    optimizer: Optimizer = "adam"
    """Optimizer: ``adam`` (two fp32 moments), ``sgd`` (momentum SGD: one), ``adam8bit`` (two 1-byte
    moments); plus an fp32 master copy of the weights under mixed precision."""
    attention: Attention = "fused"
    """Attention kernel: ``fused`` (flash / SDPA, the default of current engines: no score matrix
    stored) or ``eager`` (the ``a s^2`` scores and softmax are stored for the backward). A 32-bit run (fp32, tf32)
    asking for ``fused`` is priced ``eager`` under the engine's fused kernels (flash and cuDNN attention take 16-bit
    and fp8 only) and ``fused`` under hetpart's torch kernels (SDPA's memory-efficient kernel takes fp32):
    :func:`hetpart.costmodel.activations.attention_kernel`, the one place that decides it."""
    zero: int | None = None
    """Sharded data parallelism (ZeRO stage 0-3, ``--zero``); None lets the planner choose."""
    offload: OffloadChoice = "none"
    """Model states kept in host memory (``--offload``: none, optimizer, full; :mod:`hetpart.costmodel.offload`),
    or ``auto``: the planner offloads only where nothing fits otherwise (:func:`hetpart.policies.plan`)."""

    def __post_init__(self) -> None:
        for name, value, limit in (("global_batch", self.global_batch, 10**8), ("seq_len", self.seq_len, 10**7)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise WorkloadError(f"--{name.replace('_', '-')}: must be a whole number >= 1, got {show(value)}")
            if value > limit:
                raise WorkloadError(f"--{name.replace('_', '-')}: {value} is absurdly large (limit {limit})")
        if not isinstance(self.precision, str) or self.precision not in PRECISIONS:  # a list is unhashable
            raise WorkloadError(f"--precision: unknown precision {show(self.precision)}; use {', '.join(PRECISIONS)}")
        if not isinstance(self.recompute, str) or self.recompute not in RECOMPUTE_CHOICES:
            raise WorkloadError(f"--recompute: unknown mode {show(self.recompute)}; use none, selective, full or auto")
        if self.zero is not None and (isinstance(self.zero, bool) or self.zero not in (0, 1, 2, 3)):
            raise WorkloadError(f"--zero: {show(self.zero)} is not a sharding level; use 0, 1, 2 or 3")
        if not isinstance(self.offload, str) or self.offload not in OFFLOAD_CHOICES:
            raise WorkloadError(f"--offload: unknown offload {show(self.offload)}; use {', '.join(OFFLOAD_CHOICES)}")
        if self.offload == "full" and self.zero not in (None, 3):
            raise WorkloadError(f"--offload: 'full' gathers the parameters from the host unit by unit, which needs "
                                f"--zero 3 (not {self.zero}); use --zero 3 or --offload optimizer")
        if not isinstance(self.optimizer, str) or self.optimizer not in OPTIMIZERS:
            raise WorkloadError(f"--optimizer: unknown optimizer {show(self.optimizer)}; use {', '.join(OPTIMIZERS)}")
        if not isinstance(self.attention, str) or self.attention not in ATTENTIONS:
            raise WorkloadError(f"--attention: unknown attention kernel {show(self.attention)}; use "
                                f"{', '.join(ATTENTIONS)}")

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.precision]

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    def to_dict(self) -> dict:
        out = asdict(self)
        if out["zero"] is None:  # left to the planner: records written before --zero read the same
            del out["zero"]
        if out["offload"] == "none":  # records written before --offload read the same
            del out["offload"]
        return out


def default_precision(gpus) -> str:
    """bf16 where every device type has it, else fp16 (``gpus``: the :class:`~hetpart.hardware.GPUSpec` in use)."""
    return "bf16" if all(g.supports_bf16 for g in gpus) else "fp16"


def cluster_precision(cluster) -> str:
    """What ``hetpart plan`` trains in on ``cluster`` when no precision is given: :func:`default_precision`
    over its device types (fp16 where a V100, T4 or Turing consumer card is in it)."""
    return default_precision({d.gpu for d in cluster.devices})


def check_precision(precision: str, gpus, source: str = "--precision") -> str:
    """``precision`` if every device type in ``gpus`` supports it; :class:`WorkloadError` naming those that do not.

    Args:
        precision: bf16, fp16, fp32, tf32 or fp8.
        gpus: the device types the plan or cluster uses.
        source: where the value came from (``--precision``, ``plan.json: precision``), for the message.
    """
    if precision == "bf16":
        lacking = sorted({g.name for g in gpus if not g.supports_bf16})
        if lacking:
            raise WorkloadError(f"{source}: bf16 is not supported by {', '.join(lacking)} (fp16 matrix units only); "
                                "use --precision fp16 (or fp32)")
    if precision == "fp8":
        lacking = sorted({g.name for g in gpus if not g.supports_fp8})
        if lacking:  # the fix is a precision the devices have: bf16 only where every one has it
            no_bf16 = sorted({g.name for g in gpus if not g.supports_bf16})
            fix = ("use --precision bf16 (or fp16)" if not no_bf16 else
                   f"use --precision fp16 (or fp32; bf16 is not supported by {', '.join(no_bf16)} either)")
            raise WorkloadError(f"{source}: fp8 is not supported by {', '.join(lacking)} (fp8 matrix units exist on "
                                f"Hopper, Ada and MI300 only); {fix}")
    return precision
