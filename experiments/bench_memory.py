"""Benchmark: peak memory of real CPU runs against the simulator (issue 9's and issue 10's memory targets).

Each case is a real ``hetpart run`` on this machine (gloo, one process per plan device, shrunken
gpt2-small): a 2-stage 1F1B pipeline (tiny and small scale, recompute none and full, 8 micro-batches, GPipe), a
4-stage pipeline, a 2-stage pipeline of TP-2 stages, a 2-device interleaved pipeline of 2 chunks each, and ZeRO
data-parallel pairs. The runtime reports, per rank, the peak of its live tensor bytes in one extra untimed step
(``memory_method`` ``live_tensors``, :mod:`hetpart.runtime.live_memory`: every tensor storage alive, the
weights, gradients and optimizer states included), the quantity ``torch.cuda.max_memory_allocated`` gives
on a GPU. So the device's whole predicted peak (:class:`~hetpart.costmodel.Simulator`, with the options of
the run record: the ``torch`` kernel set) is compared with the measured peak directly, nothing subtracted.
Records of older runs (``rss_peak_delta``: resident-set growth during a step, blind to the state at rest)
are compared as before, their growth against the prediction less the state at rest (``_at_rest_gb``).

Run: ``OMP_NUM_THREADS=1 python -m hetpart.experiments.bench_memory`` (about 10 minutes on the shared
2-core machine); ``--write`` rewrites the ``memory-validation`` section of docs/BENCHMARKS.md;
``--records FILE`` re-predicts records measured before instead of running (the runs of docs/BENCHMARKS.md:
``experiments/data/cpu_memory_runs_live.jsonl``, live-tensor peaks, 2026-11-30; the older
``experiments/data/cpu_memory_runs_mmap.jsonl``, resident-set growth).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["CASES", "run_case", "compare", "section", "main"]

_PIPE = {"global_batch": 8, "seq_len": 512, "schedule": "1f1b", "interleave": 1, "precision": "bf16",
         "replicas": [{"batch_share": 1.0, "stages": [{"layers": [0, 7], "devices": ["0/0/0"], "tp": 1},
                                                      {"layers": [7, 14], "devices": ["0/0/1"], "tp": 1}]}],
         "meta": {"model": "gpt2-small", "cluster": "tiny-mixed"}}
_ZERO = {"global_batch": 8, "micro_batch": 2, "seq_len": 128, "schedule": "1f1b", "recompute": "none",
         "replicas": [{"batch_share": 0.5, "stages": [{"layers": [0, 14], "devices": ["0/0/0"], "tp": 1}]},
                      {"batch_share": 0.5, "stages": [{"layers": [0, 14], "devices": ["0/0/1"], "tp": 1}]}],
         "meta": {"model": "gpt2-small", "cluster": "tiny-mixed"}}

_PIPE4 = [{"batch_share": 1.0, "stages": [{"layers": [0, 4], "devices": ["0/0/0"], "tp": 1},
                                           {"layers": [4, 8], "devices": ["0/0/1"], "tp": 1},
                                           {"layers": [8, 11], "devices": ["1/0/0"], "tp": 1},
                                           {"layers": [11, 14], "devices": ["1/0/1"], "tp": 1}]}]
_PIPE_TP = [{"batch_share": 1.0, "stages": [{"layers": [0, 7], "devices": ["0/0/0", "0/0/1"], "tp": 2},
                                            {"layers": [7, 14], "devices": ["1/0/0", "1/0/1"], "tp": 2}]}]
_INTERLEAVED = [{"batch_share": 1.0, "stages": [{"layers": [0, 4], "devices": ["0/0/0"], "tp": 1},
                                                {"layers": [4, 7], "devices": ["0/0/1"], "tp": 1},
                                                {"layers": [7, 11], "devices": ["0/0/0"], "tp": 1},
                                                {"layers": [11, 14], "devices": ["0/0/1"], "tp": 1}]}]

CASES = [
    ("pipeline, tiny (h=64, seq 32)", "tiny", dict(_PIPE, micro_batch=2, recompute="none")),
    ("pipeline, small (h=256, seq 128)", "small", dict(_PIPE, micro_batch=4, recompute="none")),
    ("pipeline, small, full recompute", "small", dict(_PIPE, micro_batch=4, recompute="full")),
    ("ZeRO-3 (FSDP2) x 2, small", "small", dict(_ZERO, zero=3)),
    ("ZeRO-1 x 2, small", "small", dict(_ZERO, zero=1)),
    ("ZeRO-1 x 2, uneven 0.75/0.25, small", "small", dict(_ZERO, zero=1, shard_fractions=[0.75, 0.25])),
    ("ZeRO-2 x 2, uneven 0.75/0.25, small", "small", dict(_ZERO, zero=2, shard_fractions=[0.75, 0.25])),
    ("pipeline, small, 8 micro-batches", "small", dict(_PIPE, global_batch=32, micro_batch=4, recompute="none")),
    ("pipeline, small, GPipe", "small", dict(_PIPE, micro_batch=4, recompute="none", schedule="gpipe")),
    ("pipeline x 4, small", "small",
     dict(_PIPE, global_batch=16, micro_batch=4, recompute="none", precision="fp16", replicas=_PIPE4)),
    ("pipeline x 2, TP 2, small", "small",
     dict(_PIPE, micro_batch=4, recompute="none", precision="fp16", replicas=_PIPE_TP)),
    ("pipeline x 2, interleaved x 2, small", "small",
     dict(_PIPE, global_batch=16, micro_batch=4, recompute="none", schedule="interleaved", interleave=2,
          replicas=_INTERLEAVED)),
]
"""(label, scale, plan): the runs of the comparison."""


def run_case(plan: dict, scale: str, out: Path, steps: int = 3) -> None:
    """One real ``hetpart run`` of ``plan``, its record appended to ``out``."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump(plan, fh)
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    cmd = [sys.executable, "-m", "hetpart", "run", fh.name, "--model", "gpt2-small", "--cluster", "tiny-mixed",
           "--scale", scale, "--steps", str(steps), "--out", str(out)]
    try:
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=900)
    finally:
        os.unlink(fh.name)


def _at_rest_gb(plan, model, replica: int, stage: int) -> float:
    """What a device holds when the runtime's memory probe starts a step: weights, gradients (the previous
    step's: the runtime frees them only when the next forward starts, after the probe has read the
    resident set) and optimizer states, sharded as the plan's level shards them."""
    from hetpart.costmodel.memory import PrefixTables
    from hetpart.costmodel.sharding import sharded_state_bytes, state_bytes, tied_params_held

    rep = plan.replicas[replica]
    pp = rep.pp // plan.chunks_per_device
    tables = PrefixTables(model)
    params = sum(tables.params_per_device(*rep.stages[k].layers, rep.stages[k].tp) for k in range(stage, rep.pp, pp))
    zero = plan.zero if plan.dp > 1 else 0
    # the runtime shards no tied weight: its weight, last gradient and optimizer states stay whole
    tied = max(tied_params_held(model, *rep.stages[k].layers) for k in range(stage, rep.pp, pp)) if zero else 0.0
    whole = tied * sum(state_bytes(plan.precision, plan.optimizer))
    if zero in (1, 2) and plan.shard_fractions is not None and len(set(plan.shard_fractions)) > 1:
        # hetpart's distributed optimizer (uneven fractions): whole weights and the shard's optimizer states;
        # the gradients were freed into the shard when they were reduce-scattered
        w, _, opt = state_bytes(plan.precision, plan.optimizer)
        return ((params - tied) * (w + opt * plan.shard_fraction(replica)) + whole) / 1e9
    # the runtime runs every level on FSDP2, whose parameters, gradients and optimizer states are all sharded
    # between steps (levels 1-2 gather the parameters at the first forward and keep them until the step ends)
    return (sharded_state_bytes(params - tied, plan.precision, 3 if zero else 0, plan.shard_fraction(replica),
                                plan.optimizer) + whole) / 1e9


def compare(record) -> list[dict]:
    """Per rank of ``record``: measured and predicted peak. Live-tensor records compare the whole peaks
    (``at_rest_mb`` 0); resident-set records (``rss_peak_delta``) the growth, the prediction less the states
    at rest."""
    from hetpart.costmodel.predictor import get_predictor
    from hetpart.costmodel.replay import RUNTIME_TERMS
    from hetpart.workload import Workload

    graph, plan, wl = record.model_graph(), record.run_plan("record"), Workload(**record.workload)
    options = dict(record.predicted.options) if record.predicted is not None else {}
    options.pop("profile", None)
    for key in RUNTIME_TERMS:  # times the runtime adds to the step (runtime.measure.predict), not options
        options.pop(key, None)
    pred = get_predictor("simulator", graph, record.prediction_cluster("record"), wl, **options).predict(plan, wl)
    by_device = {dev: (b["replica"], b["stage"], b["memory_gb"]) for b in pred.breakdown for dev in b["devices"]}
    rows = []
    for r in record.measured.ranks:
        rank = r if isinstance(r, dict) else r.__dict__
        replica, stage, peak = by_device[rank["device"]]
        whole = record.measured.memory_method in ("live_tensors", "cuda_max_allocated")
        rest = 0.0 if whole else _at_rest_gb(plan, graph, replica, stage)
        rows.append({"rank": rank["rank"], "device": rank["device"], "measured_mb": rank["peak_memory_gb"] * 1e3,
                     "predicted_peak_mb": peak * 1e3, "at_rest_mb": rest * 1e3, "predicted_mb": (peak - rest) * 1e3,
                     "ratio": (peak - rest) / rank["peak_memory_gb"], "kernels": options.get("kernels", "fused"),
                     "micro_batch": plan.micro_batch, "recompute": plan.recompute, "zero": plan.zero,
                     "method": record.measured.memory_method})
    return rows


def section(records: Path | None = None, cases=None):
    from hetpart.experiments.benchdoc import Section, load, machine
    from hetpart.records import load_records

    host = machine()
    if records is None:
        records = Path(tempfile.mkdtemp()) / "memory_runs.jsonl"
        for _, scale, plan in cases or CASES:
            run_case(plan, scale, records)
    lines = ["| run | rank | measured (MB) | predicted peak (MB) | at rest subtracted (MB) | predicted (MB) | "
             "predicted / measured |", "|---|---|---|---|---|---|---|"]
    ratios = []
    for (label, _, _), rec in zip(cases or CASES, load_records(records)):
        for row in compare(rec):
            ratios.append(row["ratio"])
            lines.append(f"| {label} | {row['rank']} | {row['measured_mb']:.1f} | {row['predicted_peak_mb']:.1f} | "
                         f"{row['at_rest_mb']:.1f} | {row['predicted_mb']:.1f} | {row['ratio']:.3f} |")
    lines += ["", f"Predicted / measured over {len(ratios)} ranks: {min(ratios):.3f} to {max(ratios):.3f}.",
              f"Records: `{records}` (a temporary file unless `--records` named one)."]
    return Section(key="memory-validation", title="Peak memory of real CPU runs against the simulator (issues 9, 10)",
                   body="\n".join(lines) + "\n", command="OMP_NUM_THREADS=1 python -m hetpart.experiments.bench_memory",
                   machine=host, load_after=load())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=Path, help="re-predict these run records (JSON lines) instead of running")
    ap.add_argument("--keep", type=Path, help="append the new run records to this file")
    ap.add_argument("--write", action="store_true", help="rewrite the section of docs/BENCHMARKS.md")
    ap.add_argument("--only", help="run and compare only the cases whose label contains this text")
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    records = args.records
    cases = [c for c in CASES if args.only in c[0]] if args.only else CASES
    if records is None and args.keep is not None:
        for _, scale, plan in cases:
            run_case(plan, scale, args.keep)
        records = args.keep
    sec = section(records, cases)
    if args.write:
        from hetpart.experiments.benchdoc import write_section

        print(write_section(sec))
    else:
        print(sec.body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
