"""Checkpoints of a running plan with ``torch.distributed.checkpoint`` (``hetpart run --checkpoint DIR``).

Every rank saves what it holds under canonical, plan-independent keys: ``model.<unit>.<param>`` for
weights and ``optim.<unit>.<param>.<state>`` for Adam's step and moments. Ranks that hold the same
unit (data-parallel replicas, tied copies) hold identical values after the exact gradient sync, and
DCP keeps one copy; tensor-parallel shards are DTensors, which DCP saves as shards of one tensor.
Rank 0 then writes ``hetpart_checkpoint.json`` with the next step, so a resumed run feeds the same
synthetic batches (they depend on the step only) to the same weights and optimizer state: its
losses continue those of an uninterrupted run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hetpart.errors import RuntimeFault

__all__ = ["save_checkpoint", "load_checkpoint", "checkpoint_info", "META_FILE"]

META_FILE = "hetpart_checkpoint.json"
_ADAM_STATES = ("step", "exp_avg", "exp_avg_sq")


def checkpoint_info(directory: str | Path) -> dict[str, Any] | None:
    """The metadata of the checkpoint in ``directory`` (None when there is none)."""
    path = Path(directory) / META_FILE
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise RuntimeFault(f"{path}: unreadable checkpoint metadata ({getattr(exc, 'strerror', None) or 'invalid JSON'}); "
                           "remove the directory or give another --checkpoint") from None


def _state(executor, *, create: bool) -> dict[str, Any]:
    """This rank's tensors by canonical key (optimizer state created as zeros when ``create``)."""
    import torch

    state: dict[str, Any] = {}
    for key, p in executor.params.items():
        state[f"model.{key}"] = p
        opt = executor.optimizer.state.get(p)
        if not opt and create:
            opt = {"step": torch.tensor(0.0, dtype=torch.float32), "exp_avg": torch.zeros_like(p),
                   "exp_avg_sq": torch.zeros_like(p)}
            executor.optimizer.state[p] = opt
        if opt:
            for name in _ADAM_STATES:
                state[f"optim.{key}.{name}"] = opt[name]
    return state


def save_checkpoint(directory: str | Path, executor, next_step: int, meta: dict[str, Any] | None = None) -> None:
    """Save every rank's weights and Adam state (collective: every rank calls it)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    dcp.save(_state(executor, create=False), checkpoint_id=str(directory))
    if not dist.is_initialized() or dist.get_rank() == 0:
        info = {"next_step": next_step, "model": executor.spec.name, "num_units": len(executor.infos),
                **(meta or {})}
        tmp = directory / (META_FILE + ".tmp")
        tmp.write_text(json.dumps(info, indent=1))
        tmp.replace(directory / META_FILE)
    if dist.is_initialized():
        dist.barrier()


def load_checkpoint(directory: str | Path, executor) -> int:
    """Load the checkpoint in ``directory`` into ``executor``; returns the step to continue from (0 when
    the directory holds no checkpoint yet). Collective: every rank calls it."""
    import torch.distributed.checkpoint as dcp

    info = checkpoint_info(directory)
    if info is None:
        return 0
    if info.get("num_units") != len(executor.infos):
        raise RuntimeFault(f"{directory}: the checkpoint holds a model of {info.get('num_units')} units "
                           f"({info.get('model')}) but this run has {len(executor.infos)}; give another --checkpoint")
    state = _state(executor, create=True)
    try:
        dcp.load(state, checkpoint_id=str(directory))
    except Exception as exc:  # DCP raises plain exceptions (missing keys, shape mismatches)
        raise RuntimeFault(f"{directory}: cannot resume from this checkpoint "
                           f"({' '.join(str(exc).split())[:200]}); it was written for another model or plan") from None
    return int(info["next_step"])
