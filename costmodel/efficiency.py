"""Achievable matrix-unit efficiency per device type, as a function of work size and TP degree.

Matrix units reach their datasheet peak only on large matrix products, and a transformer also runs
memory-bound kernels (norms, softmax, dropout, activation functions) whose cost grows with the
activations, not the FLOPs. For a transformer unit the products are ``tokens x width x width/tp``
(the tensor-parallel shard), so we model the fraction of peak a device reaches as

    eff(w) = e_max / (1 + (w0 / w) ** alpha),   w = min(width / tp, tokens)

with ``w`` the smallest matrix dimension of the unit's products on one device: the tensor-parallel
shard of the hidden width (``width / tp`` for a transformer block) or the tokens of one micro-batch
(``micro_batch * seq_len``) when that is smaller -- a product is slow when any of its dimensions is.
``w0`` grows with the device's peak (a faster device needs bigger products to hide the same fixed
costs): ``w0 = w0_ref * (peak / peak_ref) ** (1/alpha)``. The memory-bound kernels cost
``act_traffic * act_bytes / hbm_bandwidth`` on top (:attr:`EfficiencyCurve.act_traffic`); their
share shrinks as the hidden size grows, which is what separates small models at low TP from large
ones at TP=8.

Curves (``CURVES``), one per generation:

* ``ampere`` -- FITTED end to end through the simulator to Korthikanti et al. 2022, Table 5 (22B..1T
  on A100-80GB, 8 step times) together with Narayanan et al. 2021, Table 1 (1.7B..1T, 10 throughputs
  at TP 1..8) -- ``hetpart.costmodel.calibration.fit_a100_curve`` reproduces the constants.
* ``volta`` -- the Ampere shape with ``e_max`` ANCHORED to one published point: Shoeybi et al. 2019
  (Megatron-LM), a 1.2B model (h=1536, 40 layers) on one V100 sustains 39 TFLOPS = 30% of peak
  (``calibration.anchor_volta_e_max`` reproduces it; ``calibration.megatron_8p3b_check`` compares
  with the paper's 512-GPU run, which was not used).
* every other type (Hopper, Ada, AMD, Huawei, inline) -- ASSUMED: the Ampere curve scaled by its peak
  and its own memory bandwidth; we found no published end-to-end figure with enough detail to fit
  them (``calibration.llama3_405b_check`` compares H100 with Llama 3's published throughput).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hetpart.hardware import GPUSpec

__all__ = ["EfficiencyCurve", "CURVES", "curve_for", "matmul_efficiency", "unit_gemm_width"]


@dataclass(frozen=True)
class EfficiencyCurve:
    """A saturating curve of the fraction of peak reached by a device's matrix units."""

    name: str
    e_max: float
    """Fraction of peak reached by very large products."""
    w0_ref: float
    """Matrix dimension at which the width term equals 1, for a device of peak ``peak_ref_tflops``."""
    alpha: float
    """Steepness of the fall-off for small products."""
    peak_ref_tflops: float
    """Dense 16-bit peak of the reference device of the curve, TFLOPS."""
    status: str
    """``fitted``, ``anchored`` or ``assumed``, and to what."""
    act_traffic: float = 0.0
    """Memory-bound work (norms, softmax, dropout, activations, residuals): HBM bytes moved in a
    forward pass per byte of activations a unit saves without recomputation (the backward moves twice
    as much). Their time, ``act_traffic * act_bytes / hbm``, adds to the matrix products'."""

    def w0(self, peak_tflops: float) -> float:
        """Half-saturation dimension for a device of ``peak_tflops``."""
        return self.w0_ref * (peak_tflops / self.peak_ref_tflops) ** (1.0 / self.alpha)

    def efficiency(self, width: float, tokens: float, peak_tflops: float) -> float:
        """Fraction of ``peak_tflops`` reached on products of smallest dimension ``width`` over ``tokens`` rows."""
        w = max(min(width, tokens), 1.0)
        return self.e_max / (1.0 + (self.w0(peak_tflops) / w) ** self.alpha)


# Produced by ``python -m hetpart.costmodel.calibration`` (fit_a100_curve); tests/test_calibration.py
# checks they are a least-squares optimum. Keep the numbers together with their provenance.
_AMPERE = EfficiencyCurve("ampere", e_max=0.7919, w0_ref=211.0, alpha=1.0, peak_ref_tflops=312.0,
                          status="fitted: Korthikanti et al. 2022 Table 5 + Narayanan et al. 2021 Table 1 (A100)",
                          act_traffic=2.678)
# e_max from calibration.anchor_volta_e_max(): Shoeybi et al. 2019, 1.2B on one V100 = 30% of peak.
_VOLTA = EfficiencyCurve("volta", e_max=0.4465, w0_ref=_AMPERE.w0_ref, alpha=_AMPERE.alpha, peak_ref_tflops=312.0,
                         status="anchored: Shoeybi et al. 2019 (1.2B on one V100-32GB, 39 TFLOPS = 30% of peak)",
                         act_traffic=_AMPERE.act_traffic)

CURVES: dict[str, EfficiencyCurve] = {"ampere": _AMPERE, "volta": _VOLTA}

_GENERATION_BY_PREFIX = (("V100", "volta"), ("T4", "volta"), ("P100", "volta"))


def curve_for(gpu: GPUSpec) -> EfficiencyCurve:
    """The efficiency curve of ``gpu``'s generation (Ampere's, scaled by peak, when unknown)."""
    for prefix, generation in _GENERATION_BY_PREFIX:
        if gpu.name.startswith(prefix):
            return CURVES[generation]
    return CURVES["ampere"]


def unit_gemm_width(width: int, kind: str, tp: int, fwd_flops_per_token: float) -> float:
    """Smallest matrix dimension of a unit's products on one device of a ``tp``-way group.

    Blocks shard their inner dimension (``width / tp``); the head and embedding shard the vocabulary,
    which stays large, so their width is the hidden size. Traced modules without a known width use
    ``sqrt(flops per token / 2)``, the side of a square weight with that cost.
    """
    if width <= 0:
        width = math.sqrt(max(fwd_flops_per_token, 2.0) / 2.0)
    return width / tp if kind in ("block", "module") else float(width)


def matmul_efficiency(gpu: GPUSpec, width: float, tokens: float, precision: str = "bf16") -> float:
    """Fraction of ``gpu``'s ``precision`` peak reached on products of smallest dimension ``width``."""
    return curve_for(gpu).efficiency(width, tokens, gpu.tflops(precision))
