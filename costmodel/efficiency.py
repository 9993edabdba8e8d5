"""Achievable matrix-unit efficiency per GPU architecture, as a function of product size and precision.

Matrix units reach their datasheet peak only on large matrix products, and a transformer also runs
memory-bound kernels (norms, softmax, dropout, activation functions) whose cost grows with the
activations, not the FLOPs. For a transformer unit the products are ``tokens x width x width/tp``
(the tensor-parallel shard), so we model the fraction of peak a device reaches as

    eff(w, T) = e_max[precision] / (1 + (w0 / w) ** alpha + (t0 / T) ** alpha)

with ``w`` the unit's matrix width on one device (``width / tp`` for a block) and ``T`` the tokens
of one micro-batch (``micro_batch * seq_len``): a product is slow when any of its dimensions is small
(tile and wave quantization, the fixed start and tail of every kernel), and the token term keeps
the batch in play after ``T`` passes the width -- micro-batch 1 is slower per sample than 4.
``w0`` and ``t0`` grow with the device's 16-bit peak within an architecture (more SMs need bigger
products to fill a wave): ``w0 = w0_ref * (peak16 / peak_ref) ** (1/alpha)``. An fp8 product runs at twice
the 16-bit rate on the same SMs and memory, so its fixed costs per tile (prologue, epilogue, the 16-bit output
it writes) weigh twice as much: it needs twice the arithmetic intensity to be compute-bound, and its ``w0`` and
``t0`` are those of a device of its fp8 peak (:data:`FP8_SIZE_FACTOR`, :func:`size_tflops`). ``e_max`` depends on
the precision class: 16-bit and fp8 tensor cores, TF32 tensor cores, and plain fp32 on the CUDA
cores, which saturate at their own fraction of their (much lower) peak.

The memory-bound kernels cost ``act_traffic * act_bytes / hbm_bandwidth`` on top
(:attr:`EfficiencyCurve.act_traffic`), and every operator a unit runs costs a fixed host dispatch
and launch time (:data:`HOST_US_PER_OP`, :mod:`hetpart.costmodel.compute`).

Curves (``CURVES``), one per architecture (``GPUSpec.arch``):

* ``ampere`` -- FITTED end to end through the simulator to Korthikanti et al. 2022, Table 5 (22B..1T
  on A100-80GB, 8 step times) together with Narayanan et al. 2021, Table 1 (1.7B..1T, 10 throughputs
  at TP 1..8) -- ``hetpart.costmodel.calibration.fit_a100_curve`` reproduces the constants; the
  token term's ratio ``t0 / w0`` is taken from the Hopper GEMM sweep (the tables barely move it).
* ``hopper`` -- FITTED to a GEMM microbenchmark: 32 aligned bf16, TF32 and fp32 products per precision
  (256..16,384 tokens x 512..32,768 wide) measured on an H100 SXM for this project
  (``experiments/data/h100_unit_profile.json``; ``calibration.fit_hopper_gemm`` reproduces them).
  The memory-bound traffic is Ampere's (same kernels). Its fp8 plateau is PUBLISHED (:data:`_HOPPER_FP8`: a
  tile-lang fp8 sweep on an H800 SXM), with the fp8 sizes of :data:`FP8_SIZE_FACTOR`.
* ``volta`` -- the Ampere shape with ``e_max`` ANCHORED to one published point: Shoeybi et al. 2019
  (Megatron-LM), a 1.2B model (h=1536, 40 layers) on one V100 sustains 39 TFLOPS = 30% of peak
  (``calibration.anchor_volta_e_max``); plain fp32 products reach 70% of the fp32 peak (outside
  checks of published V100 fp32 runs), not the tensor cores' fraction.
* ``cdna3`` (MI300X), ``cdna2`` (MI250X), ``ada`` (RTX 4090, L20) and, per device type
  (:data:`DEVICE_CURVES`), the T4, TITAN RTX, RTX 2080 Ti and L4 -- PUBLISHED: ``e_max`` set, per
  precision where a number exists, to one published large-product GEMM measurement
  (:mod:`hetpart.costmodel.published_gemm`: AMD's Max-Achievable FLOPs table for MI300X, a MAMF sweep
  for one MI250X GCD, cuBLAS on an L20 for Ada, torch.mm tables for the Turing boards and the L4); the
  published fraction of peak is taken as the plateau itself (such best-shape figures sit 2-6% above the
  fitted ``e_max`` on A100 and H100). Precisions without a published number keep their earlier assumed
  fraction, and the size fall-off (``w0``, ``t0``), memory-bound traffic and per-operator cost stay the
  nearest fitted generation's, scaled by peak: no source gives sizes small enough to fit them.
* ``turing`` types without their own figure, ``pascal``, ``davinci`` and unknown types -- ASSUMED: the
  curve of the nearest generation named in :data:`_ASSUMED_FROM`, scaled by peak.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from hetpart.hardware import GPUSpec

__all__ = ["EfficiencyCurve", "CURVES", "DEVICE_CURVES", "curve_for", "matmul_efficiency", "unit_gemm_width", "HOST_US_PER_OP",
           "UNALIGNED_FRACTION", "FP8_SIZE_FACTOR", "aligned", "effective_precision"]

HOST_US_PER_OP = 18.3
"""MEASURED: host cost of one counted operator (:data:`~hetpart.costmodel.compute.OPS_PER_UNIT`) as a training
step pays it, microseconds: 14-unit chains of the runtime's GPT-2 units (embedding, 12 blocks, head with the
loss; 1,774 operators per micro-batch), forward + backward back to back on one H100 whose device work was under
half the host's (20 shapes: hidden 256-1,600, micro-batches 1-8, bf16 and fp32): median 18.3 us per operator
(``experiments/data/h100_host_overlap.json``, ``python -m hetpart.experiments.bench_host_overlap``; single
blocks 20.2 us). This is PyTorch eager through Python modules and autograd on that machine's host CPU; a bare
small-kernel launch loop there costs 11.2 us (``launch_overhead_us_per_small_kernel`` in
``experiments/data/h100_unit_profile.json``), the same order as the ~10 us per operator that PyTorch's
CUDA-graphs documentation and He 2022, "Making Deep Learning Go Brrrr", give for eager-mode overhead. The
device runs while the host issues: see :data:`~hetpart.costmodel.compute.DISPATCH_MODES`."""

FP8_SIZE_FACTOR = 2.0
"""An fp8 product's half-saturation sizes (``w0``, ``t0``) over a 16-bit one's on the same device: the ratio of
the fp8 to the 16-bit dense peak (2.0 on every fp8 device of the catalog: H100 1979 / 989, MI300X 2614.9 / 1307.4,
L4 242.5 / 121, RTX 4090 330.3 / 165.2; datasheets). Where a product's 16-bit output and fixed per-tile costs
bound it, doubling the rate doubles the size at which it saturates (roofline: twice the arithmetic intensity).
Checked, not fitted, against a published fp8 sweep on an H800 SXM (the H100's fp8 rate; :data:`_HOPPER_FP8`):
at 8192 x 8192 and K from 256 to 16,384 the benchmark's published run falls off as this factor says (within 4%);
a later run in a fork follows the 16-bit sizes."""

UNALIGNED_FRACTION = 0.10
"""MEASURED on H100: a 16-bit or TF32 product with a dimension that is not a multiple of 16 bytes (e.g.
GPT-2's vocabulary of 50,257) cannot use the vectorised tensor-core kernels; a bare bf16 ``linear`` of
8,192 tokens onto 50,257 or 32,001 outputs ran at 94-113 TFLOPS against 670-798 at 50,304 or 32,000
(``docs/BENCHMARKS.md``, section gpu), i.e. ~0.10 of the 16-bit peak. Megatron-LM pads the vocabulary
to a multiple of 128 for this reason. ASSUMED to hold on other NVIDIA/AMD tensor-core devices."""


@dataclass(frozen=True)
class EfficiencyCurve:
    """A saturating curve of the fraction of peak reached by a device's matrix units."""

    name: str
    e_max: float
    """Fraction of the 16-bit (and fp8) tensor peak reached by very large products."""
    w0_ref: float
    """Matrix width at which the width term equals 1, for a device of 16-bit peak ``peak_ref_tflops``."""
    alpha: float
    """Steepness of the fall-off for small products."""
    peak_ref_tflops: float
    """Dense 16-bit peak of the reference device of the curve, TFLOPS."""
    status: str
    """``fitted``, ``anchored``, ``published`` or ``assumed``, and to what."""
    act_traffic: float = 0.0
    """Memory-bound work (norms, softmax, dropout, activations, residuals): HBM bytes moved in a
    forward pass per byte of activations a unit saves without recomputation (the backward moves twice
    as much). Their time, ``act_traffic * act_bytes / hbm``, adds to the matrix products'."""
    t0_ref: float = 0.0
    """Tokens per micro-batch at which the token term equals 1 (same reference device)."""
    e_max_tf32: float = 0.0
    """Fraction of the TF32 peak reached by very large products (0: ``e_max``)."""
    e_max_fp32: float = 0.0
    """Fraction of the plain fp32 (CUDA-core) peak reached by very large products (0: ``e_max``)."""
    e_max_fp16: float = 0.0
    """Fraction of the 16-bit peak reached by very large fp16 products where it differs from bf16's
    (0: ``e_max``; MI300X runs fp16 products at a lower clock than bf16)."""
    e_max_fp8: float = 0.0
    """Fraction of the fp8 peak reached by very large fp8 products (0: ``e_max``)."""
    host_us_per_op: float = HOST_US_PER_OP
    """Fixed host dispatch + launch cost per operator, microseconds (0 for emulated devices)."""

    def size_ratio(self, precision: str) -> float:
        """How much larger than a 16-bit product a ``precision`` product must be to saturate
        (:data:`FP8_SIZE_FACTOR` for fp8, else 1)."""
        return FP8_SIZE_FACTOR if precision == "fp8" else 1.0

    def w0(self, peak_tflops: float) -> float:
        """Half-saturation width for a device of 16-bit peak ``peak_tflops``."""
        return self.w0_ref * (peak_tflops / self.peak_ref_tflops) ** (1.0 / self.alpha)

    def t0(self, peak_tflops: float) -> float:
        """Half-saturation tokens for a device of 16-bit peak ``peak_tflops``."""
        return self.t0_ref * (peak_tflops / self.peak_ref_tflops) ** (1.0 / self.alpha)

    def e_peak(self, precision: str) -> float:
        """Fraction of ``precision``'s peak that very large products reach."""
        if precision == "fp32":
            return self.e_max_fp32 or self.e_max
        if precision == "tf32":
            return self.e_max_tf32 or self.e_max
        if precision == "fp16":
            return self.e_max_fp16 or self.e_max
        if precision == "fp8":
            return self.e_max_fp8 or self.e_max
        return self.e_max

    def efficiency(self, width: float, tokens: float, peak_tflops: float, precision: str = "bf16") -> float:
        """Fraction of the ``precision`` peak reached on products ``width`` wide over ``tokens`` rows, on a
        device whose 16-bit peak is ``peak_tflops``."""
        w, t = max(width, 1.0), max(tokens, 1.0)
        size = peak_tflops * self.size_ratio(precision)
        return self.e_peak(precision) / (1.0 + (self.w0(size) / w) ** self.alpha
                                         + (self.t0(size) / t) ** self.alpha)


# Hopper: calibration.fit_hopper_gemm() on the H100 GEMM sweep (bf16: e_max, w0, t0; TF32 and fp32:
# their e_max with bf16's w0 and t0). tests/test_calibration.py checks they reproduce.
_T0_PER_W0 = 120.0 / 419.0
"""Token half-saturation over width half-saturation on the H100 sweep; Ampere takes the same ratio."""
# Produced by ``python -m hetpart.costmodel.calibration`` (fit_a100_curve); tests/test_calibration.py
# checks they are a least-squares optimum. Keep the numbers together with their provenance.
_AMPERE = EfficiencyCurve("ampere", e_max=0.8017, w0_ref=220.5, alpha=1.0, peak_ref_tflops=312.0,
                          status="fitted: Korthikanti et al. 2022 Table 5 + Narayanan et al. 2021 Table 1 (A100)",
                          act_traffic=2.657, t0_ref=220.5 * _T0_PER_W0, e_max_fp32=0.8982)
"""Ampere's plain-fp32 fraction is ASSUMED equal to Hopper's measured one (both run cuBLAS SGEMM on CUDA cores)."""
_HOPPER_FP8 = ("tile-ai/tilelang, benchmark/matmul_fp8/README.md (commit 128a7967), 'FP8 Matmul Benchmark (8192x8192)': "
               "M = N = 8192 on one NVIDIA H800 SXM, K = 16384: 1523 TFLOPS of the 1979 dense fp8 peak")
"""PUBLISHED: the fp8 figure of Hopper's curve, ``e_max_fp8 = 1523 / 1979`` (its latency column is in ms). The H800
SXM runs the H100 SXM's tensor cores at its clocks (1979 dense fp8 TFLOPS; it differs in NVLink and fp64). The
sweep's largest product (K 16,384) is taken as the plateau, the convention of the published curves; its smaller
rows check the size fall-off (:data:`FP8_SIZE_FACTOR`): scaled to agree at K 16,384, this curve gives 382, 617,
891, 1144, 1334 and 1454 TFLOPS at K 256..8192 against the published 376, 622, 927, 1174, 1378 and 1461 (within
4%); with bf16's sizes it would give 598-1486. A later run in a fork of the benchmark (xwhzz/tilelang, commit
b2acfc37, same README) published 569-1541, which follows bf16's sizes instead: the two runs disagree on the
fall-off, not on the plateau (1.2% apart). fp8 keeps about bf16's fraction of its own peak (bf16 best shapes on
H100: 0.80, the MAMF row of :mod:`~hetpart.costmodel.published_gemm`)."""
_HOPPER = EfficiencyCurve("hopper", e_max=0.7834, w0_ref=419.0, alpha=1.0, peak_ref_tflops=989.0,
                          status="fitted: GEMM sweep on one H100 SXM (experiments/data/h100_unit_profile.json)",
                          act_traffic=_AMPERE.act_traffic, t0_ref=120.0, e_max_tf32=0.6438, e_max_fp32=0.8982,
                          e_max_fp8=round(1523.0 / 1979.0, 4))
# e_max from calibration.anchor_volta_e_max(): Shoeybi et al. 2019, 1.2B on one V100 = 30% of peak.
_VOLTA = EfficiencyCurve("volta", e_max=0.4478, w0_ref=_AMPERE.w0_ref, alpha=_AMPERE.alpha, peak_ref_tflops=312.0,
                         status="anchored: Shoeybi et al. 2019 (1.2B on one V100-32GB, 39 TFLOPS = 30% of peak)",
                         act_traffic=_AMPERE.act_traffic, t0_ref=_AMPERE.t0_ref, e_max_fp32=0.70)
"""Volta's plain-fp32 fraction 0.70: what the outside checks of 80 published runs found for large fp32 matrix products on
V100 ("near 70% of the fp32 peak, not at the 16-bit tensor-core efficiency", shared/OUTSIDE-CHECKS.md, item 4 of
what it missed); a mechanism stated by that check, not a fit to any of its rows."""

# Published: e_max per precision = one published GEMM throughput / the dense peak it was measured
# against (hetpart.costmodel.published_gemm; tests/test_fidelity.py checks they reproduce it). The
# shape, memory-bound traffic and host cost are Ampere's (Volta's for the T4) scaled by peak, and a
# precision without a published number keeps the value the architecture was assumed to have before.
_CDNA3 = replace(_AMPERE, name="cdna3", e_max=0.5415, e_max_fp16=0.5002, e_max_fp8=0.4868,
                 e_max_tf32=_AMPERE.e_max,
                 status="published: AMD ROCm blog 'Measuring Max-Achievable FLOPs - Part 2' (2025), Table 1: "
                        "MI300X hipBLASLt bf16 708, fp16 654, fp8 1273 TFLOPS")
"""MI300X: bf16 0.5415, fp16 0.5002, fp8 0.4868 of the dense peaks (1307.4 / 2614.9 TFLOPS). TF32 keeps
the Ampere fraction it was assumed to have (0.8017, no published xf32 figure) and plain fp32 Ampere's
0.8982 (ASSUMED). A MAMF sweep with warm caches reached 781.9 TFLOPS bf16 (ml-engineering, ROCm 6.2):
10% above AMD's figure, which is the one used."""
_CDNA2 = replace(_AMPERE, name="cdna2", e_max=0.7676,
                 status="published: ml-engineering MAMF table (Bekman), MI250X one GCD bf16 147.0 TFLOPS of 191.5 "
                        "(ROCm 6.2)")
"""One MI250X GCD: 16-bit products at 0.7676 of 191.5 TFLOPS (bf16 measured; fp16 runs at the same rate
on CDNA2 and is taken equal). CDNA2 has no TF32 (fp32 runs plain, Ampere's 0.8982: ASSUMED)."""
_ADA = replace(_AMPERE, name="ada", e_max=0.9728, e_max_tf32=0.9726, e_max_fp32=0.6232, e_max_fp8=_AMPERE.e_max,
               status="published: xlite-dev/LeetCUDA hgemm README, cuBLAS fp16 116.25 TFLOPS of 119.5 on an L20 "
                      "(AD102, fp32 accumulate); TF32 58.16 and fp32 37.27 of 59.8 (community torch.mm table, L20)")
"""Ada with the GeForce AD102 rate (the L20's 512 FLOP/SM/clock, the rate of the catalog's RTX 4090
peak with fp32 accumulation): 16-bit products at 0.9728, TF32 at 0.9726 and CUDA-core fp32 at 0.6232 (an
L20 row of the community torch.mm table; the RTX 4090 rows give 1.04 and 0.66). fp8 keeps the Ampere
fraction it was assumed to have (0.8017): no published Ada fp8 figure (ASSUMED)."""
_TORCH_PERF = "zzc0721/torch-performence-test-data database.md (community torch.mm table)"
_T4 = replace(_VOLTA, name="turing", e_max=0.6451, e_max_fp32=0.5370,
              status=f"published: {_TORCH_PERF}, three cloud T4s: fp16 41.93 of 65, fp32 4.35 of 8.1 TFLOPS")
"""T4 (70 W, full-rate fp32 accumulation): fp16 products at 0.6451 of 65 TFLOPS, fp32 at 0.5370 of 8.1 (median
of three contributors' Colab/Kaggle T4s, within 2% of each other). A T4 without server airflow runs at its
base clock: one forum user measured 24 TFLOPS (0.37), which NVIDIA called expected under the power cap."""
_TITAN_RTX = replace(_VOLTA, name="turing", e_max=0.5082, e_max_fp32=0.7307,
                     status=f"published: {_TORCH_PERF}, TITAN RTX fp16 66.32 of 130.5, fp32 11.91 of 16.3 TFLOPS")
"""TITAN RTX (280 W, full-rate fp32 accumulation): fp16 products at 0.5082, fp32 at 0.7307 (one row)."""
_RTX2080TI = replace(_VOLTA, name="turing", e_max=0.8346, e_max_fp32=0.8507,
                     status="published: bewantbe/busy-gemm-benchmark, RTX 2080 Ti torch 8000^3 fp16 44.9 of 53.8, "
                            "fp32 11.4 of 13.4 TFLOPS")
"""RTX 2080 Ti (GeForce: fp32 accumulation at half rate, the catalog's 53.8): fp16 at 0.8346, fp32 at 0.8507.
A memory-modified 22 GB card in the community table reached 58.58 (1.09 of the reference-clock peak)."""
_L4 = replace(_ADA, e_max=0.5859, e_max_fp16=0.5688, e_max_tf32=0.5313, e_max_fp32=0.5076, e_max_fp8=0.0,
              status=f"published: {_TORCH_PERF}, L4 bf16 70.89 of 121, fp16 68.83, TF32 31.88 of 60, fp32 15.38 "
                     "of 30.3 TFLOPS")
"""L4 (72 W, full-rate fp32 accumulation): bf16 0.5859, fp16 0.5688, TF32 0.5313, fp32 0.5076 (one row);
fp8 ASSUMED at the bf16 fraction (the same power cap)."""

_ASSUMED_FROM = {"turing": _VOLTA, "pascal": _VOLTA, "davinci": _AMPERE}
"""Architectures without a fit or a published figure: the curve of the nearest generation (Turing's tensor
cores are Volta's generation with the same fp16-only units; Huawei: the Ampere curve)."""

CURVES: dict[str, EfficiencyCurve] = {
    "ampere": _AMPERE, "hopper": _HOPPER, "volta": _VOLTA, "cdna3": _CDNA3, "cdna2": _CDNA2, "ada": _ADA,
    **{arch: replace(base, name=arch, status=f"assumed: the {base.name} curve, scaled by peak")
       for arch, base in _ASSUMED_FROM.items()},
}

GRACE_HOST_FACTOR = 33.17 / 13.48
"""PUBLISHED: host time of one PyTorch operator on a Grace CPU (GH200's) over an x86 host of an H100 system:
``torch.nn.Linear`` forward, bf16, hidden 2,048, 8,192 tokens, 33.17 us of CPU time on GH200 against 13.48 us
on a DGX H100 (Xeon Platinum 8480C), NVIDIA/TransformerEngine issue 2053 (2025; GB200: 37.08 us). The per-operator
cost :data:`HOST_US_PER_OP` was measured on an x86 host; a GH200's operators cost this much more."""

_GH200 = replace(_HOPPER, host_us_per_op=HOST_US_PER_OP * GRACE_HOST_FACTOR,
                 status=_HOPPER.status + f"; host per operator x{GRACE_HOST_FACTOR:.2f} on its Grace CPU")

DEVICE_CURVES: dict[str, EfficiencyCurve] = {
    "T4-16GB": _T4, "TitanRTX-24GB": _TITAN_RTX, "RTX2080Ti-11GB": _RTX2080TI, "L4-24GB": _L4, "GH200-96GB": _GH200,
}
"""Catalog types with figures of their own, which their architecture's curve does not speak for: boards
accumulating fp32 at full rate under a power cap (T4, TITAN RTX, L4) reach a fraction of their datasheet peak,
GeForce boards at half rate reach about all of it (RTX 2080 Ti); the GH200 computes as an H100 but dispatches from
a Grace CPU (:data:`GRACE_HOST_FACTOR`)."""

_EMULATED = replace(_AMPERE, name="unknown", status="assumed: the ampere curve, scaled by peak", host_us_per_op=0.0,
                    e_max_fp32=0.0)
"""Device types without an architecture that are not a vendor's GPU (the runtime's emulated devices, CPU processes
of the loop's ground: inline entries of vendor ``other``): the Ampere curve without fixed per-operator costs (an
emulating CPU process measures its own)."""
_UNNAMED_GPU = replace(_AMPERE, name="unknown", status="assumed: the ampere curve, scaled by peak")
"""An NVIDIA or AMD GPU written inline without ``arch`` (an L40S or H100 PCIe the catalog lacks): the Ampere curve
scaled by its peak, with the per-operator host cost a GPU's host pays (:data:`HOST_US_PER_OP`); without it the
same H100 written inline ran 3.3x faster than the catalog's at micro-batch 1 (gpt2-small, sequence 512)."""


def curve_for(gpu: GPUSpec) -> EfficiencyCurve:
    """The efficiency curve of ``gpu``: its type's own (:data:`DEVICE_CURVES`), else its architecture's
    (when it names none: :data:`_UNNAMED_GPU` for a vendor's GPU, :data:`_EMULATED` for the rest)."""
    own = DEVICE_CURVES.get(gpu.name)
    if own is not None and own.name == gpu.arch:
        return own
    if gpu.arch in CURVES:
        return CURVES[gpu.arch]
    return _UNNAMED_GPU if gpu.vendor in ("nvidia", "amd") and not gpu.name.startswith("emu-") else _EMULATED


def effective_precision(gpu: GPUSpec, precision: str) -> str:
    """The precision ``gpu``'s matrix units really run: TF32 asked of a device without TF32 units runs
    plain fp32 (PyTorch ignores ``allow_tf32`` there)."""
    return "fp32" if precision == "tf32" and not gpu.tflops_tf32 else precision


def aligned(dim: int, precision: str) -> bool:
    """Whether a product dimension of ``dim`` elements is a multiple of 16 bytes at ``precision``
    (what the vectorised tensor-core kernels need; plain fp32 has no such requirement)."""
    if precision == "fp32":
        return True
    elem_bytes = {"tf32": 4, "fp8": 1}.get(precision, 2)
    return dim % (16 // elem_bytes) == 0


def unit_gemm_width(width: int, kind: str, tp: int, fwd_flops_per_token: float) -> float:
    """Matrix width of a unit's products on one device of a ``tp``-way group.

    Blocks shard their inner dimension (``width / tp``); the head and embedding shard the vocabulary,
    which stays large, so their width is the hidden size. Traced modules without a known width use
    ``sqrt(flops per token / 2)``, the side of a square weight with that cost.
    """
    if width <= 0:
        width = math.sqrt(max(fwd_flops_per_token, 2.0) / 2.0)
    return width / tp if kind in ("block", "module") else float(width)


def matmul_efficiency(gpu: GPUSpec, width: float, tokens: float, precision: str = "bf16") -> float:
    """Fraction of ``gpu``'s ``precision`` peak reached on products ``width`` wide over ``tokens`` rows."""
    return curve_for(gpu).efficiency(width, tokens, gpu.tflops_bf16, effective_precision(gpu, precision))
