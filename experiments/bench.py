"""``hetpart bench``: every planner on every suite entry -> results.csv, a markdown table, plots, an
HTML report and a tracked run.

Files written to ``out`` (all from the same rows):

* ``results.csv`` - one row per scenario and planner (:data:`~hetpart.experiments.suite.COLUMNS`);
* ``results.md`` - the table: throughput, % of HETHUB's bound and of the memory-lifted ceiling,
  speed-up over ``uniform``, % of ``search``, peak memory against capacity, planning time;
* ``throughput.png``, ``pct_upper_bound.png`` (planner comparison per scenario),
  ``gantt_<scenario>.png`` (the best plan's schedule), ``plan_time_vs_gpus.png``;
* ``report.html`` - the same, self-contained (figures inlined).

The tracked run (``{runs}/bench-<suite>__0__<time>/``) holds the config, TensorBoard scalars
``bench/<metric>/<planner>`` with the entry index as step, and a copy of ``results.csv``.
"""

from __future__ import annotations

import base64
import html
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from hetpart.experiments.suite import (SuiteEntry, check_planners, load_suite, make_out_dir, solve_entry, write_csv,
                                       write_plots)

__all__ = ["BenchResult", "run_bench", "markdown_table", "TRACKED_METRICS"]

TRACKED_METRICS = ("tokens_per_s", "pct_upper_bound", "pct_memory_lifted", "speedup_vs_uniform", "plan_time_s")


@dataclass
class BenchResult:
    """What one ``hetpart bench`` wrote."""

    rows: list[dict[str, Any]]
    out: Path
    files: list[Path] = field(default_factory=list)
    run_dir: Path | None = None
    """The tracked run's folder (``None`` with ``--tracker null``)."""


def run_bench(suite: str | Path, planners: Sequence[str], out_dir: str | Path, *, tracker: str = "tensorboard",
              runs_dir: str | Path = "runs",
              on_step: Callable[[SuiteEntry, str], None] | None = None) -> BenchResult:
    """Run the suite and write everything (see the module docstring).

    Args:
        tracker: ``tensorboard``, ``wandb``, both comma-separated, or ``null``.
        on_step: called before each planner runs on each entry (a progress bar).
    """
    from hetpart.experiments.tracking import make_tracker

    names = check_planners(planners)
    entries = load_suite(suite)
    out = make_out_dir(out_dir)
    config = {"suite": str(Path(suite).resolve()), "planners": names, "out": str(out.resolve()),
              "entries": [vars(e) for e in entries]}
    rows: list[dict[str, Any]] = []
    files: list[Path] = []
    with make_tracker(tracker, f"bench/{Path(suite).stem}", seed=0, config=config, root=runs_dir) as run:
        for step, entry in enumerate(entries):
            result = solve_entry(entry, names, on_planner=on_step)
            rows += result.rows
            run.log(_scalars(result.rows), step=step)
            if result.best is not None:
                files.append(_gantt(result, out))
        files.insert(0, write_csv(rows, out / "results.csv"))
        files += write_plots(rows, names, out)
        files.append(_plan_time_plot(rows, out))
        md = markdown_table(rows, names)
        (out / "results.md").write_text(f"# hetpart bench: {Path(suite).name}\n\n{md}\n")
        files.append(out / "results.md")
        files.append(_html_report(rows, names, suite, out, files, run.name))
        if run.run_dir is not None:
            shutil.copy(out / "results.csv", run.run_dir / "results.csv")
    return BenchResult(rows, out, files, run.run_dir)


def _scalars(rows: list[dict[str, Any]]) -> dict[str, float]:
    return {f"bench/{metric}/{r['planner']}": float(r[metric]) for r in rows for metric in TRACKED_METRICS
            if r.get(metric) not in ("", None)}


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "scenario"


def _gantt(result, out: Path) -> Path:
    from hetpart import plotting
    from hetpart.costmodel.simulator import simulate

    best = result.best
    traced = simulate(result.model, result.cluster, best.plan, validate=False, trace=True)
    scenario = result.rows[0]["scenario"]
    fig = plotting.gantt_figure(traced.timeline, best.plan, result.cluster,
                                title=f"{scenario} ({best.planner})", step_time_s=traced.step_time_s,
                                tokens_per_s=traced.tokens_per_s)
    return plotting.save_png(fig, out / f"gantt_{_slug(scenario)}.png")


def _plan_time_plot(rows: list[dict[str, Any]], out: Path) -> Path:
    from hetpart import plotting

    points = [{"planner": r["planner"], "gpus": r["num_devices"], "types": 1, "plan_time_s": r["plan_time_s"]}
              for r in rows if r.get("plan_time_s") not in ("", None)]
    fig = plotting.scaling_figure(points, "plan_time_s", "planning time (s)")
    fig.axes[0].set_title("planning time against cluster size (suite entries)", fontsize="medium")
    for line in fig.axes[0].get_lines():
        line.set_linestyle("none")
        line.set_label(line.get_label().split(",")[0])
    fig.axes[0].legend(frameon=False, fontsize="small")
    return plotting.save_png(fig, out / "plan_time_vs_gpus.png")


def _f(value: Any, fmt: str) -> str:
    return "" if value in ("", None) else format(float(value), fmt)


def markdown_table(rows: list[dict[str, Any]], planners: Sequence[str]) -> str:
    """The results as a markdown table, one line per scenario and planner."""
    head = ("| scenario | GPUs | planner | tokens/s | % UB | % ceiling | x uniform | % of search | "
            "peak memory / capacity | plan time s |\n|---|---:|---|---:|---:|---:|---:|---:|---|---:|")
    lines = [head]
    for r in rows:
        if r["error"]:
            lines.append(f"| {r['scenario']} | {r['num_devices']} | {r['planner']} | no plan | | | | | | |")
            continue
        mem = (f"{r['peak_memory_gb']:.1f} / {r['peak_memory_capacity_gb']:.1f} GB ({r['peak_memory_gpu']})"
               + ("" if r["fits_in_memory"] else " DOES NOT FIT"))
        lines.append(f"| {r['scenario']} | {r['num_devices']} | {r['planner']} | {r['tokens_per_s']:,.0f} | "
                     f"{_f(r['pct_upper_bound'], '.1f')} | {_f(r['pct_memory_lifted'], '.1f')} | "
                     f"{_f(r['speedup_vs_uniform'], '.2f')} | {_f(r['pct_of_search'], '.1f')} | {mem} | "
                     f"{_f(r['plan_time_s'], '.2f')} |")
    return "\n".join(lines)


def _html_report(rows: list[dict[str, Any]], planners: Sequence[str], suite: str | Path, out: Path,
                 files: list[Path], run_name: str) -> Path:
    from hetpart import report

    table_rows = []
    for r in rows:
        ok = not r["error"]
        table_rows.append([
            r["scenario"], r["num_devices"], r["planner"],
            (f"{r['tokens_per_s']:,.0f}", r["tokens_per_s"]) if ok else ("no plan", 0),
            (_f(r["pct_upper_bound"], ".1f"), r["pct_upper_bound"] or 0),
            (_f(r["pct_memory_lifted"], ".1f"), r["pct_memory_lifted"] or 0),
            (_f(r["speedup_vs_uniform"], ".2f"), r["speedup_vs_uniform"] or 0),
            (_f(r["pct_of_search"], ".1f"), r["pct_of_search"] or 0),
            f"{r['peak_memory_gb']:.1f} / {r['peak_memory_capacity_gb']:.1f} GB" if ok else r["error"][:120],
            (_f(r["plan_time_s"], ".2f"), r["plan_time_s"] or 0)])
    table = report.html_table(["scenario", "GPUs", "planner", "tokens/s", "% UB", "% ceiling", "x uniform",
                               "% of search", "peak memory / capacity", "plan time s"], table_rows,
                              table_id="results-table", numeric=[False, True, False] + [True] * 5 + [False, True])
    sections = [f'<section id="results"><h2>Results</h2>{table}<p class="note">% UB: share of HETHUB\'s upper '
                f'bound; % ceiling: of the memory-lifted ceiling; tracked run {html.escape(run_name)}.</p></section>']
    for path in sorted((p for p in files if p.suffix == ".png"), key=lambda p: p.name.startswith("gantt_")):
        if path.suffix == ".png":
            data = base64.b64encode(path.read_bytes()).decode()
            ident = _slug(path.stem)
            sections.append(f'<section id="{ident}"><h2>{html.escape(path.stem.replace("_", " "))}</h2>'
                            f'<div class="figure" id="{ident}-figure"><img alt="{html.escape(path.stem)}" '
                            f'src="data:image/png;base64,{data}"></div></section>')
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    page = report.html_page(f"hetpart bench: {Path(suite).name}",
                            f"planners {', '.join(planners)} on {len({r['scenario'] for r in rows})} scenarios; {stamp}",
                            sections, {"rows": rows, "run": run_name})
    path = out / "report.html"
    path.write_text(page)
    return path
