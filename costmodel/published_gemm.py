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

The community torch.mm table (zzc0721/torch-performence-test-data) is many contributors' one-off runs
with their clocks, drivers and cooling unstated; where it is the only source (T4, TITAN RTX, L4) its
rows are taken as published, and its rows for the fitted generations sit where MAMF's do (A100 0.85,
H100 0.81 of peak).

Found and not used: a cuBLAS fp16 benchmark comment giving 92.7 TFLOPS on a TITAN RTX at 5376 x 5376 x
2048 (a fork of KnowingNothing/MatmulTutorial's ``call_cublas.cu`` whose repository could not be
identified to cite; its inputs are small integers, a low-toggle pattern that raises clocks, and the same
file's A100 figures vary from 151 to 212 TFLOPS). No fair GEMM figure was found for Pascal in training
precisions or for Ascend (the community table's own note says its Ascend rows are not reliable).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # pragma: no cover
    from hetpart.costmodel.efficiency import EfficiencyCurve

__all__ = ["PublishedGemm", "PublishedGemmSet", "PUBLISHED_GEMMS", "PUBLISHED_GEMM_SETS", "published_rows",
           "gemm_efficiency", "modelled_set_efficiency", "modelled_set_over_best"]


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
_TORCH_PERF = ("zzc0721/torch-performence-test-data, database.md: a community table of torch.mm TFLOPS per GPU "
               "(its README: square products up to 10240 x 10240, warm-up, 20-30 timed runs; one row per contributor), "
               "https://github.com/zzc0721/torch-performence-test-data/blob/main/database.md")
_BUSY_GEMM = ("bewantbe/busy-gemm-benchmark, README.md, table 'By torch' (`python busy_pytorch_blas.py 8000 10`), "
              "https://github.com/bewantbe/busy-gemm-benchmark")
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
    # Turing and the T4. Boards whose tensor cores accumulate fp32 at full rate (T4, TITAN RTX, L4, L40S)
    # cannot hold their boost clock under continuous products and reach a fraction of the datasheet peak;
    # GeForce boards at the half rate (RTX 2080 Ti, 3090, 4090) run at or above it.
    PublishedGemm("turing", "NVIDIA Tesla T4 16GB", "T4-16GB", "fp16", 10240, 10240, 10240, 41.93, 65.0, _TORCH_PERF,
                  "rows 'NVIDIA Tesla T4 16GB' (Google Colab 41.91, Kaggle 42.71, Kaggle T4 x2 41.93): the median",
                  note="three contributors' cloud T4s (server airflow) agree within 2%; shape: the tool's largest"),
    PublishedGemm("turing", "NVIDIA Tesla T4 16GB", "T4-16GB", "fp32", 10240, 10240, 10240, 4.35, 8.1, _TORCH_PERF,
                  "same rows, fp32 column (4.17, 4.43, 4.35): the median"),
    PublishedGemm("turing", "NVIDIA T4", "T4-16GB", "fp16", 4096, 4096, 4096, 24.0, 65.0, _T4_FORUM,
                  "first post (cuBLAS, 4096 x 4096 x 4096, mean of 100 iterations: 'about 24T') and NVIDIA's "
                  "reply ('power capping ... expected behavior for approximately continuous matrix multiply "
                  "operations on a T4')", role="check",
                  note="one user's T4, 43% below the cloud T4s above (its 24 TFLOPS is the base clock's rate: a "
                       "T4 without server airflow); not used"),
    PublishedGemm("turing", "NVIDIA TITAN RTX", "TitanRTX-24GB", "fp16", 10240, 10240, 10240, 66.32, 130.5, _TORCH_PERF,
                  "row 'NVIDIA TITAN RTX' (fp16 column)",
                  note="one contributor's card, no notes; a full-rate fp32-accumulate board at 280 W"),
    PublishedGemm("turing", "NVIDIA TITAN RTX", "TitanRTX-24GB", "fp32", 10240, 10240, 10240, 11.91, 16.3, _TORCH_PERF,
                  "row 'NVIDIA TITAN RTX' (fp32 column)"),
    PublishedGemm("turing", "NVIDIA RTX 2080 Ti", "RTX2080Ti-11GB", "fp16", 8000, 8000, 8000, 44.9, 53.8, _BUSY_GEMM,
                  "row '2080Ti', fp16 column",
                  note="torch.matmul; the same table's A100 (40G) row, 153 fp16, is far below other A100 figures, "
                       "so this may be low"),
    PublishedGemm("turing", "NVIDIA RTX 2080 Ti", "RTX2080Ti-11GB", "fp32", 8000, 8000, 8000, 11.4, 13.4, _BUSY_GEMM,
                  "row '2080Ti', fp32 column"),
    PublishedGemm("turing", "NVIDIA GeForce RTX 2080 Ti 22GB", "RTX2080Ti-11GB", "fp16", 10240, 10240, 10240, 58.58, 53.8,
                  _TORCH_PERF, "row 'NVIDIA GeForce RTX 2080 Ti 22GB' (AutoDL)", role="check",
                  note="a memory-modified card in a cloud, 30% above the stock-card figure used and 9% above the "
                       "datasheet peak (GeForce boards boost above their reference clock); not used"),
    # Ada beyond the L20: the L4 (72 W, full-rate accumulate) measured; the RTX 4090 as a check.
    PublishedGemm("ada", "NVIDIA L4", "L4-24GB", "bf16", 10240, 10240, 10240, 70.89, 121.0, _TORCH_PERF,
                  "row 'NVIDIA L4' (physical machine), bf16 column", note="one contributor's card"),
    PublishedGemm("ada", "NVIDIA L4", "L4-24GB", "fp16", 10240, 10240, 10240, 68.83, 121.0, _TORCH_PERF,
                  "row 'NVIDIA L4', fp16 column"),
    PublishedGemm("ada", "NVIDIA L4", "L4-24GB", "fp32", 10240, 10240, 10240, 15.38, 30.3, _TORCH_PERF,
                  "row 'NVIDIA L4', fp32 column"),
    PublishedGemm("ada", "NVIDIA L4", "L4-24GB", "tf32", 10240, 10240, 10240, 31.88, 60.0, _TORCH_PERF,
                  "row 'NVIDIA L4', tf32 column"),
    PublishedGemm("ada", "NVIDIA L20", "", "fp32", 10240, 10240, 10240, 37.27, 59.8, _TORCH_PERF,
                  "row 'NVIDIA L20' (AutoDL), fp32 column", note="CUDA-core SGEMM; peak: the L20's 59.8 fp32"),
    PublishedGemm("ada", "NVIDIA L20", "", "tf32", 10240, 10240, 10240, 58.16, 59.8, _TORCH_PERF,
                  "row 'NVIDIA L20' (AutoDL), tf32 column", note="TF32 dense peak 59.8, the GeForce AD102 rate"),
    PublishedGemm("ada", "NVIDIA RTX 4090 24GB", "RTX4090-24GB", "fp32", 10240, 10240, 10240, 54.22, 82.6, _TORCH_PERF,
                  "the six RTX 4090 24GB rows: median of the fp32 column (46.5-55.0)", role="check",
                  note="5% above the L20 figure that sets Ada's fp32"),
    PublishedGemm("ada", "NVIDIA GeForce RTX 4090", "RTX4090-24GB", "tf32", 10240, 10240, 10240, 85.65, 82.6,
                  _TORCH_PERF, "row 'NVIDIA GeForce RTX 4090' (派欧云), tf32 column (the only 4090 row with one)",
                  role="check", note="7% above the L20 figure that sets Ada's TF32"),
    PublishedGemm("ada", "NVIDIA RTX 4090 24GB", "RTX4090-24GB", "bf16", 10240, 10240, 10240, 164.81, 165.2, _TORCH_PERF,
                  "the nine RTX 4090 rows (24 GB and 48 GB cards): median of the bf16 column (160.5-173.3)",
                  role="check", note="2.6% above the L20 figure that sets Ada's e_max"),
    PublishedGemm("ada", "NVIDIA L20", "", "bf16", 10240, 10240, 10240, 114.14, 119.5, _TORCH_PERF,
                  "row 'NVIDIA L20' (AutoDL), bf16 column", role="check",
                  note="1.8% below the LeetCUDA cuBLAS figure that sets Ada's e_max"),
    # Checks on the fitted generations (MAMF: the same table as the MI250X row; torch.mm: the community table).
    PublishedGemm("ampere", "NVIDIA A100 SXM", "A100-80GB", "bf16", 6912, 16384, 2048, 267.9, 312.0, _MAMF,
                  "same table, row NVIDIA A100 SXM (CUDA-12.1)", role="check"),
    PublishedGemm("hopper", "NVIDIA H100 SXM", "H100-80GB", "bf16", 6144, 17920, 2816, 792.1, 989.0, _MAMF,
                  "same table, row NVIDIA H100 SXM (CUDA-12.1)", role="check"),
    PublishedGemm("ampere", "NVIDIA A100 SXM4 80GB", "A100-80GB", "bf16", 10240, 10240, 10240, 264.53, 312.0,
                  _TORCH_PERF, "row 'NVIDIA A100 SXM4 80GB', bf16 column", role="check"),
    PublishedGemm("hopper", "NVIDIA H100 80GB HBM3", "H100-80GB", "bf16", 10240, 10240, 10240, 797.51, 989.0,
                  _TORCH_PERF, "first row 'NVIDIA H100 80GB HBM3', bf16 column", role="check"),
    PublishedGemm("volta", "NVIDIA Tesla V100-SXM2-16GB", "V100-16GB", "fp16", 10240, 10240, 10240, 94.84, 125.0,
                  _TORCH_PERF, "first row 'NVIDIA Tesla V100-SXM2-16GB', fp16 column", role="check",
                  note="0.76 of peak, against the anchored e_max of 0.46: Volta's e_max is end to end (Megatron-LM "
                       "2019), not a GEMM figure"),
)
"""Every published GEMM figure hetpart uses or shows (see the module docstring)."""


@dataclass(frozen=True)
class PublishedGemmSet:
    """A published throughput over a fixed set of product shapes (FLOP-weighted harmonic mean: total FLOPs
    over total time), beside the best-shape figure measured under the same conditions. Their ratio says
    how fast efficiency falls from the best shape to workload shapes: a check of a curve's size terms."""

    arch: str
    device: str
    precision: str
    shapes: tuple[tuple[int, int, int], ...]
    """``(m, n, k)`` of every product in the set."""
    tflops: float
    """The set's FLOP-weighted harmonic-mean throughput, TFLOPS."""
    best_shape: tuple[int, int, int]
    best_tflops: float
    """The best-shape (MAF) throughput under the same conditions, TFLOPS."""
    source: str
    where: str
    note: str = ""

    @property
    def over_best(self) -> float:
        """Set throughput over best-shape throughput."""
        return self.tflops / self.best_tflops


_AMD_TAF = ("AMD ROCm blog, B. Sander, T. Schluessler, A. Gupta, E. Masters, J. Bennett, 'Completing the GPU "
            "Performance Picture: Understanding TAF Alongside Peak FLOPs and MAF', 06 Oct 2026, "
            "https://rocm.blogs.amd.com/artificial-intelligence/taf-blog/README.html")
_TAF_SHAPES = tuple((m, n, k) for m in (32, 32768)
                    for n, k in ((2112, 7168), (3072, 1536), (7168, 2048), (4608, 7168), (7168, 256)))

PUBLISHED_GEMM_SETS: tuple[PublishedGemmSet, ...] = tuple(
    PublishedGemmSet("cdna3", "AMD Instinct MI325X", precision, _TAF_SHAPES, taf, best, maf, _AMD_TAF,
                     f"Table 1 (TAF {precision.upper()}), the table comparing the three metrics, footnote 1 (MAF "
                     f"shape); the 10 DeepSeek-V3 shapes of its TAF Methodology table",
                     note="normal-distribution inputs, 30 s per shape, one MI325X at 1000 W; the earlier MAF table "
                          "(used for the MI300X above) ran 'trig_float' inputs, which AMD says lower switching and "
                          "raise clocks: on MI325X its MAF figures were 1.4% (bf16), 0.8% (fp16) and 7.3% (fp8) "
                          "above these")
    for precision, taf, maf, best in (("bf16", 616.0, 831.40, (4096, 4864, 32896)),
                                      ("fp16", 606.0, 787.25, (4096, 4864, 32896)),
                                      ("fp8", 1143.0, 1408.06, (4096, 3648, 32896))))
"""AMD's Typical Attained FLOPs on one MI325X (CDNA3, the MI300X's compute die at 1000 W)."""


def gemm_efficiency(curve: "EfficiencyCurve", m: int, n: int, k: int, peak16_tflops: float,
                    precision: str = "bf16") -> float:
    """Fraction of the ``precision`` peak ``curve`` gives one ``(m x k) @ (k x n)`` product: the curve's
    width is the product's smaller inner/outer dimension (a unit's products are ``tokens x w x c*w``) and
    its tokens are ``m``."""
    return curve.efficiency(min(n, k), m, peak16_tflops, precision)


def modelled_set_efficiency(curve: "EfficiencyCurve", row: PublishedGemmSet, peak16_tflops: float) -> float:
    """The FLOP-weighted harmonic mean of ``curve``'s efficiency over the set's shapes (fraction of peak)."""
    flops = [2.0 * m * n * k for m, n, k in row.shapes]
    time = sum(f / gemm_efficiency(curve, m, n, k, peak16_tflops, row.precision)
               for f, (m, n, k) in zip(flops, row.shapes))
    return sum(flops) / time


def modelled_set_over_best(curve: "EfficiencyCurve", row: PublishedGemmSet, peak16_tflops: float) -> float:
    """What ``curve`` predicts for :attr:`PublishedGemmSet.over_best`: its set efficiency over its efficiency
    at the best shape."""
    return (modelled_set_efficiency(curve, row, peak16_tflops)
            / gemm_efficiency(curve, *row.best_shape, peak16_tflops, row.precision))


def published_rows(arch: str, role: str = "sets") -> list[PublishedGemm]:
    """The rows of ``arch`` with ``role``."""
    return [r for r in PUBLISHED_GEMMS if r.arch == arch and r.role == role]
