"""``hetpart run PLAN``: execute a plan with torch.distributed on this machine and measure it."""

from __future__ import annotations

from typing import Optional

import typer

from hetpart.cli.common import JsonFlag, console, emit_json, params_text

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
        checkpoint_every: int = typer.Option(0, "--checkpoint-every", help="Also save a checkpoint every N steps (0: after the last step only)."),
        max_restarts: int = typer.Option(0, "--max-restarts", help="Restart a failed or hung run up to N times, from its last checkpoint."),
        log_every: int = typer.Option(1, "--log-every", help="Print progress (step, loss, step time, tokens/s, ETA) on stderr every N steps; 0: never."),
        tracker: str = typer.Option("null", "--tracker", help="Also log the progress to tensorboard, wandb (offline) or both (tensorboard,wandb)."),
        logdir: str = typer.Option("runs", "--logdir", help="Folder of the tracked runs (hetpart dashboard --logdir serves it)."),
        time_factor: Optional[float] = typer.Option(None, "--time-factor", help="Emulation slowdown of the real cluster's links (default: fastest peak / calibrated CPU peak, see --links)."),
        links: Optional[str] = typer.Option(None, "--links", help="balanced (default): links slowed so the shrunken run keeps the plan's gradient-sync to compute ratio (seconds per step); compute: slowed as much as compute (the shrunken model's far fewer tokens then make sync dominate)."),
        no_emulation: bool = typer.Option(False, "--no-emulation", help="Run every process at this machine's speed, links unshaped."),
        device: str = typer.Option("auto", "--device", help="Where the ranks compute: cpu; cuda (one GPU per rank, with --no-emulation); auto: cuda where that holds, else cpu."),
        profile: Optional[str] = typer.Option(None, "--profile", help="A profile of the model that runs ('hetpart calibrate "
                                              "--scale ...') for the prediction (default: every rank times its units before and after its steps)."),
        netem: bool = typer.Option(False, "--netem", help="Shape real traffic between per-rank network namespaces with tc (root + iproute2) instead of sleeping."),
        hang_timeout: float = typer.Option(120.0, "--hang-timeout", help="Seconds without progress on any rank that count as a hang."),
        seed: int = typer.Option(0, "--seed", help="Seed of the weights and the synthetic data."),
        run_dir: Optional[str] = typer.Option(None, "--run-dir", help="Directory for the ranks' logs, heartbeats and results (default: a temporary one, removed unless the run fails)."),
        nnodes: int = typer.Option(1, "--nnodes", help="Machines the run spans: one per cluster node the plan uses (each runs this command with its own --node-rank; implies --no-emulation)."),
        node_rank: int = typer.Option(0, "--node-rank", help="This machine's place, 0 to --nnodes - 1: it runs the plan's devices on the K-th cluster node the plan uses (in the plan's rank order)."),
        master_addr: Optional[str] = typer.Option(None, "--master-addr", help="With --nnodes > 1: the address of node rank 0's machine (every machine must reach it)."),
        master_port: int = typer.Option(29500, "--master-port", help="With --nnodes > 1: a free TCP port on node rank 0's machine."),
        check_gradients: bool = typer.Option(False, "--check-gradients", help="Also compare the loss and every gradient of "
                                             "the first step with the whole model run in one process (one more untimed "
                                             "forward and backward per rank); prints the largest errors per unit and "
                                             "exits 1 where one is beyond the tolerance (gradients: |error| <= 1e-6 + "
                                             "1e-4 |reference|; loss: 1e-5 relative)."),
        json_out: bool = JsonFlag) -> None:
    """Run PLAN with torch.distributed (emulating its cluster on local processes by default; --no-emulation, --device cuda, --nnodes for real devices); print measured vs predicted step time."""
    from hetpart.errors import PlanError
    from hetpart.plan import load_plan
    from hetpart.runtime.launch import LocalRunResult, Nodes, run_plan, RunOptions

    if log_every < 0:
        raise PlanError(f"--log-every: must be a whole number >= 0, got {log_every}")
    if not hang_timeout > 0:
        raise PlanError(f"--hang-timeout: must be > 0 seconds, got {hang_timeout:g}; give seconds such as 120")
    if links is not None and links not in ("balanced", "compute"):
        raise PlanError(f"--links: unknown mode {links!r}; use balanced or compute")
    first = None
    if nnodes > 1:  # real devices on several machines: the emulation slows one machine's CPU
        given = [flag for flag, on in (("--time-factor", time_factor is not None), ("--links", links is not None),
                                       ("--netem", netem)) if on]
        if given:
            raise PlanError(f"{', '.join(given)}: only shape the emulation of a cluster on one machine, and --nnodes "
                            f"{nnodes} runs the real devices of {nnodes} machines; drop {'them' if len(given) > 1 else 'it'}")
        if not master_addr:
            raise PlanError(f"--master-addr: needed with --nnodes {nnodes}: the address of node rank 0's machine "
                            "(the same on every machine)")
        if not no_emulation:  # said once the run starts: a refusal before it stays one line
            first = (f"--nnodes {nnodes}: running without emulation (as --no-emulation): the real devices at their "
                     "own speed")
        no_emulation = True
        if check_gradients:
            raise PlanError(f"--check-gradients: compares every rank's gradients on one machine, and --nnodes {nnodes} "
                            "spreads them over several; run the plan on one machine to check it, or drop --check-gradients")
    if no_emulation:  # these only shape the emulation: silently ignored, they looked applied
        given = [flag for flag, on in (("--time-factor", time_factor is not None), ("--links", links is not None),
                                       ("--netem", netem)) if on]
        if given:
            raise PlanError(f"{', '.join(given)}: only shape the emulation, and --no-emulation turns it off; drop "
                            f"{'them' if len(given) > 1 else 'it'} or run without --no-emulation")
    nodes = Nodes(nnodes=nnodes, node_rank=node_rank, master_addr=master_addr or "127.0.0.1", master_port=master_port)
    plan = _check_precision(load_plan(plan_path), plan_path, model, cluster)
    options = RunOptions(steps=steps, warmup=warmup, scale=hidden_size if hidden_size is not None else scale, seed=seed,
                         time_factor=time_factor, balance_links=links in (None, "balanced"), emulate=not no_emulation,
                         checkpoint_dir=checkpoint,
                         checkpoint_every=checkpoint_every, max_restarts=max_restarts,
                         hang_timeout_s=hang_timeout, netem=netem, profile=profile, device=device,
                         check_gradients=check_gradients)
    track = _tracker(tracker, logdir, seed, {"plan": plan_path, "options": options.to_dict()})
    try:
        result = run_plan(plan, model, cluster, options, out=out, run_dir=run_dir,
                          on_progress=_Progress(log_every, track, emulate=not no_emulation, first=first), source=plan_path,
                          nodes=nodes)
    finally:
        track.finish()
    if isinstance(result, LocalRunResult):  # another machine than node rank 0: its own ranks only
        if json_out:
            emit_json(result.summary())
        else:
            _show_local(result)
        return
    check = result.gradient_check
    failed = check is not None and not check.passed
    if json_out:
        summary = result.summary()
        if failed:
            summary |= {"error": _mismatch_line(check), "kind": "gradient_mismatch"}
        emit_json(summary)
    else:
        _show(result)
        if check is not None:
            _show_check(check)
        if track.run_dir is not None:
            console().print(f"tracked run: {track.run_dir}")
    if failed:
        import sys

        print(f"hetpart: error: {_mismatch_line(check)}", file=sys.stderr)
        raise typer.Exit(1)
    if result.record_error:  # the run's results were shown; only the record missed its file
        import sys

        print(f"hetpart: error: {result.record_error}", file=sys.stderr)
        raise typer.Exit(2)


def _check_precision(plan, plan_path: str, model: str | None, cluster: str | None):
    """The plan with its precision checked against the devices it uses, exactly as ``predict --plan`` and
    ``export`` check it, before any process starts (a bf16 plan on V100s ran, an fp8 one failed in every rank);
    a plan file that names no precision takes the devices' default, as they do."""
    from dataclasses import replace

    from hetpart import load_cluster
    from hetpart.cli.common import resolve_precision
    from hetpart.cli.plan_cmd import _stated_precision
    from hetpart.runtime.launch import plan_sources

    cl = load_cluster(plan_sources(plan, model, cluster, plan_path)[1])
    precision = resolve_precision(_stated_precision(plan, plan_path),
                                  {cl.device(d).gpu for d in plan.devices if cl.has_device(d)}, f"{plan_path}: precision")
    return replace(plan, precision=precision)


def _tracker(kinds: str, logdir: str, seed: int, config: dict):
    """The experiments tracker for ``--tracker`` (the runtime only sees its ``log``: it cannot import experiments)."""
    from hetpart.experiments.tracking import make_tracker, tracker_kinds

    tracker_kinds(kinds, "--tracker")  # a bad kind is named by the flag the user typed

    return make_tracker(kinds, "run", seed, config=config, root=logdir, rank=0)


class _Progress:
    """Prints a run's progress on stderr every ``every`` steps and logs every step to the tracker."""

    def __init__(self, every: int, tracker, emulate: bool = True, first: str | None = None) -> None:
        import sys

        self.every, self.tracker, self.err, self.emulate, self.first = every, tracker, sys.stderr, emulate, first

    def __call__(self, p) -> None:
        if self.first:  # the run started: every check passed
            self._say(self.first)
            self.first = None
        if p.phase == "restart":
            self._say(f"restart {p.attempt} after: {p.message}")
            if p.resumed_from is not None:
                self._say(f"resuming from the checkpoint of step {p.resumed_from}")
            return
        if p.step is None:
            what = {"start": "starting the ranks", "rendezvous": "ranks joining", "build": "building the model",
                    "calibrate": "calibrating the emulation" if self.emulate else "preparing the steps (no emulation)",
                    "steps": "running the first step"}.get(p.phase, p.phase)
            self._say(what + (f" (resumed from step {p.resumed_from})" if p.resumed_from else ""))
            return
        if p.phase == "checkpoint":  # the global step, as hetpart_checkpoint.json's next_step counts it
            self._say(f"saving a checkpoint after step {p.step + 1 if p.step is not None else p.done}")
            return
        metrics = {"run/loss": p.loss, "run/step_time_s": p.step_time_s, "run/tokens_per_s": p.tokens_per_s}
        self.tracker.log({k: float(v) for k, v in metrics.items() if v is not None and v == v}, step=p.step)
        if self.every and (p.done % self.every == 0 or p.done == p.total):
            self._say(_progress_line(p))

    def _say(self, text: str) -> None:
        if self.every:
            print(f"hetpart run: {text}", file=self.err, flush=True)


def _progress_line(p) -> str:
    parts = [f"step {p.done}/{p.total}" + (" (warm-up)" if p.warmup else "")]
    if p.resumed_from:
        parts[0] += f" (resumed from step {p.resumed_from})"
    if p.loss is not None and p.loss == p.loss:
        parts.append(f"loss {p.loss:.4f}")
    if p.step_time_s:
        parts.append(f"{p.step_time_s:.2f} s/step")
    if p.tokens_per_s:
        parts.append(f"{p.tokens_per_s:,.0f} tokens/s")
    if p.eta_s is not None and p.done < p.total:
        parts.append(f"ETA {_duration(p.eta_s)}")
    return ", ".join(parts)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else (
        f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s")


def _show(result) -> None:
    from rich.table import Table

    s = result.summary()
    m, p = s["measured"], s["predicted"]
    out = console()
    out.print(_headline(s))
    if s.get("nodes"):
        n = s["nodes"]
        out.print(f"ran on {n['nnodes']} machines: " + "; ".join(
            f"node rank {g['node_rank']}: ranks {','.join(str(r) for r in g['ranks'])} ({','.join(g['devices'])})"
            for g in n["ranks"]))
    if s.get("resumed_from"):
        out.print(f"resumed from step {s['resumed_from']} (the checkpoint's); the measured steps follow it")
    t = Table(title=f"{s['steps']} measured steps after {s['warmup']} warm-up")
    for col in ("", "step time s", "tokens/s", "samples/s"):
        t.add_column(col, justify="right")
    t.add_row("measured", f"{m['step_time_s']:.4f}", f"{m['tokens_per_s']:.1f}", f"{m['samples_per_s']:.2f}")
    if p is not None:
        t.add_row("predicted", f"{p['step_time_s']:.4f}", f"{p['tokens_per_s']:.1f}", f"{p['samples_per_s']:.2f}")
        t.add_row("error", f"{100 * (p['step_time_s'] / m['step_time_s'] - 1):+.1f}%", "", "")
    out.print(t)
    chunked = any(len(row.get("chunks", ())) > 1 for row in m["stages"])
    st = Table(title="per stage, seconds per step (mean over its ranks)" if not chunked else
               "per pipeline position, its chunks together, seconds per step")
    for col in ("replica", "stage" if not chunked else "stages", "units", "devices", "compute", "comm", "optimizer", "idle"):
        st.add_column(col, justify="right")
    for row in m["stages"]:
        chunks = row.get("chunks") or [row["layers"]]
        st.add_row(str(row["replica"]), "+".join(str(k) for k in row.get("stages") or [row["stage"]]),
                   ",".join(f"{a}-{b - 1}" for a, b in chunks),
                   ",".join(row["devices"]), *(f"{row[k]:.4f}" for k in ("compute_s", "comm_s", "optimizer_s", "idle_s")))
    out.print(st)
    out.print(f"losses: {', '.join(f'{x:.4f}' for x in m['losses'])}")
    out.print(_memory_line(m, p))
    if s["run_dir"]:
        out.print(f"rank files: {s['run_dir']}")


def _mismatch_line(check) -> str:
    return (f"--check-gradients: the run differs from the single-process reference at step {check.step}: "
            f"{check.mismatches[0]}" + (f" (and {len(check.mismatches) - 1} more)" if len(check.mismatches) > 1 else ""))


def _show_check(check) -> None:
    from rich.table import Table

    tol = check.tolerance
    t = Table(title=f"gradient check, step {check.step}: {'PASSED' if check.passed else 'FAILED'} against the "
                    f"single-process reference (|error| <= {tol['grad_atol']:g} + {tol['grad_rtol']:g} |reference|)")
    for col in ("unit", "params", "max abs error", "max rel error", "worst parameter", "elements off"):
        t.add_column(col, justify="right")
    for g in check.groups:
        t.add_row(g["group"], str(g["params"]), f"{g['max_abs_error']:.2e}", f"{g['max_rel_error']:.2e}", g["worst"],
                  str(g["mismatched"]))
    out = console()
    out.print(t)
    out.print(f"loss {check.loss:.6f}, reference {check.reference_loss:.6f} (relative error {check.loss_rel_error:.1e}, "
              f"tolerance {tol['loss_rtol']:g}); max rel error: the worst parameter's largest error over its "
              f"reference gradient's largest magnitude (gradients within {tol['grad_atol']:g} of zero: absolute "
              "error only)")
    for line in check.mismatches[:10]:
        out.print(f"mismatch: {line}")


def _memory_line(m: dict, p: dict | None) -> str:
    """Peak memory per device type, measured and predicted under the same key (the plan's GPU names)."""
    predicted = (p or {}).get("peak_memory_gb") or {}
    parts = []
    for gpu, gb in m["peak_memory_gb"].items():
        text = f"{gpu} {gb * 1e3:.1f} MB measured"
        if gpu in predicted:
            text += f", {predicted[gpu] * 1e3:.1f} MB predicted ({100 * (predicted[gpu] / gb - 1):+.1f}%)" if gb > 0 else \
                f", {predicted[gpu] * 1e3:.1f} MB predicted"
        parts.append(text)
    how = {"live_tensors": "bytes of live tensors at their peak, counted in one extra untimed step",
           "cuda_max_allocated": "torch.cuda.max_memory_allocated"}.get(m["memory_method"], m["memory_method"])
    return f"peak memory per device type: {'; '.join(parts)} ({how})"


def _show_local(result) -> None:
    """What a machine other than node rank 0 prints: its ranks' measured step times and losses."""
    n = result.nodes
    out = console()
    out.print(f"node rank {n.node_rank} of {n.nnodes}: this machine's ranks; node rank 0 ({n.master_addr}) prints "
              "the whole run's measurements")
    for r in result.ranks:
        out.print(f"rank {r['rank']} ({r['device']}): step times "
                  f"{', '.join(f'{x:.4f}' for x in r['step_times_s'])} s; losses {', '.join(f'{x:.4f}' for x in r['losses'])}")
    if result.run_dir:
        out.print(f"rank files: {result.run_dir}")


def _headline(s: dict) -> str:
    model, emu = s["model"], s["emulation"]
    if model["shrunken"]:
        what = (f"[bold]{model['name']}[/] ran SHRUNKEN ({model['scale']}): hidden {model['hidden_size']}, "
                f"{model['num_units']} units, seq {model['seq_len']} (plan: {model['full_seq_len']}), "
                f"{params_text(model['num_params'])} of {params_text(model['full_num_params'])} parameters")
    else:
        what = f"[bold]{model['name']}[/] ran as given: {model['num_units']} units, {params_text(model['num_params'])} parameters"
    if not emu["enabled"]:
        return what + "; no emulation (every process at this machine's speed)"
    compute = emu.get("compute_time_factor") or emu["time_factor"]
    if abs(compute - emu["time_factor"]) > 1e-6 * compute:
        return what + (f"; cluster {s['cluster']} emulated {compute:.0f}x slower than real, its links "
                       f"{emu['time_factor']:.0f}x (--links balanced)")
    return what + f"; cluster {s['cluster']} emulated {emu['time_factor']:.0f}x slower than real"


def register(app: typer.Typer) -> None:
    app.command("run")(run)
