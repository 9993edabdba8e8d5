"""The simulator against published measurements: docs/BENCHMARKS.md's calibration block.

Predicts every published setup with the shipped efficiency constants (no refit here; the fit itself is
``python -m hetpart.costmodel.calibration``) and writes the two tables and the two checks of
curves that were not fitted. Run: ``make bench BENCH=simulator-calibration`` (about a minute).
"""

from __future__ import annotations

__all__ = ["section"]


def _table5() -> tuple[str, float]:
    from hetpart.costmodel.calibration import KORTHIKANTI_TABLE5, mean_abs_error_pct, table5_comparison

    rows = table5_comparison()
    runs = {r.name: r for r in KORTHIKANTI_TABLE5}
    lines = ["| model | GPUs | PP | recompute | published step (s) | predicted step (s) | error |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        run = runs[r.name]
        lines.append(f"| {r.name} | {run.num_gpus} | {run.pp} | {r.recompute} | {r.published_s:.2f} | "
                     f"{r.predicted_s:.2f} | {r.error_pct:+.1f}% |")
    return "\n".join(lines), mean_abs_error_pct(rows)


def _table1() -> tuple[str, float]:
    from hetpart.costmodel.calibration import NARAYANAN_TABLE1, table1_validation

    rows = table1_validation()
    runs = {r.params_b: r for r in NARAYANAN_TABLE1}
    lines = ["| model | TP x PP x DP | published TFLOPS/GPU | predicted | micro-batch | error |",
             "|---|---|---|---|---|---|"]
    for v in rows:
        run = runs[v.params_b]
        dp = run.num_gpus // (run.tp * run.pp)
        lines.append(f"| {v.params_b:g}B | {run.tp} x {run.pp} x {dp} | {v.published_tflops:g} | "
                     f"{v.predicted_tflops:.1f} | {v.micro_batch} | {v.error_pct:+.1f}% |")
    mean = sum(abs(v.error_pct) for v in rows) / len(rows)
    return "\n".join(lines), mean


def section():
    """Run the comparisons and return the ``simulator-calibration`` block."""
    from hetpart.costmodel.calibration import llama3_405b_check, megatron_8p3b_check
    from hetpart.experiments.benchdoc import Section, load, machine

    where = machine()
    t5, t5_mean = _table5()
    t1, t1_mean = _table1()
    volta = megatron_8p3b_check()
    hopper = llama3_405b_check()
    body = (
        "Setups from Korthikanti et al. 2022 (Table 3): GPT shapes (22B h=6144 L=48 a=64; 175B h=12288 L=96 "
        "a=96; 530B h=20480 L=105 a=128; 1T h=25600 L=128 a=160), vocabulary 51200, DGX A100-80GB nodes "
        "(NVLink3, 8 x IB HDR), TP=8, DP=1, embedding with the first stage and head with the last "
        "(`megatron_plan`). Predicted with the constants shipped in `hetpart/costmodel/efficiency.py`.\n\n"
        f"#### Korthikanti et al. 2022, Table 5 (A100-80GB, seq 2048)\n\n{t5}\n\n"
        f"Mean absolute error {t5_mean:.1f}% (test bound: 5% mean, 15% worst row, `tests/test_calibration.py`).\n\n"
        "#### Narayanan et al. 2021 (SC21), Table 1 (A100-80GB, seq 2048)\n\n"
        "The paper counts FLOPs with full recomputation (our `hardware_tflops_per_device`) and lists no "
        "micro-batch sizes: we take 1F1B, full recompute and the fastest micro-batch of 1, 2, 4, 8 that fits.\n\n"
        f"{t1}\n\nMean absolute error {t1_mean:.1f}% (test bound: 5% mean).\n\n"
        "#### Curves that were not fitted\n\n"
        f"- Anchored Volta curve, checked on a figure not used to anchor it (Shoeybi et al. 2019, 8.3B at TP=8 x "
        f"DP=64 on 512 V100-32GB): published {volta.published_tflops:.1f} TFLOPS per GPU, predicted "
        f"{volta.predicted_tflops:.1f} ({volta.error_pct:+.1f}%).\n"
        "- Hopper curve (fitted on an H100 GEMM sweep, never on a training run), Llama 3 405B on H100-80GB "
        "(Llama Team 2024, Table 4; TP=8, PP=16, interleaving 4, no recompute, fused attention): " + "; ".join(
            f"published {v.published_tflops:g}, predicted {v.predicted_tflops:.0f} ({v.error_pct:+.1f}%)"
            for v in hopper) + " TFLOPS per GPU on 8,192 and 16,384 GPUs.")
    return Section("simulator-calibration", "Calibration against published runs", body,
                   "python -m hetpart.experiments.run_all simulator-calibration", where, load_after=load(), level=3)
