"""Per-layer profiles other tools measured, read into a hetpart profile (:mod:`hetpart.costmodel.profile`).

**Metis** (Um et al., USENIX ATC 2024; ``SamsungLabs/Metis``) profiles one device type at one tensor-parallel
degree and micro-batch size per file, ``DeviceType.{TYPE}_tp{T}_bs{B}.json``::

    {"model": {"model_name": ..., "num_layers": N, "parameters": {"parameters_per_layer_bytes": [...]}},
     "execution_time": {"layer_compute_total_ms": [N numbers], "optimizer_time_ms": ..., ...},
     "execution_memory": {"layer_memory_total_mb": [...]}}

``layer_compute_total_ms[i]`` is layer ``i``'s forward and backward on one ``T``-way shard for one micro-batch of
``B`` sequences (Metis' cost model sums them over a stage's layers and multiplies by the micro-batches); its
layers are the model's embedding, blocks and head in order, so they are hetpart's units one for one. Each
becomes a :class:`~hetpart.costmodel.profile.ComputeEntry` of that unit at the shard's FLOPs per call
(``fwd_flops * B / T``), so files at several degrees and sizes give several points of one curve.

What the files do not say, and how it is filled in (each ASSUMED, named in the profile's ``meta``):

* the split of a layer's time into forward and backward: by the unit's FLOPs (a third forward for a
  transformer block, whose backward does twice its forward's matrix work; a third for the embedding too);
* the sequence length they were measured at: ``seq_len`` of the model graph it is read against
  (``--seq-len``), which must be the one Metis ran;
* the precision: the one given (Metis runs Megatron-LM in 16-bit mixed precision; ``bf16`` by default);
* the optimizer step: ``optimizer_time_ms`` over the parameters one ``T``-way shard of the whole model holds,
  the median over the files, as seconds per parameter;
* memory (``layer_memory_total_mb``) and links are not imported: Metis measures its links apart.

Each Metis device type prices the cluster's device types whose names start with it (``A100`` ->
``A100-80GB``, ``A100-40GB``) unless ``bind`` names them: a cluster type named in ``bind`` is priced by the Metis
type it is bound to alone, and a ``bind`` key with no Metis file is refused. Each is a measurement of that device,
not a stand-in.
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hetpart._validate import fail, number, read_text, require_mapping
from hetpart.errors import SpecError

from hetpart.costmodel.profile import ComputeEntry, DeviceBinding, DeviceClass, Profile

if TYPE_CHECKING:  # pragma: no cover
    from hetpart.cluster import Cluster
    from hetpart.graph.model_graph import ModelGraph

__all__ = ["METIS_FILE", "import_metis"]

METIS_FILE = re.compile(r"DeviceType\.(?P<type>[A-Za-z0-9][\w.-]*?)_tp(?P<tp>\d+)_bs(?P<bs>\d+)\.json")
"""A Metis profile's file name: device type, tensor-parallel degree, micro-batch size."""
_FWD_SHARE_LOOKUP = 1.0 / 3.0
"""ASSUMED: the forward's share of a lookup's (the embedding's) forward + backward, where FLOPs cannot split it."""


def import_metis(directory: str | Path, model: "ModelGraph", cluster: "Cluster", precision: str = "bf16",
                 bind: dict[str, list[str]] | None = None) -> Profile:
    """The Metis profiles in ``directory`` as a hetpart profile of ``model`` (its units and ``seq_len``) on
    ``cluster`` (module docstring). ``bind``: Metis device type -> the cluster device types it prices.
    Raises :class:`SpecError` (one line: file, field, fix) on anything it cannot read."""
    folder = Path(directory)
    if not folder.is_dir():
        raise SpecError(f"--import-metis: {folder}: not a directory; give the folder of Metis' "
                        "DeviceType.NAME_tpT_bsB.json files")
    files = sorted(p for p in folder.iterdir() if METIS_FILE.fullmatch(p.name))
    if not files:
        raise SpecError(f"--import-metis: {folder}: no Metis profile files (DeviceType.NAME_tpT_bsB.json) in it; "
                        "give the folder Metis' profiler wrote")
    units = model.units
    compute: list[ComputeEntry] = []
    adam: dict[str, list[float]] = {}
    for path in files:
        m = METIS_FILE.fullmatch(path.name)
        kind, tp, bs = m["type"], int(m["tp"]), int(m["bs"])
        if tp < 1 or bs < 1:
            raise SpecError(f"{path}: tp{tp}_bs{bs}: the degree and the micro-batch size must be at least 1; "
                            "rename the file")
        times, optimizer_ms = _read(path)
        if len(times) != len(units):
            raise fail(SpecError, str(path), "execution_time.layer_compute_total_ms",
                       f"{len(times)} layers, but {model.name} has {len(units)} units (embedding, "
                       f"{model.num_units - 2} blocks, head); import it against the model Metis profiled")
        for u, ms in zip(units, times):
            if ms <= 0:
                continue  # nothing measured (Metis writes 0 for layers it did not time)
            total = ms / 1e3
            share = u.fwd_flops / (u.fwd_flops + u.bwd_flops) if u.fwd_flops > 0 else _FWD_SHARE_LOOKUP
            shard = tp if u.tp_shardable else 1
            compute.append(ComputeEntry(device=kind, precision=precision, unit=u.kind, params=int(u.params),
                                        seq_len=model.seq_len, micro_batch=bs, fwd_flops=u.fwd_flops * bs / shard,
                                        fwd_s=total * share, bwd_s=total * (1 - share), width=int(u.width)))
        if optimizer_ms is not None and optimizer_ms > 0:
            held = sum(u.params / (tp if u.tp_shardable else 1) for u in units)
            adam.setdefault(kind, []).append(optimizer_ms / 1e3 / held)
    kinds = sorted({METIS_FILE.fullmatch(p.name)["type"] for p in files})
    devices = {k: DeviceClass(name=k, kind="imported", description=f"Metis profile {folder} ({k})",
                              adam_s_per_param=statistics.median(adam[k]) if k in adam else None) for k in kinds}
    bindings = _bindings(kinds, cluster, bind or {}, folder)
    meta = {"imported_from": "metis", "directory": str(folder), "files": [p.name for p in files],
            "assumed": ["forward share of a layer's time by its FLOPs (a third for a block and the embedding)",
                        f"measured at seq_len {model.seq_len} (the model graph's)",
                        f"precision {precision}", "optimizer time over one shard of the whole model"],
            "not_imported": ["layer_memory_total_mb", "links"]}
    return Profile(devices=devices, device_types=bindings, compute=tuple(compute),
                   model={"name": model.name, "seq_len": model.seq_len, "precision": precision,
                          "num_units": model.num_units, "num_params": model.num_params},
                   meta=meta, source=str(folder))


def _read(path: Path) -> tuple[list[float], float | None]:
    """``(layer_compute_total_ms, optimizer_time_ms or None)`` of one Metis file."""
    text = read_text(SpecError, path, "the Metis profile")
    try:
        data: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError(f"{path}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}; fix the "
                        "syntax") from None
    except (RecursionError, ValueError):
        raise SpecError(f"{path}: unreadable JSON; fix the file") from None
    data = require_mapping(SpecError, data, str(path), "")
    timing = require_mapping(SpecError, data.get("execution_time"), str(path), "execution_time")
    layers = timing.get("layer_compute_total_ms")
    where = "execution_time.layer_compute_total_ms"
    if not isinstance(layers, list) or not layers:
        raise fail(SpecError, str(path), where, "missing or empty; a Metis profile lists each layer's milliseconds")
    times = [number(SpecError, x, str(path), f"{where}[{i}]", strict=False, maximum=1e7) for i, x in enumerate(layers)]
    opt = timing.get("optimizer_time_ms")
    optimizer = None if opt is None else number(SpecError, opt, str(path), "execution_time.optimizer_time_ms",
                                                strict=False, maximum=1e7)
    return times, optimizer


def _bindings(kinds: list[str], cluster: "Cluster", bind: dict[str, list[str]], folder: Path) -> dict[str, DeviceBinding]:
    """Cluster device type -> the Metis type that prices it: ``bind``, else by name prefix."""
    types = sorted({g.gpu.name for g in cluster.groups})
    unknown_kinds = [k for k in bind if k not in kinds]
    if unknown_kinds:
        raise SpecError(f"--bind: {unknown_kinds[0]}: no Metis file of that type in {folder} (it holds "
                        f"{', '.join(kinds)}); name one of those")
    out: dict[str, DeviceBinding] = {}
    for kind in kinds:  # an explicit bind first: a type it names is priced by it alone
        for t in bind.get(kind, []):
            if t not in types:
                raise SpecError(f"--bind: {kind}={t}: {t!r} is not a device type of cluster "
                                f"{cluster.name!r} ({', '.join(types)}); name one of them")
            if t in out and out[t].device != kind:
                raise SpecError(f"--bind: {t} is bound to both {out[t].device} and {kind}; bind it to one")
            out[t] = DeviceBinding(device=kind, stand_in=False)
    bound = set(out)
    for kind in kinds:  # the rest by name prefix, never a type a bind named
        if kind in bind:
            continue
        for t in types:
            if t in bound or not (t.lower() == kind.lower() or t.lower().startswith(kind.lower() + "-")):
                continue
            if t in out and out[t].device != kind:
                raise SpecError(f"--import-metis: {folder}: device type {t} matches both {out[t].device} and {kind}; "
                                f"say which with --bind {kind}={t}")
            out[t] = DeviceBinding(device=kind, stand_in=False)
    if not out:
        raise SpecError(f"--import-metis: {folder}: its device types ({', '.join(kinds)}) match none of cluster "
                        f"{cluster.name!r}'s ({', '.join(types)}); bind them, e.g. --bind {kinds[0]}={types[0]}")
    return out
