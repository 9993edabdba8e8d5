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
                   out: Optional[Path] = typer.Option(None, "--out", help="Also write the artifact alone to this file."),
                   strict: bool = typer.Option(False, "--strict", help="Exit 2 when the target cannot express all of the plan."),
                   json_out: bool = JsonFlag) -> None:
    """Print the launch arguments (Megatron-LM), config (torchtitan TOML, DeepSpeed JSON) for PLAN, and what
    the target cannot express."""
    from hetpart.errors import PlanError
    from hetpart.export import TARGETS, export_plan
    from hetpart.graph import load_model
    from hetpart.plan import load_plan

    if to not in TARGETS:
        raise PlanError(f"--to: unknown target {to!r}; use one of {', '.join(TARGETS)}")
    plan = load_plan(plan_path)
    spec = model or plan.meta.get("model")
    if not isinstance(spec, str) or not spec:
        raise PlanError(f"{plan_path}: meta.model: missing (the plan does not say which model it was made for); "
                        "give --model")
    graph = load_model(spec, seq_len=plan.seq_len, precision=plan.precision)
    result = export_plan(plan, graph, to)
    if out is not None:
        try:
            out.write_text(result.text)
        except OSError as exc:
            raise PlanError(f"--out: cannot write {out} ({exc.strerror or exc.__class__.__name__}); check the "
                            "directory") from None
    if strict and result.cannot_express:
        raise PlanError(f"--strict: {to} cannot express: {'; '.join(result.cannot_express)}")
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
