"""Real runs as ground truth: measure a profile of this machine, then run real (non-emulated) plans and
compare the measured step time with the simulator's prediction from that profile; and the runtime's own
emulated prediction, run to run.

Two parts (``make bench BENCH=profile-truth``):

* ``truth``: ``hetpart calibrate`` on this machine's CPU for the model that runs (gpt2-small shrunk with
  ``--scale small``: 14 units, hidden 256, seq 128), then plans of one to four ranks -- the Megatron
  grid (pipeline, data and tensor parallel), one stage split unevenly two ways (9:3 heads, run by hand)
  and a ``search`` plan planned with the profile on a two-type cluster -- each run with ``hetpart run --no-emulation --profile`` (every rank a process of this CPU,
  gloo, fp32), measured against the profile's prediction;
* ``emulated``: the issue's plan (gpt2-small, global batch 8, search on one A100 + one V100 over
  Ethernet-10) run three times with ``hetpart run --scale tiny`` (emulated): the prediction's compute
  comes from a profile every rank measures before and after its steps (medians of blocks of calls),
  reported with its spread.

    OMP_NUM_THREADS=1 python -m hetpart.experiments.bench_profile_truth --out results.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["truth_rows", "emulated_rows", "measured_band", "section", "main"]

TRUTH_CLUSTER = """name: four-a100
nodes:
  - {count: 2, gpus_per_node: 2, gpu: A100-80GB, intra_node: NVLink3, nic: Ethernet-10}
"""
MIXED_CLUSTER = """name: two-types
nodes:
  - {count: 1, gpus_per_node: 2, gpu: A100-80GB, intra_node: NVLink3, nic: Ethernet-10}
  - {count: 1, gpus_per_node: 2, gpu: V100-32GB, intra_node: NVLink2, nic: Ethernet-10}
"""
ISSUE_CLUSTER = """name: a100-v100-eth10
nodes:
  - {count: 1, gpus_per_node: 1, gpu: A100-80GB, intra_node: NVLink3, nic: Ethernet-10}
  - {count: 1, gpus_per_node: 1, gpu: V100-32GB, intra_node: NVLink2, nic: Ethernet-10}
"""
GRID = ((1, 1, 1, 1), (1, 1, 1, 2), (1, 1, 1, 4), (1, 2, 1, 1), (1, 2, 1, 2), (1, 1, 2, 2), (2, 1, 1, 1),
        (2, 1, 1, 2), (2, 1, 1, 4), (1, 2, 2, 2), (1, 4, 1, 1))
"""(tp, pp, dp, micro-batch) of the Megatron-grid plans: one and two ranks (a core each), then four ranks
on the machine's cores (more ranks than cores where it has two)."""


UNEVEN_MICRO_BATCHES = (2, 4)
"""Micro-batches of the uneven tensor-parallel plan (gpt2-small's 12 heads split 9:3, its MLP 3:1)."""


def _write(folder: Path, name: str, text: str) -> str:
    path = folder / name
    path.write_text(text)
    return str(path)


def truth_rows(scale: str = "small", global_batch: int = 8, steps: int = 4, warmup: int = 2,
               grid=GRID, say=print) -> dict[str, Any]:
    """Calibrate this machine, run the plans without emulation, compare with the profile's predictions."""
    from hetpart import Workload, load_cluster
    from hetpart.costmodel import megatron_plan
    from hetpart.costmodel.predictor import get_predictor
    from hetpart.graph.transformer import transformer_graph
    from hetpart.policies import plan as make_plan
    from hetpart.runtime.calibrate import CalibrateOptions, calibrate_profile
    from hetpart.runtime.launch import RunOptions, run_plan
    from hetpart.runtime.models import runnable_spec, scaled_seq_len

    folder = Path(tempfile.mkdtemp(prefix="hetpart-truth-"))
    cluster_path = _write(folder, "four.yaml", TRUTH_CLUSTER)
    mixed_path = _write(folder, "mixed.yaml", MIXED_CLUSTER)
    seq = scaled_seq_len(1024, scale)
    started = time.perf_counter()
    profile = calibrate_profile(cluster_path, "gpt2-small", CalibrateOptions(micro_batches=(1, 2, 4), seq_len=seq,
                                                                            scale=scale, device="cpu"),
                                say=lambda t: say(f"calibrate: {t}"))
    calibrate_s = time.perf_counter() - started
    profile_path = str(folder / "profile.json")
    profile.save(profile_path)
    # one profile for both clusters: bind the mixed cluster's types too (both stand in for this CPU)
    from dataclasses import replace

    from hetpart.costmodel.profile import DeviceBinding, load_profile

    both = replace(profile, device_types=profile.device_types | {"V100-32GB": DeviceBinding("cpu", True)})
    both.save(profile_path)
    profile = load_profile(profile_path)
    spec = runnable_spec("gpt2-small", scale)
    graph = transformer_graph(spec.config, f"gpt2-small@{scale}", seq, 4)
    plans = []
    cluster = load_cluster(cluster_path)
    for tp, pp, dp, mb in grid:
        w = Workload(global_batch, seq, precision="fp32", recompute="none")
        p = megatron_plan(graph, cluster, w, tp=tp, pp=pp, dp=dp, micro_batch=mb, recompute="none")
        plans.append((f"megatron {f'tp{tp} ' if tp > 1 else ''}pp{pp} dp{dp} mb{mb}", p, cluster_path))
    from hetpart.plan import Plan, Replica, Stage, TPSplit

    for mb in UNEVEN_MICRO_BATCHES:  # one stage split 3:1 over two ranks: the runtime runs it by hand (Megatron-style)
        stage = Stage((0, graph.num_units), ("0/0/0", "0/0/1"), tp=2, tp_split=TPSplit(heads=(9, 3), ffn=(2304, 768)))
        p = Plan(global_batch=global_batch, micro_batch=mb, seq_len=seq, recompute="none", precision="fp32",
                 replicas=(Replica(1.0, (stage,)),))
        plans.append((f"uneven tp2 (heads 9:3) mb{mb}", p, cluster_path))
    mixed = load_cluster(mixed_path)
    w = Workload(global_batch, seq, precision="fp32", recompute="none")
    searched = make_plan(graph, mixed, w, "search", predictor=get_predictor("simulator", graph, mixed, w,
                                                                          overlap_grad_reduce=False, profile=profile))
    shape = "; ".join(" + ".join(f"{len(st.devices)}x tp{st.tp}" for st in r.stages) for r in searched.plan.replicas)
    plans.append((f"search with the profile, 2xA100 + 2xV100 ({shape})", searched.plan, mixed_path))
    rows = []
    for name, p, cl in plans:
        from dataclasses import replace as dc_replace

        # the plan of the full-size model (hetpart run shrinks it again): same units, devices and batches
        p = dc_replace(p, seq_len=1024, meta=dict(p.meta, model="gpt2-small", cluster=cl))
        say(f"run: {name} ({p.num_devices} ranks)")
        result = run_plan(p, options=RunOptions(steps=steps, warmup=warmup, scale=scale, emulate=False,
                                                profile=profile_path))
        m, pred = result.measured, result.predicted
        rows.append({"plan": name, "ranks": p.num_devices, "micro_batch": p.micro_batch,
                     "measured_s": m.step_time_s, "measured_std_s": m.step_time_std_s,
                     "predicted_s": pred["step_time_s"], "error_pct": 100 * (pred["step_time_s"] / m.step_time_s - 1)})
        say(f"  measured {m.step_time_s:.4f} s, predicted {pred['step_time_s']:.4f} s "
            f"({rows[-1]['error_pct']:+.1f}%)")
    return {"rows": rows, "calibrate_s": calibrate_s, "profile": json.loads(Path(profile_path).read_text()),
            "scale": scale, "global_batch": global_batch, "steps": steps, "warmup": warmup}


STORED_RUNS = Path(__file__).resolve().parent / "data" / "cpu_truth_runs_tp.json"
"""Rows of real CPU runs (measured step times and the profile calibrated right before them) kept in the repo."""


def replay_rows(path: Path = STORED_RUNS, cores: int = 2) -> list[dict[str, Any]]:
    """The stored real runs of :func:`truth_rows` predicted again by the current code from the profile stored
    with them (the plans rebuilt as the bench built them; the ranks sharing ``cores`` cores, as on the
    machine that measured them): what a change to the model does to every measured row, without measuring."""
    from dataclasses import replace

    from hetpart import Workload, load_cluster
    from hetpart.costmodel import megatron_plan
    from hetpart.costmodel.predictor import get_predictor
    from hetpart.costmodel.profile import parse_profile
    from hetpart.graph.transformer import transformer_graph
    from hetpart.plan import Plan, Replica, Stage, TPSplit
    from hetpart.policies import plan as make_plan
    from hetpart.runtime import measure
    from hetpart.runtime.launch import RunOptions, prepare_run
    from hetpart.runtime.models import runnable_spec, scaled_seq_len

    data = json.loads(Path(path).read_text())
    folder = Path(tempfile.mkdtemp(prefix="hetpart-replay-"))
    four, mixed = _write(folder, "four.yaml", TRUTH_CLUSTER), _write(folder, "mixed.yaml", MIXED_CLUSTER)
    out = []
    for run in data["runs"]:
        profile = parse_profile(run["profile"])
        seq = scaled_seq_len(1024, run["scale"])
        graph = transformer_graph(runnable_spec("gpt2-small", run["scale"]).config, f"gpt2-small@{run['scale']}", seq, 4)
        w = Workload(run["global_batch"], seq, precision="fp32", recompute="none")
        plans = {f"megatron {f'tp{tp} ' if tp > 1 else ''}pp{pp} dp{dp} mb{mb}": (megatron_plan(
            graph, load_cluster(four), w, tp=tp, pp=pp, dp=dp, micro_batch=mb, recompute="none"), four)
            for tp, pp, dp, mb in GRID}
        for mb in UNEVEN_MICRO_BATCHES:
            stage = Stage((0, graph.num_units), ("0/0/0", "0/0/1"), tp=2, tp_split=TPSplit(heads=(9, 3), ffn=(2304, 768)))
            plans[f"uneven tp2 (heads 9:3) mb{mb}"] = (Plan(global_batch=run["global_batch"], micro_batch=mb, seq_len=seq,
                                                       recompute="none", precision="fp32",
                                                       replicas=(Replica(1.0, (stage,)),)), four)
        mc = load_cluster(mixed)
        searched = make_plan(graph, mc, w, "search", predictor=get_predictor("simulator", graph, mc, w,
                                                                            overlap_grad_reduce=False, profile=profile))
        for row in run["rows"]:
            p, cl = (searched.plan, mixed) if row["plan"].startswith("search") else plans[row["plan"]]
            p = replace(p, seq_len=1024, meta=dict(p.meta, model="gpt2-small", cluster=cl))
            prep = prepare_run(p, "gpt2-small", cl, RunOptions(steps=run["steps"], scale=run["scale"], emulate=False))
            predicted = measure.predict(prep.run_graph, prep.cluster, prep.run_plan,
                                        profile=profile.sharing_cores(p.num_devices, cores))["step_time_s"]
            out.append({"run": run["run"], "plan": row["plan"], "ranks": row["ranks"], "measured_s": row["measured_s"],
                        "stored_error_pct": row["error_pct"],
                        "error_pct": 100 * (predicted / row["measured_s"] - 1), "predicted_s": predicted})
    return out


EMULATED_RUNS = Path(__file__).resolve().parent / "data" / "quiet16_cpu_emulated_runs.json"
"""The three emulated runs of :func:`emulated_rows` on a quiet 16-core machine, kept in the repo."""


def measured_band(truth: Path = STORED_RUNS, emulated: Path = EMULATED_RUNS) -> dict:
    """:data:`hetpart.costmodel.provenance.ERROR_BANDS`' ``measured`` band recomputed from the rows it was
    taken from: the stored real CPU runs of one and two ranks (``error_pct`` as measured against the profile
    calibrated right before them; runs of more ranks than the two cores are the separate processor-sharing
    case) and the stored emulated runs."""
    from hetpart.experiments.bench_validation import signed_band

    pct = [r["error_pct"] for run in json.loads(Path(truth).read_text())["runs"] for r in run["rows"]
           if r["ranks"] <= 2]
    pct += [r["error_pct"] for r in json.loads(Path(emulated).read_text())["emulated"]]
    return signed_band(pct)


def emulated_rows(repeats: int = 3, steps: int = 5, say=print) -> list[dict[str, Any]]:
    """The issue's plan, run ``repeats`` times emulated at ``--scale tiny``: predicted vs measured each time."""
    from hetpart import Workload, load_cluster, load_model
    from hetpart.policies import plan as make_plan
    from hetpart.runtime.launch import RunOptions, run_plan

    folder = Path(tempfile.mkdtemp(prefix="hetpart-emulated-"))
    path = _write(folder, "a100-v100.yaml", ISSUE_CLUSTER)
    model = load_model("gpt2-small", seq_len=1024, precision="bf16")
    chosen = make_plan(model, load_cluster(path), Workload(8, 1024, precision="bf16"), "search").plan
    rows = []
    for i in range(repeats):
        result = run_plan(chosen, "gpt2-small", path, RunOptions(steps=steps, warmup=2, scale="tiny"))
        m, p = result.measured, result.predicted
        units = result.emulation.get("profile", {}).get("units", [])
        spread = max((max(abs(x) for x in u["fwd_spread_pct"] + u["bwd_spread_pct"]) for u in units), default=0.0)
        rows.append({"run": i + 1, "devices": chosen.devices, "measured_s": m.step_time_s,
                     "measured_std_s": m.step_time_std_s, "predicted_s": p["step_time_s"],
                     "error_pct": 100 * (p["step_time_s"] / m.step_time_s - 1),
                     "calibrated_on": result.emulation.get("calibrated_on"), "profile_spread_pct": spread,
                     "profile_repeats": sum(u["repeats"] for u in units)})
        say(f"emulated run {i + 1}: measured {m.step_time_s:.4f} s, predicted {p['step_time_s']:.4f} s "
            f"({rows[-1]['error_pct']:+.1f}%)")
    return rows


def gpu_rows(hidden: int = 768, micro_batches=(1, 4), global_batch: int = 16, say=print) -> dict[str, Any]:
    """On a CUDA device: calibrate the shrunken model ``hetpart run --hidden-size`` runs (fp32, TF32 off),
    then one-rank runs without emulation, predicted with that profile and without it."""
    from dataclasses import replace

    from hetpart import Workload, load_cluster, load_model
    from hetpart.costmodel import megatron_plan
    from hetpart.runtime.calibrate import CalibrateOptions, calibrate_profile
    from hetpart.runtime.launch import RunOptions, run_plan

    folder = Path(tempfile.mkdtemp(prefix="hetpart-gpu-"))
    path = _write(folder, "h100.yaml", "name: one-h100\nnodes:\n  - {count: 1, gpus_per_node: 1, gpu: H100-80GB, "
                                       "intra_node: NVLink4, nic: IB-NDR}\n")
    profile = calibrate_profile(path, "gpt2-small", CalibrateOptions(micro_batches=(1, 2, 4, 8), seq_len=512,
                                                                     scale=hidden, precision="fp32", links=False,
                                                                     device="cuda"), say=lambda t: say(f"calibrate: {t}"))
    profile_path = str(folder / "profile.json")
    profile.save(profile_path)
    full = load_model("gpt2-small", seq_len=1024, precision="fp32")
    rows = []
    for mb in micro_batches:
        p = megatron_plan(full, load_cluster(path), Workload(global_batch, 1024, precision="fp32", recompute="none"),
                          tp=1, pp=1, dp=1, micro_batch=mb, recompute="none")
        p = replace(p, meta=dict(p.meta, model="gpt2-small", cluster=path))
        result = run_plan(p, options=RunOptions(steps=6, warmup=2, scale=hidden, emulate=False, profile=profile_path))
        m, pred = result.measured, result.predicted
        from hetpart.runtime.measure import predict

        from hetpart.runtime.launch import prepare_run

        prep = prepare_run(p, "gpt2-small", path, RunOptions(scale=hidden))
        analytic = predict(prep.run_graph, prep.cluster, prep.run_plan)["step_time_s"]
        rows.append({"plan": f"1 x H100, hidden {hidden}, mb {mb}", "measured_s": m.step_time_s,
                     "measured_std_s": m.step_time_std_s, "predicted_s": pred["step_time_s"],
                     "error_pct": 100 * (pred["step_time_s"] / m.step_time_s - 1), "analytic_s": analytic})
        say(f"gpu run mb {mb}: measured {m.step_time_s:.4f} s, profile {pred['step_time_s']:.4f} s "
            f"({rows[-1]['error_pct']:+.1f}%), analytic {analytic:.4f} s")
    return {"rows": rows, "profile": json.loads(Path(profile_path).read_text())}


def _markdown(truth: dict[str, Any] | None, emulated: list[dict[str, Any]] | None) -> str:
    out = []
    if truth is not None:
        rows = truth["rows"]
        errors = [abs(r["error_pct"]) for r in rows]
        prof = truth["profile"]
        out += [f"**Real CPU runs against a profile of this machine.** `hetpart calibrate --model gpt2-small --scale "
                f"{truth['scale']} --micro-batches 1,2,4 --device cpu` ({truth['calibrate_s']:.0f} s; "
                f"{prof['devices']['cpu']['description']}), then each plan run with `hetpart run --no-emulation "
                f"--scale {truth['scale']} --profile` (every rank a process of this CPU, gloo, fp32; global batch "
                f"{truth['global_batch']}, {truth['warmup']} warm-up + {truth['steps']} measured steps) and predicted "
                "by the simulator with that profile (the runtime's order: gradients all-reduced after the backward).",
                "", "| plan | ranks | micro-batch | measured step (s) | spread (std, s) | predicted (s) | error |",
                "|---|---|---|---|---|---|---|"]
        out += [f"| {r['plan']} | {r['ranks']} | {r['micro_batch']} | {r['measured_s']:.4f} | "
                f"{r['measured_std_s']:.4f} | {r['predicted_s']:.4f} | {r['error_pct']:+.1f}% |" for r in rows]
        out += ["", f"Mean absolute error {statistics.fmean(errors):.1f}% over {len(rows)} plans (worst "
                f"{max(errors):.1f}%; target 10%).", ""]
    if emulated is not None:
        errors = [r["error_pct"] for r in emulated]
        out += ["**The runtime's own prediction, run to run.** The issue's plan (gpt2-small, global batch 8, search "
                "on one A100 + one V100 over Ethernet-10; it runs on the A100 alone) three times with `hetpart run "
                "--scale tiny` (emulated). The prediction's compute comes from a profile that every rank measures "
                "before and after its steps (medians of blocks of calls of at least 20 ms), no longer from one "
                "warm-up step.", "",
                "| run | measured step (s) | std (s) | predicted (s) | error | calibrated on | profile spread (worst unit) |",
                "|---|---|---|---|---|---|---|"]
        out += [f"| {r['run']} | {r['measured_s']:.4f} | {r['measured_std_s']:.4f} | {r['predicted_s']:.4f} | "
                f"{r['error_pct']:+.1f}% | {r['calibrated_on']} | {r['profile_spread_pct']:.0f}% |" for r in emulated]
        out += ["", f"Errors {', '.join(f'{e:+.1f}%' for e in errors)} (before: +28%, +114%, +120% as the issue "
                "reports; target: within 15% run to run)."]
    return "\n".join(out)


def section():
    """docs/BENCHMARKS.md's ``profile-truth`` section (``make bench BENCH=profile-truth``)."""
    from hetpart.experiments.benchdoc import Section, load, machine

    where = machine()
    truth = truth_rows()
    emulated = emulated_rows()
    return Section("profile-truth", "Measured profiles: real CPU runs as ground truth", _markdown(truth, emulated),
                   "OMP_NUM_THREADS=1 python -m hetpart.experiments.bench_profile_truth", where, load_after=load())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    ap.add_argument("--part", choices=("truth", "emulated", "both", "gpu", "replay"), default="both")
    ap.add_argument("--scale", default="small")
    args = ap.parse_args(argv)
    from hetpart.experiments.benchdoc import load, machine

    where = machine()
    if args.part == "replay":  # the stored real runs, predicted again by this code
        rows = replay_rows()
        print("| run | plan | ranks | measured (s) | predicted then | predicted now |\n|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['run']} | {r['plan']} | {r['ranks']} | {r['measured_s']:.3f} | {r['stored_error_pct']:+.1f}% | "
                  f"{r['error_pct']:+.1f}% |")
        if args.out:
            Path(args.out).write_text(json.dumps(rows, indent=1))
        return 0
    if args.part == "gpu":
        rows = gpu_rows()
        print(json.dumps(rows["rows"], indent=1))
        if args.out:
            Path(args.out).write_text(json.dumps(rows | {"machine": where.line(load())}, indent=1, default=str))
        return 0
    truth = truth_rows(args.scale) if args.part in ("truth", "both") else None
    emulated = emulated_rows() if args.part in ("emulated", "both") else None
    text = _markdown(truth, emulated)
    print(text)
    if args.out:
        Path(args.out).write_text(json.dumps({"truth": truth, "emulated": emulated, "machine": where.line(load())},
                                             indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
