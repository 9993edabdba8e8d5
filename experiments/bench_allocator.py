"""What PyTorch's caching allocator reserves beyond the tensors a training step holds (issue 10's fit margin).

``costmodel.memory.FRAGMENTATION_FRACTION`` (5%, ASSUMED) is the share of a device's memory the usable capacity
gives up to the caching allocator. Nothing measured sets it. Llama 3 405B's published layout fits or does not
fit by less than that margin (docs/BENCHMARKS.md, "Memory model"). This benchmark measures the margin on a GPU,
for the allocation pattern that matters there: a pipeline stage that holds the activations of ``k``
micro-batches (every forward before any backward, the pattern of an interleaved stage with m = pp), then runs
their backwards and an Adam step. It uses the runtime's own units (Hugging Face GPT-2 and Llama blocks at a
reduced width), several steps, and the peak after the first.

Per case it records ``torch.cuda.max_memory_allocated`` (what tensors held at the peak) and
``torch.cuda.max_memory_reserved`` (what the allocator had taken from the driver), over the steps after
warm-up. Each allocator setting runs in its own process, because ``PYTORCH_CUDA_ALLOC_CONF`` is read when CUDA
starts: the default, and ``expandable_segments:True``.

    python -m hetpart.experiments.bench_allocator --measure --out allocator.json   # CUDA; a few minutes
    python -m hetpart.experiments.bench_allocator --worker --cpu --quick            # the loop on CPU (no stats)

No GPU here: the rows come from a lent GPU session (``experiments/device/gpu_memory_recompute.sh``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["CASES", "QUICK_CASES", "ALLOC_CONFS", "run_case", "worker", "measure", "summarize", "main"]

CASES = [
    # model, width, sequence, micro-batch, micro-batches in flight, recompute, precision (sequence <= 512: the
    # runtime's shrunken models keep 512 positions)
    ("gpt2-small", 1024, 512, 2, 16, "none", "bf16"),
    ("gpt2-small", 1024, 512, 4, 8, "none", "bf16"),
    ("gpt2-small", 1024, 512, 2, 16, "selective", "bf16"),
    ("gpt2-small", 1024, 512, 8, 8, "full", "bf16"),
    ("llama2-7b", 1024, 512, 4, 16, "none", "bf16"),
    ("llama2-7b", 1024, 512, 4, 16, "full", "bf16"),
    ("llama2-7b", 2048, 512, 2, 8, "none", "bf16"),
]
"""Cases measured with ``--measure``: stage-like chains of 8 blocks (the runtime's modules at ``width``)."""
QUICK_CASES = [("gpt2-small", 64, 32, 1, 3, "none", "fp32"), ("llama2-7b", 64, 32, 2, 2, "full", "fp32")]
"""Tiny cases: the code path on CPU (tests) or a quick GPU check."""
ALLOC_CONFS = ("", "expandable_segments:True")
"""``PYTORCH_CUDA_ALLOC_CONF`` values compared (``""``: the default allocator)."""
BLOCKS = 8
STEPS = 4


def run_case(case: tuple, device: str = "cuda", steps: int = STEPS, blocks: int = BLOCKS) -> dict:
    """One case: ``blocks`` runtime blocks of ``model`` at ``width``; per step, ``k`` forwards whose outputs
    stay alive, then their backwards (last first) and an Adam step; peaks over the steps after the first."""
    import torch

    from hetpart.runtime.models import build_units, runnable_spec

    model, width, seq, mb, k, recompute, precision = case
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[precision]
    spec = runnable_spec(model, scale=width)
    units = build_units(spec, list(range(1, 1 + blocks)), device=device, dtype=dtype)
    for u in units:
        u.set_recompute(recompute)
    params = [p for u in units for p in u.parameters()]
    opt = torch.optim.Adam(params, lr=1e-4)
    cuda = device.startswith("cuda")
    gen = torch.Generator(device="cpu").manual_seed(0)
    peaks = []
    t0 = time.perf_counter()
    for _step in range(steps):
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        held = []
        for _ in range(k):
            x = torch.randn(mb, seq, width, generator=gen).to(device=device, dtype=dtype).requires_grad_(True)
            h = x
            for u in units:
                h = u(h)
                h = h[0] if isinstance(h, tuple) else h
            held.append(h)
        for h in reversed(held):
            h.float().square().mean().backward()
        held.clear()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
            peaks.append((int(torch.cuda.max_memory_allocated()), int(torch.cuda.max_memory_reserved())))
    after = peaks[1:] or peaks
    allocated = max((a for a, _ in after), default=None)
    reserved = max((r for _, r in after), default=None)
    return {"model": model, "width": width, "seq": seq, "micro_batch": mb, "in_flight": k, "recompute": recompute,
            "precision": precision, "blocks": blocks, "steps": steps, "seconds": time.perf_counter() - t0,
            "params": sum(p.numel() for p in params), "peak_allocated_bytes": allocated, "peak_reserved_bytes": reserved,
            "reserved_over_allocated": (reserved / allocated) if allocated else None}


def worker(cases, device: str) -> list[dict]:
    """Every case in this process (one allocator setting), rows tagged with the setting."""
    import torch

    rows = []
    for case in cases:
        row = run_case(case, device)
        row["alloc_conf"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
        row["device_name"] = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
        rows.append(row)
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return rows


def measure(quick: bool = False, timeout_s: float = 600.0) -> dict:
    """Every allocator setting of :data:`ALLOC_CONFS` in its own process; the rows and a summary."""
    rows, errors = [], []
    for conf in ALLOC_CONFS:
        env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=conf)
        cmd = [sys.executable, "-m", "hetpart.experiments.bench_allocator", "--worker"] + (["--quick"] if quick else [])
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
        if proc.returncode != 0:
            errors.append({"alloc_conf": conf, "rc": proc.returncode, "stderr": proc.stderr[-2000:]})
            continue
        rows += json.loads(proc.stdout.strip().splitlines()[-1])
    import torch

    return {"meta": {"torch": torch.__version__, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                     "method": __doc__.split("\n\n")[1].replace("\n", " ")},
            "rows": rows, "errors": errors, "summary": summarize(rows)}


def summarize(rows: list[dict]) -> dict:
    """Per allocator setting: the largest and the median reserved / allocated - 1 (the fragmentation share)."""
    out = {}
    for conf in sorted({r["alloc_conf"] for r in rows}):
        fr = sorted(r["reserved_over_allocated"] - 1.0 for r in rows
                    if r["alloc_conf"] == conf and r["reserved_over_allocated"] is not None)
        if fr:
            out[conf or "default"] = {"cases": len(fr), "median": fr[len(fr) // 2], "max": fr[-1], "min": fr[0]}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measure", action="store_true", help="run every allocator setting (CUDA) and write --out")
    ap.add_argument("--worker", action="store_true", help="run the cases in this process; print the rows as JSON")
    ap.add_argument("--cpu", action="store_true", help="--worker on the CPU (the loop only: no allocator statistics)")
    ap.add_argument("--quick", action="store_true", help="the tiny cases only")
    ap.add_argument("--out", type=Path, default=Path("allocator.json"))
    args = ap.parse_args(argv)
    cases = QUICK_CASES if args.quick else CASES
    if args.worker:
        import torch

        if not args.cpu and not torch.cuda.is_available():
            print("bench_allocator: no CUDA device; --cpu runs the loop without allocator statistics", file=sys.stderr)
            return 2
        print(json.dumps(worker(cases, "cpu" if args.cpu else "cuda")))
        return 0
    if args.measure:
        import torch

        if not torch.cuda.is_available():
            print("bench_allocator: --measure needs a CUDA device (the caching allocator is CUDA's)", file=sys.stderr)
            return 2
        data = measure(args.quick)
        args.out.write_text(json.dumps(data, indent=1) + "\n")
        for conf, s in data["summary"].items():
            print(f"{conf}: reserved / allocated - 1 over {s['cases']} cases: median {s['median']:.3f}, "
                  f"range {s['min']:.3f}-{s['max']:.3f}")
        for e in data["errors"]:
            print(f"allocator setting {e['alloc_conf']!r} failed (rc {e['rc']}): {e['stderr'][-300:]}")
        print(f"wrote {args.out}")
        return 0 if data["rows"] else 1
    ap.error("give --measure or --worker")
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
