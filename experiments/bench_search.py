"""How long the search planner takes as clusters grow in GPUs and in device types.

Run: ``python -m hetpart.experiments.bench_search [--model llama2-13b] [--sizes 32,64,128,256,512]``.
Prints a markdown table (GPUs, types, seconds, tokens/s of search and uniform) for clusters
of 8-GPU nodes split evenly between two (A100-80GB, V100-32GB) or three (+ H100-80GB) types.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass

__all__ = ["SearchTiming", "synthetic_cluster", "time_search", "main"]

_TYPES = (
    {"gpu": "H100-80GB", "intra_node": "NVLink4", "nic": "IB-NDR", "nics_per_node": 8},
    {"gpu": "A100-80GB", "intra_node": "NVLink3", "nic": "IB-HDR", "nics_per_node": 4},
    {"gpu": "V100-32GB", "intra_node": "NVLink2", "nic": "IB-EDR", "nics_per_node": 2},
)


@dataclass(frozen=True)
class SearchTiming:
    """One measurement."""

    gpus: int
    types: int
    wall_s: float
    """Wall-clock seconds of ``plan(..., "search")`` (baselines included)."""
    tokens_per_s: float
    uniform_tokens_per_s: float


def synthetic_cluster(gpus: int, types: int):
    """``gpus`` GPUs in 8-GPU nodes, split as evenly as possible between the last ``types`` types
    of (H100, A100, V100)."""
    from hetpart.cluster import parse_cluster

    nodes = gpus // 8
    kinds = _TYPES[3 - types:]
    counts = [nodes // types + (1 if i < nodes % types else 0) for i in range(types)]
    groups = [dict(kind, count=c, gpus_per_node=8) for kind, c in zip(kinds, counts) if c]
    return parse_cluster({"name": f"bench-{gpus}x{types}", "nodes": groups})


def time_search(model_name: str, gpus: int, types: int, global_batch: int, seq_len: int) -> SearchTiming:
    """Plan once with ``search`` and once with ``uniform`` and report the search's wall time."""
    from hetpart import Workload, load_model
    from hetpart.policies.plan_search import plan_search
    from hetpart.workload import cluster_precision
    from hetpart.policies.plan_uniform import plan_uniform

    model = load_model(model_name, seq_len=seq_len)
    cluster = synthetic_cluster(gpus, types)
    workload = Workload(global_batch, seq_len, precision=cluster_precision(cluster))  # as `hetpart plan`
    start = time.perf_counter()
    best = plan_search(model, cluster, workload)
    wall = time.perf_counter() - start
    uniform = plan_uniform(model, cluster, workload)
    return SearchTiming(gpus, types, wall, best.tokens_per_s, uniform.tokens_per_s)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama2-13b")
    parser.add_argument("--sizes", default="32,64,128,256,512")
    parser.add_argument("--types", default="2,3")
    parser.add_argument("--global-batch", type=int, default=1024)
    parser.add_argument("--seq-len", type=int, default=2048)
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(f"model {args.model}, global batch {args.global_batch} x {args.seq_len} tokens")
    print("| GPUs | types | search wall s | search tokens/s | uniform tokens/s | speed-up |")
    print("|---:|---:|---:|---:|---:|---:|")
    for types in (int(t) for t in args.types.split(",")):
        for gpus in (int(n) for n in args.sizes.split(",")):
            t = time_search(args.model, gpus, types, args.global_batch, args.seq_len)
            print(f"| {t.gpus} | {t.types} | {t.wall_s:.1f} | {t.tokens_per_s:,.0f} | {t.uniform_tokens_per_s:,.0f} | "
                  f"{t.tokens_per_s / t.uniform_tokens_per_s:.2f} |", flush=True)


if __name__ == "__main__":
    main()
