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
    _check_file_names(entries, suite)
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


def _check_file_names(entries: Sequence[SuiteEntry], suite: str | Path) -> None:
    """Entries whose names differ only where a file name cannot ('a b', 'a/b') would share one Gantt chart."""
    from hetpart.errors import SpecError

    seen: dict[str, int] = {}
    for i, entry in enumerate(entries):
        slug = _slug(entry.name)
        if slug in seen:
            raise SpecError(f"{suite}: entries[{i}].name: {entry.name!r} and entries[{seen[slug]}]'s name "
                            f"{entries[seen[slug]].name!r} both give gantt_{slug}.png; rename one")
        seen[slug] = i


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
    fig = plotting.scaling_figure(points, "plan_time_s", "planning time (s)", lines=False,
                                  title="planning time against cluster size (suite entries)")
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


PUBLIC_SUITE = Path(__file__).resolve().parent / "suites" / "public" / "suite.yaml"
DOC_IMAGES = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"


def suite_section(suite: Path = PUBLIC_SUITE, planners: Sequence[str] = ("uniform", "proportional", "search"),
                  out: str | Path = "out/bench-public", runs_dir: str | Path = "runs"):
    """Run the public suite and return docs/BENCHMARKS.md's Planners section (its plots go to docs/benchmarks/)."""
    from hetpart.experiments.benchdoc import Section, load, machine

    where = machine()
    result = run_bench(suite, planners, out, runs_dir=runs_dir)
    DOC_IMAGES.mkdir(parents=True, exist_ok=True)
    for name in ("throughput.png", "pct_upper_bound.png"):
        shutil.copy(Path(out) / name, DOC_IMAGES / f"planners_{name}")
    body = _suite_body(result.rows, list(planners), suite, result.run_dir)
    root = DOC_IMAGES.parents[1]
    rel = suite.relative_to(root) if suite.is_relative_to(root) else suite
    return Section("planners", "Planners", body, f"OMP_NUM_THREADS=1 hetpart bench --suite {rel} "
                   f"--planners {','.join(planners)} --out {out}", where, load_after=load())


def _suite_body(rows: list[dict[str, Any]], planners: list[str], suite: Path, run_dir: Path | None) -> str:
    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    by = {(r["scenario"], r["planner"]): r for r in rows}
    head = ("| scenario | GPUs | upper bound tok/s | " + " | ".join(f"{p} tok/s (% UB)" for p in planners)
            + " | search / uniform | search % of ceiling | plan time s (" + " / ".join(planners) + ") |")
    lines = [head, "|---|" + "---:|" * (len(planners) + 5)]
    for s in scenarios:
        first = by[(s, planners[0])]
        cells = [f"{by[(s, p)]['tokens_per_s']:,.0f} ({by[(s, p)]['pct_upper_bound']:.1f}%)"
                 if not by[(s, p)]["error"] else "no plan" for p in planners]
        search = by.get((s, "search"))
        ok = search is not None and not search["error"]
        times = " / ".join(_f(by[(s, p)]["plan_time_s"], ".2f") or "-" for p in planners)
        lines.append(f"| {s} | {first['num_devices']} | {first['upper_bound_tokens_per_s']:,.0f} | "
                     + " | ".join(cells) + f" | {_f(search['speedup_vs_uniform'], '.2f') if ok else ''} | "
                     f"{_f(search['pct_memory_lifted'], '.1f') if ok else ''} | {times} |")
    facts = _suite_facts(rows, scenarios, by)
    run = f" The run is tracked as `runs/{run_dir.name}` (`hetpart dashboard`)." if run_dir else ""
    return (f"The planners (`hetpart plan --planner {'|'.join(planners)}`) and HETHUB's upper bound on the public "
            f"suite (`experiments/suites/public/`, a copy of `shared/scenarios/`). Numbers are the simulator's "
            f"predictions; planning times are wall-clock seconds of one thread on the machine above while other "
            f"jobs ran, so they are upper estimates. \"% UB\": share of HETHUB's upper bound (sum over device types "
            f"of the best throughput each type reaches alone); \"ceiling\": the same with memory limits lifted for "
            f"every type, which no feasible plan exceeds.{run}\n\n### The public suite\n\n" + "\n".join(lines)
            + "\n\n" + facts + "\n\n![tokens/s per scenario and planner](benchmarks/planners_throughput.png)\n")


def _suite_facts(rows, scenarios, by) -> str:
    out = []
    if all((s, p) in by for s in scenarios for p in ("search", "uniform", "proportional")):
        never = [s for s in scenarios if not by[(s, "search")]["error"] and all(
            by[(s, "search")]["tokens_per_s"] >= (by[(s, p)]["tokens_per_s"] or 0) * (1 - 1e-9)
            for p in ("uniform", "proportional") if not by[(s, p)]["error"])]
        out.append(f"The search is at least as fast as uniform and proportional on {len(never)} of "
                   f"{len(scenarios)} scenarios (their plans are among its candidates).")
    over = [(r["scenario"], r["pct_upper_bound"]) for r in rows if r["planner"] == "search" and not r["error"]
            and r["pct_upper_bound"] > 100]
    if over:
        out.append("**The upper bound is exceeded** by the search on " + ", ".join(f"{s} ({p:.1f}%)" for s, p in over)
                   + ": HETHUB's definition counts each type at its best throughput alone, with memory limits lifted "
                   "only where a type cannot hold the model at all, so a type that just fits alone is charged deep "
                   "pipelines or recomputation that a mixed plan spares it.")
    ceiling = [r["pct_memory_lifted"] for r in rows if not r["error"]]
    if ceiling:
        search = [r["pct_memory_lifted"] for r in rows if r["planner"] == "search" and not r["error"]]
        span = f"the search reaches {min(search):.1f}-{max(search):.1f}% of it; " if search else ""
        out.append(f"Against the memory-lifted ceiling: {span}the highest share of any plan is {max(ceiling):.1f}%"
                   + (" (no plan exceeds it)." if max(ceiling) <= 100 + 1e-9 else " (ABOVE the ceiling: a bug)."))
    return "\n\n".join(out)
