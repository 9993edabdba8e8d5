"""The planner benchmark suite: every planner on every entry of a suite file.

A suite file (shared/CONTRACT.md) is ``entries: [{name, cluster, model, global_batch, seq_len}]``;
``cluster`` and ``model`` are catalog names or paths relative to the suite file. :func:`run_suite`
writes ``results.csv`` (one row per scenario and planner) and two bar charts.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from hetpart import _validate as v
from hetpart.errors import HetpartError, PlanError, SpecError

__all__ = ["SuiteEntry", "load_suite", "run_entry", "run_suite", "COLUMNS", "write_plots"]

COLUMNS = ("scenario", "planner", "tokens_per_s", "pct_upper_bound", "speedup_vs_uniform", "plan_time_s",
           "fits_in_memory", "upper_bound_tokens_per_s", "memory_lifted_upper_bound_tokens_per_s", "num_devices",
           "model", "cluster", "global_batch", "seq_len", "error")


@dataclass(frozen=True)
class SuiteEntry:
    """One scenario."""

    name: str
    cluster: str
    """Catalog name or resolved path of the cluster YAML."""
    model: str
    """Catalog name or resolved path of a config.json."""
    global_batch: int
    seq_len: int


def _resolve(value: Any, base: Path, source: str, field: str) -> str:
    text = v.string(SpecError, value, source, field)
    candidate = base / text
    return str(candidate.resolve()) if candidate.exists() else text


def load_suite(path: str | Path) -> list[SuiteEntry]:
    """Read and check a suite file; raises :class:`SpecError` naming the file and field."""
    from hetpart._yaml import load_yaml_file

    path = Path(path)
    data = load_yaml_file(SpecError, path, "the suite")
    data = v.require_mapping(SpecError, data, str(path), "")
    entries = data.get("entries")
    if not isinstance(entries, list) or not entries:
        raise SpecError(f"{path}: entries: expected a non-empty list of {{name, cluster, model, global_batch, seq_len}}")
    out = []
    for i, raw in enumerate(entries):
        field = f"entries[{i}]"
        raw = v.require_mapping(SpecError, raw, str(path), field)
        v.require_keys(SpecError, raw, str(path), field, ["name", "cluster", "model", "global_batch", "seq_len"], [])
        out.append(SuiteEntry(
            name=v.string(SpecError, raw["name"], str(path), f"{field}.name"),
            cluster=_resolve(raw["cluster"], path.parent, str(path), f"{field}.cluster"),
            model=_resolve(raw["model"], path.parent, str(path), f"{field}.model"),
            global_batch=v.integer(SpecError, raw["global_batch"], str(path), f"{field}.global_batch", maximum=10**8),
            seq_len=v.integer(SpecError, raw["seq_len"], str(path), f"{field}.seq_len", maximum=10**7)))
    return out


def check_planners(planners: Sequence[str]) -> list[str]:
    """The planner names, checked against the planner registry (an unregistered ``policy`` says why)."""
    from hetpart.policies.registry import available_planners, get_planner

    names = [p.strip() for p in planners if p.strip()]
    for name in names:
        try:
            get_planner(name)
        except PlanError as exc:
            raise PlanError(f"--planners: {str(exc).removeprefix('--planner: ')}") from None
    if not names:
        raise PlanError(f"--planners: empty list; use a comma-separated list of {', '.join(available_planners())}")
    return names


def run_entry(entry: SuiteEntry, planners: Sequence[str]) -> list[dict[str, Any]]:
    """One row per planner for ``entry`` (a planner that finds nothing gets a row with its error)."""
    from hetpart import Workload, load_cluster, load_model
    from hetpart.policies.planner import plan
    from hetpart.policies.upper_bound import upper_bound

    model = load_model(entry.model, seq_len=entry.seq_len)
    cluster = load_cluster(entry.cluster)
    workload = Workload(entry.global_batch, entry.seq_len)
    bound = upper_bound(model, cluster, workload)
    results: dict[str, Any] = {}
    for name in dict.fromkeys([*planners, "uniform"]):
        try:
            results[name] = plan(model, cluster, workload, name)
        except HetpartError as exc:
            results[name] = exc
    uniform = results["uniform"]
    base = None if isinstance(uniform, HetpartError) else uniform.prediction.tokens_per_s
    rows = []
    for name in planners:
        r = results[name]
        row = {"scenario": entry.name, "planner": name, "upper_bound_tokens_per_s": bound["tokens_per_s"],
               "memory_lifted_upper_bound_tokens_per_s": bound["memory_lifted_tokens_per_s"],
               "num_devices": cluster.num_devices, "model": entry.model, "cluster": entry.cluster,
               "global_batch": entry.global_batch, "seq_len": entry.seq_len}
        if isinstance(r, HetpartError):
            row |= {"tokens_per_s": "", "pct_upper_bound": "", "speedup_vs_uniform": "", "plan_time_s": "",
                    "fits_in_memory": False, "error": " ".join(str(r).split())}
        else:
            tps = r.prediction.tokens_per_s
            row |= {"tokens_per_s": tps, "pct_upper_bound": tps / bound["tokens_per_s"] * 100,
                    "speedup_vs_uniform": tps / base if base else "", "plan_time_s": r.wall_time_s,
                    "fits_in_memory": r.prediction.fits_in_memory, "error": ""}
        rows.append(row)
    return rows


def run_suite(suite: str | Path, planners: Sequence[str], out_dir: str | Path,
              on_entry: Callable[[SuiteEntry], None] | None = None) -> list[dict[str, Any]]:
    """Run every planner on every entry; write ``results.csv`` and the plots to ``out_dir``."""
    names = check_planners(planners)
    entries = load_suite(suite)
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecError(f"--out: cannot create {out} ({exc.__class__.__name__}); choose another directory") from None
    rows = []
    for entry in entries:
        if on_entry is not None:
            on_entry(entry)
        rows += run_entry(entry, names)
    with open(out / "results.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    write_plots(rows, names, out)
    return rows


def write_plots(rows: list[dict[str, Any]], planners: Sequence[str], out: Path) -> list[Path]:
    """``throughput.png`` (tokens/s per scenario and planner, upper bound marked) and ``pct_upper_bound.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    width = 0.8 / max(len(planners), 1)
    paths = []
    for column, label, fname in (("tokens_per_s", "tokens/s (predicted)", "throughput.png"),
                                 ("pct_upper_bound", "% of the upper bound", "pct_upper_bound.png")):
        fig, ax = plt.subplots(figsize=(max(8, 1.6 * len(scenarios)), 4.8))
        for k, name in enumerate(planners):
            values = [next((_num(r[column]) for r in rows if r["scenario"] == s and r["planner"] == name), 0.0)
                      for s in scenarios]
            ax.bar([i + k * width for i in range(len(scenarios))], values, width, label=name)
        if column == "tokens_per_s":
            bounds = [next(r["upper_bound_tokens_per_s"] for r in rows if r["scenario"] == s) for s in scenarios]
            ax.scatter([i + 0.4 - width / 2 for i in range(len(scenarios))], bounds, marker="_", s=900, color="black",
                       label="upper bound", zorder=3)
            ax.set_yscale("log")
        else:
            ax.axhline(100, color="black", linewidth=0.8)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(scenarios))], scenarios, rotation=20, ha="right")
        ax.set_ylabel(label)
        ax.legend(frameon=False, fontsize="small")
        fig.tight_layout()
        fig.savefig(out / fname, dpi=110)
        plt.close(fig)
        paths.append(out / fname)
    return paths


def _num(x: Any) -> float:
    try:
        value = float(x)
    except (TypeError, ValueError):
        return 0.0
    return value if math.isfinite(value) else 0.0
