"""``hetpart bench``: every planner on every entry of a suite file -> results.csv, table, plots, HTML, tracked run."""

from __future__ import annotations

from pathlib import Path

import typer

from hetpart.cli.common import JsonFlag, console, emit_json

__all__ = ["register"]


def bench_command(suite: Path = typer.Option(..., "--suite", help="Suite YAML: entries [{name, cluster, model, global_batch, seq_len}]."),
                  planners: str = typer.Option("uniform,proportional,search", "--planners",
                                               help="Comma-separated planners (uniform, proportional, search, policy; any registered one)."),
                  out: Path = typer.Option(..., "--out", help="Directory for results.csv, results.md, the plots and report.html."),
                  tracker: str = typer.Option("tensorboard", "--tracker",
                                              help="tensorboard, wandb (offline), both comma-separated, or null."),
                  runs_dir: Path = typer.Option(Path("runs"), "--runs-dir",
                                                help="Folder of tracked runs ('hetpart dashboard --logdir' serves it)."),
                  json_out: bool = JsonFlag) -> None:
    """Compare planners on a benchmark suite (throughput, % of upper bound, speed-up, memory, planning time)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from hetpart.experiments.bench import run_bench
    from hetpart.experiments.suite import check_planners, load_suite

    _check_paths(tracker, out, runs_dir)
    names = check_planners(planners.split(","))
    entries = load_suite(suite)  # every entry checked (cluster, model, seq_len) before anything is planned or written
    total = len(entries) * len(dict.fromkeys([*names, "uniform"]))
    err = Console(stderr=True, soft_wrap=True, highlight=False)
    # the bar only where it redraws in place (a terminal); a line per step in every case, so that a log
    # shows what runs while a slow planner works
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=err, transient=True, disable=json_out or not err.is_terminal)
    index = {entry.name: i for i, entry in enumerate(entries, 1)}
    with progress:
        task = progress.add_task("bench", total=total)
        started = [False]

        def step(entry, planner: str) -> None:
            if started[0]:
                progress.advance(task)
            started[0] = True
            progress.update(task, description=f"{entry.name}: {planner}")
            err.print(f"bench: entry {index.get(entry.name, '?')}/{len(entries)} {entry.name}: {planner}",
                      markup=False)

        result = run_bench(suite, names, out, tracker=tracker, runs_dir=runs_dir, on_step=step)
        progress.advance(task)
    if json_out:
        emit_json({"results": result.rows, "csv": str(out / "results.csv"), "files": [str(f) for f in result.files],
                   "run_dir": str(result.run_dir) if result.run_dir else None})
        return
    _print_table(result.rows, suite)
    con = console()
    con.print(f"wrote {', '.join(f.name for f in result.files)} to {out}"
              + (f"; tracked run {result.run_dir} (hetpart dashboard --logdir {runs_dir})" if result.run_dir else ""))


def _check_paths(tracker: str, out: Path, runs_dir: Path) -> None:
    """--tracker, --out and --runs-dir, refused by their flag before any folder is created."""
    from hetpart.errors import SpecError
    from hetpart.experiments.tracking import tracker_kinds

    tracker_kinds(tracker, "--tracker")
    for flag, folder in (("--out", out), ("--runs-dir", runs_dir)):
        for place in (folder, *folder.parents):
            if place.exists():
                if not place.is_dir():
                    raise SpecError(f"{flag}: {place} is a file, not a folder; choose another directory")
                break


def _print_table(rows, suite: Path) -> None:
    from rich.table import Table

    t = Table(title=f"planners on {suite}")
    for col in ("scenario", "planner", "tokens/s", "% UB", "% ceiling", "x uniform", "% search", "peak mem GB",
                "plan time s"):
        t.add_column(col, justify="left" if col in ("scenario", "planner") else "right")
    for r in rows:
        if r["error"]:
            t.add_row(r["scenario"], r["planner"], "no plan", "", "", "", "", "", "")
            continue
        t.add_row(r["scenario"], r["planner"], f"{r['tokens_per_s']:,.0f}", f"{r['pct_upper_bound']:.1f}",
                  f"{r['pct_memory_lifted']:.1f}", _fmt(r["speedup_vs_uniform"], ".2f"), _fmt(r["pct_of_search"], ".1f"),
                  f"{r['peak_memory_gb']:.1f}/{r['peak_memory_capacity_gb']:.0f}", f"{r['plan_time_s']:.2f}")
    console().print(t)


def _fmt(value, spec: str) -> str:
    return "" if value in ("", None) else format(float(value), spec)


def register(app: typer.Typer) -> None:
    app.command("bench")(bench_command)
