"""Options and helpers shared by the CLI commands."""

from __future__ import annotations

import json
import sys
from typing import Any

import typer

__all__ = ["GlobalBatch", "SeqLen", "Precision", "RecomputeOpt", "JsonFlag", "ModelArg", "ClusterArg",
           "emit_json", "console", "workload_from"]

ModelArg = typer.Option(..., "--model", "-m", help="Catalog name, path to a HF config.json, or python:MODULE:FUNCTION.")
ClusterArg = typer.Option(..., "--cluster", "-c", help="Catalog name or path to a cluster YAML.")
GlobalBatch = typer.Option(512, "--global-batch", help="Sequences per optimizer step.")
SeqLen = typer.Option(2048, "--seq-len", help="Tokens per sequence.")
Precision = typer.Option("bf16", "--precision", help="bf16, fp16 or fp32.")
RecomputeOpt = typer.Option("auto", "--recompute", help="none, selective, full or auto.")
JsonFlag = typer.Option(False, "--json", help="Print exactly one JSON object on stdout.")


def console():
    from rich.console import Console

    return Console()


def emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=_default) + "\n")


def _default(o: Any) -> Any:
    if hasattr(o, "to_dict"):
        return o.to_dict()
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, (set, tuple)):
        return list(o)
    return str(o)


def workload_from(global_batch: int, seq_len: int, precision: str, recompute: str):
    from hetpart.workload import Workload

    return Workload(global_batch=global_batch, seq_len=seq_len, precision=precision, recompute=recompute)
