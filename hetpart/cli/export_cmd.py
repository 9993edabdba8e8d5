"""``hetpart export PLAN --to megatron|torchtitan|deepspeed``: the plan as an engine's arguments or config."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from hetpart.cli.common import JsonFlag, emit_json

__all__ = ["register"]


def export_command(plan_path: Path = typer.Argument(..., metavar="PLAN", help="A plan JSON written by 'hetpart plan --out'."),
                   to: str = typer.Option(..., "--to", help="megatron, torchtitan or deepspeed."),
                   model: Optional[str] = typer.Option(None, "--model", "-m", help="Model (default: the plan's meta.model)."),
                   cluster: Optional[str] = typer.Option(None, "--cluster", "-c",
                                                         help="Cluster (default: the plan's meta.cluster)."),
                   out: Optional[Path] = typer.Option(None, "--out", help="Also write the artifact alone to this file."),
                   strict: bool = typer.Option(False, "--strict", help="Exit 2, writing nothing, when the target cannot express all of the plan."),
                   json_out: bool = JsonFlag) -> None:
    """Print the launch arguments (Megatron-LM), config (torchtitan TOML, DeepSpeed JSON) for PLAN, and what
    the target cannot express. PLAN is checked against its model and cluster first, as 'predict --plan' does."""
    from dataclasses import replace

    from hetpart.cli.plan_cmd import _from_plan_meta, _load, _stated_precision, note_cluster_changed
    from hetpart.errors import PlanError
    from hetpart.export import TARGETS, export_plan

    if to not in TARGETS:
        raise PlanError(f"--to: unknown target {to!r}; use one of {', '.join(TARGETS)}")
    model, cluster, plan = _from_plan_meta(plan_path, model, cluster)
    from hetpart import _validate

    _validate.refuse_input_as_output(PlanError, out, "--out", {"PLAN": plan_path, "--model": model, "--cluster": cluster})
    from hetpart.cli.common import refuse_replacing
    from hetpart.export import is_export

    refuse_replacing(out, "--out", "hetpart export --out", f"a {to} export", lambda text: is_export(text, to))
    graph, cl, precision = _load(model, cluster, plan.seq_len, _stated_precision(plan, plan_path), devices=plan.devices,
                                 precision_source=f"{plan_path}: precision", seq_len_source=f"{plan_path}: seq_len")
    plan = replace(plan, precision=precision)
    plan.check(graph, cl, str(plan_path))  # an impossible plan has no launch arguments
    note_cluster_changed(plan, cl, plan_path)
    result = export_plan(plan, graph, to, cl)
    if strict and result.cannot_express:  # refused before --out: a refused export writes nothing
        raise PlanError(f"--strict: {to} cannot express: {'; '.join(result.cannot_express)}")
    if out is not None:
        try:
            out.write_text(result.text)
        except OSError as exc:
            raise PlanError(f"--out: cannot write {out} ({exc.strerror or exc.__class__.__name__}); check the "
                            "directory") from None
    if json_out:
        emit_json(result.to_dict())
        return
    sys.stdout.write(result.text)
    for note in result.notes:
        print(f"# {note}")
    for what in result.cannot_express:
        print(f"hetpart: warning: {to} cannot express {what}", file=sys.stderr)


def register(app: typer.Typer) -> None:
    app.command("export")(export_command)
