"""The policy planner against exact search: quality on public and held-out scenarios, time at scale.

    OMP_NUM_THREADS=1 .venv/bin/python -m hetpart.experiments.bench_policy --out runs/bench-policy
    OMP_NUM_THREADS=1 .venv/bin/python -m hetpart.experiments.bench_policy --suite '' --held-out 4 --held-out-seed 11
    OMP_NUM_THREADS=1 .venv/bin/python -m hetpart.experiments.bench_policy --scale CLUSTER.yaml ... [--scale-search]

* **public**: every entry of ``shared/scenarios/suite.yaml`` (given with ``--suite``; several suites
  joined with commas);
* **held out** (never in training, :data:`hetpart.envs.scenarios.HELD_OUT`): held-out catalog models
  (llama2-7b, llama3-8b, llama2-13b, gpt3-13b) on random clusters; models on 4-type clusters; models
  on 160 to 512 GPUs; drawn with a fixed seed;
* **scale**: planning time of policy and search against cluster size (up to 1,024 GPUs with an
  80-layer model, and 4,096 GPUs of 4 types).

Each scenario reports search's tokens/s and, as ratios of it, the policy's greedy decode alone, the
best of K sampled decodes, and that after refinement, plus proportional. Writes ``results.csv`` and
``policy_scaling.png`` under ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import math
import time
from pathlib import Path

__all__ = ["held_out_scenarios", "compare", "scale_times", "main", "BENCH_HELD_OUT_MODELS"]

BENCH_HELD_OUT_MODELS = ("llama2-7b", "llama3-8b", "llama2-13b", "gpt3-13b")
"""The held-out catalog models the benchmark plans (of :func:`hetpart.envs.scenarios.held_out_models`)."""


def held_out_scenarios(seed: int = 7, per_kind: int = 3):
    """``(name, model, cluster, workload)`` of the held-out kinds, drawn reproducibly."""
    import numpy as np

    from hetpart.envs.scenarios import ScenarioDistribution, sample_scenario
    from hetpart.policies.structure import Scenario

    held_models = BENCH_HELD_OUT_MODELS
    kinds = {
        "held-out-models": ScenarioDistribution(catalog_models=held_models, catalog_share=1.0, max_devices=128),
        "four-types": ScenarioDistribution(min_types=4, max_types=4, min_devices=32, max_devices=128),
        "160-512-gpus": ScenarioDistribution(catalog_models=held_models, min_devices=160, max_devices=512),
    }
    rng = np.random.default_rng(seed)
    out = []
    for kind, dist in kinds.items():
        found = 0
        while found < per_kind:
            model, cluster, workload = sample_scenario(rng, dist)
            if cluster.num_devices < dist.min_devices or not Scenario(model, cluster, workload).feasible:
                continue
            found += 1
            out.append((f"{kind}-{found}:{model.name}@{cluster.num_devices}", model, cluster, workload))
    return out


def compare(name: str, model, cluster, workload, samples: int = 16) -> dict:
    """Search, proportional and the policy (greedy, best of K, refined) on one scenario."""
    from hetpart.policies import plan
    from hetpart.policies.policy_planner import decode

    row = {"scenario": name, "devices": cluster.num_devices, "units": model.num_units}
    start = time.perf_counter()
    found = decode(model, cluster, workload, samples=samples)
    row["policy_s"] = time.perf_counter() - start
    start = time.perf_counter()
    search = plan(model, cluster, workload, "search")
    row["search_s"] = time.perf_counter() - start
    row["search_tokens_per_s"] = search.prediction.tokens_per_s
    proportional = plan(model, cluster, workload, "proportional")
    for key, value in (("greedy", found.greedy), ("sampled", found.sampled), ("refined", found.refined)):
        row[f"{key}_ratio"] = value.tokens_per_s / row["search_tokens_per_s"] if value else 0.0
    row["proportional_ratio"] = proportional.prediction.tokens_per_s / row["search_tokens_per_s"]
    row["structures"] = found.structures
    return row


def _suite(path: str):
    from hetpart import load_cluster, load_model
    from hetpart.experiments.suite import load_suite
    from hetpart.workload import Workload, cluster_precision

    for e in load_suite(Path(path)):
        cluster = load_cluster(e.cluster)  # trained in what `hetpart plan` picks there (fp16 beside V100, T4)
        yield (e.name, load_model(e.model, seq_len=e.seq_len), cluster,
               Workload(e.global_batch, e.seq_len, precision=cluster_precision(cluster)))


def _geo(values) -> float:
    values = [v for v in values if v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def scale_times(clusters: list[str], model_name: str = "llama2-70b", global_batch: int = 1024, seq_len: int = 4096,
                repeats: int = 3, search: bool = False) -> list[dict]:
    """``plan(..., "policy")``'s ``wall_time_s`` (the network loaded first, as ``hetpart plan`` does) on
    each cluster, the median of ``repeats``, with its tokens/s; ``search`` adds search's time and ratio."""
    import statistics

    from hetpart import load_cluster, load_model
    from hetpart.policies import plan
    from hetpart.policies.policy_planner import POLICY
    from hetpart.workload import Workload, cluster_precision

    POLICY.prepare()
    model = load_model(model_name, seq_len=seq_len)
    rows = []
    for path in clusters:
        cluster = load_cluster(path)
        workload = Workload(global_batch, seq_len, precision=cluster_precision(cluster))
        runs = [plan(model, cluster, workload, "policy") for _ in range(repeats)]
        row = {"cluster": Path(path).stem, "devices": cluster.num_devices, "model": model_name,
               "policy_s": statistics.median(r.wall_time_s for r in runs),
               "policy_tokens_per_s": runs[0].prediction.tokens_per_s}
        if search:
            found = plan(model, cluster, workload, "search")
            row |= {"search_s": found.wall_time_s,
                    "policy_over_search": row["policy_tokens_per_s"] / found.prediction.tokens_per_s}
        rows.append(row)
        print(row, flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="../shared/scenarios/suite.yaml")
    ap.add_argument("--out", default="runs/bench-policy")
    ap.add_argument("--held-out", type=int, default=3, help="scenarios per held-out kind (0: none)")
    ap.add_argument("--held-out-seed", type=int, default=7, help="seed of the held-out draw")
    ap.add_argument("--scale", nargs="*", default=None, metavar="CLUSTER",
                    help="only time the policy on these clusters (llama2-70b, batch 1024 x 4096)")
    ap.add_argument("--scale-search", action="store_true", help="with --scale: search's time and ratio beside")
    args = ap.parse_args(argv)
    if args.scale is not None:
        scale_times(args.scale, search=args.scale_search)
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    groups = [("public", [s for path in args.suite.split(",") if path for s in _suite(path)])]
    if args.held_out:
        groups.append(("held-out", held_out_scenarios(seed=args.held_out_seed, per_kind=args.held_out)))
    for group, scenarios in groups:
        for name, model, cluster, workload in scenarios:
            row = compare(name, model, cluster, workload) | {"group": group}
            rows.append(row)
            print(f"{group:8s} {name:45s} greedy {row['greedy_ratio']:.3f} best-of-K {row['sampled_ratio']:.3f} "
                  f"refined {row['refined_ratio']:.3f} proportional {row['proportional_ratio']:.3f} "
                  f"policy {row['policy_s']:.2f} s search {row['search_s']:.2f} s", flush=True)
        sel = [r for r in rows if r["group"] == group]
        if sel:
            print(f"{group}: geo-mean greedy {_geo(r['greedy_ratio'] for r in sel):.3f}, best-of-K "
                  f"{_geo(r['sampled_ratio'] for r in sel):.3f}, refined {_geo(r['refined_ratio'] for r in sel):.3f}"
                  f" (min {min(r['refined_ratio'] for r in sel):.3f})", flush=True)
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
