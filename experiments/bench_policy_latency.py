"""How long the ``policy`` planner takes, and what it finds, on generated heterogeneous clusters.

    OMP_NUM_THREADS=1 .venv/bin/python -m hetpart.experiments.bench_policy_latency --out runs/latency.json
    OMP_NUM_THREADS=1 .venv/bin/python -m hetpart.experiments.bench_policy_latency --compare runs/before.json

A fixed, seeded set of :data:`COUNT` scenarios (:func:`scenarios`): 1 to 4 catalog GPU types in node
groups of 1 to 8 GPUs (8 to ~300 GPUs), each group with its intra-node link and NIC, sometimes two zones
joined by a slow link, sometimes throttled (``slow:``) devices, and a catalog model with a batch and
sequence length (never the public scenarios' files: those are checked by ``shared/acceptance``). The
first entry is the fuzzing probe's case (6 RTX 3090 + 120 Ascend 910B, gpt3-6.7b). Each scenario is planned
``--repeats`` times in this process as ``hetpart plan --planner policy`` plans it
(:func:`hetpart.policies.plan`, the network loaded once beforehand); the report gives each scenario's
fastest ``wall_time_s``, its fewest CPU seconds (this process and the planner's forked children: steadier
than wall time on a shared machine) and its predicted tokens/s, then the median, p90 and max over
scenarios. ``--compare`` adds each scenario's wall time, CPU time and throughput change against a saved
``--out`` file, and names the scenarios more than 0.5% slower in throughput.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
from pathlib import Path

__all__ = ["COUNT", "scenarios", "measure", "main"]

COUNT = 20
"""Scenarios in the generated set."""

SEED = 20261130
"""The generator's seed (the set is the same on every machine)."""

# (gpu, intra-node link choices, NIC choices, GPUs per node choices)
_KINDS = (
    ("H100-80GB", ("NVLink4",), ("IB-NDR", "RoCE-400"), (8,)),
    ("H200-141GB", ("NVLink4",), ("IB-NDR",), (8,)),
    ("A100-80GB", ("NVLink3",), ("IB-HDR", "RoCE-200"), (4, 8)),
    ("A100-40GB", ("NVLink3", "PCIe4"), ("IB-HDR", "Ethernet-100"), (4, 8)),
    ("V100-32GB", ("NVLink2",), ("IB-EDR", "Ethernet-25"), (4, 8)),
    ("V100-16GB", ("NVLink2", "PCIe3"), ("Ethernet-25", "Ethernet-10"), (4, 8)),
    ("T4-16GB", ("PCIe3",), ("Ethernet-25", "Ethernet-10"), (2, 4)),
    ("A10-24GB", ("PCIe4",), ("Ethernet-25", "Ethernet-100"), (2, 4)),
    ("L4-24GB", ("PCIe4",), ("Ethernet-100", "Ethernet-25"), (4, 8)),
    ("RTX3090-24GB", ("PCIe4",), ("Ethernet-25", "Ethernet-10"), (2, 4)),
    ("RTX4090-24GB", ("PCIe4",), ("Ethernet-25", "Ethernet-100"), (2, 4, 8)),
    ("A6000-48GB", ("PCIe4",), ("Ethernet-100", "Ethernet-25"), (4, 8)),
    ("MI250X-GCD-64GB", ("xGMI",), ("RoCE-200",), (8,)),
    ("MI300X-192GB", ("xGMI",), ("RoCE-400",), (8,)),
    ("Ascend910B-64GB", ("HCCS",), ("RoCE-200", "RoCE-100"), (8,)),
)

_MODELS = (  # (model, batch choices, seq_len choices)
    ("gpt2-medium", (64, 128), (1024,)),
    ("gpt2-xl", (128, 256), (1024,)),
    ("gpt3-1.3b", (128, 256), (2048,)),
    ("gpt3-2.7b", (128, 256), (1024, 2048)),
    ("gpt3-6.7b", (256, 512), (512, 2048)),
    ("llama2-7b", (128, 256, 512), (2048, 4096)),
    ("llama3-8b", (256, 512), (2048,)),
    ("gpt3-13b", (256, 512), (2048,)),
    ("llama2-13b", (256, 512), (2048, 4096)),
    ("opt-350m", (64, 128), (2048,)),
    ("bert-large", (256,), (512,)),
)

_PROBE = ({"name": "probe-3090-ascend", "nodes": [
    {"count": 3, "gpus_per_node": 2, "gpu": "RTX3090-24GB", "intra_node": "PCIe4", "nic": "Ethernet-25"},
    {"count": 15, "gpus_per_node": 8, "gpu": "Ascend910B-64GB", "intra_node": "HCCS", "nic": "RoCE-200"}]},
    "gpt3-6.7b", 256, 512)


def _draw(rng, index: int) -> tuple[dict, str, int, int]:
    """One scenario: a cluster dict, a catalog model, a global batch and a sequence length."""
    types = int(rng.choice([1, 2, 2, 2, 3, 3, 4]))
    kinds = [_KINDS[i] for i in rng.choice(len(_KINDS), size=types, replace=False)]
    budget = int(rng.choice([16, 32, 64, 128, 192, 300]))
    zoned = types > 1 and rng.random() < 0.25
    groups = []
    for g, (gpu, intras, nics, shapes) in enumerate(kinds):
        per = int(rng.choice(shapes))
        count = max(1, int(budget / types / per * rng.uniform(0.5, 1.5)))
        group = {"count": count, "gpus_per_node": per, "gpu": gpu, "intra_node": str(rng.choice(intras)),
                 "nic": str(rng.choice(nics))}
        if per >= 8 and rng.random() < 0.5:
            group["nics_per_node"] = int(rng.choice([2, 4, 8]))
        if zoned:
            group["zone"] = "east" if g % 2 == 0 else "west"
        groups.append(group)
    cluster: dict = {"name": f"gen-{index:02d}", "nodes": groups}
    if zoned:
        cluster["links"] = [{"zones": ["east", "west"], "bandwidth_gbit_s": float(rng.choice([10, 25, 100])),
                             "latency_us": float(rng.choice([500, 2000]))}]
    if rng.random() < 0.25:
        g = int(rng.integers(len(groups)))
        node = int(rng.integers(groups[g]["count"]))
        cluster["slow"] = {f"{g}/{node}/0": round(float(rng.uniform(0.3, 0.8)), 2)}
    name, batches, seqs = _MODELS[int(rng.integers(len(_MODELS)))]
    return cluster, name, int(rng.choice(batches)), int(rng.choice(seqs))


def scenarios(count: int = COUNT, seed: int = SEED) -> list[tuple[str, object, object, object]]:
    """``(name, model, cluster, workload)`` of the generated set: the probe's case, then seeded draws whose
    model states fit in the cluster's memory and whose search space has a structure that fits (the
    workload as ``hetpart plan`` makes it: the cluster's precision, everything else default)."""
    import numpy as np

    from hetpart import Workload, load_model
    from hetpart.cluster import parse_cluster
    from hetpart.policies.structure import Scenario
    from hetpart.workload import cluster_precision

    rng = np.random.default_rng(seed)
    out = []
    drawn = [_PROBE]
    while len(out) < count:
        spec, name, batch, seq = drawn.pop() if drawn else _draw(rng, len(out))
        cluster = parse_cluster(spec, source=f"generated:{spec['name']}")
        if not 8 <= cluster.num_devices <= 320:
            continue
        model = load_model(name, seq_len=seq)
        workload = Workload(batch, seq, precision=cluster_precision(cluster))
        if not Scenario(model, cluster, workload).feasible:
            continue
        types = "+".join(f"{sum(1 for d in cluster.devices if d.gpu.name == t)}x{t}" for t in cluster.gpu_types)
        label = f"{len(out):02d} {name} b{batch} s{seq} {types}{' slow' if cluster.slow else ''}"
        out.append((label, model, cluster, workload))
    return out


def measure(model, cluster, workload, repeats: int) -> dict:
    """The policy planner's fastest wall time over ``repeats`` plans, every wall time, and its tokens/s."""
    from hetpart.policies import plan

    walls, cpus, tokens = [], [], set()
    for _ in range(repeats):
        before = _cpu_s()
        got = plan(model, cluster, workload, "policy")
        cpus.append(_cpu_s() - before)
        walls.append(got.wall_time_s)
        tokens.add(round(got.prediction.metrics["tokens_per_s"], 3))
    if len(tokens) > 1:
        raise RuntimeError(f"{cluster.name}: the policy's plan changed between repeats: {sorted(tokens)}")
    return {"wall_s": min(walls), "walls_s": walls, "cpu_s": min(cpus), "tokens_per_s": tokens.pop()}


def _cpu_s() -> float:
    """CPU seconds of this process and its reaped children (the planner's forked walks and baselines): what a
    plan costs whatever else the machine runs, where wall time on a shared 2-core machine varies by 2x."""
    import resource

    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _summary(rows: dict[str, dict]) -> str:
    walls = [r["wall_s"] for r in rows.values()]
    out = (f"wall s: median {statistics.median(walls):.2f}, p90 {_quantile(walls, 0.9):.2f}, max {max(walls):.2f}; "
           f"{sum(w > 1.0 for w in walls)}/{len(walls)} above 1 s")
    cpus = [r["cpu_s"] for r in rows.values() if "cpu_s" in r]
    if len(cpus) == len(walls):
        out += f"; CPU s: median {statistics.median(cpus):.2f}, p90 {_quantile(cpus, 0.9):.2f}, max {max(cpus):.2f}"
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=COUNT)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--repeats", type=int, default=2, help="plans per scenario (the fastest is reported)")
    parser.add_argument("--only", default="", help="comma-separated scenario indices to run")
    parser.add_argument("--out", type=Path, help="write the results as JSON")
    parser.add_argument("--compare", type=Path, help="a saved --out file to compare with")
    args = parser.parse_args(argv)

    from hetpart.policies.policy_planner import POLICY

    POLICY.prepare()
    only = {int(i) for i in args.only.split(",") if i}
    before = json.loads(args.compare.read_text())["scenarios"] if args.compare else {}
    rows: dict[str, dict] = {}
    load = [os.getloadavg()[0]]
    print("| scenario | GPUs | wall s | CPU s | tokens/s |"
          + (" wall before | CPU before | tokens/s change |" if before else ""))
    print("|---|---|---|---|---|" + ("---|---|---|" if before else ""))
    for i, (name, model, cluster, workload) in enumerate(scenarios(args.count, args.seed)):
        if only and i not in only:
            continue
        row = rows[name] = measure(model, cluster, workload, args.repeats) | {"gpus": cluster.num_devices}
        line = (f"| {name} | {cluster.num_devices} | {row['wall_s']:.2f} | {row['cpu_s']:.2f} |"
                f" {row['tokens_per_s']:,.0f} |")
        if name in before:
            old = before[name]
            line += (f" {old['wall_s']:.2f} | {old.get('cpu_s', math.nan):.2f} |"
                     f" {100 * (row['tokens_per_s'] / old['tokens_per_s'] - 1):+.2f}% |")
        print(line, flush=True)
    load.append(os.getloadavg()[0])
    print(f"\n{_summary(rows)} (load average {load[0]:.2f} before, {load[1]:.2f} after)")
    if before:
        shared = {k: v for k, v in before.items() if k in rows}
        print(f"before: {_summary(shared)}")
        worse = [k for k in shared if rows[k]["tokens_per_s"] < shared[k]["tokens_per_s"] * 0.995]
        print(f"scenarios more than 0.5% slower in throughput: {', '.join(worse) or 'none'}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"load_average": load, "repeats": args.repeats, "scenarios": rows}, indent=1))


if __name__ == "__main__":
    main()
