"""Scaling study: planning time and plan quality of each planner as the cluster grows.

Clusters of 8-GPU nodes from 16 to 4,096 GPUs, split evenly between 1 to 4 device types (H100-80GB,
A100-80GB, V100-32GB, A10-24GB, each with its usual links), one model (llama2-13b by default) and a
global batch that grows with the cluster (``2 x GPUs`` sequences, at least 64), so that every GPU has
work at every size. Per point and planner: wall-clock planning time, predicted tokens/s, % of
HETHUB's upper bound and speed-up over ``uniform``.

Run: ``OMP_NUM_THREADS=1 python -m hetpart.experiments.scaling [--sizes 16,64,256,1024,4096]
[--types 1,2,3,4] [--planners uniform,proportional,search] [--out DIR] [--tracker tensorboard]``.
It prints a markdown table, draws ``scaling_plan_time.png`` and ``scaling_quality.png`` into
``--out`` and logs ``plan/<metric>/<planner>/<types>types`` with the GPU count as step.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

__all__ = ["ScalingPoint", "synthetic_cluster", "measure", "run_study", "markdown", "section", "main", "TYPES"]

TYPES = (
    {"gpu": "H100-80GB", "intra_node": "NVLink4", "nic": "IB-NDR", "nics_per_node": 8},
    {"gpu": "A100-80GB", "intra_node": "NVLink3", "nic": "IB-HDR", "nics_per_node": 4},
    {"gpu": "V100-32GB", "intra_node": "NVLink2", "nic": "IB-EDR", "nics_per_node": 2},
    {"gpu": "A10-24GB", "intra_node": "PCIe4", "nic": "Ethernet-100", "nics_per_node": 1},
)
"""Device types in the order they join: 1 type is H100 only, 4 types add A10 nodes."""


@dataclass(frozen=True)
class ScalingPoint:
    """One planner on one cluster size and type count."""

    planner: str
    gpus: int
    types: int
    global_batch: int
    plan_time_s: float
    """Wall-clock seconds of the planner (single thread)."""
    tokens_per_s: float
    """Predicted throughput of its plan; 0 when it found none."""
    upper_bound_tokens_per_s: float
    pct_upper_bound: float
    speedup_vs_uniform: float
    error: str = ""


def synthetic_cluster(gpus: int, types: int):
    """``gpus`` GPUs in 8-GPU nodes (smaller when ``gpus / types < 8``), split as evenly as possible between
    the first ``types`` of :data:`TYPES`."""
    from hetpart.cluster import parse_cluster

    per_node = 8
    while per_node > 1 and gpus // per_node < types:  # 16 GPUs of 3 or 4 types: 4-GPU nodes
        per_node //= 2
    nodes = max(gpus // per_node, types)
    counts = [nodes // types + (1 if i < nodes % types else 0) for i in range(types)]
    groups = [dict(kind, count=c, gpus_per_node=per_node) for kind, c in zip(TYPES[:types], counts) if c]
    return parse_cluster({"name": f"scaling-{gpus}x{types}", "nodes": groups})


def measure(model_name: str, gpus: int, types: int, planners: Sequence[str], seq_len: int = 2048) -> list[ScalingPoint]:
    """Every planner once on one cluster (the upper bound computed once, outside the timings)."""
    from hetpart import Workload, load_model
    from hetpart.workload import cluster_precision
    from hetpart.errors import HetpartError
    from hetpart.policies import plan, upper_bound

    model = load_model(model_name, seq_len=seq_len)
    cluster = synthetic_cluster(gpus, types)
    global_batch = max(64, 2 * gpus)
    workload = Workload(global_batch, seq_len, precision=cluster_precision(cluster))  # as `hetpart plan`
    try:
        bound = upper_bound(model, cluster, workload)["tokens_per_s"]
    except HetpartError:  # a type alone holds no plan for this batch: no bound to compare with
        bound = 0.0
    found: dict[str, tuple[float, float, str]] = {}
    for name in dict.fromkeys([*planners, "uniform"]):
        start = time.perf_counter()
        try:
            tps, error = plan(model, cluster, workload, name).prediction.tokens_per_s, ""
        except HetpartError as exc:
            tps, error = 0.0, " ".join(str(exc).split())[:200]
        found[name] = (time.perf_counter() - start, tps, error)
    base = found["uniform"][1]
    return [ScalingPoint(name, cluster.num_devices, types, global_batch, found[name][0], found[name][1], bound,
                         found[name][1] / bound * 100 if bound else 0.0,
                         found[name][1] / base if base else 0.0, found[name][2]) for name in planners]


def run_study(model_name: str, sizes: Sequence[int], types: Sequence[int], planners: Sequence[str],
              on_point: Callable[[ScalingPoint], None] | None = None, tracker=None,
              budget_s: float = 60.0, seq_len: int = 2048) -> list[ScalingPoint]:
    """Measure every (types, size) pair; log each point to ``tracker`` (``plan/...`` keys, step = GPUs).

    A planner that took more than ``budget_s`` on one size is not run on the larger sizes of the same
    type count (its points say so), which keeps the study to minutes on a shared 2-core machine.
    """
    points: list[ScalingPoint] = []
    for t in types:
        over: dict[str, ScalingPoint] = {}
        for n in sorted(sizes):
            active = [p for p in planners if p not in over]
            measured = measure(model_name, n, t, active, seq_len=seq_len) if active else []
            skipped = [ScalingPoint(name, measured[0].gpus if measured else n, t, max(64, 2 * n), 0.0, 0.0,
                                    0.0, 0.0, 0.0, f"skipped: took {over[name].plan_time_s:.0f} s at "
                                    f"{over[name].gpus} GPUs (budget {budget_s:.0f} s)") for name in over]
            for p in measured:
                if p.plan_time_s > budget_s:
                    over[p.planner] = p
            for p in measured + skipped:
                points.append(p)
                if tracker is not None and p.tokens_per_s:
                    tracker.log({f"plan/{m}/{p.planner}/{t}types": getattr(p, m)
                                 for m in ("plan_time_s", "tokens_per_s", "pct_upper_bound", "speedup_vs_uniform")},
                                step=p.gpus)
                if on_point is not None:
                    on_point(p)
    return points


def markdown(points: Sequence[ScalingPoint], planners: Sequence[str]) -> str:
    """One line per cluster: per planner the planning time and % of the upper bound."""
    head = "| GPUs | types | global batch | " + " | ".join(
        f"{p} s | {p} % UB" for p in planners) + " | search x uniform |"
    lines = [head, "|" + "---:|" * (3 + 2 * len(planners) + 1)]
    keys = list(dict.fromkeys((p.gpus, p.types, p.global_batch) for p in points))
    for gpus, types, gb in sorted(keys, key=lambda k: (k[1], k[0])):
        row = {p.planner: p for p in points if (p.gpus, p.types) == (gpus, types)}
        cells = []
        for name in planners:
            p = row.get(name)
            if p is None or p.error.startswith("skipped"):
                cells += ["skipped", ""]
            elif not p.tokens_per_s:
                cells += [f"{p.plan_time_s:.2f}", "no plan"]
            else:
                cells += [f"{p.plan_time_s:.2f}", f"{p.pct_upper_bound:.1f}" if p.upper_bound_tokens_per_s else "no bound"]
        speed = f"{row['search'].speedup_vs_uniform:.2f}" if "search" in row and row["search"].tokens_per_s else ""
        lines.append(f"| {gpus} | {types} | {gb} | " + " | ".join(cells) + f" | {speed} |")
    return "\n".join(lines)


def write_plots(points: Sequence[ScalingPoint], out: Path) -> list[Path]:
    from hetpart import plotting

    rows = [asdict(p) for p in points if p.tokens_per_s]
    time_fig = plotting.scaling_figure(rows, "plan_time_s", "planning time (s), one thread",
                                       title="planning time as the cluster grows")
    quality = plotting.scaling_figure(rows, "pct_upper_bound", "% of HETHUB's upper bound", log_y=False,
                                      title="plan quality as the cluster grows")
    return [plotting.save_png(time_fig, out / "scaling_plan_time.png"),
            plotting.save_png(quality, out / "scaling_quality.png")]


def section(model_name: str = "llama2-13b", sizes: Sequence[int] = (16, 64, 256, 1024, 4096),
            types: Sequence[int] = (1, 2, 3, 4), planners: Sequence[str] = ("uniform", "proportional", "policy", "search"),
            runs_dir: str | Path = "runs", budget_s: float = 60.0):
    """Run the study and return docs/BENCHMARKS.md's scaling block (plots to docs/benchmarks/)."""
    from hetpart.experiments.bench import DOC_IMAGES
    from hetpart.experiments.benchdoc import Section, load, machine
    from hetpart.experiments.tracking import make_tracker

    where = machine()
    config = {"model": model_name, "sizes": list(sizes), "types": list(types), "planners": list(planners)}
    with make_tracker("tensorboard", "plan/scaling", seed=0, config=config, root=runs_dir) as run:
        points = run_study(model_name, sizes, types, planners, tracker=run, budget_s=budget_s,
                           on_point=lambda p: print(f"scaling: {p.gpus} GPUs, {p.types} types, {p.planner}: "
                                                    f"{p.plan_time_s:.2f} s {p.error[:60]}", flush=True))
    DOC_IMAGES.mkdir(parents=True, exist_ok=True)
    write_plots(points, DOC_IMAGES)
    body = (f"{model_name}, seq 2048, global batch 2 x GPUs (at least 64); clusters of 8-GPU nodes split evenly "
            f"between the first 1-4 of H100-80GB, A100-80GB, V100-32GB, A10-24GB (4-GPU nodes for 16 GPUs of 3-4 "
            f"types; \"no bound\" where a type alone has no plan for the batch). Per planner: wall-clock planning time of one thread (s) and the plan's % of HETHUB's upper "
            f"bound (computed once per cluster, outside the timings). A planner that took over {budget_s:.0f} s is "
            f"not rerun on larger clusters of the same type count (\"skipped\"). Tracked as `runs/{run.name}` "
            f"(`plan/...` scalars, GPUs as the step).\n\n" + markdown(points, planners) + "\n\n"
            + _facts(points, planners) + "\n\n![planning time](benchmarks/scaling_plan_time.png)\n"
            "![plan quality](benchmarks/scaling_quality.png)\n")
    command = (f"OMP_NUM_THREADS=1 python -m hetpart.experiments.scaling --model {model_name} "
               f"--sizes {','.join(map(str, sizes))} --types {','.join(map(str, types))} --budget-s {budget_s:g}")
    return Section("scaling", "Planners: scaling study (16 to 4,096 GPUs, 1 to 4 device types)", body, command,
                   where, load_after=load(), level=3)


def _facts(points: Sequence[ScalingPoint], planners: Sequence[str]) -> str:
    out = []
    for name in planners:
        mine = [p for p in points if p.planner == name and p.tokens_per_s]
        if not mine:
            continue
        slow = max(mine, key=lambda p: p.plan_time_s)
        bounded = [p for p in mine if p.upper_bound_tokens_per_s] or mine
        low = min(bounded, key=lambda p: p.pct_upper_bound)
        out.append(f"- `{name}`: slowest {slow.plan_time_s:.1f} s ({slow.gpus} GPUs, {_types(slow.types)}); "
                   f"quality {low.pct_upper_bound:.1f}-{max(p.pct_upper_bound for p in bounded):.1f}% of the upper "
                   f"bound (lowest at {low.gpus} GPUs, {_types(low.types)}); no plan on "
                   f"{sum(1 for p in points if p.planner == name and not p.tokens_per_s and not p.error.startswith('skipped'))}"
                   f" of {sum(1 for p in points if p.planner == name)} clusters; skipped (over the time budget at a "
                   f"smaller size) on {sum(1 for p in points if p.planner == name and p.error.startswith('skipped'))}.")
    return "\n".join(out)


def _types(n: int) -> str:
    return f"{n} type{'s' if n > 1 else ''}"


def main(argv: list[str] | None = None) -> list[ScalingPoint]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama2-13b")
    parser.add_argument("--sizes", default="16,64,256,1024,4096")
    parser.add_argument("--types", default="1,2,3,4")
    parser.add_argument("--planners", default="uniform,proportional,policy,search")
    parser.add_argument("--out", default="out/scaling")
    parser.add_argument("--tracker", default="tensorboard")
    parser.add_argument("--runs-dir", default="runs")
    parser.add_argument("--budget-s", type=float, default=60.0)
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from hetpart.experiments.tracking import make_tracker

    planners = [p for p in args.planners.split(",") if p]
    sizes = [int(s) for s in args.sizes.split(",")]
    types = [int(t) for t in args.types.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with make_tracker(args.tracker, "plan/scaling", seed=0, config=vars(args), root=args.runs_dir) as run:
        points = run_study(args.model, sizes, types, planners, tracker=run, budget_s=args.budget_s,
                           on_point=lambda p: print(f"{p.gpus} GPUs x{p.types} {p.planner}: {p.plan_time_s:.2f} s, "
                                                    f"{p.pct_upper_bound:.1f}% UB", flush=True))
    print(markdown(points, planners))
    write_plots(points, out)
    return points


if __name__ == "__main__":
    main()
