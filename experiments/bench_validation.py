"""The simulator against published measured runs and this project's own GPU measurements.

Three sources of truth, each split into FITTING rows (some constant of the cost model was solved from
them) and HELD-OUT rows (nothing was tuned on them):

1. ``experiments/data/published_runs.csv``: published end-to-end runs with every setting the
   simulator needs (GPU, nodes, links, shape, batch, micro-batch, TP/PP/DP, schedule, recompute,
   precision, attention kernel) and the published number (step time, or TFLOPS per GPU counted as the
   paper counts them). Fair sources only: Korthikanti et al. 2022, Narayanan et al. 2021, Shoeybi et
   al. 2019 and the Llama 3 paper; rows the simulator cannot express are listed with the reason.
2. ``experiments/data/h100_runs.jsonl``: ten real training runs on one H100 (hetpart's runtime, no
   emulation), re-predicted from their records with the runtime's own options (``kernels="torch"``: its
   Hugging Face modules, and gradient all-reduces after the backward). Held out.
3. ``experiments/data/h100_unit_profile.json``: per-unit forward/backward times of five models at
   micro-batches 1-8 in bf16, TF32 and fp32 on the same H100. Held out (only its GEMM sweep, a
   separate part of the file, fitted the Hopper curve).

``python -m hetpart.experiments.bench_validation`` prints the section;
``make bench BENCH=simulator-validation`` writes it into docs/BENCHMARKS.md;
``--count-ops`` recounts the operators per unit that :data:`hetpart.costmodel.compute.OPS_PER_UNIT`
holds (torch.profiler on the runtime's units, CPU).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PublishedRow", "load_published", "predict_published", "GPU_RUN_FILES", "gpu_run_rows", "h100_run_rows", "h100_unit_summary",
           "signed_band", "ampere_band", "hopper_band", "volta_band", "section",
           "count_ops", "main"]

DATA = Path(__file__).resolve().parent / "data"
PUBLISHED = DATA / "published_runs.csv"
METRICS = ("step_time_s", "hw_tflops_per_gpu", "model_tflops_per_gpu")
_INT_FIELDS = ("nodes", "gpus_per_node", "nics_per_node", "layers", "hidden", "heads", "vocab", "seq_len",
               "global_batch", "tp", "pp", "dp", "cp", "interleave")


@dataclass(frozen=True)
class PublishedRow:
    """One published run (a line of ``published_runs.csv``)."""

    fields: dict
    """Every column as read (numbers converted)."""

    @property
    def id(self) -> str:
        return self.fields["id"]

    @property
    def role(self) -> str:
        return self.fields["role"]


@dataclass(frozen=True)
class Result:
    id: str
    role: str
    source: str
    setup: str
    metric: str
    published: float
    predicted: float | None
    """None where the simulator cannot express the run (``why``)."""
    why: str = ""

    @property
    def error_pct(self) -> float | None:
        """Signed error, % of the published value; positive means predicted too slow (time up, rate down)."""
        if self.predicted is None:
            return None
        if self.metric == "step_time_s":
            return 100.0 * (self.predicted / self.published - 1.0)
        return 100.0 * (self.published / self.predicted - 1.0)


def load_published(path: Path = PUBLISHED) -> list[PublishedRow]:
    """The rows of ``path``; a malformed row raises ValueError naming the row and the column."""
    rows = []
    with path.open(newline="") as fh:
        for number, raw in enumerate(csv.DictReader(fh), 2):
            fields = dict(raw)
            for key in _INT_FIELDS:
                try:
                    fields[key] = int(fields[key])
                except (TypeError, ValueError):
                    raise ValueError(f"{path}:{number}: {key}: expected a whole number, got {fields[key]!r}") from None
            fields["published"] = float(fields["published"])
            if fields["role"] not in ("fit", "heldout") or fields["metric"] not in METRICS:
                raise ValueError(f"{path}:{number}: role must be fit or heldout and metric one of {METRICS}")
            rows.append(PublishedRow(fields))
    return rows


def _setup(f: dict) -> str:
    mb = f["micro_batch"]
    return (f"{f['gpu']} x {f['nodes'] * f['gpus_per_node']}, h={f['hidden']} L={f['layers']}, seq {f['seq_len']}, "
            f"batch {f['global_batch']}/mb {mb}, TP{f['tp']} PP{f['pp']} DP{f['dp']}"
            f"{' CP' + str(f['cp']) if f['cp'] > 1 else ''}, {f['recompute']}, "
            f"{f['precision']}")


def predict_published(row: PublishedRow, options: dict | None = None) -> Result:
    """The simulator's number for one published row (in the row's metric); ``options``: further
    :class:`~hetpart.costmodel.Simulator` options (``curve_of``, ``op_counts``)."""
    from hetpart import Workload, load_model
    from hetpart.cluster import parse_cluster
    from hetpart.costmodel import Simulator, megatron_plan
    from hetpart.graph.transformer import TransformerConfig, transformer_graph

    f = row.fields
    base = Result(row.id, row.role, f"{f['source']}, {f['where']}", _setup(f), f["metric"], f["published"], None)
    if f["note"].startswith("not expressible"):
        return Result(**{**base.__dict__, "why": f["note"]})
    if f["model"] == "gpt":
        cfg = TransformerConfig("gpt2", f["layers"], f["hidden"], f["heads"], f["vocab"], f["seq_len"])
        model = transformer_graph(cfg, row.id, f["seq_len"], 2 if f["precision"] in ("bf16", "fp16", "fp8") else 4)
    else:
        model = load_model(f["model"], seq_len=f["seq_len"], precision=f["precision"])
    cluster = parse_cluster({"name": row.id, "nodes": [
        {"count": f["nodes"], "gpus_per_node": f["gpus_per_node"], "gpu": f["gpu"], "intra_node": f["intra_node"],
         "nic": f["nic"], "nics_per_node": f["nics_per_node"]}]}, source=str(PUBLISHED))
    workload = Workload(f["global_batch"], f["seq_len"], precision=f["precision"], attention=f["attention"])
    per_replica = f["global_batch"] // f["dp"]
    mbs = [1, 2, 4, 8] if f["micro_batch"] == "best" else [int(f["micro_batch"])]
    sim = Simulator(model, cluster, **(options or {}))
    best = None
    for mb in mbs:
        if per_replica % mb:
            continue
        plan = megatron_plan(model, cluster, workload, f["tp"], f["pp"], f["dp"], mb, schedule=f["schedule"],
                             interleave=f["interleave"], recompute=f["recompute"], cp=f["cp"])
        pred = sim.simulate(plan, validate=False)
        value = {"step_time_s": pred.step_time_s, "hw_tflops_per_gpu": pred.metrics["hardware_tflops_per_device"],
                 "model_tflops_per_gpu": pred.metrics["model_tflops_per_device"]}[f["metric"]]
        # the fastest micro-batch that fits (the published runs were tuned); memory is not checked where
        # the run sharded its optimizer (the note says so)
        fits = pred.fits_in_memory or "FSDP" in f["note"]
        better = best is None or (value < best if f["metric"] == "step_time_s" else value > best)
        if fits and better:
            best = value
    if best is None:
        return Result(**{**base.__dict__, "why": "predicted not to fit in memory at any micro-batch"})
    return Result(**{**base.__dict__, "predicted": best})


GPU_RUN_FILES = (DATA / "h100_runs.jsonl", DATA / "h200_runs.jsonl")
"""The repo's real runs of hetpart's runtime on one GPU (no emulation): an H100 (2026-11-24) and an H200
(2026-11-29, a GPU the project has never fitted anything on)."""


def gpu_run_rows(paths: tuple[Path, ...] = GPU_RUN_FILES, options: dict | None = None) -> list[Result]:
    """The repo's real GPU runs (:data:`GPU_RUN_FILES`), re-predicted from their records by the simulator as
    the runtime prices its own runs: step time (``options``: further simulator options). Row ids name the GPU
    (``h100-run-3``, ``h200-run-1``)."""
    from hetpart.costmodel.predictor import get_predictor
    from hetpart.records import iter_records
    from hetpart.workload import Workload

    out = []
    for path in paths:
        for line, record in iter_records(path):
            plan = record.run_plan(f"{path}:{line}")
            workload = Workload(**record.workload)
            cluster = record.prediction_cluster(f"{path}:{line}")
            # the runtime's own options (runtime.measure.predict): its kernels are PyTorch's (Hugging Face modules)
            sim = get_predictor("simulator", record.model_graph(), cluster, workload,
                                **{"overlap_grad_reduce": False, "kernels": "torch", **(options or {})})
            pred = {"metrics": sim.predict(plan, workload).metrics}
            cfg = record.model.run_config or {}
            gpus = sorted({cluster.device(d).gpu.name for d in plan.devices})
            setup = (f"{'+'.join(gpus)} x {plan.num_devices}, h={cfg.get('hidden_size')} L={cfg.get('num_layers')}, "
                     f"seq {plan.seq_len}, batch {plan.global_batch}/mb {plan.micro_batch}, {plan.recompute}, "
                     f"{plan.precision}")
            when = record.environment.time_utc[:10] if record.environment else "date not recorded"
            short = gpus[0].split("-")[0]
            out.append(Result(f"{short.lower()}-run-{line}", "heldout", f"hetpart runtime on one {short} ({when})",
                              setup, "step_time_s", record.measured.step_time_s, pred["metrics"]["step_time_s"]))
    return out


def h100_run_rows(path: Path = DATA / "h100_runs.jsonl", options: dict | None = None) -> list[Result]:
    """The real H100 runs alone (:func:`gpu_run_rows` of one file)."""
    return gpu_run_rows((path,), options)


def h100_unit_summary(path: Path = DATA / "h100_unit_profile.json", curve=None) -> list[dict]:
    """Per precision and micro-batch: geometric mean and spread of simulator / measured over the blocks
    and heads of the five profiled models (forward and backward); ``curve``: the H100's efficiency curve
    where it is not the shipped one."""
    from hetpart.experiments.bench_gpu_profile import compare

    rows = compare(json.loads(path.read_text()), "H100-80GB", curve)
    out = []
    for prec in ("bf16", "tf32", "fp32"):
        for mb in (1, 2, 4, 8):
            logs = [math.log(r[k]) for r in rows if r["precision"] == prec and r["micro_batch"] == mb
                    for k in ("fwd_ratio", "bwd_ratio")]
            within = sum(abs(x) <= math.log(1.25) for x in logs) / len(logs)
            out.append({"precision": prec, "micro_batch": mb, "geomean": math.exp(sum(logs) / len(logs)),
                        "min": math.exp(min(logs)), "max": math.exp(max(logs)), "within_25pct": within, "n": len(logs)})
    return out


def signed_band(pct: list[float]) -> dict:
    """An error band of :data:`hetpart.costmodel.provenance.ERROR_BANDS` from signed step-time errors in %
    (``predicted / measured - 1``, negative too fast): ``{"mean_abs_pct", "signed_pct", "rows"}``, rounded
    as the table holds them."""
    return {"mean_abs_pct": round(sum(map(abs, pct)) / len(pct), 1),
            "signed_pct": [round(min(pct), 1), round(max(pct), 1)], "rows": len(pct)}


def ampere_band() -> dict:
    """``fitted:ampere`` recomputed: the in-sample residuals of the A100 fit, Korthikanti et al. 2022 Table 5
    (8 step times) and Narayanan et al. 2021 Table 1 (10 throughputs, as step times: published / predicted
    TFLOPS - 1), from :mod:`hetpart.costmodel.calibration` (``make bench BENCH=simulator-calibration``)."""
    from hetpart.costmodel.calibration import table1_validation, table5_comparison

    pct = [r.error_pct for r in table5_comparison()]
    pct += [100.0 * (v.published_tflops / v.predicted_tflops - 1.0) for v in table1_validation()]
    return signed_band(pct)


def volta_band() -> dict:
    """``fitted:volta`` recomputed: the one held-out check of the anchored Volta curve, Shoeybi et al. 2019's
    8.3B on 512 V100s (:func:`hetpart.costmodel.calibration.megatron_8p3b_check`), as a step time."""
    from hetpart.costmodel.calibration import megatron_8p3b_check

    v = megatron_8p3b_check()
    return signed_band([100.0 * (v.published_tflops / v.predicted_tflops - 1.0)])


def hopper_band() -> dict:
    """``fitted:hopper`` recomputed: every held-out Hopper row, the Llama 3 405B rows of
    ``published_runs.csv`` (``l24-*``, step-time terms) and the real runs of :data:`GPU_RUN_FILES` (11 on an
    H100, one on an H200)."""
    pct = [r.error_pct for r in map(predict_published, load_published()) if r.id.startswith("l24")]
    pct += [r.error_pct for r in gpu_run_rows()]
    if any(p is None for p in pct):
        raise ValueError(f"{PUBLISHED}: a Llama 3 row is no longer expressible; the hopper band has no value for it")
    return signed_band(pct)


def _mean_abs(results: list[Result]) -> float:
    errs = [abs(r.error_pct) for r in results if r.error_pct is not None]
    return sum(errs) / len(errs) if errs else float("nan")


def _table(results: list[Result]) -> str:
    lines = ["| row | role | source | setup | metric | published | predicted | error |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        pred = f"{r.predicted:.3g}" if r.predicted is not None else f"- ({r.why})"
        err = f"{r.error_pct:+.1f}%" if r.error_pct is not None else "-"
        lines.append(f"| {r.id} | {r.role} | {r.source} | {r.setup} | {r.metric} | {r.published:g} | {pred} | {err} |")
    return "\n".join(lines)


def _groups(results: list[Result]) -> list[str]:
    groups = [("fitting: Korthikanti et al. 2022, Table 5", lambda r: r.id.startswith("k22")),
              ("fitting: Narayanan et al. 2021, Table 1", lambda r: r.id.startswith("n21")),
              ("fitting (anchor, one number): Shoeybi et al. 2019, 1.2B on one V100", lambda r: r.id.startswith("s19-1.2b")),
              ("held out: Shoeybi et al. 2019, 8.3B on 8 and 512 V100", lambda r: r.id.startswith("s19-8.3b")),
              ("held out: Llama 3 405B on H100", lambda r: r.id.startswith("l24")),
              ("held out: hetpart runtime on one H100", lambda r: r.id.startswith("h100-run")),
              ("held out: hetpart runtime on one H200 (nothing fitted on it)", lambda r: r.id.startswith("h200-run"))]
    out = []
    for name, pick in groups:
        chosen = [r for r in results if pick(r)]
        scored = [r for r in chosen if r.error_pct is not None]
        slow = sum(r.error_pct > 0 for r in scored)
        out.append(f"| {name} | {len(scored)} of {len(chosen)} | {_mean_abs(chosen):.1f}% | "
                   f"{max((abs(r.error_pct) for r in scored), default=float('nan')):.1f}% | {slow} of {len(scored)} |")
    return ["| rows | expressed | mean abs error | worst | predicted too slow |", "|---|---|---|---|---|", *out]


def section():
    """Run every row and return the ``simulator-validation`` block."""
    from hetpart.experiments.benchdoc import Section, load, machine

    where = machine()
    results = [predict_published(r) for r in load_published()] + gpu_run_rows()
    units = h100_unit_summary()
    unit_lines = ["| precision | micro-batch | geometric mean | range | within 25% |", "|---|---|---|---|---|"]
    for u in units:
        unit_lines.append(f"| {u['precision']} | {u['micro_batch']} | {u['geomean']:.2f} | {u['min']:.2f}-{u['max']:.2f} | "
                          f"{u['within_25pct'] * 100:.0f}% of {u['n']} |")
    body = (
        "Every row is predicted by the shipped simulator (`Simulator`, Megatron-LM placement via `megatron_plan`) "
        "from the settings in `experiments/data/published_runs.csv` (source, table, every setting, the published "
        "number) and from the run records in `experiments/data/h100_runs.jsonl` and `h200_runs.jsonl`. Error sign: positive means "
        "predicted too slow (step time too long or TFLOPS too low). FITTING rows determined constants of the cost "
        "model (the Ampere curve, the Volta anchor); HELD-OUT rows never tuned anything. Where a paper does not "
        "publish a setting the choice is stated in the row's note (csv).\n\n"
        "#### Summary\n\n" + "\n".join(_groups(results)) + "\n\n"
        "#### Per row\n\n" + _table(results) + "\n\n"
        "#### Per-unit times on one H100 (held out): simulator / measured\n\n"
        "Blocks and heads of gpt2-small, gpt2-medium, gpt2-xl, gpt3-2.7b and llama2-7b (Hugging Face modules, SDPA "
        "attention, unpadded GPT-2 vocabulary), forward and backward, from `experiments/data/h100_unit_profile.json` "
        "(`python -m hetpart.experiments.bench_gpu_profile`); 1.00 is exact, below 1 the simulator is too fast.\n\n"
        + "\n".join(unit_lines))
    return Section("simulator-validation", "Validation against published and measured runs", body,
                   "python -m hetpart.experiments.run_all simulator-validation", where, load_after=load(), level=3)


def count_ops(models: tuple[str, ...] = ("gpt2-small", "llama2-7b")) -> dict[str, dict[str, tuple[int, int]]]:
    """Top-level ATen operators the runtime's embedding, first block and head dispatch, forward and backward
    (one micro-batch of 64 tokens on the CPU, torch.profiler)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from hetpart.runtime.models import build_units, runnable_spec

    def count(fn) -> int:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            fn()
        evs = [e for e in prof.events() if e.name.startswith("aten::")]
        return len([e for e in evs if not (e.cpu_parent and e.cpu_parent.name.startswith("aten::"))])

    out = {}
    for name in models:
        spec = runnable_spec(name, scale=256)
        units = build_units(spec, [0, 1, spec.num_units - 1])
        x = torch.randint(0, 100, (1, 64))
        counts = {}
        inp = x
        for kind, unit in zip(("embedding", "block", "head"), units):
            unit(inp)  # warm up
            box = {}
            fwd = count(lambda box=box, unit=unit, inp=inp: box.setdefault("y", unit(inp)))
            y = box["y"][0] if isinstance(box["y"], tuple) else box["y"]
            bwd = count(lambda y=y: y.float().sum().backward())
            counts[kind] = (fwd, bwd)
            inp = y.detach().requires_grad_(y.is_floating_point())
        out[name] = counts
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count-ops", action="store_true", help="recount the operators per unit and exit")
    args = ap.parse_args(argv)
    if args.count_ops:
        print(json.dumps(count_ops(), indent=1))
        return 0
    from hetpart.experiments.benchdoc import render

    print(render(section()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
