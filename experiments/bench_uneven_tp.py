"""Benchmark: uneven tensor parallelism (issue 17) measured and predicted.

1. An emulated pair: two A100 in one node, one of them measured at half speed (``slow: {"0/0/1": 0.5}``),
   one tensor-parallel stage of one transformer block of width 768 (12 heads, MLP 3072, a 256-token
   vocabulary so that the embedding and head, which every rank runs whole, stay small). The even split
   (6:6 heads) against the split by speed (8:4 heads, 2048:1024 columns), each run with ``hetpart run``
   (local CPU processes; the slow rank sleeps for the compute it would lose), repeats interleaved
   (even, uneven, even, ...): measured step time (median of the repeats' medians), the simulator's
   prediction on the emulated cluster, and the speed-up. The ceiling is 1.5x (the split removes the
   slow rank's wait but not the all-reduces).
2. Planning: ``hetpart plan`` (search) on every public-suite entry with and without the LP splits
   (``Evaluator.split_tp``), interleaved: wall time and throughput (homogeneous clusters must not move).
3. Recovery on a node of eight A100-80GB with one at 0.6x (llama2-13b, 64 x 2048; the acceptance check's
   scenario and arithmetic): the search's plan with the slow GPU, the all-fast node's plan, and the
   planned plan made naive (no split, even batch shares and layers); the share of the throughput the slow
   GPU costs that the plan recovers. Also the search held at level 0 (no sharded states with the split).

Run: ``OMP_NUM_THREADS=1 python -m hetpart.experiments.bench_uneven_tp [--repeats 3] [--steps 3]``
(``make bench BENCH=uneven-tp``).
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

__all__ = ["pair", "planning", "recovery", "section", "main"]

_CONFIG = {"model_type": "gpt2", "n_embd": 768, "n_layer": 1, "n_head": 12, "n_positions": 1024, "vocab_size": 256}
_CLUSTER = """name: pair-one-slow
nodes:
  - {count: 1, gpus_per_node: 2, gpu: A100-80GB, intra_node: NVLink3, nic: IB-HDR}
slow: {"0/0/1": 0.5}
"""


def _plans(seq_len: int, global_batch: int, micro_batch: int) -> dict[str, dict]:
    # The even split is written out (6:6) so that both runs take the same code path (local slices and
    # Megatron's wrappers; without tp_split the runtime uses DTensor) and the same emulation of the slow
    # rank (its sleep before each TP all-reduce).
    stage = {"layers": [0, 3], "devices": ["0/0/0", "0/0/1"], "tp": 2}
    base = {"global_batch": global_batch, "micro_batch": micro_batch, "seq_len": seq_len, "schedule": "1f1b",
            "recompute": "none", "precision": "bf16"}
    return {"even": dict(base, replicas=[{"batch_share": 1.0, "stages": [dict(stage, tp_split={"heads": [6, 6]})]}]),
            "uneven": dict(base, replicas=[{"batch_share": 1.0, "stages": [dict(stage, tp_split={
                "heads": [8, 4], "ffn": [2048, 1024]})]}])}


def _hetpart() -> list[str]:
    return [sys.executable, "-m", "hetpart.cli.app"]


def pair(repeats: int = 3, steps: int = 3, seq_len: int = 256, global_batch: int = 4, micro_batch: int = 2,
         time_factor: float = 1000.0) -> dict:
    """Measured and predicted step times of the even and the uneven split (see the module docstring).

    ``time_factor``: the links' emulation slowdown, fixed for every run (by default each run would
    derive it from its own calibration, so runs on a loaded machine would emulate different links)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out: dict[str, dict[str, list[float]]] = {k: {"measured": [], "predicted": []} for k in ("even", "uneven")}
    emulations: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        (t / "config.json").write_text(json.dumps(_CONFIG))
        (t / "cluster.yaml").write_text(_CLUSTER)
        for name, plan in _plans(seq_len, global_batch, micro_batch).items():
            (t / f"{name}.json").write_text(json.dumps(plan))
        for _ in range(repeats):
            for name in ("even", "uneven"):
                cmd = _hetpart() + ["run", str(t / f"{name}.json"), "--model", str(t / "config.json"), "--cluster",
                                    str(t / "cluster.yaml"), "--steps", str(steps), "--hidden-size", "768",
                                    "--log-every", "0", "--time-factor", str(time_factor), "--json"]
                done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1200)
                if done.returncode:
                    raise RuntimeError(f"{name}: hetpart run failed: {done.stderr.strip().splitlines()[-1:]}")
                result = json.loads(done.stdout)
                out[name]["measured"].append(result["measured"]["step_time_s"])
                out[name]["predicted"].append(result["predicted"]["step_time_s"])
                emulations.append(result["emulation"])
        same = [_one_calibration(t, emu) for emu in emulations]
    summary = {k: {m: statistics.median(v[m]) for m in v} | {"runs": v} for k, v in out.items()}
    summary["speedup_measured"] = summary["even"]["measured"] / summary["uneven"]["measured"]
    summary["speedup_paired"] = [e / u for e, u in zip(out["even"]["measured"], out["uneven"]["measured"])]
    summary["speedup_predicted"] = statistics.median(same)
    summary["speedup_predicted_runs"] = same
    return summary


def _one_calibration(t: Path, emu: dict) -> float:
    """Predicted even / uneven step time, both on the emulated cluster of one run's calibration (each
    run calibrates its own on a machine whose load moves, so per-run predictions mix calibrations)."""
    from hetpart.plan import load_plan
    from hetpart.runtime.emulation import emulated_cluster
    from hetpart.runtime.launch import RunOptions, prepare_run
    from hetpart.runtime.measure import predict

    steps = []
    for name in ("even", "uneven"):
        prep = prepare_run(load_plan(t / f"{name}.json"), str(t / "config.json"), str(t / "cluster.yaml"),
                           RunOptions(scale=768))
        cluster = emulated_cluster(prep.cluster, prep.run_plan, emu["peak_tflops"], emu["time_factor"],
                                   emu["memory_gbyte_s"], emu["precision"])
        steps.append(predict(prep.run_graph, cluster, prep.run_plan)["step_time_s"])
    return steps[0] / steps[1]


def planning(repeats: int = 1) -> list[dict]:
    """Search planning on the public suite with and without LP splits (wall time, tokens/s)."""
    from hetpart import Workload, load_cluster, load_model
    from hetpart.workload import cluster_precision
    from hetpart.costmodel.evaluator import Evaluator
    from hetpart.experiments.bench import PUBLIC_SUITE
    from hetpart.experiments.suite import load_suite
    from hetpart.policies.plan_search import plan_search

    rows = []
    for entry in load_suite(PUBLIC_SUITE):
        model = load_model(entry.model, seq_len=entry.seq_len)
        cluster = load_cluster(entry.cluster)
        workload = Workload(entry.global_batch, entry.seq_len, precision=cluster_precision(cluster))
        row = {"scenario": entry.name, "unlike": not cluster.uniform_speed or len(cluster.gpu_types) > 1}
        for _ in range(repeats):
            for split in (False, True):
                ev = Evaluator(model, cluster, workload)
                ev.split_tp = split
                start = time.perf_counter()
                best = plan_search(model, cluster, workload, evaluator=ev)
                key = "lp" if split else "even"
                row.setdefault(f"{key}_s", []).append(time.perf_counter() - start)
                row[f"{key}_tokens_per_s"] = best.tokens_per_s
                row[f"{key}_splits"] = sum(s.tp_split is not None for r in best.plan.replicas for s in r.stages)
        rows.append(row)
    return rows


_SLOW_NODE = {"name": "one-slow", "nodes": [{"count": 1, "gpus_per_node": 8, "gpu": "A100-80GB",
                                             "intra_node": "NVLink3", "nic": "IB-HDR"}], "slow": {"0/0/3": 0.6}}


def _naive(plan):
    """The acceptance check's naive version of ``plan``: no split, even batch shares, layers cut evenly."""
    from dataclasses import replace

    replicas = []
    n = sum(s.layers[1] - s.layers[0] for s in plan.replicas[0].stages)
    for r in plan.replicas:
        k, a, stages = len(r.stages), 0, []
        for i, s in enumerate(r.stages):
            b = a + n // k + (1 if i < n % k else 0)
            stages.append(replace(s, layers=(a, b), tp_split=None))
            a = b
        replicas.append(replace(r, batch_share=1.0 / len(plan.replicas), stages=tuple(stages)))
    return replace(plan, replicas=tuple(replicas))


def recovery() -> dict:
    """Part 3: plans and predictions on the node with a throttled GPU (see the module docstring)."""
    from dataclasses import replace

    from hetpart import Workload, load_model
    from hetpart.cluster import parse_cluster
    from hetpart.costmodel.simulator import simulate
    from hetpart.policies.plan_search import plan_search

    model = load_model("llama2-13b", seq_len=2048)
    slow = parse_cluster(_SLOW_NODE, "one-slow.yaml")
    fast = replace(slow, slow=())
    w = Workload(global_batch=64, seq_len=2048)
    out = {}
    for name, cluster, workload in (("slow", slow, w), ("fast", fast, w), ("slow_level0", slow, replace(w, zero=0))):
        start = time.perf_counter()
        best = plan_search(model, cluster, workload)
        pred = simulate(model, cluster, best.plan)
        out[name] = {"plan": best.plan, "tokens_per_s": pred.tokens_per_s, "plan_s": time.perf_counter() - start,
                     "peak_gb": max(pred.memory_gb.values()), "memory_gb": pred.memory_gb}
    for name in ("slow", "slow_level0"):
        naive = simulate(model, slow, _naive(out[name]["plan"]))
        lost = out["fast"]["tokens_per_s"] - naive.tokens_per_s
        out[name]["naive_tokens_per_s"] = naive.tokens_per_s
        out[name]["recovered"] = (out[name]["tokens_per_s"] - naive.tokens_per_s) / lost if lost > 0 else 1.0
    return out


def _recovery_lines(rec: dict) -> list[str]:
    def what(plan) -> str:
        splits = [str(dict(s.tp_split.to_dict())) for r in plan.replicas for s in r.stages if s.tp_split is not None]
        shape = f"{plan.dp} x (pp {plan.replicas[0].pp}, tp {plan.replicas[0].stages[0].tp})"
        return (f"{shape}, micro-batch {plan.micro_batch}, zero {plan.zero}, recompute {plan.recompute}"
                + (f", split {'; '.join(splits)}" if splits else ""))

    lines = ["| plan | what | tokens/s | peak GB/GPU (of 80) | naive tokens/s | recovered | plan s |",
             "|---|---|---|---|---|---|---|"]
    labels = {"fast": "all-fast node (search)", "slow": "slow GPU (search)",
              "slow_level0": "slow GPU (search held at zero 0)"}
    for name in ("fast", "slow", "slow_level0"):
        r = rec[name]
        naive = f"{r['naive_tokens_per_s']:,.0f}" if "naive_tokens_per_s" in r else ""
        got = f"**{100 * r['recovered']:.0f}%**" if "recovered" in r else ""
        lines.append(f"| {labels[name]} | {what(r['plan'])} | {r['tokens_per_s']:,.0f} | {r['peak_gb']:.1f} | "
                     f"{naive} | {got} | {r['plan_s']:.1f} |")
    return lines


def section(repeats: int = 2, steps: int = 3):
    """docs/BENCHMARKS.md's uneven tensor parallelism section (``make bench BENCH=uneven-tp``)."""
    from hetpart.experiments.benchdoc import Section, load, machine

    where = machine()
    p = pair(repeats, steps)
    rows = planning()
    rec = recovery()
    err = {k: 100 * (p[k]["predicted"] / p[k]["measured"] - 1) for k in ("even", "uneven")}
    lines = ["| split | measured s/step (median) | runs | predicted s/step | error |", "|---|---|---|---|---|"]
    for k in ("even", "uneven"):
        runs = ", ".join(f"{x:.3f}" for x in p[k]["runs"]["measured"])
        lines.append(f"| {k} | {p[k]['measured']:.3f} | {runs} | {p[k]['predicted']:.3f} | {err[k]:+.1f}% |")
    plan_lines = ["| scenario | several GPU types | search s (even) | search s (with LP) | ratio | tokens/s even | "
                  "tokens/s with LP | split stages |", "|---|---|---|---|---|---|---|---|"]
    total = {"even": 0.0, "lp": 0.0}
    for r in rows:
        e, s = statistics.median(r["even_s"]), statistics.median(r["lp_s"])
        total["even"] += e
        total["lp"] += s
        plan_lines.append(f"| {r['scenario']} | {'yes' if r['unlike'] else 'no'} | {e:.2f} | {s:.2f} | {s / e:.2f} | "
                          f"{r['even_tokens_per_s']:,.0f} | {r['lp_tokens_per_s']:,.0f} | {r['lp_splits']} |")
    plan_lines.append(f"| **total** | | {total['even']:.2f} | {total['lp']:.2f} | {total['lp'] / total['even']:.2f} "
                      "| | | |")
    body = (
        "**Emulated pair.** Two A100-80GB in one node, `0/0/1` at half speed (`slow:`), one TP-2 stage of a "
        "GPT-2 block of width 768 (12 heads, MLP 3072, vocabulary 256; `--hidden-size 768`, sequences of 256, "
        f"global batch 4 in micro-batches of 2), {steps} measured steps per run after 2 warm-up steps, "
        f"{repeats} runs of each split interleaved (even, uneven, even, ...). Predicted: the simulator on the "
        "emulated cluster, as `hetpart run` reports it (its compute from the profile the ranks measure before "
        "and after their steps; until 2026-11-24 that profile priced the half-speed device's factor twice and its "
        "healthy peer as slow too, which was the +72-86% these predictions showed).\n\n" + "\n".join(lines) +
        f"\n\nSpeed-up of the split by speed (8:4 heads, 2048:1024 columns) over the even one: measured "
        f"**{p['speedup_measured']:.2f}x** (ratio of the medians; run by run "
        f"{', '.join(f'{x:.2f}' for x in p['speedup_paired'])}), predicted {p['speedup_predicted']:.2f}x (both plans "
        "simulated under one run's calibration, median over the runs' calibrations: "
        f"{', '.join(f'{x:.2f}' for x in p['speedup_predicted_runs'])}). The ceiling is 1.5x (the split removes the "
        "slow rank's compute wait, not the all-reduces, the embedding or the head). "
        + ("A measured speed-up above it is the machine's load, not the split: the load average (above) was far above "
           "the 2 cores, the same run took up to 2x longer from one repeat to the next (runs column), and the emulated "
           "slow rank's sleeps leave its core to the fast rank. Rerun on a quiet machine for a clean number.\n\n"
           if p["speedup_measured"] > 1.5 else "\n\n") +
        "**Planning time with the LP.** `plan_search` on each public-suite entry with the evaluator's LP splits off "
        "and on (one process, interleaved). Only clusters with unlike tensor-parallel groups pay for the LP; "
        "on the others the plan and its throughput must not move.\n\n" + "\n".join(plan_lines) +
        "\n\n**One GPU at 0.6x in a node of eight A100-80GB** (llama2-13b, global batch 64 x 2048; the acceptance "
        "check's scenario and arithmetic: recovered = (planned - naive) / (all-fast - naive), naive = the planned plan "
        "without its split, with even batch shares and layers). Predicted by the simulator.\n\n"
        + "\n".join(_recovery_lines(rec)) +
        "\n\nAt level 0 the split replica's fast devices hold more than their even quarter of the heads and columns, "
        f"so the micro-batch the all-fast node runs ({rec['fast']['plan'].micro_batch}, at "
        f"{rec['fast']['peak_gb']:.2f} GB) does not fit them; sharded optimizer "
        "states (zero 1: each device keeps half of the Adam states of its own slice) buy it back. The search tries "
        "the next level when its best plan has a split, and the runtime runs the pair on its distributed optimizer "
        "(`tests/test_runtime_split_sharded.py`).")
    return Section("uneven-tp", "Uneven tensor parallelism", body,
                   f"OMP_NUM_THREADS=1 python -m hetpart.experiments.bench_uneven_tp --repeats {repeats} --steps {steps}",
                   where, load_after=load())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--write", action="store_true", help="rewrite the section of docs/BENCHMARKS.md")
    a = ap.parse_args(argv)
    if a.write:
        from hetpart.experiments.benchdoc import write_section

        write_section(section(a.repeats, a.steps))
        return
    print(json.dumps(pair(a.repeats, a.steps), indent=1, default=str))


if __name__ == "__main__":
    main()
