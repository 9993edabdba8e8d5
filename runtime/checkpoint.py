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
Each save goes into a folder of its own, ``DIR/step-<next step>``; only when every rank has written it
does rank 0 point ``hetpart_checkpoint.json`` at it (an atomic replace) and remove the older folders, so a
save cut short (Ctrl-C, a crash, a hang-timeout kill) leaves the last complete checkpoint in force.
Checkpoints written before the folders (their files in ``DIR`` itself, no ``data`` key) still load.
Rank 0 writes ``hetpart_checkpoint.json`` with the next step, so a resumed run feeds the same
synthetic batches (they depend on the step only) to the same weights and optimizer state: its
losses continue those of an uninterrupted run. It also names the model that ran (:func:`model_identity`:
name, hidden size, parameter count, a fingerprint of its units' sizes), so that a run of another model or
scale is refused before any rank starts (:func:`identity_mismatch`) instead of failing inside DCP.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hetpart.errors import RuntimeFault

__all__ = ["save_checkpoint", "load_checkpoint", "checkpoint_info", "model_identity", "identity_mismatch", "META_FILE"]

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


_IDENTITY_KEYS = ("model", "num_units", "hidden_size", "num_params", "units_fingerprint")
"""What must agree between a checkpoint and the run that resumes it (a checkpoint written before a key
was kept is compared on the keys it has)."""


def model_identity(runnable, graph, model_spec: str | None = None, scale: Any = None) -> dict[str, Any]:
    """What identifies the model that runs, as ``hetpart_checkpoint.json`` keeps it: the runnable's name,
    its unit count, hidden size and parameter count, and a fingerprint of every unit's kind and parameter
    count (the shapes DCP loads into; the plan's cut, TP degrees and fractions are not in it: checkpoints
    are plan-independent). ``model_spec`` and ``scale`` are kept for the messages only."""
    import hashlib

    units = ";".join(f"{u.kind}:{u.params}" for u in graph.units)
    config = getattr(runnable, "config", None)
    out: dict[str, Any] = {"model": runnable.name, "num_units": graph.num_units,
                           "hidden_size": getattr(config, "hidden_size", None) if config is not None else None,
                           "num_params": int(graph.num_params),
                           "units_fingerprint": hashlib.sha256(units.encode()).hexdigest()[:16]}
    if model_spec is not None:
        out["model_spec"] = model_spec
    if scale is not None:
        out["scale"] = scale
    return out


def _describe(ident: dict[str, Any]) -> str:
    parts = [str(ident.get("model", "?"))]
    if ident.get("hidden_size") is not None:
        parts.append(f"hidden {ident['hidden_size']}" + (f" (--scale {ident['scale']})" if isinstance(ident.get("scale"), str)
                                                          else ""))
    if ident.get("num_params") is not None:
        parts.append(f"{ident['num_params']:,} parameters")
    if ident.get("num_units") is not None:
        parts.append(f"{ident['num_units']} units")
    return ", ".join(parts)


def identity_mismatch(directory: str | Path, info: dict[str, Any], ident: dict[str, Any]) -> str | None:
    """One line saying why the checkpoint ``info`` in ``directory`` cannot resume the model ``ident``
    (:func:`model_identity`), with the fix; None when they agree on every key the checkpoint keeps."""
    differ = [k for k in _IDENTITY_KEYS if k in info and info[k] is not None and k in ident and ident[k] is not None
              and info[k] != ident[k]]
    if not differ:
        return None
    what = ("another model" if "model" in differ else
            "another size of the model" if {"hidden_size", "num_params", "units_fingerprint"} & set(differ) else
            "a model of another unit count")
    fixes = []
    if "model" in differ and info.get("model_spec"):
        fixes.append(f"--model {info['model_spec']}")
    if "model" not in differ and info.get("scale") is not None and info.get("scale") != ident.get("scale"):
        scale = info["scale"]
        fixes.append(f"--scale {scale}" if isinstance(scale, str) else f"--hidden-size {scale}")
    fix = (f"run with {' '.join(fixes)} to resume it, or give another --checkpoint directory" if fixes else
           "give another --checkpoint directory (or remove this one to start over)")
    return (f"--checkpoint: {directory} holds a checkpoint of {what} ({_describe(info)}; differs in "
            f"{', '.join(differ)}), but this run's model is {_describe(ident)}; {fix}")


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


def _data_dir(directory: Path, info: dict[str, Any] | None) -> Path:
    """Where the tensors of the checkpoint described by ``info`` lie (``DIR`` itself before the folders)."""
    data = (info or {}).get("data")
    return directory / data if isinstance(data, str) and data else directory


def save_checkpoint(directory: str | Path, executor, next_step: int, meta: dict[str, Any] | None = None) -> None:
    """Save every rank's weights and Adam state (collective: every rank calls it).

    The tensors go to ``DIR/step-<next_step>``, a folder no complete checkpoint is in; the metadata file is
    switched to it only after every rank has written its part, then older folders are removed."""
    import shutil

    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    rank0 = not dist.is_initialized() or dist.get_rank() == 0
    target = directory / f"step-{next_step}"
    if rank0 and target.exists() and _data_dir(directory, checkpoint_info(directory)) != target:
        shutil.rmtree(target, ignore_errors=True)  # what a save cut short left
    if dist.is_initialized():
        dist.barrier()  # no rank writes into the folder while rank 0 clears it
    state = _state(executor, create=False)
    if getattr(executor, "dist_optimizer", None) is not None:
        state.update(executor.dist_optimizer.whole_states())
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        dcp.save(_whole_slices(executor, state), checkpoint_id=str(target))
    except (OSError, CheckpointException) as exc:  # a full disk, a directory gone: one line, not DCP's tracebacks
        raise RuntimeFault(f"{directory}: cannot save a checkpoint ({_reason(exc)}); check that the directory is "
                           "writable and has space, or give another --checkpoint") from None
    if dist.is_initialized():
        dist.barrier()  # every rank's part is on disk before the metadata points at it
    if rank0:
        info = {"next_step": next_step, "model": executor.spec.name, "num_units": len(executor.infos),
                "data": target.name, **(meta or {})}
        tmp = directory / (META_FILE + ".tmp")
        tmp.write_text(json.dumps(info, indent=1))
        tmp.replace(directory / META_FILE)
        _remove_stale(directory, keep=target)
    if dist.is_initialized():
        dist.barrier()


def _remove_stale(directory: Path, keep: Path) -> None:
    """Remove the folders and the pre-folder files of older checkpoints in ``directory``."""
    import shutil

    for path in directory.iterdir():
        if path == keep:
            continue
        if path.is_dir() and path.name.startswith("step-"):
            shutil.rmtree(path, ignore_errors=True)
        elif path.is_file() and (path.suffix == ".distcp" or path.name == ".metadata"):
            path.unlink(missing_ok=True)


def load_checkpoint(directory: str | Path, executor, identity: dict[str, Any] | None = None) -> int:
    """Load the checkpoint in ``directory`` into ``executor``; returns the step to continue from (0 when
    the directory holds no checkpoint yet). Collective: every rank calls it. ``identity``: the model that
    runs (:func:`model_identity`), refused when the checkpoint names another (the launcher checks it first)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    info = checkpoint_info(directory)
    if info is None:
        return 0
    why = identity_mismatch(directory, info, identity) if identity else None
    if why is not None:
        raise RuntimeFault(why)
    if info.get("num_units") != len(executor.infos):
        raise RuntimeFault(f"{directory}: the checkpoint holds a model of {info.get('num_units')} units "
                           f"({info.get('model')}) but this run has {len(executor.infos)}; give another --checkpoint")
    local = _state(executor, create=True)
    dist_opt = getattr(executor, "dist_optimizer", None)
    sharded = dist_opt.whole_states() if dist_opt is not None else {}  # shaped as held here; dcp.load fills them
    local.update(sharded)
    state = _whole_slices(executor, local, gather=False)
    data = _data_dir(Path(directory), info)
    if not (data / ".metadata").is_file():
        raise RuntimeFault(f"{directory}: the checkpoint is incomplete ({data.name}/.metadata is missing: its save "
                           "did not finish); give another --checkpoint directory, or remove this one to start over")
    try:
        dcp.load(state, checkpoint_id=str(data))
    except (Exception, CheckpointException) as exc:  # CheckpointException derives from BaseException, not Exception
        raise RuntimeFault(f"{directory}: cannot resume from this checkpoint ({_reason(exc)}); its files are "
                           "damaged or it was written for another model or plan; give another --checkpoint "
                           "directory") from None
    _cut_slices(executor, local, state)
    if dist_opt is not None:
        dist_opt.load_whole_states({k: local[k] for k in sharded})  # loaded in place, slices cut in
    return int(info["next_step"])


def _reason(exc: BaseException) -> str:
    """One short line for a DCP failure: a CheckpointException's first rank's own error, not its tracebacks."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        first = next(iter(failures.values()))
        inner = first[0] if isinstance(first, tuple) and first else first
        if isinstance(inner, BaseException):
            exc = inner
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:200]


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
