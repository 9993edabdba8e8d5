"""Options and helpers shared by the CLI commands."""

from __future__ import annotations

import sys
from typing import Any

import typer

__all__ = ["GlobalBatch", "SeqLen", "Precision", "RecomputeOpt", "OptimizerOpt", "AttentionOpt", "JsonFlag", "ModelArg", "ClusterArg",
           "emit_json", "json_text", "console", "workload_from", "resolve_precision", "params_text",
           "refuse_replacing", "is_plan_text"]

ModelArg = typer.Option(..., "--model", "-m", help="Catalog name, path to a HF config.json, or python:MODULE:FUNCTION.")
ClusterArg = typer.Option(..., "--cluster", "-c", help="Catalog name or path to a cluster YAML.")
GlobalBatch = typer.Option(512, "--global-batch", help="Sequences per optimizer step.")
SeqLen = typer.Option(None, "--seq-len", help="Tokens per sequence (default: the model's own maximum, at most 2048).")
Precision = typer.Option(None, "--precision", help="bf16, fp16, fp32, tf32 or fp8 (default: bf16 where every device has "
                         "it, else fp16; fp32 is IEEE fp32, tf32 fp32 with TF32 tensor-core products; fp8 on "
                         "Hopper, Ada and MI300 only).")
RecomputeOpt = typer.Option("auto", "--recompute", help="none, selective, full or auto.")
ZeroOpt = typer.Option(None, "--zero", help="Sharded data parallelism: 0 none, 1 optimizer states, 2 + gradients, "
                       "3 + parameters (FSDP). plan: default lets the planner choose; predict: default the plan's, else 0.")
OffloadOpt = typer.Option(None, "--offload", help="Model states in host memory: none, optimizer (ZeRO-Offload: "
                          "master weights, moments and gradient shards; the optimizer step on the CPU) or full (also "
                          "the parameters; needs --zero 3); plan also takes auto (offload only where nothing fits "
                          "otherwise). plan: default none; predict: default the plan's, else none.")
OptimizerOpt = typer.Option("adam", "--optimizer", help="adam, sgd (momentum) or adam8bit: model-state bytes and "
                            "optimizer step time.")
AttentionOpt = typer.Option("fused", "--attention", help="fused (flash/SDPA: no attention-score matrix stored) or "
                            "eager (scores stored for the backward).")
JsonFlag = typer.Option(False, "--json", help="Print exactly one JSON object on stdout.")
OverlapP2POpt = typer.Option(None, "--overlap-p2p/--no-overlap-p2p", help="The engine overlaps pipeline sends "
                             "with compute over RDMA (asynchronous p2p) or not (default: sends block the sender, as "
                             "Megatron-LM's 1F1B does; predict and show: the plan's recorded choice).")
OverlapGradOpt = typer.Option(None, "--overlap-grad-reduce/--no-overlap-grad-reduce", help="Gradient all-reduces "
                              "run bucket by bucket during the backward (default, DDP and Megatron-LM's "
                              "--overlap-grad-reduce) or after it (engines that sync after the backward); predict and "
                              "show: default the plan's recorded choice.")
OpCountsOpt = typer.Option(None, "--op-counts", help="Operators each unit dispatches, for the host's fixed "
                           "cost per operator: engine (default: the kernel set's own; Megatron-Core with Transformer "
                           "Engine's fused kernels, a Llama block 12/20, or hetpart's runtime's eager modules under "
                           "its torch kernels) or measured (the counts of eager PyTorch modules whatever the kernel "
                           "set, a Llama block 66/138, and the vocabulary as it is, unpadded: hand-written engines without "
                           "fused kernels); predict and show: default the plan's recorded choice.")

ENGINE_DEFAULTS = {"overlap_p2p": False, "overlap_grad_reduce": True, "op_counts": "engine"}
"""The simulator's engine options when no flag and no plan says otherwise (:class:`Simulator`'s defaults)."""


_PIPE_WIDTH = 200
"""Columns when stdout is not a terminal (rich would assume 80 and cut device and model names)."""


def console(stderr: bool = False):
    """A rich console whose tables never cut identifiers: cells fold onto the next line instead of
    ending in an ellipsis, and output that goes to a file or pipe is 200 columns wide."""
    from rich.console import Console
    from rich.table import Table

    class _Folding(Console):
        def print(self, *objects, **kwargs):
            for obj in objects:
                if isinstance(obj, Table):
                    for col in obj.columns:
                        col.overflow = "fold"
            super().print(*objects, **kwargs)

    stream = sys.stderr if stderr else sys.stdout
    return _Folding(stderr=stderr, width=None if stream.isatty() else _PIPE_WIDTH)


def emit_json(obj: Any) -> None:
    """``obj`` as one JSON object on stdout; a float that is not finite (NaN: nothing measured) is written null,
    since JSON has no NaN and strict parsers (JavaScript's JSON.parse) refuse it."""
    sys.stdout.write(json_text(obj, indent=2) + "\n")


def json_text(obj: Any, indent: int | None = None) -> str:
    """``obj`` as strict JSON text: objects with ``to_dict``/``item`` converted, non-finite floats as null."""
    from hetpart._json import strict_dumps

    return strict_dumps(obj, indent=indent, default=_default)


def _default(o: Any) -> Any:
    if hasattr(o, "to_dict"):
        return o.to_dict()
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, (set, tuple)):
        return list(o)
    return str(o)


def resolve_precision(precision: str | None, gpus, source: str = "--precision") -> str:
    """The given precision checked against the device types ``gpus``, or their common default."""
    from hetpart.workload import check_precision, default_precision

    return default_precision(gpus) if precision is None else check_precision(precision, gpus, source)


def params_text(n: float) -> str:
    """A parameter count as the field writes it: 124M, 1.56B, 1.8T."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            value = n / scale
            return f"{value:.3g}{unit}" if value < 100 else f"{value:.0f}{unit}"
    return f"{n:.0f}"


def workload_from(global_batch: int, seq_len: int, precision: str, recompute: str, zero: int | None = None,
                  optimizer: str = "adam", attention: str = "fused", offload: str | None = None):
    from hetpart.workload import Workload

    return Workload(global_batch=global_batch, seq_len=seq_len, precision=precision, recompute=recompute, zero=zero,
                    optimizer=optimizer, attention=attention, offload=offload or "none")


def engine_flags(overlap_p2p: bool | None, overlap_grad_reduce: bool | None, op_counts: str | None) -> dict:
    """The engine options given on the command line (``--[no-]overlap-p2p``, ``--[no-]overlap-grad-reduce``,
    ``--op-counts``; None: not given), default values included: an explicit flag overrides what a plan recorded."""
    from hetpart.errors import SpecError

    if op_counts is not None and op_counts not in ("measured", "engine"):
        raise SpecError(f"--op-counts: unknown {op_counts!r}; use measured or engine")
    given = {"overlap_p2p": overlap_p2p, "overlap_grad_reduce": overlap_grad_reduce, "op_counts": op_counts}
    return {key: value for key, value in given.items() if value is not None}


def non_default(options: dict) -> dict:
    """``options`` without the engine options at their defaults (a predictor that does not take them then refuses
    only the ones that change its answer, with one clear line)."""
    return {key: value for key, value in options.items()
            if key not in ENGINE_DEFAULTS or ENGINE_DEFAULTS[key] != value}


def engine_options(overlap_p2p: bool | None = None, overlap_grad_reduce: bool | None = None,
                   op_counts: str | None = None) -> dict:
    """The simulator options of the engine flags, only where they differ from the defaults."""
    return non_default(engine_flags(overlap_p2p, overlap_grad_reduce, op_counts))


def refuse_replacing(out, flag: str, command: str, writes: str, is_ours) -> None:
    """Refuse, before any work, an ``out`` that already holds a file this command did not write: the command
    replaces the file whole, and a probe of 2026-12-01 lost a run-records store (``hetpart run --out``'s JSON
    lines, hours of measured runs) to ``hetpart plan --out``. An earlier output of the same kind (``is_ours`` of
    its text is true) is replaced as before, an empty or whitespace-only file too; a missing path, a folder or a file that cannot be
    read is left to the writer, whose own error names it.

    Args:
        out: the path given (None: nothing is written).
        flag: the option, for the message (``--out``).
        command: the command that writes, for the message (``hetpart plan --out``).
        writes: what the command writes (``a plan JSON``).
        is_ours: text -> whether it is an earlier output of the command.

    Raises:
        PlanError: ``FLAG: OUT holds ...; choose another path ... (nothing was written)``.
    """
    from pathlib import Path

    from hetpart import _validate
    from hetpart.errors import PlanError
    from hetpart.records import holds_run_records

    if out is None:
        return
    path = Path(out)
    try:
        if not path.is_file() or path.stat().st_size == 0:
            return
        if path.stat().st_size > _validate.MAX_FILE_BYTES:
            text = None  # no output of hetpart's is this large
        else:
            text = path.read_bytes().decode("utf-8", errors="replace")
        records = holds_run_records(path)
    except OSError:
        return
    if text is not None and (is_ours(text) or not text.strip()):
        return  # an earlier output of the command, or only whitespace: nothing to lose
    fix = "choose another path, or move that file away first (nothing was written)"
    if records:
        raise PlanError(f"{flag}: {out} holds hetpart run records ('hetpart run --out' appends them there), which "
                        f"{command} would replace with {writes}; {fix}")
    raise PlanError(f"{flag}: {out} exists and is not {writes} ({command} replaces only {writes} it wrote); {fix}")


def is_plan_text(text: str) -> bool:
    """Whether ``text`` is a plan as ``hetpart plan --out`` writes it: one JSON object with ``replicas``."""
    import json

    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return False
    return isinstance(data, dict) and "replicas" in data
