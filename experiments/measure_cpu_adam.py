"""How fast a CPU runs the Adam step of an offloaded optimizer, against its memory bandwidth (issue 10).

An offloaded optimizer (ZeRO-Offload, FSDP2's ``CPUOffloadPolicy``) runs Adam on the host. The step is
element-wise over four fp32 arrays per parameter (gradient, weight and two moments read; weight and moments
written back: 28 bytes, :data:`hetpart.costmodel.memory.OPTIMIZER_STEP_BYTES`), so on many cores it is bound
by memory bandwidth. This script measures, on the machine at hand, with every core:

* a STREAM triad (``a[i] = b[i] + s c[i]`` over float arrays far larger than the caches, C with OpenMP,
  compiled here with ``gcc -O3 -march=native -fopenmp``; torch's ``add`` where there is no C compiler),
  counted as STREAM counts it: 12 bytes per element (its stores also read each line first, so the memory
  really moves 16);
* ``torch.optim.Adam`` steps (``fused`` and ``foreach``) over as many parameters;

and reports the fused step's 28 bytes per parameter over its time as a multiple of the triad's reported
bandwidth, the evidence behind :data:`hetpart.costmodel.offload.CPU_ADAM_BANDWIDTH_FRACTION` (which turns a
node's published STREAM triad, the cluster file's ``host_memory_gbyte_s``, into its CPU step). Best (triad, as STREAM reports)
and median (Adam) of ``--repeats`` after one warm-up. Writes ``experiments/data/cpu_adam.json`` with
``--write``.

    python -m hetpart.experiments.measure_cpu_adam --write
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

DATA = Path(__file__).resolve().parent / "data" / "cpu_adam.json"
STEP_BYTES = 28


def _median_s(fn, repeats: int) -> tuple[float, float, float]:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), min(times), max(times)


_TRIAD_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <omp.h>
int main(int argc, char **argv) {
  long n = atol(argv[1]); int reps = atoi(argv[2]);
  float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float)), *c = malloc(n * sizeof(float));
  #pragma omp parallel for
  for (long i = 0; i < n; i++) { a[i] = 0; b[i] = 1; c[i] = 2; }
  double best = 1e30;
  for (int r = 0; r <= reps; r++) {
    double t = omp_get_wtime();
    #pragma omp parallel for
    for (long i = 0; i < n; i++) a[i] = b[i] + 3.0f * c[i];
    t = omp_get_wtime() - t;
    if (r && t < best) best = t;
  }
  printf("%.9f %d %f\n", best, omp_get_max_threads(), a[n / 2]);
  return 0;
}
"""


def triad_gbyte_s(n: int, repeats: int) -> dict:
    """A STREAM triad over ``n`` floats per array: compiled C with OpenMP on every core where ``gcc`` is at
    hand, else torch's ``add`` (which reaches less)."""
    import shutil
    import subprocess
    import tempfile

    gcc = shutil.which("gcc")
    if gcc is not None:
        with tempfile.TemporaryDirectory() as tmp:
            src, exe = Path(tmp, "triad.c"), Path(tmp, "triad")
            src.write_text(_TRIAD_C)
            subprocess.run([gcc, "-O3", "-march=native", "-fopenmp", str(src), "-o", str(exe)], check=True)
            out = subprocess.run([str(exe), str(n), str(repeats)], check=True, capture_output=True, text=True,
                                 env=dict(os.environ, OMP_NUM_THREADS=str(os.cpu_count() or 1)))
            best, threads, _ = out.stdout.split()
        return {"kernel": "C, gcc -O3 -march=native -fopenmp", "threads": int(threads), "elements": n,
                "best_s": float(best), "gbyte_s": 12 * n / float(best) / 1e9}
    b, c = torch.rand(n), torch.rand(n)
    a = torch.empty(n)
    med, lo, hi = _median_s(lambda: torch.add(b, c, alpha=3.0, out=a), repeats)
    return {"kernel": "torch.add", "threads": torch.get_num_threads(), "elements": n, "best_s": lo,
            "gbyte_s": 12 * n / lo / 1e9}


def adam_step(n: int, repeats: int, impl: str) -> dict:
    # a few large tensors, as an offloaded optimizer holds its flat shards
    sizes = [n // 4] * 4
    params = [torch.nn.Parameter(torch.rand(s)) for s in sizes]
    for p in params:
        p.grad = torch.rand_like(p)
    opt = torch.optim.Adam(params, lr=1e-4, **({"foreach": True} if impl == "foreach" else {"fused": True}))
    med, lo, hi = _median_s(opt.step, repeats)
    return {"impl": impl, "params": sum(sizes), "median_s": med, "min_s": lo, "max_s": hi,
            "params_per_s": sum(sizes) / med, "effective_gbyte_s": STEP_BYTES * sum(sizes) / med / 1e9}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=int, default=256_000_000,
                    help="parameters per Adam step and floats per triad array (default 256M: 4 GB of Adam states)")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--write", action="store_true", help=f"write {DATA.relative_to(DATA.parents[2])}")
    args = ap.parse_args(argv)
    torch.set_num_threads(os.cpu_count() or 1)  # a node's CPU step runs on its cores, bound by memory
    threads = torch.get_num_threads()
    triad = triad_gbyte_s(args.params, args.repeats)
    steps = [adam_step(args.params, args.repeats, impl) for impl in ("foreach", "fused")]
    best = max(steps, key=lambda s: s["effective_gbyte_s"])
    out = {
        "what": "Adam step on the CPU against a triad's memory bandwidth (experiments/measure_cpu_adam.py)",
        "machine": {"processor": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                    "torch_threads": threads, "torch": torch.__version__,
                    "load_average": os.getloadavg()},
        "triad": triad,
        "adam": steps,
        "best": best["impl"],
        "bandwidth_fraction": best["effective_gbyte_s"] / triad["gbyte_s"],
        "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    print(json.dumps(out, indent=2))
    if args.write:
        DATA.write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":  # pragma: no cover
    main()
