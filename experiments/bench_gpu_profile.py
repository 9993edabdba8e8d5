"""Measured per-unit times on a real GPU against the simulator's per-unit compute.

Two modes:

* ``--measure`` (on a machine with a GPU): times the embedding, one block and the head of several catalog
  models at full size, micro-batches 1-8, in bf16, TF32 and plain fp32 (:func:`hetpart.runtime.profile.
  profile_units`), plus a GEMM sweep and the per-kernel launch cost, and writes one JSON file;
* default: reads such a file and prints, per model, precision and micro-batch, the simulator's per-unit
  forward and backward time over the measured one (``pred/meas``; 1.0 is exact, below 1 too fast).

    python -m hetpart.experiments.bench_gpu_profile --measure --out experiments/data/h100_unit_profile.json
    python -m hetpart.experiments.bench_gpu_profile experiments/data/h100_unit_profile.json --gpu H100-80GB
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

__all__ = ["measure", "compare", "main"]

MODELS = (("gpt2-small", 1024), ("gpt2-medium", 1024), ("gpt2-xl", 1024), ("gpt3-2.7b", 2048), ("llama2-7b", 2048))
MICRO_BATCHES = (1, 2, 4, 8)
PRECISIONS = ("bf16", "tf32", "fp32")


def measure(out: Path, device: str = "cuda") -> dict:
    """Profile :data:`MODELS` on ``device`` and write the JSON to ``out``."""
    import torch

    from hetpart.runtime.models import runnable_spec
    from hetpart.runtime.profile import device_name, profile_units

    dev = torch.device(device)
    rows = []
    for name, seq in MODELS:
        spec = runnable_spec(name, None)
        for prec in PRECISIONS:
            for t in profile_units(spec, list(MICRO_BATCHES), seq, prec, dev, warmup=3, repeats=10):
                rows.append(t.to_dict() | {"model": name})
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    data = {"meta": {"device": device_name(dev), "torch": torch.__version__, "cuda": torch.version.cuda,
                     "host": platform.node(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                     "launch_overhead_us_per_small_kernel": _launch_us(dev),
                     "seq_len": dict(MODELS),
                     "method": "runtime unit modules at full size (transformers GPT-2/Llama, sdpa attention), "
                               "CUDA events, 3 warm-up + median of 10"},
            "units": rows, "gemm": _gemm_sweep(dev)}
    out.write_text(json.dumps(data, indent=1))
    return data


def _gemm_sweep(dev) -> list[dict]:
    import torch

    from hetpart.runtime.profile import _Clock

    clock, rows = _Clock(dev), []
    for prec, dtype, tf32 in (("bf16", torch.bfloat16, False), ("tf32", torch.float32, True),
                              ("fp32", torch.float32, False)):
        if dev.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = tf32
        for h in (512, 768, 1024, 1600, 2048, 2560, 4096, 8192):
            for tokens in (256, 1024, 4096, 16384):
                for n, k in ((4 * h, h), (h, 4 * h), (3 * h, h)):
                    a = torch.randn(tokens, k, device=dev, dtype=dtype)
                    b = torch.randn(k, n, device=dev, dtype=dtype)
                    times = [clock(lambda a=a, b=b: a @ b) for _ in range(13)][3:]
                    s = statistics.median(times)
                    rows.append({"precision": prec, "m": tokens, "n": n, "k": k, "s": s,
                                 "tflops": 2 * tokens * n * k / s / 1e12})
    return rows


def _launch_us(dev) -> float | None:
    import torch

    if dev.type != "cuda":
        return None
    from hetpart.runtime.profile import _Clock

    x = torch.randn(16, device=dev)

    def chain():
        y = x
        for _ in range(1000):
            y = y + 1

    _Clock(dev)(chain)
    return _Clock(dev)(chain) / 1000 * 1e6


def compare(data: dict, gpu_name: str, curve=None) -> list[dict]:
    """Per measured (model, precision, unit, micro-batch): the simulator's time over the measured one
    (``curve``: the device's efficiency curve where it is not the shipped one)."""
    from hetpart import load_model
    from hetpart.catalog.hardware import GPU_CATALOG
    from hetpart.costmodel.compute import unit_compute_s

    gpu = GPU_CATALOG[gpu_name]
    out, graphs = [], {}
    for r in data["units"]:
        if r["unit"] == "embedding":
            continue  # a gather: no matrix work for the curve to price
        sim_prec = r["precision"]  # bf16, tf32 (fp32 tensors, TF32 products) or plain fp32
        key = (r["model"], r["seq_len"], sim_prec)
        if key not in graphs:
            graphs[key] = load_model(r["model"], seq_len=r["seq_len"], precision=sim_prec)
        g = graphs[key]
        f, b = unit_compute_s(g, gpu, 1, r["micro_batch"], sim_prec, "none", curve, kernels="torch")  # HF modules
        i = 1 if r["unit"].startswith("block") else g.num_units - 1
        out.append({"model": r["model"], "precision": r["precision"], "unit": r["unit"].split("_")[0],
                    "micro_batch": r["micro_batch"], "meas_fwd_ms": r["fwd_s"] * 1e3, "meas_bwd_ms": r["bwd_s"] * 1e3,
                    "fwd_ratio": float(f[i]) / r["fwd_s"], "bwd_ratio": float(b[i]) / r["bwd_s"]})
    return out


def assumed_band(path: str | None = None) -> dict:
    """:data:`hetpart.costmodel.provenance.ERROR_BANDS`' ``assumed`` band recomputed: the Ampere curve scaled to an H100 against the per-unit times measured on
    one (``experiments/data/h100_unit_profile.json``): ``{"mean_abs_pct", "signed_pct", "rows"}``, one row per
    unit and pass. (Set on 2026-11-24 at 80.9%, -88% to +599%; the host cost per operator measured since brought
    the small units in: 27.3%.)"""
    import json
    from pathlib import Path

    from hetpart.costmodel.efficiency import CURVES

    where = Path(path) if path else Path(__file__).resolve().parent / "data" / "h100_unit_profile.json"
    rows = compare(json.loads(where.read_text()), "H100-80GB", CURVES["ampere"])
    pct = [(r[k] - 1.0) * 100.0 for r in rows for k in ("fwd_ratio", "bwd_ratio")]
    return {"mean_abs_pct": round(sum(map(abs, pct)) / len(pct), 1),
            "signed_pct": [round(min(pct), 1), round(max(pct), 1)], "rows": len(pct)}


def _markdown(data: dict, rows: list[dict], gpu_name: str, path: str) -> str:
    meta = data["meta"]
    lines = [f"Measured on {meta['device']} ({meta['date']}, torch {meta['torch']}, CUDA {meta['cuda']}); "
             f"{meta['method']}; compared with the simulator's per-unit compute for `{gpu_name}` "
             f"(`python -m hetpart.experiments.bench_gpu_profile {path} --gpu {gpu_name}`). "
             f"Launch cost of one small kernel: {meta['launch_overhead_us_per_small_kernel']:.1f} us.", "",
             "Simulator / measured (fwd, bwd) per unit and micro-batch; below 1 the simulator is too fast:", "",
             "| model | precision | unit | mb 1 | mb 2 | mb 4 | mb 8 |", "|---|---|---|---|---|---|---|"]
    cells: dict[tuple, dict[int, str]] = {}
    for r in rows:
        cells.setdefault((r["model"], r["precision"], r["unit"]), {})[r["micro_batch"]] = \
            f"{r['fwd_ratio']:.2f} / {r['bwd_ratio']:.2f}"
    for (m, p, u), by_mb in cells.items():
        lines.append(f"| {m} | {p} | {u} | " + " | ".join(by_mb.get(b, "") for b in MICRO_BATCHES) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile", nargs="?", default="experiments/data/h100_unit_profile.json")
    ap.add_argument("--gpu", default="H100-80GB", help="catalog GPU whose simulator prices are compared")
    ap.add_argument("--measure", action="store_true", help="measure on this machine's GPU first")
    ap.add_argument("--out", default=None, help="with --measure: where to write the profile JSON")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args(argv)
    path = Path(args.out or args.profile)
    data = measure(path, args.device) if args.measure else json.loads(path.read_text())
    print(_markdown(data, compare(data, args.gpu), args.gpu, str(args.profile)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
