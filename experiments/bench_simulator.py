"""Benchmark: simulator plan evaluations per second, llama2-70b on 64 GPUs, one core.

A planner's inner loop evaluates many different plans of one model on one cluster with one
:class:`~hetpart.costmodel.Simulator` (unit costs cached across plans, plans pre-validated). We time
exactly that -- ``estimate`` (step time + memory fit), ``simulate`` (full prediction with metrics and
breakdown) and ``simulate`` with plan validation -- on seeded random plans: random Megatron grids
(tp, pp, dp, micro-batch, schedule, recompute) with random uneven layer cuts, on a homogeneous and on
a two-type cluster, so that plans rarely repeat a pipeline.

Run: ``OMP_NUM_THREADS=1 python -m hetpart.experiments.bench_simulator [--plans 600] [--global-batch 64]``
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from dataclasses import replace

__all__ = ["random_plans", "bench", "section", "main"]


def _clusters():
    from hetpart.cluster import parse_cluster

    node = {"gpus_per_node": 8, "intra_node": "NVLink3", "nic": "IB-HDR", "nics_per_node": 8}
    homo = parse_cluster({"name": "a100x64", "nodes": [{"count": 8, "gpu": "A100-80GB", **node}]})
    mixed = parse_cluster({"name": "h100x32+a100x32", "nodes": [
        {"count": 4, "gpu": "H100-80GB", **node, "intra_node": "NVLink4", "nic": "IB-NDR"},
        {"count": 4, "gpu": "A100-80GB", **node}]})
    return homo, mixed


def _random_cuts(rng: random.Random, num_units: int, stages: int) -> list[tuple[int, int]]:
    cuts = sorted(rng.sample(range(1, num_units), stages - 1))
    bounds = [0] + cuts + [num_units]
    return list(zip(bounds[:-1], bounds[1:]))


def random_plans(model, cluster, global_batch: int, count: int, seed: int = 0):
    """``count`` seeded random valid plans: Megatron grids with random layer cuts."""
    from hetpart.costmodel.megatron import megatron_plan
    from hetpart.errors import HetpartError
    from hetpart.plan import Replica, Stage
    from hetpart.workload import Workload

    rng = random.Random(seed)
    out = []
    while len(out) < count:
        tp = rng.choice([1, 2, 4, 8])
        pp = rng.choice([p for p in (1, 2, 4, 8, 16) if tp * p <= 64])
        dp = rng.choice([d for d in (1, 2, 4, 8) if tp * pp * d <= 64 and global_batch % d == 0])
        mb = rng.choice([1, 2, 4])
        schedule = rng.choice(["1f1b", "1f1b", "gpipe", "interleaved"])
        v = 2 if schedule == "interleaved" else 1
        try:
            base = megatron_plan(model, cluster, Workload(global_batch, model.seq_len), tp, pp, dp, mb, schedule, v,
                                 rng.choice(["none", "selective", "full"]))
        except HetpartError:
            continue
        reps = []
        for r in base.replicas:
            cuts = _random_cuts(rng, model.num_units, len(r.stages))
            reps.append(Replica(r.batch_share, tuple(Stage(c, s.devices, s.tp) for c, s in zip(cuts, r.stages))))
        plan = replace(base, replicas=tuple(reps))
        try:
            plan.check(model, cluster)
        except HetpartError:
            continue
        if schedule == "interleaved" and any(plan.num_microbatches(i) % pp for i in range(dp)):
            continue
        out.append(plan)
    return out


def _time_passes(make_sim, call, plans, repeats: int) -> tuple[float, float]:
    """(plans/s from each plan's fastest of ``repeats`` passes, plans/s of the median whole pass).

    Every pass starts from a fresh simulator, so each plan meets the same cache state in every pass;
    taking each plan's fastest pass filters out the time other jobs on the machine took from us.
    """
    per_plan = [[] for _ in plans]
    totals = []
    clock = time.perf_counter
    for _ in range(repeats):
        sim = make_sim()
        start = clock()
        for i, plan in enumerate(plans):
            t0 = clock()
            call(sim, plan)
            per_plan[i].append(clock() - t0)
        totals.append(clock() - start)
    return len(plans) / sum(min(t) for t in per_plan), len(plans) / statistics.median(totals)


def bench(model_name: str = "llama2-70b", seq_len: int = 4096, global_batch: int = 64, plans: int = 600,
          repeats: int = 5) -> list[dict]:
    """Evaluations per second per cluster (see :func:`_time_passes`)."""
    from hetpart.costmodel.simulator import Simulator
    from hetpart.graph import load_model

    model = load_model(model_name, seq_len=seq_len)
    rows = []
    for cluster in _clusters():
        todo = random_plans(model, cluster, global_batch, plans)
        row = {"cluster": cluster.name, "plans": len(todo)}
        for name, call in (("estimate", lambda s, p: s.estimate(p)),
                           ("simulate", lambda s, p: s.simulate(p, validate=False)),
                           ("simulate_validated", lambda s, p: s.simulate(p, validate=True))):
            row[name], row[name + "_median"] = _time_passes(lambda c=cluster: Simulator(model, c), call, todo,
                                                              repeats)
        m = [p.num_microbatches(0) for p in todo]
        row |= {"microbatches_median": statistics.median(m), "microbatches_max": max(m)}
        rows.append(row)
    return rows


def _table(rows: list[dict]) -> str:
    lines = ["| cluster | plans | micro-batches per replica (median / max) | estimate/s | simulate/s | "
             "simulate/s (validated) |", "|---|---|---|---|---|---|"]
    for r in rows:
        cells = " | ".join(f"{r[k]:.0f} [{r[k + '_median']:.0f}]"
                           for k in ("estimate", "simulate", "simulate_validated"))
        lines.append(f"| {r['cluster']} | {r['plans']} | {r['microbatches_median']:g} / {r['microbatches_max']} | "
                     f"{cells} |")
    return "\n".join(lines)


def section(plans: int = 600, global_batch: int = 64):
    """docs/BENCHMARKS.md's simulator speed block (``make bench BENCH=simulator-speed``)."""
    from hetpart.experiments.benchdoc import Section, load, machine

    where = machine()
    rows = bench(global_batch=global_batch, plans=plans)
    body = (f"{plans} seeded random valid plans per cluster (random tp/pp/dp/micro-batch/schedule/recompute grids "
            f"with random uneven layer cuts), llama2-70b, global batch {global_batch}, seq 4096. Each of 5 passes "
            "starts from a fresh `Simulator` (unit-cost caches are filled inside the timing); a plan's time is its "
            "fastest pass, which filters out the time other jobs took from us; in brackets the median whole pass. "
            "`estimate` returns step time + memory fit (the planners' and the RL reward's inner loop); `simulate` "
            "the full `Prediction` (metrics, breakdown); \"validated\" adds `Plan.check`. One thread; the rates "
            "move with the machine's load (above).\n\n" + _table(rows))
    return Section("simulator-speed", "Speed: plan evaluations per second, llama2-70b on 64 GPUs, one core", body,
                   f"OMP_NUM_THREADS=1 python -m hetpart.experiments.bench_simulator --plans "
                   f"{plans} --global-batch {global_batch}", where, load_after=load(), level=3)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plans", type=int, default=600)
    parser.add_argument("--global-batch", type=int, default=64)
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(f"llama2-70b, seq 4096, global batch {args.global_batch}, {args.plans} random plans per cluster")
    print("Plans per second from each plan's fastest of 5 passes [median whole pass in brackets]:")
    print(_table(bench(global_batch=args.global_batch, plans=args.plans)))


if __name__ == "__main__":
    main()
