"""``hetpart show --html`` (the plan report) and ``hetpart dashboard`` (TensorBoard over the runs)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any, Optional

import typer

__all__ = ["register", "plan_html"]


def plan_html(plan_path: Path, plan, graph, cluster, prediction, compare: str, options: dict | None = None) -> str:
    """The HTML report of ``plan``: upper bound, provenance and, for ``compare``, other planners' results, all
    priced on the plan's own input: its workload and the simulator ``options`` that priced it (engine options,
    a profile: :func:`hetpart.cli.recorded.plan_options`)."""
    from hetpart import __version__, report
    from hetpart.policies import upper_bound

    options = options or {}
    workload = _workload(plan)
    bound = upper_bound(graph, cluster, workload, predictor="simulator", predictor_options=options)
    comparison = _compare(graph, cluster, workload, plan, prediction, compare, options)
    provenance = {"predictor": "simulator (hetpart.costmodel.simulate, analytical; see docs/BENCHMARKS.md#simulator)",
                  "plan file": str(plan_path), "model": str(plan.meta.get("model", graph.name)),
                  "cluster": str(plan.meta.get("cluster", cluster.name)), "hetpart": __version__}
    return report.plan_report(plan, cluster, graph, prediction, upper_bound=bound, comparison=comparison,
                              provenance=provenance)


def _workload(plan):
    """The workload ``hetpart plan`` planned ``plan`` for (its ``meta.workload``: the choices it left to the
    planner, such as recompute auto or no zero stage, stay open), with the plan's own batch, sequence length and
    precision; a plan without a readable record: the plan's own optimizer, attention, recompute and offload,
    the zero stage left to the planners."""
    from hetpart.errors import HetpartError
    from hetpart.workload import Workload

    own = {"global_batch": plan.global_batch, "seq_len": plan.seq_len, "precision": plan.precision}
    saved = plan.meta.get("workload") if isinstance(plan.meta.get("workload"), dict) else {}
    keys = ("recompute", "optimizer", "attention", "zero", "offload")
    try:
        recorded = {key: saved[key] for key in keys if key in saved}
        if recorded.get("offload") == "auto":  # the offload the planner settled on, as plan's bound takes it
            recorded["offload"] = plan.offload
        return Workload(**own, **recorded) if recorded else _plan_workload(plan, own)
    except (HetpartError, TypeError):
        return _plan_workload(plan, own)


def _plan_workload(plan, own: dict):
    from hetpart.workload import Workload

    return Workload(**own, recompute=plan.recompute, optimizer=plan.optimizer, attention=plan.attention,
                    offload=plan.offload)


def _compare(graph, cluster, workload, plan, prediction, compare: str,
             options: dict | None = None) -> list[dict[str, Any]]:
    from hetpart.policies import plan as run_planner
    from hetpart.errors import HetpartError

    names = [n.strip() for n in compare.split(",") if n.strip()]
    if not names:
        return []
    chosen = str(plan.meta.get("planner", "this plan"))
    took = plan.meta.get("plan_time_s")  # what the planner that wrote the file took (older files: none)
    took = float(took) if isinstance(took, (int, float)) and not isinstance(took, bool) else None
    rows = [{"planner": chosen, "tokens_per_s": prediction.tokens_per_s, "step_time_s": prediction.step_time_s,
             "fits_in_memory": prediction.fits_in_memory, "plan_time_s": took}]
    from hetpart.costmodel.predictor import get_predictor

    predictor = get_predictor("simulator", graph, cluster, workload, **options) if options else "simulator"
    for name in dict.fromkeys(names):
        if name == chosen:
            continue
        try:
            result = run_planner(graph, cluster, workload, name, predictor=predictor)
        except HetpartError as exc:
            if "unknown planner" in str(exc):
                raise
            rows.append({"planner": name, "tokens_per_s": None, "error": " ".join(str(exc).split())})
            continue
        rows.append({"planner": name, "tokens_per_s": result.prediction.tokens_per_s,
                     "step_time_s": result.prediction.step_time_s, "fits_in_memory": result.prediction.fits_in_memory,
                     "plan_time_s": result.wall_time_s})
    return rows


def dashboard_command(logdir: Optional[Path] = typer.Option(None, "--logdir", help="The runs folder to serve "
                                                             "(default: runs, created when missing)."),
                      port: int = typer.Option(6006, "--port", help="TCP port on 127.0.0.1 (0: a free one).")) -> None:
    """Serve the tracked runs (training curves, cost-model errors, benchmark scalars) with TensorBoard on 127.0.0.1."""
    from hetpart._validate import path_exists
    from hetpart.experiments.dashboard import Dashboard

    if logdir is not None and not path_exists(logdir):  # a mistyped folder would be served empty
        from hetpart.errors import SpecError

        raise SpecError(f"--logdir: {logdir}: no such directory; give the runs folder ('hetpart run' and 'hetpart "
                        "bench' write to runs/)")
    logdir = logdir or Path("runs")
    board = Dashboard(logdir, port=port)
    from hetpart.errors import Interrupted

    def _terminated(signum, frame):  # kill and timeout: 143, as 'hetpart run' ends on SIGTERM
        raise Interrupted("stopped by SIGTERM", 128 + signum)

    term = signal.signal(signal.SIGTERM, _terminated)
    try:
        board.start()
        print(f"hetpart dashboard: {board.url} (TensorBoard over {logdir.resolve()}); Ctrl-C stops it", flush=True)
        code = board.wait()
    except KeyboardInterrupt:  # the way to end it: stop TensorBoard and exit 130 (interrupted)
        board.stop()
        print("hetpart dashboard: stopped", file=sys.stderr)
        raise typer.Exit(130) from None
    except Interrupted:  # SIGTERM: stop TensorBoard and exit 143
        board.stop()
        print("hetpart dashboard: stopped", file=sys.stderr)
        raise
    finally:
        board.stop()
        signal.signal(signal.SIGTERM, term)
    if code:
        from hetpart.errors import RuntimeFault

        raise RuntimeFault(f"dashboard: TensorBoard exited with code {code}")


def register(app: typer.Typer) -> None:
    app.command("dashboard")(dashboard_command)
