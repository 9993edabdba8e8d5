"""Benchmark: even batches, proportional batches and hetpart's plan on an emulated node with a throttled GPU.

Issue 17's second target: on a mixed cluster, measured, even batches < proportional batches <= hetpart's
plan with uneven tensor parallelism. The cluster is one node of four A100-80GB on NVLink whose ``0/0/1``
computes at 0.6x (``slow:``, a throttled card); the model is GPT-3 2.7B, global batch 64 of 2,048 tokens.

* **even batches**: two data-parallel replicas, each an even TP-2 stage (``0/0/0``+``0/0/1`` and
  ``0/0/2``+``0/0/3``), 32 sequences each (what data parallelism does without knowing the speeds);
* **proportional batches**: the same replicas with shares in proportion to each replica's pace (its
  slowest device: 0.6 : 1, so 24 : 40 sequences);
* **hetpart**: ``hetpart plan`` (search) on the cluster: whatever it picks (since the search also plans on
  the cluster's speed-typed view, where the throttled GPU is a device type of its own, four data-parallel
  replicas with the throttled one's batch share cut to 10 of 64 sequences);
* **hetpart, uneven TP** (``hetpart-tp``): the search without that view (``speed_types=False``) and with
  even batch shares between replicas that differ only in speed (the evaluator's ``speed_shares`` off), what
  it picked before: a stage that is TP-2 over the throttled pair, split by the LP (the target's "plan with
  uneven tensor parallelism"; since the evaluator gives such replicas speed-proportional shares, the search
  prefers four data-parallel replicas, as with the view);
* **hetpart, cut for the emulated cluster** (``--recut``): the uneven-TP plan with its pipeline cut moved to
  where the simulator, priced by the first hetpart run's own profile, balances the stages of the shrunken
  model (its head is far lighter against a block than the real one's, so the real cut overloads the
  split stage); the split, devices, batches and schedule stay.

Every TP stage without a split (the even and proportional plans', hetpart's stage on the healthy pair) writes
its even split out (16:16 heads, 5,120:5,120 columns: what DTensor runs), so that every TP stage of every plan
runs the same code (local slices, Megatron's wrappers) and the same emulation of the throttled rank (its sleep
before each TP all-reduce, for the wall time it computed). At ``--scale small`` a DTensor half block took
about 1.6x the wall time (1.2x the CPU time) of a local-slice one here (2026-11-25: hetpart's stage on the
healthy pair, 18 blocks and the head for 16 micro-batches, computed 17-20 s, 12-13 CPU-s, against 11 s, 9
CPU-s, for 32 local-slice blocks for 8), which no plan's prediction prices.

All use hetpart's micro-batch, schedule and recompute. Each runs with ``hetpart run`` on local CPU
processes emulating the cluster (the throttled rank sleeps for the compute it would lose; links are
dilated by one fixed time factor for every run, so all runs emulate the same cluster), repeats interleaved
(even, proportional, hetpart, even, ...), the 1-minute load average read before and after each run.
Reported: measured step time (median of the runs), the simulator's prediction on the emulated cluster as
each run reports it, and the simulator's prediction for the real cluster. These are EMULATED measurements:
the slow rank's sleep and the links' delays follow the simulator's own formulas, so they check the runtime
and the plans' ranking under those formulas, not real hardware.

Scale and time factor: ``--scale small`` (hidden 256, 128 tokens) with links dilated 100x keeps the real
cluster's balance: the TP all-reduces are 2.9% of the even plan's emulated step as the simulator prices it
(2.7% on the real cluster). At ``--scale tiny`` (hidden 64, 32 tokens) and 800x they were 76% (3.47 of
4.54 s): the runs then measured the all-reduces' latency, which every micro-batch pays alike, and
proportional batches (more micro-batches on the fast pair) lost to even ones in prediction too.

Run: ``OMP_NUM_THREADS=1 python -m hetpart.experiments.bench_uneven_mixed [--repeats 2] [--steps 2]
[--scale small] [--recut]`` (``make bench BENCH=uneven-tp-mixed``; about 2.5 minutes per run at small).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["plans", "even_split", "recut", "measure", "section", "main"]

MODEL = "gpt3-2.7b"
GLOBAL_BATCH = 64
SEQ_LEN = 2048
SLOW = {"0/0/1": 0.6}
_CLUSTER = """name: node-one-throttled
nodes:
  - {count: 1, gpus_per_node: 4, gpu: A100-80GB, intra_node: NVLink3, nic: IB-HDR}
slow: {"0/0/1": 0.6}
"""
KINDS = ("even", "proportional", "hetpart")
TP = "hetpart-tp"
"""The search's plan without the speed-typed view: uneven tensor parallelism on the throttled pair."""
RECUT = "hetpart-recut"
TIME_FACTORS = {"tiny": 800.0, "small": 100.0}
"""Links' dilation per scale (module docstring): what keeps the real cluster's share of TP all-reduces."""


def _hetpart() -> list[str]:
    return [sys.executable, "-m", "hetpart.cli.app"]


def even_split(tp: int) -> dict[str, list[int]]:
    """The even split of the model's heads and feed-forward columns over ``tp`` devices, written out."""
    from hetpart.graph import load_model

    cfg = load_model(MODEL, seq_len=SEQ_LEN).config
    return {"heads": [cfg.num_heads // tp] * tp, "ffn": [cfg.ffn // tp] * tp}


def plans(cluster_path: Path) -> dict[str, dict]:
    """The three plans (see the module docstring), as plan JSON mappings."""
    from hetpart import Workload, load_cluster, load_model
    from hetpart.costmodel.evaluator import Evaluator
    from hetpart.policies.plan_search import plan_search

    cluster = load_cluster(cluster_path)
    model, work = load_model(MODEL, seq_len=SEQ_LEN), Workload(GLOBAL_BATCH, SEQ_LEN)
    hetpart = plan_search(model, cluster, work).plan.to_dict()
    even_shares = Evaluator(model, cluster, work)
    even_shares.speed_shares = False  # since 2026-11-28 the evaluator's speed shares make data parallelism win
    # the search's own structures (no walk of the policy's neighbourhood, which finds data parallelism here too)
    uneven_tp = plan_search(model, cluster, work, speed_types=False, walk=False, evaluator=even_shares).plan.to_dict()
    keep = ("global_batch", "micro_batch", "seq_len", "schedule", "recompute", "precision")
    base = {k: hetpart[k] for k in keep}
    groups = (("0/0/0", "0/0/1"), ("0/0/2", "0/0/3"))
    pace = [min(cluster.device(d).speed for d in g) for g in groups]
    micro = GLOBAL_BATCH // base["micro_batch"]
    first = round(micro * pace[0] / sum(pace))  # whole micro-batches, in proportion to each replica's pace
    layers = [0, hetpart["replicas"][0]["stages"][-1]["layers"][1]]

    def replicas(shares):
        return [{"batch_share": s, "stages": [{"layers": layers, "devices": list(g), "tp": 2,
                                               "tp_split": even_split(2)}]}
                for s, g in zip(shares, groups)]

    for r in hetpart["replicas"] + uneven_tp["replicas"]:  # even TP stages too: every TP stage runs one code path
        for s in r["stages"]:
            if s.get("tp", 1) > 1 and not s.get("tp_split"):
                s["tp_split"] = even_split(s["tp"])
    return {"even": dict(base, replicas=replicas([0.5, 0.5])),
            "proportional": dict(base, replicas=replicas([first / micro, 1 - first / micro])),
            "hetpart": {k: hetpart[k] for k in keep + ("replicas",)},
            TP: {k: uneven_tp[k] for k in keep + ("replicas",)}}


def _emulated(t: Path, plan: dict, scale: str, run: dict):
    """(shrunken graph, its plan, emulated cluster, emulated profile) of ``plan`` under ``run``'s calibration."""
    from hetpart.costmodel.profile import parse_profile
    from hetpart.plan import Plan
    from hetpart.runtime.emulation import emulated_cluster
    from hetpart.runtime.launch import RunOptions, emulated_profile, prepare_run

    emu = run["emulation"]
    prep = prepare_run(Plan.from_dict(plan), MODEL, str(t / "cluster.yaml"), RunOptions(scale=scale))
    cluster = emulated_cluster(prep.cluster, prep.run_plan, emu["peak_tflops"], emu["time_factor"],
                               emu["memory_gbyte_s"], emu["precision"])
    profile = parse_profile(run["predicted"]["predictor"]["options"]["profile"])
    return prep.run_graph, prep.run_plan, cluster, emulated_profile(profile, prep.cluster, prep.run_plan,
                                                                    prep.plan.precision)


def recut(t: Path, plan: dict, scale: str, run: dict) -> tuple[dict, list[tuple[int, float]]] | None:
    """``plan`` (one replica of two stages) with the cut between its stages where the simulator, on the
    emulated cluster of ``run`` (a ``hetpart run --json`` result: its calibration and in-run profile),
    predicts the shortest step; and the predicted step of every cut. None for other shapes."""
    from hetpart.runtime.measure import predict

    if len(plan["replicas"]) != 1 or len(plan["replicas"][0]["stages"]) != 2:
        return None
    last = plan["replicas"][0]["stages"][1]["layers"][1]
    tried = []
    for cut in range(2, last - 1):
        stages = [dict(s) for s in plan["replicas"][0]["stages"]]
        stages[0]["layers"], stages[1]["layers"] = [0, cut], [cut, last]
        candidate = dict(plan, replicas=[dict(plan["replicas"][0], stages=stages)])
        graph, small, cluster, profile = _emulated(t, candidate, scale, run)
        tried.append((cut, predict(graph, cluster, small, profile=profile)["step_time_s"], candidate))
    cut, _, best = min(tried, key=lambda x: x[1])
    return best, [(c, s) for c, s, _ in tried]


def cross_predictions(m: dict) -> list[dict[str, float]]:
    """Every plan predicted under every run's calibration (each run's in-run profile and emulated peaks): the
    plans compared on one emulated cluster at a time, which the per-run predictions (each under its own
    run's load) are not. One mapping ``plan -> predicted s/step`` per run."""
    from hetpart.runtime.measure import predict

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        (t / "cluster.yaml").write_text(_CLUSTER)
        for k0 in m["kinds"]:
            for r in m[k0].get("runs", []):
                if not r.get("profile"):
                    continue
                run = {"emulation": r["emulation"], "predicted": {"predictor": {"options": {"profile": r["profile"]}}}}
                row = {}
                for k in m["kinds"]:
                    graph, small, cluster, profile = _emulated(t, m[k]["plan"], m["scale"], run)
                    row[k] = predict(graph, cluster, small, profile=profile)["step_time_s"]
                rows.append(row)
    return rows


def _predicted_real(t: Path, name: str) -> float:
    cmd = _hetpart() + ["predict", "--model", MODEL, "--cluster", str(t / "cluster.yaml"), "--global-batch",
                        str(GLOBAL_BATCH), "--seq-len", str(SEQ_LEN), "--plan", str(t / f"{name}.json"), "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise RuntimeError(f"{name}: hetpart predict failed: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout)["metrics"]["step_time_s"]


def _load() -> float:
    return os.getloadavg()[0]


def measure(repeats: int = 2, steps: int = 2, time_factor: float | None = None, scale: str = "small",
            with_recut: bool = False, log=None) -> dict:
    """Measured (emulated) and predicted step times of the plans, repeats interleaved.

    ``time_factor``: the links' emulation slowdown, the same for every run (default
    :data:`TIME_FACTORS` of the scale; each run deriving its own would emulate a different cluster per run
    and per load). ``with_recut``: also run :data:`RECUT`, cut by the first hetpart run's calibration."""
    time_factor = time_factor or TIME_FACTORS.get(scale, TIME_FACTORS["small"])
    env = dict(os.environ, OMP_NUM_THREADS="1")
    kinds = KINDS + (TP,) + ((RECUT,) if with_recut else ())
    out: dict[str, dict] = {k: {"measured": [], "predicted_emulated": [], "losses": [], "loads": []} for k in kinds}
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        (t / "cluster.yaml").write_text(_CLUSTER)
        built = plans(t / "cluster.yaml")
        for name, plan in built.items():
            (t / f"{name}.json").write_text(json.dumps(plan))
            out[name]["plan"] = plan
            out[name]["predicted_real"] = _predicted_real(t, name)
        for i in range(repeats):
            for name in kinds:
                if name == RECUT and name not in built:
                    continue
                before = _load()
                cmd = _hetpart() + ["run", str(t / f"{name}.json"), "--model", MODEL, "--cluster", str(t / "cluster.yaml"),
                                    "--steps", str(steps), "--scale", scale, "--log-every", "0", "--time-factor",
                                    str(time_factor), "--json"]
                done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
                if done.returncode:
                    raise RuntimeError(f"{name}: hetpart run failed: {done.stderr.strip().splitlines()[-1:]}")
                result = json.loads(done.stdout)
                o = out[name]
                o["measured"].append(result["measured"]["step_time_s"])
                o["predicted_emulated"].append(result["predicted"]["step_time_s"])
                o["losses"].append(result["measured"]["losses"][-1])
                o["loads"].append((before, _load()))
                o.setdefault("runs", []).append({"stages": result["measured"].get("stages"),
                                                 "ranks": result["measured"].get("ranks"),
                                                 "profile": result["predicted"]["predictor"]["options"].get("profile"),
                                                 "emulation": {k: v for k, v in result["emulation"].items()
                                                               if k not in ("profile", "real_transport_s")}})
                if log:
                    log(f"repeat {i + 1} {name}: measured {o['measured'][-1]:.2f} s, predicted "
                        f"{o['predicted_emulated'][-1]:.2f} s, load {before:.2f} -> {_load():.2f}")
                if with_recut and name == TP and RECUT not in built:
                    found = recut(t, built[TP], scale, result)
                    if found is not None:
                        built[RECUT], out[RECUT]["cuts"] = found
                        (t / f"{RECUT}.json").write_text(json.dumps(built[RECUT]))
                        out[RECUT]["plan"] = built[RECUT]
                        out[RECUT]["predicted_real"] = _predicted_real(t, RECUT)
    kinds = tuple(k for k in kinds if out[k]["measured"])
    for name in kinds:
        out[name]["measured_median"] = statistics.median(out[name]["measured"])
        out[name]["predicted_emulated_median"] = statistics.median(out[name]["predicted_emulated"])
    out["kinds"] = kinds
    out["loads"] = [x for k in kinds for pair in out[k]["loads"] for x in pair]
    out["time_factor"] = time_factor
    out["scale"] = scale
    out["repeats"] = repeats
    out["steps"] = steps
    return out


def _describe(plan: dict) -> str:
    parts = []
    for r in plan["replicas"]:
        stages = []
        for s in r["stages"]:
            split = s.get("tp_split")
            even = split and len(set(split.get("heads", [0]))) == 1 and len(set(split.get("ffn", [0]))) == 1
            how = f"TP-{s['tp']} " + ("+".join(s["devices"])) + (f" split {split}" if split and not even else "")
            stages.append(f"units {s['layers'][0]}-{s['layers'][1] - 1} on {how}")
        parts.append(f"{round(r['batch_share'] * plan['global_batch'])} seq.: " + ", then ".join(stages))
    return "; ".join(parts)


def _flat_note(m: dict) -> str:
    """Says so when the simulator itself, on the emulated cluster of the shrunken model, cannot tell the plans
    apart or ranks them otherwise than on the real cluster: the runs then do not test the target's regime."""
    emulated = [m[k]["predicted_emulated_median"] for k in KINDS]
    real = [m[k]["predicted_real"] for k in KINDS]
    spread = max(emulated) / min(emulated) - 1
    order = lambda xs: sorted(range(len(xs)), key=xs.__getitem__)  # noqa: E731
    if spread >= 0.05 and order(emulated) == order(real):
        return ""
    why = (f"within {spread * 100:.0f}% of each other" if spread < 0.05 else
           "in another order than on the real cluster")
    return (f" The simulator's predictions for the emulated cluster of the three plans are {why}: on the emulated "
            "cluster of a shrunken model what dominates a plan's step is not what dominates it on the real one, so "
            "the measured order of these three says how the runtime follows the simulator, not whether the target "
            "holds on the real cluster.")


def _table(m: dict) -> list[str]:
    rows = ["| plan | what runs | measured s/step (median) | runs (load before -> after) | predicted, emulated "
            "cluster (median) | error | predicted, real cluster |", "|---|---|---|---|---|---|---|"]
    for k in m["kinds"]:
        o = m[k]
        runs = ", ".join(f"{x:.2f} ({a:.1f} -> {b:.1f})" for x, (a, b) in zip(o["measured"], o["loads"]))
        err = 100 * (o["predicted_emulated_median"] / o["measured_median"] - 1)
        rows.append(f"| {k} | {_describe(o['plan'])} | {o['measured_median']:.2f} | {runs} | "
                    f"{o['predicted_emulated_median']:.2f} | {err:+.0f}% | {o['predicted_real']:.2f} |")
    return rows


def _paired(m: dict, a: str, b: str) -> list[float]:
    return [x / y for x, y in zip(m[a]["measured"], m[b]["measured"])]


def _tp_text(m: dict) -> str:
    """The uneven-TP plan against the target's other plans (empty when it did not run)."""
    if TP not in m["kinds"]:
        return ""
    e, p, t = m["even"]["measured_median"], m["proportional"]["measured_median"], m[TP]["measured_median"]
    return (f" hetpart's uneven-TP plan (`{TP}`): over even {e / t:.2f}x, over proportional {p / t:.2f}x measured "
            f"(paired {', '.join(f'{x:.2f}' for x in _paired(m, 'proportional', TP))}), "
            f"{m['proportional']['predicted_real'] / m[TP]['predicted_real']:.2f}x over proportional predicted on the "
            f"real cluster; the target with it as hetpart's plan **{'holds' if e > p >= t else 'does not hold'}**.")


def section(repeats: int = 2, steps: int = 2, scale: str = "small", with_recut: bool = True, m: dict | None = None):
    """docs/BENCHMARKS.md's section ``uneven-tp-mixed`` (``make bench BENCH=uneven-tp-mixed``); ``m``: the
    measurements of an earlier :func:`measure` (``--from-json``) instead of measuring now."""
    from hetpart.experiments.benchdoc import Section, load, machine

    where = machine()
    if m is None:
        m = measure(repeats, steps, scale=scale, with_recut=with_recut)
    repeats, scale, with_recut = m["repeats"], m["scale"], RECUT in m["kinds"]
    steps = m.get("steps", steps)
    e, p, h = (m[k]["measured_median"] for k in KINDS)
    pe, pp, ph = (m[k]["predicted_emulated_median"] for k in KINDS)
    holds = e > p >= h
    fmt = lambda xs: ", ".join(f"{x:.2f}" for x in xs)  # noqa: E731
    recut_text = ""
    if RECUT in m["kinds"]:
        r, pr = m[RECUT]["measured_median"], m[RECUT]["predicted_emulated_median"]
        best = min(m[RECUT]["cuts"], key=lambda x: x[1])[0]
        cuts = ", ".join(f"{c}: {s:.2f}" for c, s in m[RECUT]["cuts"] if abs(c - best) <= 3)
        recut_text = (
            f"\n\n**hetpart, cut for the emulated cluster**: the first hetpart run's calibration prices every cut of "
            f"its pipeline (predicted s/step by first unit of the second stage: {cuts}). Measured {r:.2f} s: over "
            f"even {e / r:.2f}x, over proportional {p / r:.2f}x (paired runs {fmt(_paired(m, 'proportional', RECUT))}); "
            f"predicted on the emulated cluster over proportional {pp / pr:.2f}x. Target with this plan as hetpart's "
            f"(even < proportional <= hetpart, measured medians): **{'holds' if e > p >= r else 'does not hold'}**.")
    cross = cross_predictions(m)
    cross_text = ""
    if cross:
        def ratio(a: str, b: str) -> str:
            xs = sorted(r[a] / r[b] for r in cross)
            return f"{statistics.median(xs):.3f} ({xs[0]:.3f}-{xs[-1]:.3f})"

        pairs = [("even", "proportional"), ("proportional", "hetpart")] + (
            [("proportional", TP)] if TP in m["kinds"] else []) + (
            [("proportional", RECUT), (TP, RECUT)] if RECUT in m["kinds"] else [])
        lines = ["| ratio of step times | predicted, one calibration at a time: median (range) | measured: "
                 "ratio of medians (paired runs) |", "|---|---|---|"]
        for a, b in pairs:
            lines.append(f"| {a} / {b} | {ratio(a, b)} | {m[a]['measured_median'] / m[b]['measured_median']:.3f} "
                         f"({fmt(_paired(m, a, b))}) |")
        cross_text = (f"\n\n**Predicted against measured, plan against plan.** Each run's calibration (its in-run "
                      f"profile, {len(cross)} runs) prices every plan on its emulated cluster; above 1, the second plan "
                      "is faster.\n\n" + "\n".join(lines))
    body = (
        "EMULATED, not real hardware: local CPU processes, the throttled rank sleeping for the compute it would lose "
        "and the links delayed by the simulator's own formulas (one fixed time factor, "
        f"{m['time_factor']:g}, for every run). One node of four A100-80GB (NVLink3), `0/0/1` at 0.6x (`slow:`); "
        f"{MODEL} ({SEQ_LEN} tokens, global batch {GLOBAL_BATCH}) run shrunken (`--scale {scale}`), {steps} measured "
        f"steps per run after 2 warm-up steps, {repeats} runs of each plan interleaved; load average (1 min) "
        f"before and after each run in the runs column, {min(m['loads']):.1f} to {max(m['loads']):.1f} in all. "
        "Every TP stage without a split writes its even split out (one code path and one emulation of the "
        "throttled rank for every stage of every plan).\n\n" + "\n".join(_table(m)) +
        f"\n\nMeasured speed-ups over even batches: proportional {e / p:.2f}x (paired runs "
        f"{fmt(_paired(m, 'even', 'proportional'))}), hetpart {e / h:.2f}x (paired {fmt(_paired(m, 'even', 'hetpart'))}); "
        f"hetpart over proportional {p / h:.2f}x (paired {fmt(_paired(m, 'proportional', 'hetpart'))}). Predicted on "
        f"the emulated cluster: proportional {pe / pp:.2f}x, hetpart {pe / ph:.2f}x; on the real cluster: proportional "
        f"{m['even']['predicted_real'] / m['proportional']['predicted_real']:.2f}x, hetpart "
        f"{m['even']['predicted_real'] / m['hetpart']['predicted_real']:.2f}x. Target (even < proportional <= "
        f"hetpart, measured medians): **{'holds' if holds else 'does not hold'}** on these runs." + _tp_text(m)
        + _flat_note(m) + recut_text + cross_text +
        "\n\nHow far to trust it: four ranks share this machine's two cores (and other engineers' jobs, see the "
        "loads), so ranks that compute at the same time slow each other down; in the data-parallel plans all four "
        "compute at once, in a pipeline the stages take turns during the bubbles. The in-run profile that prices "
        "the predictions is measured by all four ranks at once, before and after the steps.")
    cmd = (f"OMP_NUM_THREADS=1 python -m hetpart.experiments.bench_uneven_mixed --repeats {repeats} --steps {steps}"
           f" --scale {scale}" + (" --recut" if with_recut else ""))
    return Section("uneven-tp-mixed", "Uneven tensor parallelism on an emulated node with a throttled GPU (issue 17)",
                   body, cmd, where, load_after=load())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--scale", default="small", help="the shrunken model that runs: tiny, small or a hidden size")
    ap.add_argument("--time-factor", type=float, default=None,
                    help=f"links' dilation (default by scale: {TIME_FACTORS})")
    ap.add_argument("--recut", action="store_true", help="also run hetpart's plan cut for the emulated cluster")
    ap.add_argument("--write", action="store_true", help="rewrite the section of docs/BENCHMARKS.md")
    ap.add_argument("--json-out", default=None, help="also write the measurements to this JSON file")
    ap.add_argument("--from-json", default=None, help="with --write: the measurements of an earlier --json-out")
    a = ap.parse_args(argv)
    if a.write:
        from hetpart.experiments.benchdoc import write_section

        m = json.loads(Path(a.from_json).read_text()) if a.from_json else None
        write_section(section(a.repeats, a.steps, a.scale, a.recut, m=m))
        return
    m = measure(a.repeats, a.steps, a.time_factor, a.scale, a.recut, log=lambda s: print(s, file=sys.stderr, flush=True))
    text = json.dumps(m, indent=1, default=str)
    if a.json_out:
        Path(a.json_out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
