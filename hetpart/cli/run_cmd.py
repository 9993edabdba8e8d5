"""``hetpart run PLAN``: execute a plan with torch.distributed on this machine and measure it."""

from __future__ import annotations

from typing import Optional

import typer

from hetpart.cli.common import JsonFlag, console, emit_json

__all__ = ["register"]


def run(plan_path: str = typer.Argument(..., metavar="PLAN", help="Plan JSON (as written by 'hetpart plan --out')."),
        steps: int = typer.Option(5, "--steps", help="Measured training steps (after the warm-up)."),
        warmup: int = typer.Option(2, "--warmup", help="Warm-up steps, excluded from the measurements (those after the first calibrate the prediction)."),
        scale: str = typer.Option("tiny", "--scale", help="Shrunken model that runs: tiny or small."),
        hidden_size: Optional[int] = typer.Option(None, "--hidden-size", help="Run a shrunken model of this width instead of --scale."),
        model: Optional[str] = typer.Option(None, "--model", "-m", help="Model of the plan (default: the plan's meta.model)."),
        cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="Cluster of the plan (default: the plan's meta.cluster)."),
        out: Optional[str] = typer.Option(None, "--out", help="Append the measurement record to this JSON lines file."),
        checkpoint: Optional[str] = typer.Option(None, "--checkpoint", help="Resume from / save to this directory (torch.distributed.checkpoint)."),
        time_factor: Optional[float] = typer.Option(None, "--time-factor", help="Emulation slowdown of the real cluster (default: fastest peak / calibrated CPU peak)."),
        no_emulation: bool = typer.Option(False, "--no-emulation", help="Run every process at this machine's speed, links unshaped."),
        netem: bool = typer.Option(False, "--netem", help="Shape real traffic between per-rank network namespaces with tc (root + iproute2) instead of sleeping."),
        hang_timeout: float = typer.Option(120.0, "--hang-timeout", help="Seconds without progress on any rank that count as a hang."),
        seed: int = typer.Option(0, "--seed", help="Seed of the weights and the synthetic data."),
        run_dir: Optional[str] = typer.Option(None, "--run-dir", help="Directory for the ranks' logs, heartbeats and results (default: a new temporary one, kept)."),
        json_out: bool = JsonFlag) -> None:
    """Run PLAN on local CPU processes emulating its cluster; print measured vs predicted step time."""
    from hetpart.plan import load_plan
    from hetpart.runtime.launch import RunOptions, run_plan

    plan = load_plan(plan_path)
    options = RunOptions(steps=steps, warmup=warmup, scale=hidden_size if hidden_size is not None else scale, seed=seed,
                         time_factor=time_factor, emulate=not no_emulation, checkpoint_dir=checkpoint,
                         hang_timeout_s=hang_timeout, netem=netem)
    if json_out:
        result = run_plan(plan, model, cluster, options, out=out, run_dir=run_dir)
        emit_json(result.summary())
        return
    result = _run_with_progress(plan, model, cluster, options, out, run_dir)
    _show(result)


def _run_with_progress(plan, model, cluster, options, out, run_dir):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from hetpart.runtime.launch import run_plan

    total = options.warmup + options.steps
    with Progress(TextColumn("[bold]hetpart run[/]"), BarColumn(), MofNCompleteColumn(), TextColumn("steps"),
                  TimeElapsedColumn(), console=console(), transient=True) as bar:
        task = bar.add_task("steps", total=total)
        return run_plan(plan, model, cluster, options, out=out, run_dir=run_dir,
                        on_progress=lambda done: bar.update(task, completed=min(done, total)))


def _show(result) -> None:
    from rich.table import Table

    s = result.summary()
    m, p = s["measured"], s["predicted"]
    out = console()
    out.print(_headline(s))
    t = Table(title=f"{s['steps']} measured steps after {s['warmup']} warm-up")
    for col in ("", "step time s", "tokens/s", "samples/s"):
        t.add_column(col, justify="right")
    t.add_row("measured", f"{m['step_time_s']:.4f}", f"{m['tokens_per_s']:.1f}", f"{m['samples_per_s']:.2f}")
    if p is not None:
        t.add_row("predicted", f"{p['step_time_s']:.4f}", f"{p['tokens_per_s']:.1f}", f"{p['samples_per_s']:.2f}")
        t.add_row("error", f"{100 * (p['step_time_s'] / m['step_time_s'] - 1):+.1f}%", "", "")
    out.print(t)
    st = Table(title="per stage, seconds per step (mean over its ranks)")
    for col in ("replica", "stage", "units", "devices", "compute", "comm", "optimizer", "idle"):
        st.add_column(col, justify="right")
    for row in m["stages"]:
        st.add_row(str(row["replica"]), str(row["stage"]), f"{row['layers'][0]}-{row['layers'][1] - 1}",
                   ",".join(row["devices"]), *(f"{row[k]:.4f}" for k in ("compute_s", "comm_s", "optimizer_s", "idle_s")))
    out.print(st)
    out.print(f"losses: {', '.join(f'{x:.4f}' for x in m['losses'])}; peak memory per device type: "
              + ", ".join(f"{k} {v * 1e3:.1f} MB" for k, v in m["peak_memory_gb"].items()) + f" ({m['memory_method']})")
    out.print(f"rank files: {s['run_dir']}")


def _headline(s: dict) -> str:
    model, emu = s["model"], s["emulation"]
    if model["shrunken"]:
        what = (f"[bold]{model['name']}[/] ran SHRUNKEN ({model['scale']}): hidden {model['hidden_size']}, "
                f"{model['num_units']} units, seq {model['seq_len']} (plan: {model['full_seq_len']}), "
                f"{model['num_params']:,} of {model['full_num_params']:,} parameters")
    else:
        what = f"[bold]{model['name']}[/] ran as given: {model['num_units']} units, {model['num_params']:,} parameters"
    if not emu["enabled"]:
        return what + "; no emulation (every process at this machine's speed)"
    return what + f"; cluster {s['cluster']} emulated {emu['time_factor']:.0f}x slower than real"


def register(app: typer.Typer) -> None:
    app.command("run")(run)
