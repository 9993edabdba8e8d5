"""``hetpart bench``: every planner on every entry of a suite file -> results.csv and bar charts."""

from __future__ import annotations

from pathlib import Path

import typer

from hetpart.cli.common import JsonFlag, console, emit_json

__all__ = ["register"]


def bench_command(suite: Path = typer.Option(..., "--suite", help="Suite YAML: entries [{name, cluster, model, global_batch, seq_len}]."),
                  planners: str = typer.Option("uniform,proportional,search", "--planners",
                                               help="Comma-separated planners (uniform, proportional, search)."),
                  out: Path = typer.Option(..., "--out", help="Directory for results.csv and the plots."),
                  json_out: bool = JsonFlag) -> None:
    """Compare planners on a benchmark suite (throughput, % of upper bound, speed-up, planning time)."""
    from rich.table import Table

    from hetpart.experiments.suite import run_suite

    con = console()
    quiet = json_out

    def progress(entry) -> None:
        if not quiet:
            con.print(f"[dim]planning {entry.name} ({entry.model} on {Path(entry.cluster).name})...[/dim]")

    rows = run_suite(suite, planners.split(","), out, on_entry=progress)
    if json_out:
        emit_json({"results": rows, "csv": str(out / "results.csv")})
        return
    t = Table(title=f"planners on {suite}")
    for col in ("scenario", "planner", "tokens/s", "% upper bound", "x uniform", "plan time s"):
        t.add_column(col, justify="left" if col in ("scenario", "planner") else "right")
    for r in rows:
        if r["error"]:
            t.add_row(r["scenario"], r["planner"], "no plan", "", "", "")
            continue
        speedup = f"{r['speedup_vs_uniform']:.2f}" if r["speedup_vs_uniform"] != "" else ""
        t.add_row(r["scenario"], r["planner"], f"{r['tokens_per_s']:,.0f}", f"{r['pct_upper_bound']:.1f}", speedup,
                  f"{r['plan_time_s']:.2f}")
    con.print(t)
    con.print(f"results in {out / 'results.csv'}, plots throughput.png and pct_upper_bound.png")


def register(app: typer.Typer) -> None:
    app.command("bench")(bench_command)
