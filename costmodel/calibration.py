"""Calibration of the efficiency model against published end-to-end measurements.

* Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", Table 5:
  step times of GPT models of 22B, 175B, 530B and 1T parameters on DGX A100-80GB nodes (8 GPUs,
  NVLink3, 8 x IB HDR), sequence 2048, vocabulary 51200, TP=8, full and selective recompute. Shapes
  and batch sizes from their Table 3 (micro-batch 4 for 22B at PP=1 and global batch 4, 1 otherwise;
  interleaved schedule with 3 chunks for 175B and 530B as stated in the issue).
  :func:`fit_a100_curve` fits the Ampere curve of :mod:`~hetpart.costmodel.efficiency` through the full
  simulator; :func:`table5_comparison` lists predicted vs published.
* Narayanan et al. 2021 (SC21), Table 1: ten GPT models from 1.7B to 1T on up to 3072 A100s, TP 1..8,
  with data parallelism (:func:`table1_validation`). Fitted together with Table 5: Korthikanti's runs
  all use TP=8, so alone they cannot tell matrix-unit efficiency (which depends on ``h / tp``) from
  memory-bound kernels (whose share depends on ``h``).
* Shoeybi et al. 2019 (Megatron-LM), a 1.2B model (h=1536, 40 layers, 16 heads, seq 1024, batch 8,
  activation checkpointing) on one V100-32GB sustains 39 TFLOPS (30% of peak, counting the
  recomputed forward): :func:`anchor_volta_e_max` solves for the Volta curve's ``e_max``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from hetpart.cluster import Cluster, parse_cluster
from hetpart.graph.model_graph import ModelGraph
from hetpart.graph.transformer import TransformerConfig, transformer_graph
from hetpart.plan import Plan
from hetpart.workload import Workload

from hetpart.costmodel.efficiency import _T0_PER_W0, CURVES, EfficiencyCurve
from hetpart.costmodel.megatron import megatron_plan
from hetpart.costmodel.simulator import Simulator

__all__ = ["PublishedRun", "KORTHIKANTI_TABLE5", "CalibrationRow", "dgx_a100_cluster", "table5_setup",
           "table5_comparison", "mean_abs_error_pct", "fit_a100_curve", "anchor_volta_e_max",
           "ScalingRun", "NARAYANAN_TABLE1", "ValidationRow", "table1_validation", "calibration_residuals",
           "llama3_405b_check", "megatron_8p3b_check", "fit_hopper_gemm", "H100_PROFILE"]


@dataclass(frozen=True)
class PublishedRun:
    """One published configuration with its measured step times."""

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_gpus: int
    pp: int
    global_batch: int
    micro_batch: int
    interleave: int
    full_recompute_s: float
    """Published step time with full activation recomputation, seconds."""
    selective_recompute_s: float
    """Published step time with selective recomputation (+ sequence parallelism), seconds."""


KORTHIKANTI_TABLE5: tuple[PublishedRun, ...] = (
    PublishedRun("22B", 6144, 48, 64, 8, 1, 4, 4, 1, 1.42, 1.10),
    PublishedRun("175B", 12288, 96, 96, 64, 8, 64, 1, 3, 18.13, 13.75),
    PublishedRun("530B", 20480, 105, 128, 280, 35, 280, 1, 3, 49.05, 37.83),
    PublishedRun("1T", 25600, 128, 160, 512, 64, 512, 1, 1, 94.42, 71.49),
)
SEQ_LEN = 2048
VOCAB = 51200


@dataclass(frozen=True)
class CalibrationRow:
    name: str
    recompute: str
    published_s: float
    predicted_s: float

    @property
    def error_pct(self) -> float:
        """Signed error of the prediction, % of the published time."""
        return 100.0 * (self.predicted_s - self.published_s) / self.published_s


def dgx_a100_cluster(num_gpus: int) -> Cluster:
    """``num_gpus / 8`` DGX A100-80GB nodes: NVLink3 inside, 8 x InfiniBand HDR per node."""
    return parse_cluster({"name": f"dgx-a100-{num_gpus}", "nodes": [
        {"count": num_gpus // 8, "gpus_per_node": 8, "gpu": "A100-80GB", "intra_node": "NVLink3", "nic": "IB-HDR",
         "nics_per_node": 8}]}, source="calibration")


def _gpt(run: PublishedRun) -> ModelGraph:
    cfg = TransformerConfig("gpt2", run.num_layers, run.hidden_size, run.num_heads, VOCAB, SEQ_LEN)
    return transformer_graph(cfg, f"gpt-{run.name}", SEQ_LEN, 2, source="Korthikanti et al. 2022, Table 3")


def table5_setup(run: PublishedRun, recompute: str) -> tuple[ModelGraph, Cluster, Plan]:
    """Model, cluster and Megatron plan of one Table 5 row (TP=8, DP=1)."""
    model, cluster = _gpt(run), dgx_a100_cluster(run.num_gpus)
    schedule = "interleaved" if run.interleave > 1 else "1f1b"
    plan = megatron_plan(model, cluster, Workload(run.global_batch, SEQ_LEN, attention="eager"), tp=8, pp=run.pp, dp=1,
                         micro_batch=run.micro_batch, schedule=schedule, interleave=run.interleave,
                         recompute=recompute)
    return model, cluster, plan


def _setups():
    return [(run, mode, *table5_setup(run, mode)) for run in KORTHIKANTI_TABLE5 for mode in ("full", "selective")]


def table5_comparison(curve: EfficiencyCurve | None = None, setups=None,
                      options: dict | None = None) -> list[CalibrationRow]:
    """Predicted vs published step time for every Table 5 row and recompute mode (``options``: further
    :class:`Simulator` options, e.g. ``op_counts``)."""
    rows = []
    for run, mode, model, cluster, plan in setups or _setups():
        sim = Simulator(model, cluster, curve_of=(lambda gpu: curve) if curve else None, **(options or {}))
        predicted = sim.simulate(plan, validate=False).step_time_s
        published = run.full_recompute_s if mode == "full" else run.selective_recompute_s
        rows.append(CalibrationRow(run.name, mode, published, predicted))
    return rows


def mean_abs_error_pct(rows: list[CalibrationRow]) -> float:
    return float(np.mean([abs(r.error_pct) for r in rows]))


def calibration_residuals(curve: EfficiencyCurve | None = None, setups=None, options: dict | None = None) -> list[float]:
    """Log errors of the A100 model: Table 5 step times (predicted / published), then Table 1
    throughputs (published / predicted), so that positive means "predicted too slow" in both."""
    table5, table1 = setups or (_setups(), _table1_setups())
    times = [float(np.log(r.predicted_s / r.published_s)) for r in table5_comparison(curve, table5, options)]
    rates = [float(np.log(r.published_tflops / r.predicted_tflops)) for r in table1_validation(curve, table1, options)]
    return times + rates


def fit_a100_curve(start: EfficiencyCurve | None = None, alpha: float = 1.0, options: dict | None = None
                   ) -> EfficiencyCurve:
    """Least-squares fit of ``e_max``, ``w0_ref`` and ``act_traffic`` to both A100 tables.

    Residuals are log ratios: Korthikanti Table 5 step times (8) and Narayanan Table 1 throughputs
    (10). ``alpha`` stays fixed at 1 (a product's time is its ideal time plus a fixed overhead): the
    data cannot separate it from ``w0_ref`` -- a free ``alpha`` runs ``e_max`` into its bound of 1 (the
    datasheet peak, which large cuBLAS products never reach) without a better fit. ``options``: further
    :class:`Simulator` options the fit predicts with (``op_counts``).
    """
    from scipy.optimize import least_squares

    start = start or CURVES["ampere"]
    setups = (_setups(), _table1_setups())

    def curve(x) -> EfficiencyCurve:
        return replace(start, e_max=float(x[0]), w0_ref=float(x[1]), act_traffic=float(x[2]), alpha=alpha,
                       t0_ref=float(x[1]) * _T0_PER_W0)

    def residuals(x):
        return calibration_residuals(curve(x), setups, options)

    fit = least_squares(residuals, x0=[start.e_max, start.w0_ref, start.act_traffic],
                        bounds=([0.3, 1.0, 0.0], [1.0, 20000.0, 50.0]), x_scale=[0.1, 100.0, 1.0])
    return curve(fit.x)


H100_PROFILE = Path(__file__).resolve().parents[1] / "experiments" / "data" / "h100_unit_profile.json"
"""The GEMM sweep measured on one H100 SXM for this project (``bench_gpu_profile --measure``)."""
_H100_PEAKS = {"bf16": 989.0, "tf32": 494.7, "fp32": 67.0}


def _gemm_rows(precision: str, path: Path = H100_PROFILE) -> np.ndarray:
    """``[m, n, k, seconds]`` of the aligned products of the sweep at ``precision``."""
    import json

    rows = [g for g in json.loads(path.read_text())["gemm"] if g["precision"] == precision and g["n"] % 64 == 0]
    return np.array([[g["m"], g["n"], g["k"], g["s"]] for g in rows], dtype=float)


def _gemm_residuals(rows: np.ndarray, peak_tflops: float, e_max: float, w0: float, t0: float,
                    floor_us: float) -> np.ndarray:
    """Log errors of ``max(floor, 2mnk / (peak e_max) (1 + w0/min(n, k) + t0/m))``: the efficiency
    curve's product time, never below the sweep's per-call floor (a Python call and launch when the
    GPU idles between timed calls)."""
    m, n, k, t = rows.T
    ideal = 2 * m * n * k / (peak_tflops * 1e12 * e_max) * (1 + w0 / np.minimum(n, k) + t0 / m)
    return np.log(np.maximum(ideal, floor_us * 1e-6) / t)


def fit_hopper_gemm(path: Path = H100_PROFILE) -> dict[str, float]:
    """The Hopper curve from the H100 GEMM sweep: bf16 fixes ``e_max``, ``w0`` and ``t0``; TF32 and plain
    fp32 fit only their own ``e_max`` with those widths (least squares on log times, 32 shapes each)."""
    from scipy.optimize import least_squares

    bf16 = _gemm_rows("bf16", path)
    fit = least_squares(lambda x: _gemm_residuals(bf16, _H100_PEAKS["bf16"], *x), x0=[0.78, 400.0, 120.0, 38.0],
                        bounds=([0.1, 0.0, 0.0, 0.0], [1.0, 1e4, 1e4, 200.0]))
    e_max, w0, t0, _ = fit.x
    out = {"e_max": float(e_max), "w0_ref": float(w0), "t0_ref": float(t0)}
    for precision in ("tf32", "fp32"):
        rows = _gemm_rows(precision, path)
        other = least_squares(lambda x, rows=rows, peak=_H100_PEAKS[precision]: _gemm_residuals(rows, peak, x[0], w0, t0,
                                                                                          x[1]),
                              x0=[0.7, 38.0], bounds=([0.1, 0.0], [1.0, 200.0]))
        out[f"e_max_{precision}"] = float(other.x[0])
    return out


def _volta_setup() -> tuple[ModelGraph, Cluster, Plan]:
    cfg = TransformerConfig("gpt2", 40, 1536, 16, VOCAB, 1024)
    model = transformer_graph(cfg, "megatron-1.2b", 1024, 2, source="Shoeybi et al. 2019, Table 1")
    cluster = parse_cluster({"name": "v100-1", "nodes": [{"count": 1, "gpus_per_node": 1, "gpu": "V100-32GB",
                                                          "intra_node": "NVLink2", "nic": "IB-EDR"}]})
    plan = megatron_plan(model, cluster, Workload(8, 1024, precision="fp16", attention="eager"), tp=1, pp=1, dp=1, micro_batch=8,
                         recompute="full")
    return model, cluster, plan


def anchor_volta_e_max(target_tflops: float = 39.0, base: EfficiencyCurve | None = None,
                       options: dict | None = None) -> float:
    """``e_max`` of the Volta curve (Ampere's shape; ``base``: another Volta curve to solve on) at which the
    Megatron-LM 1.2B run sustains ``target_tflops`` hardware TFLOPS on one V100 (Shoeybi et al. 2019)."""
    from scipy.optimize import brentq

    model, cluster, plan = _volta_setup()

    def gap(e_max: float) -> float:
        curve = replace(base or CURVES["volta"], e_max=e_max)
        sim = Simulator(model, cluster, curve_of=lambda gpu: curve, **(options or {}))
        return sim.simulate(plan, validate=False).metrics["hardware_tflops_per_device"] - target_tflops

    return float(brentq(gap, 0.05, 1.0, xtol=1e-5))


@dataclass(frozen=True)
class ScalingRun:
    """One row of Narayanan et al. 2021 (SC21), Table 1: GPT on DGX A100-80GB, seq 2048, vocab 51200."""

    params_b: float
    num_heads: int
    hidden_size: int
    num_layers: int
    tp: int
    pp: int
    num_gpus: int
    global_batch: int
    tflops_per_gpu: float
    """Published achieved TFLOPS per GPU, counting the recomputed forward (full recompute)."""


NARAYANAN_TABLE1: tuple[ScalingRun, ...] = (
    ScalingRun(1.7, 24, 2304, 24, 1, 1, 32, 512, 137),
    ScalingRun(3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
    ScalingRun(7.5, 32, 4096, 36, 4, 1, 128, 512, 142),
    ScalingRun(18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
    ScalingRun(39.1, 64, 8192, 48, 8, 2, 512, 1536, 138),
    ScalingRun(76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
    ScalingRun(145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148),
    ScalingRun(310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
    ScalingRun(529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163),
    ScalingRun(1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163),
)


@dataclass(frozen=True)
class ValidationRow:
    params_b: float
    published_tflops: float
    predicted_tflops: float
    micro_batch: int

    @property
    def error_pct(self) -> float:
        return 100.0 * (self.predicted_tflops - self.published_tflops) / self.published_tflops


def _table1_setups(micro_batches: tuple[int, ...] = (1, 2, 4, 8)):
    out = []
    for run in NARAYANAN_TABLE1:
        cfg = TransformerConfig("gpt2", run.num_layers, run.hidden_size, run.num_heads, VOCAB, SEQ_LEN)
        model = transformer_graph(cfg, f"gpt-{run.params_b}B", SEQ_LEN, 2, source="Narayanan et al. 2021, Table 1")
        cluster = dgx_a100_cluster(run.num_gpus)
        dp = run.num_gpus // (run.tp * run.pp)
        plans = [megatron_plan(model, cluster, Workload(run.global_batch, SEQ_LEN, attention="eager"), run.tp, run.pp, dp, mb,
                               recompute="full")
                 for mb in micro_batches if (run.global_batch // dp) % mb == 0]
        out.append((run, model, cluster, plans))
    return out


def table1_validation(curve: EfficiencyCurve | None = None, setups=None,
                      options: dict | None = None) -> list[ValidationRow]:
    """Predicted vs published TFLOPS per GPU for Narayanan et al. 2021, Table 1.

    The paper does not list micro-batch sizes or which rows interleave; we take 1F1B with full
    recompute (their accounting) and the fastest micro-batch among 1, 2, 4, 8 that fits, as their
    tuning would. ``options``: further :class:`Simulator` options.
    """
    rows = []
    for run, model, cluster, plans in setups or _table1_setups():
        sim = Simulator(model, cluster, curve_of=(lambda gpu: curve) if curve else None, **(options or {}))
        best = None
        for plan in plans:
            pred = sim.simulate(plan, validate=False)
            tflops = pred.metrics["hardware_tflops_per_device"]
            if pred.fits_in_memory and (best is None or tflops > best[0]):
                best = (tflops, plan.micro_batch)
        if best is not None:
            rows.append(ValidationRow(run.params_b, run.tflops_per_gpu, best[0], best[1]))
    return rows


def megatron_8p3b_check() -> ValidationRow:
    """Check of the ANCHORED Volta curve on a second Shoeybi et al. 2019 figure (not used to anchor it):
    the 8.3B model (h=3072, 72 layers, 32 heads, seq 1024) with 8-way tensor parallelism and 64-way data
    parallelism on 512 V100-32GB (32 DGX-2H: 16 GPUs on NVSwitch, 8 x IB EDR) sustains 15.1 PFLOPS,
    29.5 TFLOPS per GPU, counting recomputation; global batch 512, so 8 sequences per replica."""
    cfg = TransformerConfig("gpt2", 72, 3072, 32, VOCAB, 1024)
    model = transformer_graph(cfg, "megatron-8.3b", 1024, 2, source="Shoeybi et al. 2019")
    cluster = parse_cluster({"name": "dgx2h-512", "nodes": [{"count": 32, "gpus_per_node": 16, "gpu": "V100-32GB",
                                                           "intra_node": "NVLink2", "nic": "IB-EDR",
                                                           "nics_per_node": 8}]}, source="Shoeybi et al. 2019")
    plan = megatron_plan(model, cluster, Workload(512, 1024, precision="fp16", attention="eager"), 8, 1, 64, 8, recompute="full")
    pred = Simulator(model, cluster).simulate(plan, validate=False)
    return ValidationRow(8.3, 15.1e3 / 512, pred.metrics["hardware_tflops_per_device"], 8)


def llama3_405b_check(interleave: int = 4) -> list[ValidationRow]:
    """Held-out check of the Hopper curve (fitted on a GEMM sweep, never on a training run): Llama 3 405B on H100-80GB (Llama Team 2024,
    Table 4: TP=8, PP=16, seq 8192, 2048 sequences per step; 430 TFLOPS per GPU on 8192 GPUs, 400 on
    16384). Meta's schedule details are not published; we take interleaving ``interleave`` without
    recomputation. Meta shards optimizer states (FSDP), which hetpart does not model, so memory is
    not checked here."""
    from hetpart.graph import load_model

    model = load_model("llama3-405b", seq_len=8192)
    rows = []
    for gpus, published in ((8192, 430.0), (16384, 400.0)):
        cluster = parse_cluster({"name": f"h100-{gpus}", "nodes": [
            {"count": gpus // 8, "gpus_per_node": 8, "gpu": "H100-80GB", "intra_node": "NVLink4", "nic": "RoCE-400",
             "nics_per_node": 8}]}, source="Llama Team 2024")
        plan = megatron_plan(model, cluster, Workload(2048, 8192), 8, 16, gpus // 128, 1, schedule="interleaved",
                             interleave=interleave, recompute="none")
        pred = Simulator(model, cluster).simulate(plan, validate=False)
        rows.append(ValidationRow(405.0, published, pred.metrics["model_tflops_per_device"], 1))
    return rows


if __name__ == "__main__":  # pragma: no cover - regenerates the constants in efficiency.py
    fitted = fit_a100_curve()
    print(f"ampere: e_max={fitted.e_max:.4f} w0_ref={fitted.w0_ref:.1f} alpha={fitted.alpha:.3f} "
          f"act_traffic={fitted.act_traffic:.3f}")
    for row in table5_comparison(fitted):
        print(f"{row.name:>5} {row.recompute:>9} published {row.published_s:7.2f} s predicted "
              f"{row.predicted_s:7.2f} s error {row.error_pct:+6.1f}%")
    print(f"volta e_max (with the fitted ampere shape in efficiency.py): {anchor_volta_e_max():.4f}")
    print("validation, Narayanan et al. 2021 Table 1 (TFLOPS per GPU):")
    for v in table1_validation(fitted):
        print(f"{v.params_b:7.1f}B published {v.published_tflops:5.0f} predicted {v.predicted_tflops:6.1f} "
              f"(micro-batch {v.micro_batch}) error {v.error_pct:+6.1f}%")
    print(f"hopper (H100 GEMM sweep): {fit_hopper_gemm()}")
    v = megatron_8p3b_check()
    print(f"check of the anchored Volta curve, Megatron-LM 8.3B on 512 V100: published {v.published_tflops:.1f} "
          f"predicted {v.predicted_tflops:.1f} TFLOPS per GPU, error {v.error_pct:+.1f}%")
    print("check of the Hopper curve (fitted on GEMMs only), Llama 3 405B on 8192 / 16384 H100 (TFLOPS per GPU):")
    for v in llama3_405b_check():
        print(f"published {v.published_tflops:5.0f} predicted {v.predicted_tflops:6.1f} error {v.error_pct:+6.1f}%")
