"""Matrix efficiency per architecture: the published GEMM figures behind the curves, and what they change.

docs/BENCHMARKS.md's ``arch-efficiency`` block (``make bench BENCH=arch-efficiency``, a few seconds).
For each architecture whose curve is not fitted on training runs it lists the constants, their source
(:mod:`hetpart.costmodel.published_gemm`) and one representative plan predicted twice: with the curve
this checkout uses ("now") and with the assumption it replaced ("before": the nearest generation's
curve scaled by peak, as ``efficiency._ASSUMED_FROM`` had it for Turing, Ada, CDNA2 and CDNA3). The
two predictions differ by the efficiency curve alone (same simulator, same plan).

``python -m hetpart.experiments.bench_arch_curves`` prints the block.
"""

from __future__ import annotations

from dataclasses import replace

__all__ = ["SCENARIOS", "BEFORE", "rows", "section"]

BEFORE = {"turing": "volta", "ada": "ampere", "cdna2": "ampere", "cdna3": "ampere"}
"""The assumption each architecture had before it got a published figure: that generation's curve."""

SCENARIOS = (
    # (GPU, intra-node link, GPUs in the node, model, seq, global batch, micro-batch, tp, dp, precision)
    ("T4-16GB", "PCIe3", 4, "gpt2-medium", 1024, 32, 4, 1, 4, "fp16"),
    ("RTX2080Ti-11GB", "PCIe3-host", 8, "gpt2-medium", 1024, 32, 2, 1, 8, "fp16"),
    ("TitanRTX-24GB", "PCIe3-host", 8, "gpt2-large", 1024, 64, 4, 1, 8, "fp16"),
    ("RTX4090-24GB", "PCIe4-host", 8, "gpt2-large", 1024, 64, 4, 1, 8, "bf16"),
    ("RTX4090-24GB", "PCIe4-host", 8, "gpt2-large", 1024, 64, 4, 1, 8, "tf32"),
    ("L4-24GB", "PCIe4", 8, "gpt2-large", 1024, 64, 4, 1, 8, "bf16"),
    ("MI250X-GCD-64GB", "xGMI", 8, "gpt3-1.3b", 2048, 64, 4, 1, 8, "bf16"),
    ("MI300X-192GB", "xGMI", 8, "llama2-7b", 2048, 64, 2, 1, 8, "bf16"),
    ("MI300X-192GB", "xGMI", 8, "llama2-7b", 2048, 64, 2, 1, 8, "fp8"),
)


def _before_curve(gpu):
    from hetpart.costmodel.efficiency import CURVES, curve_for

    base = BEFORE.get(gpu.arch)
    return replace(CURVES[base], name=gpu.arch) if base else curve_for(gpu)


def rows() -> list[dict]:
    """One dict per scenario: the plan's prediction before and now, and the curve it rests on now."""
    from hetpart import Workload, load_model
    from hetpart.cluster import parse_cluster
    from hetpart.costmodel import Simulator, megatron_plan
    from hetpart.costmodel.efficiency import curve_for, effective_precision
    from hetpart.costmodel.provenance import compute_kind

    out = []
    for gpu_name, link, gpus, model_name, seq, batch, micro, tp, dp, precision in SCENARIOS:
        model = load_model(model_name, seq_len=seq, precision=precision)
        cluster = parse_cluster({"name": f"1x{gpus}-{gpu_name}", "nodes": [
            {"count": 1, "gpus_per_node": gpus, "gpu": gpu_name, "intra_node": link, "nic": "Ethernet-25"}]})
        workload = Workload(batch, seq, precision=precision, recompute="selective")
        plan = megatron_plan(model, cluster, workload, tp=tp, pp=1, dp=dp, micro_batch=micro, recompute="selective")
        gpu = cluster.devices[0].gpu
        now = Simulator(model, cluster).simulate(plan)
        before = Simulator(model, cluster, curve_of=_before_curve).simulate(plan)
        p = effective_precision(gpu, precision)
        out.append({"gpu": gpu_name, "arch": gpu.arch, "model": model_name, "seq": seq, "batch": batch,
                    "micro": micro, "tp": tp, "dp": dp, "precision": precision, "link": link,
                    "kind": compute_kind(gpu)[0], "e_before": _before_curve(gpu).e_peak(p),
                    "e_now": curve_for(gpu).e_peak(p), "step_before": before.step_time_s,
                    "step_now": now.step_time_s, "tps_before": before.tokens_per_s, "tps_now": now.tokens_per_s})
    return out


def _constants_table() -> list[str]:
    from hetpart.catalog.hardware import GPU_CATALOG
    from hetpart.costmodel.published_gemm import PUBLISHED_GEMMS

    lines = ["| architecture | GPU measured | precision | shape m x n x k | published TFLOPS | peak | e_max | role | "
             "source, where |", "|---|---|---|---|---|---|---|---|---|"]
    for r in PUBLISHED_GEMMS:
        role = "sets e_max" if r.role == "sets" else "check only"
        peak = f"{r.peak_tflops:g}" + ("" if r.catalog_gpu in GPU_CATALOG else " (source's)")
        lines.append(f"| {r.arch} | {r.device} | {r.precision} | {r.m} x {r.n} x {r.k} | {r.tflops:g} | {peak} | "
                     f"{r.fraction:.4f} | {role} | {r.source.split(',')[0]}: {r.where} |")
    return lines


def _fall_off_check() -> list[str]:
    """AMD's TAF over MAF on one MI325X against what the CDNA3 curve gives for the same shapes, and what
    that means for the MI300X in TFLOPS."""
    from hetpart.catalog.hardware import GPU_CATALOG
    from hetpart.costmodel.efficiency import CURVES
    from hetpart.costmodel.published_gemm import (PUBLISHED_GEMM_SETS, modelled_set_efficiency,
                                                  modelled_set_over_best, published_rows)

    mi300x = GPU_CATALOG["MI300X-192GB"]  # the MI325X has the same CUs and dense peaks
    maf = {r.precision: r.tflops for r in published_rows("cdna3")}
    lines = ["| precision | AMD TAF / MAF, MI325X | CDNA3 curve, same shapes | MI300X on those shapes: curve | "
             "MI300X MAF x AMD's ratio | curve too fast by |", "|---|---|---|---|---|---|"]
    for row in PUBLISHED_GEMM_SETS:
        ratio = modelled_set_over_best(CURVES["cdna3"], row, mi300x.tflops_bf16)
        curve_tflops = modelled_set_efficiency(CURVES["cdna3"], row, mi300x.tflops_bf16) * mi300x.tflops(row.precision)
        implied = row.over_best * maf[row.precision]
        lines.append(f"| {row.precision} | {row.tflops:g} / {row.best_tflops:g} = {row.over_best:.3f} | {ratio:.3f} | "
                     f"{curve_tflops:.0f} TFLOPS | {implied:.0f} TFLOPS | {100.0 * (curve_tflops / implied - 1.0):+.0f}% |")
    return lines


def _maf_shape_divisor() -> float:
    """The CDNA3 curve's plateau over its efficiency at the bf16 MAF shape."""
    from hetpart.catalog.hardware import GPU_CATALOG
    from hetpart.costmodel.efficiency import CURVES
    from hetpart.costmodel.published_gemm import gemm_efficiency, published_rows

    (row,) = [r for r in published_rows("cdna3") if r.precision == "bf16"]
    curve = CURVES["cdna3"]
    return curve.e_max / gemm_efficiency(curve, row.m, row.n, row.k, GPU_CATALOG[row.catalog_gpu].tflops_bf16)


def _summary(table: list[dict]) -> str:
    """One sentence from the rows: how far each plan moved, and which did not."""
    moved = [f"{r['gpu']} {r['precision']} {100.0 * (r['tps_now'] / r['tps_before'] - 1.0):+.1f}%"
             for r in table if r["e_now"] != r["e_before"]]
    still = sorted({r["gpu"] for r in table if r["e_now"] == r["e_before"]})
    return (f"Predicted throughput moved by {', '.join(moved)} (less than `e_max` itself: communication, "
            "memory-bound kernels and per-operator costs are unchanged)"
            + (f"; {', '.join(still)} did not move (still assumed)." if still else ".")
            + " The Turing boards move up because their assumption was Volta's anchored `e_max` (0.46), an end-to-end "
            "figure of Megatron-LM 2019 that folds in overheads the model does not price; a V100's own GEMM figure is "
            "0.76 of peak (check row above), so on Volta and its heirs the GEMM level and the anchor differ by that much.")


def section():
    """The ``arch-efficiency`` block, computed now."""
    from hetpart.experiments.benchdoc import Section, load, machine

    where = machine()
    table = rows()
    lines = ["| GPU (arch) | plan | precision | compute now | e_max before -> now | step before | step now | "
             "tokens/s before | tokens/s now | change |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in table:
        change = 100.0 * (r["tps_now"] / r["tps_before"] - 1.0)
        lines.append(f"| {r['gpu']} ({r['arch']}) | {r['model']}, seq {r['seq']}, batch {r['batch']}, micro "
                     f"{r['micro']}, DP {r['dp']} x TP {r['tp']}, {r['link']} | {r['precision']} | {r['kind']} | "
                     f"{r['e_before']:.4f} -> {r['e_now']:.4f} | {r['step_before']:.3f} s | {r['step_now']:.3f} s | "
                     f"{r['tps_before']:,.0f} | {r['tps_now']:,.0f} | {change:+.1f}% |")
    body = (
        "Where the large-product efficiency `e_max` of each architecture that is not fitted on training runs "
        "comes from (`costmodel/published_gemm.py`; `tests/test_published_curves.py` checks each curve "
        "reproduces its figure). Convention: `e_max` = the published throughput / the dense datasheet peak with "
        "fp32 accumulation it was measured against (the catalog's, so a consumer card's fp32-accumulate rate, "
        "one GCD of an MI250X, MI300X dense not sparse); the published best-shape fraction stands for the "
        "plateau. The `check` rows show how such a figure relates to a fitted `e_max`: on A100 and H100 it sits "
        "6% and 2% above it, so a published curve may be a few % optimistic on large work. Only `e_max` is "
        "published: the fall-off for small products (`w0`, `t0`), the memory-bound kernels and the per-operator "
        "cost stay the nearest fitted generation's scaled by peak (no source gives small sizes), and precisions "
        "without a figure keep the fraction they were assumed to have (Ada fp8 and MI300X TF32: 0.8017; "
        "MI300X/MI250X plain fp32: Ampere's 0.8982), except the L4's fp8, taken at its bf16 fraction (the same power cap). Boards "
        "that accumulate fp32 at full rate under a power cap (T4, TITAN RTX, L4) reach 0.51-0.65 of their "
        "datasheet peak; GeForce boards at the half rate (RTX 2080 Ti, RTX 4090) 0.83-1.0.\n\n"
        + "\n".join(_constants_table()) + "\n\n"
        "Still assumed (no fair measurement found): Turing types other than the T4, TITAN RTX and RTX 2080 Ti "
        "(Volta's anchored curve, scaled by peak), Ada types other than the L20, RTX 4090 and L4 (an inline L40S is "
        "priced with the Ada curve and reported `assumed`), ""Pascal and Ascend. Found and not used: a TITAN RTX cuBLAS figure (92.7 TFLOPS at 5376 x 5376 x 2048) in "
        "a fork of a GEMM tutorial that could not be identified to cite, measured on low-toggle integer inputs.\n\n"
        "One representative plan per architecture (one node, Megatron placement, 1F1B, selective recompute, "
        "Adam); \"before\" prices it with the assumption the architecture had (Turing: Volta's curve, Ada and "
        "CDNA: Ampere's, scaled by peak), \"now\" with this checkout's curve. The change is in predicted "
        "throughput:\n\n" + "\n".join(lines) + "\n\n" + _summary(table) + "\n\n"
        "**Check of the size fall-off (CDNA3).** AMD also published, for one MI325X (the MI300X's compute die "
        "at 1000 W), the FLOP-weighted throughput over 10 GEMM shapes of DeepSeek V3 (M = 32 and 32,768; N, K "
        "256-7,168) beside the best-shape MAF under the same normal-distribution inputs "
        "(`published_gemm.PUBLISHED_GEMM_SETS`). The CDNA3 curve (Ampere's size terms scaled by peak; width = "
        "the smaller of N and K, tokens = M) loses far less from the best shape to those shapes than measured:\n\n"
        + "\n".join(_fall_off_check()) + "\n\n"
        "The curve's fall-off from the best shape to workload shapes is too flat (its size terms are Ampere's, "
        "and its width term cannot see that the MAF shape's K = 32,896 is far deeper than a transformer's). In "
        "TFLOPS the error on such shapes is smaller than the ratios suggest, because `e_max` = MAF / peak puts "
        f"the curve's plateau above the MAF figure (the curve gives MAF / {_maf_shape_divisor():.3f} at the MAF "
        "shape). Not corrected: "
        "fitting `w0` to the ratio needs `w0` near 3,400 and an `e_max` above 1, and the ratio is an MI325X's. "
        "The MI300X MAF figures also ran AMD's earlier 'trig_float' inputs, which AMD says raise clocks: on the "
        "MI325X they were 1.4% (bf16), 0.8% (fp16) and 7.3% (fp8) "
        "above its normal-input MAF.")
    return Section("arch-efficiency", "Matrix efficiency per architecture (published GEMM figures)", body,
                   "python -m hetpart.experiments.bench_arch_curves", where, load_after=load())


def main() -> int:
    from hetpart.experiments.benchdoc import render

    print(render(section()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
