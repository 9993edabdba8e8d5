"""Benchmark: the runtime (``hetpart run``) on this machine.

1. Overhead: a 2-stage pipeline plan run by hetpart (torchrun + Executor, no emulation) against the
   same stages run directly with ``torch.distributed.pipelining`` (PipelineStage + Schedule1F1B + Adam,
   nothing else), both as 2 torchrun processes, interleaved. Wall time and process CPU time per step
   (slowest rank, after warm-up); on a shared machine the CPU time is the steadier of the two.
2. Predicted vs measured step time for 13 plans on the emulated ``tiny-mixed`` cluster (2x A100 +
   2x V100, 2-4 processes): the simulator on the emulated cluster, calibrated (a) by the workers'
   unit timings before the run and (b) by the warm-up steps; mean and max error, rank agreement.

Run: ``OMP_NUM_THREADS=1 python -m hetpart.experiments.bench_runtime [--steps 5] [--warmup 3] [--time-factor 1000]``.
The direct baseline's workers run as ``python -m hetpart.experiments.bench_runtime --direct-worker JOB``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["overhead", "accuracy", "bench_plans", "main"]

_MODEL = "gpt2-small"
_CLUSTER = "tiny-mixed"


# ------------------------------------------------------------------------------------- plans
def _plan(stages_by_replica, shares, *, global_batch=8, micro_batch=1, schedule="1f1b", name=""):
    """A plan of gpt2-small on tiny-mixed; an interleaved replica lists its virtual stages (2 per device)."""
    from hetpart.plan import Plan, Replica, Stage

    replicas = tuple(Replica(share, tuple(Stage(tuple(layers), tuple(devs), len(devs)) for layers, devs in stages))
                     for share, stages in zip(shares, stages_by_replica))
    return Plan(global_batch=global_batch, micro_batch=micro_batch, seq_len=1024, replicas=replicas,
                schedule=schedule, interleave=2 if schedule == "interleaved" else 1,
                meta={"model": _MODEL, "cluster": _CLUSTER, "name": name})


def bench_plans() -> list:
    """13 different plans for gpt2-small (14 units) on tiny-mixed (A100s 0/0/0-1, V100s 1/0/0-1)."""
    A0, A1, V0, V1 = "0/0/0", "0/0/1", "1/0/0", "1/0/1"
    P = _plan
    return [
        P([[((0, 7), [A0]), ((7, 14), [A1])]], [1.0], name="pp2 A100-A100 even"),
        P([[((0, 7), [A0]), ((7, 14), [V0])]], [1.0], name="pp2 A100-V100 even"),
        P([[((0, 10), [A0]), ((10, 14), [V0])]], [1.0], name="pp2 A100-V100 10/4"),
        P([[((0, 10), [A0]), ((10, 14), [V0])]], [1.0], schedule="gpipe", name="pp2 A100-V100 10/4 gpipe"),
        P([[((0, 7), [V0]), ((7, 14), [V1])]], [1.0], global_batch=4, name="pp2 V100-V100 even, batch 4"),
        P([[((0, 14), [A0])], [((0, 14), [A1])]], [0.5, 0.5], name="dp2 A100+A100"),
        P([[((0, 14), [A0])], [((0, 14), [V0])]], [0.75, 0.25], name="dp2 A100+V100 6/2"),
        P([[((0, 4), [A0]), ((4, 8), [A1]), ((8, 11), [V0]), ((11, 14), [V1])]], [1.0], name="pp4 4/4/3/3"),
        P([[((0, 5), [A0]), ((5, 8), [A1]), ((8, 11), [V0]), ((11, 14), [V1])]], [1.0], micro_batch=2,
          name="pp4 5/3/3/3 mb2"),
        P([[((0, 8), [A0]), ((8, 14), [A1])], [((0, 6), [V0]), ((6, 14), [V1])]], [0.75, 0.25],
          name="dp2xpp2 cut 8 / cut 6"),
        P([[((0, 4), [A0]), ((4, 7), [V0]), ((7, 11), [A0]), ((11, 14), [V0])]], [1.0], global_batch=4,
          schedule="interleaved", name="pp2x2 interleaved A100-V100"),
        P([[((0, 14), [A0, A1])]], [1.0], name="tp2 A100"),
        P([[((0, 9), [A0, A1]), ((9, 14), [V0, V1])]], [1.0], name="tp2xpp2"),
    ]


# ------------------------------------------------------------------------------------- accuracy
def accuracy(steps: int, warmup: int, time_factor: float | None, out: Path | None) -> list[dict[str, Any]]:
    """Run every bench plan emulated; return measured and predicted step times per plan."""
    from hetpart.cluster import load_cluster
    from hetpart.plan import Plan
    from hetpart.runtime.emulation import EmulationParams
    from hetpart.runtime.launch import RunOptions, run_plan
    from hetpart.runtime.measure import predict

    rows = []
    for plan in bench_plans():
        start = time.perf_counter()
        result = run_plan(plan, options=RunOptions(steps=steps, warmup=warmup, time_factor=time_factor), out=out)
        emu = result.record.emulation
        units = EmulationParams(precision=emu.precision, peak_tflops=_units_peak(result), time_factor=emu.time_factor,
                                memory_gbyte_s=emu.memory_gbyte_s, achieved_tflops=0.0)
        small = Plan.from_dict(result.record.plan)
        graph = _run_graph(plan, small)
        pred_units = predict(graph, units.cluster(load_cluster(_CLUSTER), small), small)["step_time_s"]
        rows.append({"plan": plan.meta["name"], "devices": plan.num_devices,
                     "measured_s": result.measured.step_time_s, "std_s": result.measured.step_time_std_s,
                     "predicted_s": result.predicted["step_time_s"], "predicted_units_s": pred_units,
                     "time_factor": emu.time_factor, "wall_s": time.perf_counter() - start})
        r = rows[-1]
        print(f"{r['plan']:<28} measured {r['measured_s']:.3f} s  predicted {r['predicted_s']:.3f} s "
              f"({100 * (r['predicted_s'] / r['measured_s'] - 1):+.1f}%)  units-calibrated {r['predicted_units_s']:.3f} s",
              flush=True)
    return rows


def _units_peak(result) -> float:
    from hetpart.runtime.emulation import calibrated_peak_tflops

    record = result.record
    achieved = statistics.fmean(c["achieved_tflops"] for c in record.emulation.details["calibrations"])
    plan = record.plan
    return calibrated_peak_tflops(achieved, record.model.run_config["hidden_size"], plan["micro_batch"] * plan["seq_len"])


def _run_graph(plan, small):
    from hetpart.graph.transformer import transformer_graph
    from hetpart.runtime.models import runnable_spec

    max_tp = max(s.tp for r in plan.replicas for s in r.stages)
    spec = runnable_spec(_MODEL, "tiny", max_tp=max_tp)
    return transformer_graph(spec.config, f"{_MODEL}@tiny", small.seq_len, 4)


def _rank_agreement(rows) -> dict[str, float]:
    from scipy.stats import kendalltau, spearmanr

    m = [r["measured_s"] for r in rows]
    p = [r["predicted_s"] for r in rows]
    pairs = [(i, j) for i in range(len(rows)) for j in range(i + 1, len(rows))]
    agree = sum((m[i] - m[j]) * (p[i] - p[j]) > 0 for i, j in pairs)
    return {"spearman": float(spearmanr(m, p).statistic), "kendall": float(kendalltau(m, p).statistic),
            "pairs_agree": agree, "pairs": len(pairs)}


# ------------------------------------------------------------------------------------- overhead
def _overhead_plan():
    # llama2-7b has untied embeddings: the two stages share no weight, so the direct run needs no
    # gradient exchange to compute the same step as hetpart.
    from hetpart.plan import Plan, Replica, Stage

    return Plan(global_batch=8, micro_batch=1, seq_len=1024, schedule="1f1b",
                replicas=(Replica(1.0, (Stage((0, 17), ("0/0/0",)), Stage((17, 34), ("0/0/1",)))),),
                meta={"model": "llama2-7b", "cluster": _CLUSTER})


def overhead(steps: int, warmup: int, repeats: int) -> dict[str, Any]:
    """Wall time per step: hetpart run (no emulation) vs the same stages with plain pipelining."""
    from hetpart.runtime.launch import RunOptions, prepare_run, run_plan

    plan = _overhead_plan()
    prep = prepare_run(plan, "llama2-7b", _CLUSTER, RunOptions())
    hetpart_s, direct_s, hetpart_cpu, direct_cpu = [], [], [], []
    for _ in range(repeats):  # interleaved, so that both see the same background load
        result = run_plan(plan, options=RunOptions(steps=steps, warmup=warmup, emulate=False))
        hetpart_s.append(max(r["wall_step_time_s"] for r in result.measured.ranks))
        hetpart_cpu.append(max(r["cpu_step_time_s"] for r in result.measured.ranks))
        wall, cpu = _direct_run(prep, steps, warmup)
        direct_s.append(wall)
        direct_cpu.append(cpu)
        print(f"overhead: hetpart {hetpart_s[-1]:.4f} s/step ({hetpart_cpu[-1]:.4f} s CPU), direct pipelining "
              f"{direct_s[-1]:.4f} s/step ({direct_cpu[-1]:.4f} s CPU)", flush=True)
    h, d = statistics.median(hetpart_s), statistics.median(direct_s)
    hc, dc = statistics.median(hetpart_cpu), statistics.median(direct_cpu)
    return {"hetpart_s": hetpart_s, "direct_s": direct_s, "hetpart_cpu_s": hetpart_cpu, "direct_cpu_s": direct_cpu,
            "hetpart_median_s": h, "direct_median_s": d, "overhead_pct": 100 * (h / d - 1),
            "hetpart_cpu_median_s": hc, "direct_cpu_median_s": dc, "cpu_overhead_pct": 100 * (hc / dc - 1)}


def _direct_run(prep, steps: int, warmup: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory(prefix="hetpart-direct-") as tmp:
        job = Path(tmp) / "job.json"
        job.write_text(json.dumps({"plan": prep.run_plan.to_dict(), "runnable": prep.runnable.to_dict(),
                                   "steps": steps, "warmup": warmup, "out": tmp}))
        env = dict(os.environ, OMP_NUM_THREADS="1")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1", "--nproc-per-node",
               str(prep.run_plan.num_devices), "-m", "hetpart.experiments.bench_runtime", "--direct-worker", str(job)]
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
        per_rank = [json.loads(p.read_text()) for p in sorted(Path(tmp).glob("direct*.json"))]
    return (max(statistics.fmean(r["wall"][warmup:]) for r in per_rank),
            max(statistics.fmean(r["cpu"][warmup:]) for r in per_rank))


def _direct_worker(job_path: str) -> None:
    """One rank of the baseline: PipelineStage + Schedule1F1B + Adam on the same units, nothing else."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    from hetpart.plan import Plan
    from hetpart.runtime.engine import loss_fn_for
    from hetpart.runtime.models import RunnableSpec, build_units, synthetic_batch

    torch.set_num_threads(1)
    job = json.loads(Path(job_path).read_text())
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    plan, spec = Plan.from_dict(job["plan"]), RunnableSpec.from_dict(job["runnable"])
    module = nn.Sequential(*build_units(spec, range(*plan.replicas[0].stages[rank].layers)))
    stage = PipelineStage(module, rank, world, torch.device("cpu"))
    loss = loss_fn_for(spec, plan.micro_batch / plan.global_batch)
    schedule = Schedule1F1B(stage, plan.num_microbatches(0), loss_fn=loss, scale_grads=False)
    optimizer = torch.optim.Adam(module.parameters(), lr=1e-3)
    times, cpu = [], []
    for step in range(job["warmup"] + job["steps"]):
        x, y = synthetic_batch(spec, plan.global_batch, plan.seq_len, step)
        start, cpu_start = time.perf_counter(), time.process_time()
        optimizer.zero_grad(set_to_none=True)
        if rank == 0:
            schedule.step(x)
        elif rank == world - 1:
            schedule.step(target=y, losses=[])
        else:
            schedule.step()
        optimizer.step()
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - cpu_start)
    (Path(job["out"]) / f"direct{rank}.json").write_text(json.dumps({"wall": times, "cpu": cpu}))
    dist.destroy_process_group()


# ------------------------------------------------------------------------------------- report
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--direct-worker", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=3, help="warm-up steps; all but the first calibrate the rate")
    parser.add_argument("--time-factor", type=float, default=1000.0,
                        help="emulation slowdown (0: the default, fastest peak / calibrated CPU peak)")
    parser.add_argument("--overhead-steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="runtime_bench.json")
    parser.add_argument("--skip-overhead", action="store_true")
    args = parser.parse_args(argv)
    if args.direct_worker:
        _direct_worker(args.direct_worker)
        return 0
    report: dict[str, Any] = {"time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if not args.skip_overhead:
        report["overhead"] = overhead(args.overhead_steps, args.warmup, args.repeats)
        print(json.dumps(report["overhead"]), flush=True)
    rows = accuracy(args.steps, args.warmup, args.time_factor or None, Path(args.out).with_suffix(".jsonl"))
    errors = [abs(r["predicted_s"] / r["measured_s"] - 1) for r in rows]
    errors_units = [abs(r["predicted_units_s"] / r["measured_s"] - 1) for r in rows]
    report["accuracy"] = {"rows": rows, "mean_error_pct": 100 * statistics.fmean(errors),
                          "max_error_pct": 100 * max(errors),
                          "mean_error_units_calibrated_pct": 100 * statistics.fmean(errors_units),
                          "max_error_units_calibrated_pct": 100 * max(errors_units), **_rank_agreement(rows)}
    Path(args.out).write_text(json.dumps(report, indent=1))
    a = report["accuracy"]
    print(f"mean error {a['mean_error_pct']:.1f}%, max {a['max_error_pct']:.1f}%, spearman {a['spearman']:.3f}, "
          f"pairs in the same order {a['pairs_agree']}/{a['pairs']}; units-calibrated mean "
          f"{a['mean_error_units_calibrated_pct']:.1f}% max {a['max_error_units_calibrated_pct']:.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
