"""Published measurements of large matrix products, per architecture: where the ``published`` curves'
``e_max`` come from (:mod:`hetpart.costmodel.efficiency`).

Each row is one number a vendor or an independent benchmark published for one GPU, one precision and
one product shape (``m x n x k``), with the dense datasheet peak it is a fraction of. Rows with
``role="sets"`` give an architecture's large-product efficiency (``e_max`` = ``tflops / peak_tflops``,
the plateau that the curve's size terms fall away from); rows with ``role="check"`` are the same kind
of figure on architectures whose curve was fitted another way, kept to show how such a figure relates
to a fitted ``e_max`` (best-shape sweeps with warm caches sit 2-6% above it on A100 and H100).

Fair sources only (issue 9): GPU microbenchmarks and vendor-library GEMM results. No training run is
used, so the rest of each curve (how it falls for small products, the memory-bound kernels, the fixed
cost per operator) stays the nearest fitted generation's, scaled by peak.

``tests/test_published_curves.py`` checks that each published curve's constants reproduce its ``sets`` rows.

Found and not used: a cuBLAS fp16 benchmark comment giving 92.7 TFLOPS on a TITAN RTX at 5376 x 5376 x
2048 (a fork of KnowingNothing/MatmulTutorial's ``call_cublas.cu`` whose repository could not be
identified to cite; its inputs are small integers, a low-toggle pattern that raises clocks, and the same
file's A100 figures vary from 151 to 212 TFLOPS). No fair GEMM figure was found for the RTX 2080 Ti, the
L4, Pascal or Ascend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["PublishedGemm", "PUBLISHED_GEMMS", "published_rows"]


@dataclass(frozen=True)
class PublishedGemm:
    """One published GEMM throughput."""

    arch: str
    """Architecture (``GPUSpec.arch``) the number speaks for."""
    device: str
    """The GPU measured, as the source names it."""
    catalog_gpu: str
    """The hetpart catalog type of that GPU (``""`` where the catalog has none, e.g. the L20)."""
    precision: str
    """Input precision of the product (``bf16``, ``fp16``, ``fp8``); products accumulate in fp32."""
    m: int
    n: int
    k: int
    """Product shape: ``(m x k) @ (k x n)``."""
    tflops: float
    """Published throughput, TFLOPS."""
    peak_tflops: float
    """Dense datasheet peak of the measured GPU at this precision with fp32 accumulation (the catalog's
    figure where the catalog has the type), TFLOPS."""
    source: str
    """Who published it, and where (URL)."""
    where: str
    """Table, section or line of the source holding the number."""
    role: Literal["sets", "check"] = "sets"
    """``sets``: gives the architecture's ``e_max`` at this precision; ``check``: shown beside a fitted curve."""
    note: str = ""
    """Conditions (software, clocks, how it was measured) and caveats."""

    @property
    def fraction(self) -> float:
        """Fraction of the peak the product reached."""
        return self.tflops / self.peak_tflops


_AMD_MAF = ("AMD ROCm blog, B. Sander, E. Masters, B. Poursartip, H. Ho, 'Measuring Max-Achievable FLOPs - Part 2', "
            "28 Feb 2025, https://rocm.blogs.amd.com/software-tools-optimization/measuring-max-achievable-flops-part2/"
            "README.html")
_MAMF = ("S. Bekman, 'Machine Learning Engineering Open Book', compute/accelerator/README.md, "
         "https://github.com/stas00/ml-engineering (mamf-finder.py: best of a sweep of shapes, torch.matmul)")
_LEETCUDA = ("xlite-dev/LeetCUDA (formerly DefTruth/CUDA-Learn-Notes), hgemm/README.md, "
             "https://github.com/xlite-dev/LeetCUDA/blob/main/hgemm/README.md")
_T4_FORUM = ("NVIDIA Developer Forums, 'About GPU peak performance', with NVIDIA's reply, "
             "https://forums.developer.nvidia.com/t/about-gpu-peak-performance/264462")

PUBLISHED_GEMMS: tuple[PublishedGemm, ...] = (
    # CDNA3: AMD's own Max-Achievable FLOPs, hipBLASLt, normally distributed data, cold caches, a
    # thermally settled device, median of the lowest chiplet clock.
    PublishedGemm("cdna3", "AMD Instinct MI300X", "MI300X-192GB", "bf16", 4096, 4864, 32896, 708.0, 1307.4, _AMD_MAF,
                  "Table 1 'Max Achievable FLOPs (MAF)', MAF BF16; shape from its Appendix B hipblaslt-bench command",
                  note="median clock 1207 MHz under this load (2100 MHz peak clock); hipBLASLt commit db8e93b"),
    PublishedGemm("cdna3", "AMD Instinct MI300X", "MI300X-192GB", "fp16", 4096, 4864, 32896, 654.0, 1307.4, _AMD_MAF,
                  "Table 1, MAF FP16", note="median clock 1115 MHz"),
    PublishedGemm("cdna3", "AMD Instinct MI300X", "MI300X-192GB", "fp8", 4096, 3648, 32896, 1273.0, 2614.9, _AMD_MAF,
                  "Table 1, MAF FP8 (f8_fnuz inputs, f32 compute)", note="median clock 1230 MHz"),
    PublishedGemm("cdna3", "AMD MI300X", "MI300X-192GB", "bf16", 4096, 10240, 4864, 781.9, 1307.4, _MAMF,
                  "table 'Maximum Achievable Matmul FLOPS comparison table', row AMD MI300X (ROCm-6.2)", role="check",
                  note="10% above AMD's own MAF: best of a sweep with warm caches; not used (AMD's is the "
                       "vendor's figure under training-like data and clocks)"),
    # CDNA2: one GCD of an MI250X (what one process drives).
    PublishedGemm("cdna2", "AMD MI250X (1 GCD)", "MI250X-GCD-64GB", "bf16", 1024, 14080, 19968, 147.0, 191.5, _MAMF,
                  "table 'Maximum Achievable Matmul FLOPS comparison table', row AMD MI250X (ROCm-6.2 / 1 GCD)",
                  note="best of a sweep with warm caches: the same kind of figure sits 6% (A100) and 2% (H100) "
                       "above those generations' fitted e_max, 10% above AMD's own MAF on MI300X"),
    # Ada: the L20 is an AD102 data-centre board whose 16-bit tensor rate with fp32 accumulation is the
    # GeForce AD102's (512 FLOP per SM per clock: 92 SMs x 2.52 GHz = 119 TFLOPS), the rate the
    # catalog's RTX 4090 peak (165.2) counts; the README's SASS shows HMMA.1688.F32 (fp32 accumulate).
    PublishedGemm("ada", "NVIDIA L20", "", "fp16", 16384, 16384, 8192, 116.25, 119.5, _LEETCUDA,
                  "section 'NVIDIA L20': `python3 hgemm.py --M 16384 --N 16384 --K 8192 ...`, row (cublas)",
                  note="cuBLAS via torch.matmul, fp16 in/out, fp32 accumulate; the C++ cuBLAS TN runs of the same "
                       "README give 112.5-117.1 TFLOPS on cubes of 9216-12800"),
    # Turing: the T4 is a 70 W board; under continuous products it runs far below its boost clock.
    PublishedGemm("turing", "NVIDIA T4", "T4-16GB", "fp16", 4096, 4096, 4096, 24.0, 65.0, _T4_FORUM,
                  "first post (cuBLAS, 4096 x 4096 x 4096, mean of 100 iterations: 'about 24T') and NVIDIA's "
                  "reply ('power capping ... expected behavior for approximately continuous matrix multiply "
                  "operations on a T4')",
                  note="one user's measurement, confirmed as expected by NVIDIA; T4-specific (power cap), not "
                       "Turing's: the 250-280 W GeForce/TITAN boards are not throttled the same way"),
    # Checks on the fitted generations (same table as the MI250X row).
    PublishedGemm("ampere", "NVIDIA A100 SXM", "A100-80GB", "bf16", 6912, 16384, 2048, 267.9, 312.0, _MAMF,
                  "same table, row NVIDIA A100 SXM (CUDA-12.1)", role="check"),
    PublishedGemm("hopper", "NVIDIA H100 SXM", "H100-80GB", "bf16", 6144, 17920, 2816, 792.1, 989.0, _MAMF,
                  "same table, row NVIDIA H100 SXM (CUDA-12.1)", role="check"),
)
"""Every published GEMM figure hetpart uses or shows (see the module docstring)."""


def published_rows(arch: str, role: str = "sets") -> list[PublishedGemm]:
    """The rows of ``arch`` with ``role``."""
    return [r for r in PUBLISHED_GEMMS if r.arch == arch and r.role == role]
