"""Checkpoints of a running plan with ``torch.distributed.checkpoint`` (``hetpart run --checkpoint DIR``).

Every rank saves what it holds under canonical, plan-independent keys: ``model.<unit>.<param>`` for
weights and ``optim.<unit>.<param>.<state>`` for Adam's step and moments. Ranks that hold the same
unit (data-parallel replicas, tied copies) hold identical values after the exact gradient sync, and
DCP keeps one copy; tensor-parallel shards are DTensors, which DCP saves as shards of one tensor.
Slices of an uneven split (:mod:`hetpart.runtime.uneven_tp`; DTensor cannot describe them) are put
together into the whole tensor over their TP group before saving, and cut at their prefix-sum offset
after loading, so a checkpoint does not depend on the split.
Adam's states of uneven shards (:mod:`hetpart.runtime.dist_optimizer`) are all-gathered whole the same
way and cut back into each rank's ranges after loading, so such a checkpoint resumes under any fractions.
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
    dist_opt = getattr(executor, "dist_optimizer", None)
    for key, p in executor.params.items():
        state[f"model.{key}"] = p
        if dist_opt is not None and key in executor.sharded_keys:
            continue  # uneven shards: whole tensors from ShardedAdam.whole_states
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
    state = _state(executor, create=False)
    if getattr(executor, "dist_optimizer", None) is not None:
        state.update(executor.dist_optimizer.whole_states())
    dcp.save(_whole_slices(executor, state), checkpoint_id=str(directory))
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
    local = _state(executor, create=True)
    dist_opt = getattr(executor, "dist_optimizer", None)
    sharded = dist_opt.whole_states() if dist_opt is not None else {}  # shaped as held here; dcp.load fills them
    local.update(sharded)
    state = _whole_slices(executor, local, gather=False)
    try:
        dcp.load(state, checkpoint_id=str(directory))
    except Exception as exc:  # DCP raises plain exceptions (missing keys, shape mismatches)
        raise RuntimeFault(f"{directory}: cannot resume from this checkpoint "
                           f"({' '.join(str(exc).split())[:200]}); it was written for another model or plan") from None
    _cut_slices(executor, local, state)
    if dist_opt is not None:
        dist_opt.load_whole_states({k: local[k] for k in sharded})  # loaded in place, slices cut in
    return int(info["next_step"])


def _sliced(executor, name: str) -> tuple[str, tuple[int, int, int]] | None:
    """``(parameter key, (dim, offset, length))`` of a state entry that is an uneven-split slice."""
    slices = getattr(executor, "_slices", {})
    kind, _, rest = name.partition(".")
    key = rest if kind == "model" else rest.rsplit(".", 1)[0]
    if key in slices and not name.endswith(".step"):
        return key, slices[key]
    return None


def _whole_slices(executor, state: dict[str, Any], gather: bool = True) -> dict[str, Any]:
    """``state`` with every uneven slice replaced by the whole tensor (summed over the TP group when
    ``gather``, zeros to load into otherwise)."""
    import torch
    import torch.distributed as dist

    out = dict(state)
    group = None
    for name, t in state.items():
        found = _sliced(executor, name)
        if found is None:
            continue
        key, (dim, offset, length) = found
        whole = torch.zeros(executor._param_info[key].shape, dtype=t.dtype, device=t.device)
        if gather:
            whole.narrow(dim, offset, length).copy_(t.detach())
            if group is None:
                ranks = executor.layout.tp_groups[(executor.replica, executor.role.stages[0] % executor.pp)]
                group = executor.groups.group(ranks)
            dist.all_reduce(whole, group=group)
        out[name] = whole
    return out


def _cut_slices(executor, local: dict[str, Any], loaded: dict[str, Any]) -> None:
    """Copy this rank's slice of every loaded whole tensor into its parameter or optimizer state."""
    import torch

    with torch.no_grad():
        for name, t in local.items():
            found = _sliced(executor, name)
            if found is not None:
                _, (dim, offset, length) = found
                t.copy_(loaded[name].narrow(dim, offset, length))
