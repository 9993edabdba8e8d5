"""Engine-specific operator counts and the forward host cost, tried against every validation table.

The simulator charges a fixed host cost per operator a unit dispatches (``efficiency.HOST_US_PER_OP``,
``compute.OPS_PER_UNIT``: counted on the runtime's Hugging Face modules). Megatron-Core with Transformer
Engine dispatches far fewer operators per block (``compute.FUSED_BLOCK_OPS``, derived from its source).
This benchmark predicts every row of ``bench_validation`` (the fitting tables, the held-out V100, Llama 3
405B and H100 rows, and the per-unit H100 profile) under each variant below, refitting only what the
validation procedure refits (the Ampere curve by ``calibration.fit_a100_curve``, the Volta ``e_max`` by
``calibration.anchor_volta_e_max``; Hopper's memory-bound traffic follows Ampere's):

* ``shipped`` -- the shipped simulator (``op_counts="measured"``: the runtime's counts for every kernel set);
* ``refit`` -- the shipped simulator with its constants refit (what a change elsewhere needs);
* ``tp-nccl`` -- tensor-parallel collectives priced as NCCL all-reduces (``tp_comm="nccl"``: its fastest
  algorithm and protocol per call, NVLS on H100 NVSwitch nodes; the WIP branch ``eng-tp-nccl``); refit;
* ``tp-nccl-sp`` -- as sequence parallelism runs them, a reduce-scatter plus an all-gather of the same
  buffer per call, at NCCL's fastest ring protocol (``tp_comm="nccl-sp"``); refit;
* ``engine`` -- ``op_counts="engine"``: Megatron-Core/TE's derived counts for the fitted and published
  rows (kernel set ``fused``), the runtime's measured ones for its own runs (``torch``); refit;
* ``engine+torch-fwd`` -- as ``engine``, and each forward operator of the runtime's blocks costs
  :data:`TORCH_FWD` times a backward one (its forward runs Python module code, its backward the C++
  autograd engine; measured on this machine with ``--host-ratio``);
* ``engine+te-fwd`` -- as ``engine``, and the fused set's forward operators cost ``--te-fwd`` times more
  (Transformer Engine modules' host overhead, NVIDIA/TransformerEngine issue 2053: a TE ``Linear``
  forward takes 2.7x the host time of ``torch.nn.Linear``, 90.5 against 33.2 us on GH200); refit;
* ``serial`` -- the host's fixed cost added to the device's work (``dispatch="serial"``, the simulator before
  2026-11-27; the shipped ``overlap``, the larger of the two, was measured on an H100: docs/BENCHMARKS.md
  "Host dispatch against device work"); refit. (``engine+overlap``, tried before the measurement with the
  launch-loop host cost of 11.2 us per operator, is the shipped structure now.)

    python -m hetpart.experiments.bench_host_ops              # the tables (about a minute)
    python -m hetpart.experiments.bench_host_ops --host-ratio # forward / backward host time per operator
    python -m hetpart.experiments.bench_host_ops --recompute-host  # host cost of recomputation (writes
                                                                   # experiments/data/recompute_host.json)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

__all__ = ["variant", "run_variant", "host_ratio", "recompute_host", "RECOMPUTE_HOST_DATA", "main"]

VARIANTS = ("shipped", "refit", "tp-nccl", "tp-nccl-sp", "engine", "engine+torch-fwd", "engine+te-fwd", "serial")
TORCH_FWD = {"gpt2": 2.15, "llama": 1.5}
"""MEASURED (``--host-ratio``, this machine's CPU, 2026-11-25, two runs: 2.15/2.16 and 1.52/1.49): host
seconds per counted forward operator of the runtime's block over those per backward operator."""


@contextlib.contextmanager
def variant(name: str, te_fwd: float = 2.7):
    """Patch the compute model for the what-if variants (``shipped`` and ``engine`` patch nothing)."""
    import numpy as np

    import hetpart.costmodel.compute as compute
    import hetpart.costmodel.simulator as simulator

    ops, ucs = compute.unit_ops, compute.unit_compute_s

    def scaled_ops(model, kernels="torch", attention="fused"):
        f, b = ops(model, kernels, attention)
        if name == "engine+torch-fwd" and kernels == "torch":
            scale = TORCH_FWD.get(getattr(model.config, "family", ""), TORCH_FWD["gpt2"])
            f = np.where([u.kind == "block" for u in model.units], f * scale, f)
        if name == "engine+te-fwd" and kernels == "fused":
            f = f * te_fwd
        return f, b

    try:
        compute.unit_ops = scaled_ops
        yield
    finally:
        compute.unit_ops, compute.unit_compute_s, simulator.unit_compute_s = ops, ucs, ucs


def run_variant(name: str, te_fwd: float = 2.7) -> dict:
    """``{"curves", "results", "units"}`` of one variant: refit constants, every validation row, the unit summary."""
    from hetpart.costmodel.calibration import anchor_volta_e_max, fit_a100_curve
    from hetpart.costmodel.efficiency import CURVES
    from hetpart.experiments.bench_validation import h100_run_rows, h100_unit_summary, load_published, predict_published

    options = {"shipped": {}, "refit": {}, "tp-nccl": {"tp_comm": "nccl"}, "tp-nccl-sp": {"tp_comm": "nccl-sp"},
               "serial": {"dispatch": "serial"}}.get(name, {"op_counts": "engine"})
    with variant(name, te_fwd):
        curves = dict(CURVES)
        if name != "shipped":
            a = fit_a100_curve(CURVES["ampere"], options=options)
            v = replace(CURVES["volta"], w0_ref=a.w0_ref, t0_ref=a.t0_ref, act_traffic=a.act_traffic)
            curves.update(ampere=a, volta=replace(v, e_max=anchor_volta_e_max(base=v, options=options)),
                          hopper=replace(CURVES["hopper"], act_traffic=a.act_traffic))
        fixed = {"ampere", "volta", "hopper"}
        if name != "shipped":
            options["curve_of"] = lambda gpu: curves[gpu.arch] if gpu.arch in fixed else CURVES.get(gpu.arch)
        results = [predict_published(r, options) for r in load_published()] + h100_run_rows(options=options)
        units = h100_unit_summary(curve=curves["hopper"])
    return {"curves": {k: curves[k] for k in ("ampere", "volta")}, "results": results, "units": units}


def _groups(results) -> list[tuple[str, float, int, int]]:
    """``(group, mean abs error %, too fast, rows)`` per validation group."""
    names = (("Korthikanti 2022 Table 5 (fit)", "k22"), ("Narayanan 2021 Table 1 (fit)", "n21"),
             ("Shoeybi 2019 1.2B, one V100 (anchor)", "s19-1.2b"), ("Shoeybi 2019 8.3B, V100 (held out)", "s19-8.3b"),
             ("Llama 3 405B, H100 (held out)", "l24"), ("hetpart runtime, one H100 (held out)", "h100-run"))
    out = []
    for label, prefix in names:
        rows = [r for r in results if r.id.startswith(prefix) and r.error_pct is not None]
        out.append((label, sum(abs(r.error_pct) for r in rows) / len(rows), sum(r.error_pct < 0 for r in rows), len(rows)))
    return out


def report(runs: dict[str, dict]) -> str:
    """Markdown: constants, group errors, per-row errors of the held-out rows, unit summary, per variant."""
    names = list(runs)
    lines = ["| constant | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for key, label in (("ampere", "Ampere e_max / w0 / act_traffic"), ("volta", "Volta e_max")):
        cells = []
        for n in names:
            c = runs[n]["curves"][key]
            cells.append(f"{c.e_max:.4f} / {c.w0_ref:.1f} / {c.act_traffic:.3f}" if key == "ampere" else f"{c.e_max:.4f}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "| rows: mean abs error (too fast of n) | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    groups = {n: _groups(runs[n]["results"]) for n in names}
    for i, (label, *_rest) in enumerate(groups[names[0]]):
        lines.append(f"| {label} | " + " | ".join(f"{groups[n][i][1]:.1f}% ({groups[n][i][2]} of {groups[n][i][3]})"
                                                   for n in names) + " |")
    held = {n: [r for r in runs[n]["results"] if r.role == "heldout" and r.error_pct is not None] for n in names}
    lines.append("| all held-out rows | " + " | ".join(
        f"{sum(abs(r.error_pct) for r in held[n]) / len(held[n]):.2f}% ({sum(r.error_pct < 0 for r in held[n])} of "
        f"{len(held[n])})" for n in names) + " |")
    lines += ["", "| row: error | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    by_id = {n: {r.id: r for r in runs[n]["results"]} for n in names}
    for r in runs[names[0]]["results"]:
        if r.error_pct is None:
            continue
        lines.append(f"| {r.id} | " + " | ".join(f"{by_id[n][r.id].error_pct:+.1f}%" for n in names) + " |")
    lines += ["", "| H100 unit profile (held out): sim / measured, geomean [range] | " + " | ".join(names) + " |",
              "|---|" + "---|" * len(names)]
    for i, u in enumerate(runs[names[0]]["units"]):
        lines.append(f"| {u['precision']} mb {u['micro_batch']} | " + " | ".join(
            f"{runs[n]['units'][i]['geomean']:.2f} [{runs[n]['units'][i]['min']:.2f}-{runs[n]['units'][i]['max']:.2f}]"
            for n in names) + " |")
    return "\n".join(lines)


def host_ratio(models: tuple[str, ...] = ("gpt2-small", "llama2-7b"), repeats: int = 40) -> dict[str, dict]:
    """Host seconds of the runtime's first block, forward and backward, with next to no work (one token,
    width 256, the CPU, one thread): per counted operator (``compute.OPS_PER_UNIT``), and the ratio of
    a forward operator's cost to a backward one's. Medians over ``repeats`` after 5 warm-up calls."""
    import torch

    from hetpart.costmodel.compute import OPS_PER_UNIT
    from hetpart.runtime.models import runnable_spec

    torch.set_num_threads(1)
    out = {}
    for name in models:
        spec = runnable_spec(name, scale=256)
        fwd, bwd = _time_block(*_first_block(spec), repeats)
        n_f, n_b = OPS_PER_UNIT["block/llama" if spec.config.family == "llama" else "block"]
        f, b = statistics.median(fwd), statistics.median(bwd)
        out[name] = {"fwd_us": f * 1e6, "bwd_us": b * 1e6, "fwd_us_per_op": f * 1e6 / n_f,
                     "bwd_us_per_op": b * 1e6 / n_b, "ratio": (f / n_f) / (b / n_b)}
    return out


def _first_block(spec, device: str = "cpu", recompute: str = "none"):
    """``(block, input)``: the runtime's first block of ``spec`` under ``recompute``, and one token's hidden
    state from its embedding, detached, requiring grad."""
    import torch

    from hetpart.runtime.models import build_units

    emb, block = build_units(spec, [0, 1], device=device)
    block.set_recompute(recompute)
    h = emb(torch.randint(0, 100, (1, 1), device=device))
    return block, (h[0] if isinstance(h, tuple) else h).detach().requires_grad_(True)


def _time_block(block, h, repeats: int, warmup: int = 5) -> tuple[list[float], list[float]]:
    """Seconds of ``repeats`` forwards and of their backwards (of ``y.float().sum()``), after ``warmup`` calls."""
    fwd, bwd = [], []
    for i in range(repeats + warmup):
        t0 = time.perf_counter()
        y = block(h)
        t1 = time.perf_counter()
        (y[0] if isinstance(y, tuple) else y).float().sum().backward()
        t2 = time.perf_counter()
        if i >= warmup:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
    return fwd, bwd


RECOMPUTE_HOST_DATA = Path(__file__).resolve().parent / "data" / "recompute_host.json"
"""Where ``--recompute-host`` writes its measurement (the source of ``compute.RECOMPUTE_HOST``)."""


def recompute_host(models: tuple[str, ...] = ("gpt2-small", "llama2-7b"), repeats: int = 200,
                   rounds: int = 5, device: str = "cpu") -> dict:
    """Host seconds of the runtime's first block under each recompute mode (``UnitModel.set_recompute``:
    ``selective`` checkpoints the attention sublayer, ``full`` the whole block, both with
    ``torch.utils.checkpoint``, non-reentrant), with next to no work (one token, width 256, the CPU, one
    thread): forward, and forward + backward. The modes are measured in turn, ``rounds`` times each
    (``repeats`` calls after 5 warm-up calls per round), so that a drift of the machine's load falls on
    every mode alike; per mode the median of the round medians. Returns the raw times and, per model,
    the factors over ``none``. ``device="cuda"``: the same on a GPU, where the checkpoint also saves and
    restores the device's RNG state (at one token the kernels finish before the host issues the next)."""
    import platform

    import torch

    from hetpart.runtime.models import runnable_spec

    torch.set_num_threads(1)
    modes = ("none", "selective", "full")
    out: dict = {"meta": {"cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
                          "python": platform.python_version(), "threads": 1, "tokens": 1, "scale": 256,
                          "device": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
                          "repeats": repeats, "rounds": rounds,
                          "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                          "method": "perf_counter around the block's forward, and forward + backward of y.float().sum(); "
                                    "medians per round, the median of the rounds"},
                 "models": {}}
    for name in models:
        spec = runnable_spec(name, scale=256)
        units = {}
        for mode in modes:
            units[mode] = _first_block(spec, device, mode)
        rows = {m: {"fwd_ms": [], "total_ms": []} for m in modes}
        for _ in range(rounds):
            for mode in modes:
                fwd, bwd = _time_block(*units[mode], repeats)
                tot = [f + b for f, b in zip(fwd, bwd)]
                if device.startswith("cuda"):
                    torch.cuda.synchronize()
                rows[mode]["fwd_ms"].append(statistics.median(fwd) * 1e3)
                rows[mode]["total_ms"].append(statistics.median(tot) * 1e3)
        med = {m: (statistics.median(r["fwd_ms"]), statistics.median(r["total_ms"])) for m, r in rows.items()}
        out["models"][name] = {
            "family": spec.config.family, "rounds": rows,
            "median_ms": {m: {"fwd": f, "total": t} for m, (f, t) in med.items()},
            "factors": {m: {"fwd": med[m][0] / med["none"][0], "total": med[m][1] / med["none"][1]}
                        for m in ("selective", "full")}}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host-ratio", action="store_true", help="measure the runtime's forward/backward host cost per operator")
    ap.add_argument("--recompute-host", action="store_true",
                    help="measure the host cost of recomputation on the runtime's blocks (writes --out)")
    ap.add_argument("--out", type=Path, default=None, help="--recompute-host: where to write (default "
                    "experiments/data/recompute_host.json)")
    ap.add_argument("--device", default="cpu", help="--recompute-host: cpu (default) or cuda")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, of " + ", ".join(VARIANTS))
    ap.add_argument("--te-fwd", type=float, default=2.7, help="engine+te-fwd: TE forward operators' host cost factor")
    args = ap.parse_args(argv)
    if args.host_ratio:
        for name, r in host_ratio().items():
            print(f"{name}: block forward {r['fwd_us']:.0f} us, backward {r['bwd_us']:.0f} us; per counted operator "
                  f"{r['fwd_us_per_op']:.1f} / {r['bwd_us_per_op']:.1f} us; forward / backward {r['ratio']:.2f}")
        return 0
    if args.recompute_host:
        data = recompute_host(device=args.device)
        out = args.out or RECOMPUTE_HOST_DATA
        out.write_text(json.dumps(data, indent=1) + "\n")
        for name, r in data["models"].items():
            m, f = r["median_ms"], r["factors"]
            print(f"{name}: forward / forward + backward, ms: none {m['none']['fwd']:.3f} / {m['none']['total']:.3f}, "
                  f"selective {m['selective']['fwd']:.3f} / {m['selective']['total']:.3f} "
                  f"(x{f['selective']['fwd']:.2f} / x{f['selective']['total']:.2f}), full {m['full']['fwd']:.3f} / "
                  f"{m['full']['total']:.3f} (x{f['full']['fwd']:.2f} / x{f['full']['total']:.2f})")
        print(f"wrote {out}")
        return 0
    names = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        ap.error(f"unknown variant(s) {', '.join(unknown)}")
    print(report({n: run_variant(n, args.te_fwd) for n in names}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
