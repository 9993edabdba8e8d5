"""The shrunken shapes ``hetpart run --scale`` and ``hetpart calibrate --scale`` build (torch-free, so that the
CLI can check a sequence length against a scale before it imports torch)."""

from __future__ import annotations

from dataclasses import dataclass

from hetpart.errors import ModelError

__all__ = ["Scale", "SCALES", "scale_of", "check_seq_len"]


@dataclass(frozen=True)
class Scale:
    """Shape of a shrunken model: same number of units, smaller everything else."""

    hidden_size: int
    """Width of the shrunken model."""
    num_heads: int
    """Attention heads (raised to a multiple of the plan's largest tensor-parallel degree)."""
    vocab_size: int
    """The largest vocabulary of the shrunken model (its vocabulary keeps the full model's vocabulary to width
    ratio, :func:`~hetpart.runtime.models.scaled_config`)."""
    seq_len: int
    """Largest sequence length the shrunken run uses."""


SCALES: dict[str, Scale] = {
    "tiny": Scale(hidden_size=64, num_heads=4, vocab_size=8192, seq_len=32),
    "small": Scale(hidden_size=256, num_heads=8, vocab_size=32768, seq_len=128),
}


def scale_of(scale: str | int) -> Scale:
    """The :class:`Scale` of ``tiny``, ``small`` or a hidden size (an int or its digits).

    Raises:
        ModelError: anything else, or a hidden size outside 8..65536.
    """
    if isinstance(scale, bool) or not isinstance(scale, (str, int)):
        raise ModelError(f"--scale: expected tiny, small or a hidden size, got {scale!r}")
    if isinstance(scale, str) and scale.isdigit():
        scale = int(scale)
    if isinstance(scale, int):
        if not 8 <= scale <= 65536:
            raise ModelError(f"--hidden-size: {scale} is outside 8..65536; give a hidden size such as 128")
        heads = max(1, scale // 32)
        return Scale(hidden_size=scale, num_heads=heads, vocab_size=128 * scale, seq_len=min(512, scale))
    if scale not in SCALES:
        raise ModelError(f"--scale: unknown scale {scale!r}; use tiny, small or a hidden size such as 128")
    return SCALES[scale]


def check_seq_len(seq_len: int, name: str, positions: int, scale: str | int | None) -> None:
    """Refuse ``--seq-len`` beyond the positions of the model that will be built: ``name``'s own
    ``positions`` at full size, the scale's (:attr:`Scale.seq_len`, at least 8) when shrunk.

    Raises:
        PlanError: one line naming the limit, where it comes from, and lengths or scales that fit.
    """
    from hetpart.errors import PlanError

    if scale is None:
        if seq_len > positions:
            raise PlanError(f"--seq-len: {seq_len} is more than {name}'s {positions:,} positions; give a shorter one")
        return
    limit = max(scale_of(scale).seq_len, 8)
    if seq_len <= limit:
        return
    wider = [f"--scale {k} ({s.seq_len})" for k, s in SCALES.items() if s.seq_len >= seq_len]
    full = ["no --scale (the full model)"] if seq_len <= positions else []
    fits = " or ".join(wider + full)
    raise PlanError(f"--seq-len: {seq_len}: at --scale {scale} the shrunken {name} runs at most {limit} positions "
                    f"(the full model has {positions:,}); give --seq-len <= {limit}" + (f" or {fits}" if fits else ""))
