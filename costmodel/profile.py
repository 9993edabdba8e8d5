"""Measured profiles: what units, optimizer steps and links really cost on a device, as a file.

A profile (``hetpart calibrate`` writes one; :func:`load_profile` reads it) holds measurements:

* ``devices``: the device classes that were measured (``cpu``, or a CUDA device by its name), each
  with what it is and, when measured, its Adam step time per parameter;
* ``device_types``: which measured device class prices each cluster device type (``A100-80GB`` ->
  ``NVIDIA A100-SXM4-80GB``), and whether it is that device or a STAND-IN (this machine's CPU measured
  for a cluster that names A100s: the numbers then describe running the plan on this machine, as
  ``hetpart run --no-emulation`` does, not on real A100s);
* ``compute``: per device class, precision, unit (its kind and parameter count) and micro-batch size,
  the median forward and backward seconds of one call, their spread, the repeats, and the memory
  (saved activations; peak allocated on GPUs);
* ``links``: per pair of device classes and scope (``intra_node``, ``inter_node`` or ``any``), the
  latency and bandwidth fitted to a point-to-point or all-reduce sweep, with the sweep.

The simulator (:class:`~hetpart.costmodel.simulator.Simulator` with ``profile=``) uses an entry
in place of its analytic term wherever the profile has one that applies, through :class:`BoundProfile`
(a device type's own class entry by entry; a stand-in only for the model it measured, all its kinds or
none: :meth:`BoundProfile.applying_class`):

* a unit's time at a micro-batch and sequence length that were not measured is interpolated
  piecewise-linearly in forward FLOPs per call over the measured points of that unit (exact at the
  measured ones; below the smallest along the first segment, which keeps the fixed cost per call;
  above the largest in proportion to the FLOPs); a tensor-parallel shard counts ``1/tp`` of the
  FLOPs, and recomputation adds the forward's measured time in proportion to the recomputed FLOPs;
* a link entry replaces the cluster's datasheet link in that scope (:meth:`BoundProfile.link_cluster`:
  p2p entries for point-to-point transfers, all-reduce entries -- per-hop latency and bandwidth of a
  ring, fitted on the measured member count -- for collectives), and the simulator's algorithms
  (rings, hierarchical all-reduce, NIC sharing) run on the measured hops;
* the optimizer step takes the measured seconds per parameter.

The file format is versioned (``format: hetpart-profile``, ``version: 1``) and documented in the
README; a bad file is refused with one line naming the file, the field and the fix.
"""

from __future__ import annotations

import json
from bisect import bisect_left
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Sequence

import numpy as np

from hetpart._validate import boolean, fail, integer, number, read_text, require_keys, require_mapping, string
from hetpart.errors import SpecError

if TYPE_CHECKING:  # pragma: no cover
    from hetpart.cluster import Cluster
    from hetpart.graph.model_graph import ModelGraph, Unit
    from hetpart.hardware import GPUSpec

__all__ = ["PROFILE_FORMAT", "PROFILE_VERSION", "DeviceClass", "DeviceBinding", "ComputeEntry", "LinkEntry",
           "TensorParallelEntry", "CoreSharing",
           "Profile", "load_profile", "parse_profile", "BoundProfile", "fit_latency_bandwidth"]

PROFILE_FORMAT = "hetpart-profile"
PROFILE_VERSION = 1
_PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp8")
_UNIT_KINDS = ("embedding", "block", "head", "module")
_SCOPES = ("intra_node", "inter_node", "any")


@dataclass(frozen=True)
class DeviceClass:
    """One measured device class."""

    name: str
    """``cpu`` or the CUDA device's name (``NVIDIA H100 80GB HBM3``)."""
    kind: Literal["cpu", "cuda", "imported"]
    """How it was measured: this machine's CPU, a CUDA device, or imported from another tool's file."""
    description: str = ""
    """What it is, for people (CPU model and threads per process, GPU and driver)."""
    adam_s_per_param: float | None = None
    """Measured seconds of one Adam step per parameter (fp32 master weights and moments); None: not measured."""
    adam_fixed_s: float = 0.0
    """Measured seconds of one Adam step that do not grow with the parameters (per call)."""


@dataclass(frozen=True)
class DeviceBinding:
    """Which measured device class prices one cluster device type."""

    device: str
    """A key of :attr:`Profile.devices`."""
    stand_in: bool
    """True when the class is not that device type (this CPU measured for an A100): the entries then
    price running the plan on the measured device, not on the named one."""


@dataclass(frozen=True)
class _UnitCall:
    """Which unit a measurement is of, on what, and one call's size (the fields every entry of a unit starts with)."""

    device: str
    precision: str
    unit: str
    """Unit kind: ``embedding``, ``block``, ``head`` or ``module``."""
    params: int
    """The unit's parameter count: with the kind it says which model's unit this is."""
    seq_len: int
    micro_batch: int
    fwd_flops: float
    """Forward FLOPs of one call of the whole unit (``micro_batch`` sequences of ``seq_len`` tokens); 0 for a
    lookup (an embedding), whose calls are then compared by tokens."""

    @property
    def work(self) -> float:
        """What calls of this unit are interpolated over: FLOPs per call, tokens for a lookup."""
        return self.fwd_flops if self.fwd_flops > 0 else float(self.micro_batch * self.seq_len)


@dataclass(frozen=True)
class ComputeEntry(_UnitCall):
    """One unit at one micro-batch size, measured: the median of ``repeats`` calls."""

    fwd_s: float
    bwd_s: float
    """Backward seconds (input and weight gradients, no recomputation)."""
    fwd_range_s: tuple[float, float] = (0.0, 0.0)
    """Fastest and slowest measured forward."""
    bwd_range_s: tuple[float, float] = (0.0, 0.0)
    repeats: int = 1
    activation_gb: float | None = None
    """Bytes the forward saved for the backward (autograd's saved tensors), GB; None: not measured."""
    peak_memory_gb: float | None = None
    """Peak allocated device memory during forward + backward (GPUs), GB; None: not measured."""
    width: int = 0
    """The unit's hidden width (0: unknown)."""


@dataclass(frozen=True)
class TensorParallelEntry(_UnitCall):
    """One unit at one micro-batch size run tensor-parallel ``tp`` ways the way ``hetpart run`` runs it
    (over ``tp`` local processes; :attr:`engine`: torch's DTensor ``parallelize_module`` for an even split,
    Megatron-style local slices by hand for an uneven one), measured: the slowest rank's median of
    ``repeats`` calls, forward and backward, its tensor-parallel all-reduces included, and the same
    all-reduces (count and bytes) timed alone in the same processes.

    What the unit costs beyond its ``1/tp`` share of the single-process curve and those all-reduces
    (:meth:`BoundProfile.tp_overhead_s`: the engine's dispatch of every sharded operator, the ranks waiting
    for each other at each all-reduce, a unit every rank runs whole) is the engine's own price of tensor
    parallelism, which the analytic terms do not see. ``fwd_flops`` is the whole unit's; a rank does ``1/tp``."""

    tp: int
    fwd_s: float
    """Median seconds of one forward, all-reduces included (the slowest rank's)."""
    bwd_s: float
    collective_fwd_s: float
    """The forward's all-reduces alone: ``collectives_fwd`` all-reduces of ``collective_bytes`` each."""
    collective_bwd_s: float
    collectives_fwd: int = 0
    collectives_bwd: int = 0
    collective_bytes: float = 0.0
    fwd_range_s: tuple[float, float] = (0.0, 0.0)
    bwd_range_s: tuple[float, float] = (0.0, 0.0)
    repeats: int = 1
    backend: str = ""
    engine: str = "dtensor"
    """How the runtime ran it: ``dtensor`` (an even split) or ``megatron`` (by hand, as an uneven split runs;
    measured at an even one)."""


@dataclass(frozen=True)
class LinkEntry:
    """Latency and bandwidth between two device classes, fitted to a measured sweep."""

    kind: Literal["p2p", "allreduce"]
    devices: tuple[str, str]
    scope: Literal["intra_node", "inter_node", "any"]
    """Where the measured devices sat: one node, two nodes, or ``any`` (a stand-in: loopback between
    local processes prices every link of a run on this machine)."""
    latency_us: float
    """p2p: one message's latency; all-reduce: the per-hop latency of a ring."""
    bandwidth_gbyte_s: float
    """p2p: bytes per second of one transfer; all-reduce: the per-hop bandwidth of a ring."""
    members: int = 2
    """Ranks in the measured all-reduce (2 for p2p)."""
    backend: str = ""
    """``gloo`` or ``nccl``."""
    sweep: tuple[dict[str, float], ...] = ()
    """The measured points: ``{bytes, seconds, min_s, max_s}`` (median and spread)."""


@dataclass(frozen=True)
class CoreSharing:
    """The processes of one run and the cores they share (:meth:`Profile.sharing_cores`)."""

    processes: int
    threads: int
    """Threads each process computes with."""
    cores: int

    @property
    def capacity(self) -> float:
        """How many processes compute at full speed at once."""
        return self.cores / self.threads


@dataclass(frozen=True)
class Profile:
    """A measured profile (see the module docstring)."""

    devices: dict[str, DeviceClass]
    device_types: dict[str, DeviceBinding]
    compute: tuple[ComputeEntry, ...] = ()
    links: tuple[LinkEntry, ...] = ()
    tensor_parallel: tuple[TensorParallelEntry, ...] = ()
    model: dict[str, Any] = field(default_factory=dict)
    """What was measured: name, seq_len, precision, scale (for people; entries match units by shape)."""
    meta: dict[str, Any] = field(default_factory=dict)
    """How it was measured: command, date, host, torch, load average, wall time."""
    source: str = ""
    """The file it was read from ("" when built in memory)."""
    core_sharing: "CoreSharing | None" = None
    """Set by :meth:`sharing_cores`: the run's processes outnumber the host's cores."""

    def to_dict(self) -> dict[str, Any]:
        return {"format": PROFILE_FORMAT, "version": PROFILE_VERSION, "meta": dict(self.meta),
                "model": dict(self.model),
                "devices": {k: asdict(v) for k, v in self.devices.items()},
                "device_types": {k: asdict(v) for k, v in self.device_types.items()},
                "compute": [_entry_dict(e) for e in self.compute],
                "links": [_link_dict(e) for e in self.links],
                **({"tensor_parallel": [_entry_dict(e) for e in self.tensor_parallel]} if self.tensor_parallel else {}),
                **({"core_sharing": asdict(self.core_sharing)} if self.core_sharing is not None else {})}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    @property
    def fingerprint(self) -> str:
        """A short hash of the entries (predictor versions name the profile they used)."""
        import hashlib

        body = json.dumps({k: v for k, v in self.to_dict().items() if k != "meta"}, sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()[:10]

    def binding(self, device_type: str) -> DeviceBinding | None:
        return self.device_types.get(device_type)

    def sharing_cores(self, processes: int, cores: int, threads: int = 1) -> "Profile":
        """This profile for ``processes`` processes of ``threads`` threads each running at once on one
        host of ``cores`` cores, when they need more cores than there are.

        ``hetpart calibrate`` times a CPU's units in one process with a core to itself; when a run's
        ranks outnumber the cores, the operating system time-slices the ones that compute. The profile
        then carries a :class:`CoreSharing`, and the simulator runs the step's operations under
        processor sharing (:func:`~hetpart.costmodel.schedule.simulate_shared_cores`): while ``n``
        processes compute, each gets ``cores / (n * threads)`` of a core, so data-parallel replicas that
        all compute stretch by their share and a pipeline's fill and drain, where few stages compute, run
        at full speed. The optimizer step, which every rank runs at once at the end, stretches by
        ``processes * threads / cores``; links were measured between processes already. The profile
        itself when the cores suffice, or for GPU classes.
        """
        factor = processes * threads / max(cores, 1)
        cpu = {name for name, d in self.devices.items() if d.kind == "cpu"}
        if factor <= 1.0 or not cpu:
            return self
        from dataclasses import replace

        devices = {name: replace(d, adam_s_per_param=None if d.adam_s_per_param is None
                                 else d.adam_s_per_param * factor, adam_fixed_s=d.adam_fixed_s * factor)
                   if name in cpu else d for name, d in self.devices.items()}
        return replace(self, devices=devices, core_sharing=CoreSharing(processes, threads, cores))


def _entry_dict(e: "ComputeEntry | TensorParallelEntry") -> dict[str, Any]:
    out = asdict(e)
    out["fwd_range_s"], out["bwd_range_s"] = list(e.fwd_range_s), list(e.bwd_range_s)
    return out


def _link_dict(e: LinkEntry) -> dict[str, Any]:
    out = asdict(e)
    out["devices"], out["sweep"] = list(e.devices), [dict(p) for p in e.sweep]
    return out


# ------------------------------------------------------------------------------------------ reading
def load_profile(path: str | Path) -> Profile:
    """Read and check a profile file (``hetpart calibrate --out``).

    Raises:
        SpecError: unreadable file, not JSON, another format or version, or a bad field (one line:
            file, field, fix).
    """
    path = Path(path)
    text = read_text(SpecError, path, "profile")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError(f"{path}: not JSON (line {exc.lineno}: {exc.msg}); give a profile written by "
                        "'hetpart calibrate --out'") from None
    return parse_profile(data, str(path))


def parse_profile(data: Any, source: str = "profile") -> Profile:
    """A :class:`Profile` from its JSON form, checked field by field."""
    data = require_mapping(SpecError, data, source, "")
    require_keys(SpecError, data, source, "", ("format", "version", "devices", "device_types"),
                 ("meta", "model", "compute", "links", "tensor_parallel", "source", "core_sharing"))
    if data["format"] != PROFILE_FORMAT:
        raise fail(SpecError, source, "format", f"{data['format']!r} is not {PROFILE_FORMAT!r}; give a profile "
                   "written by 'hetpart calibrate --out'")
    if data["version"] != PROFILE_VERSION:
        raise fail(SpecError, source, "version", f"{data['version']!r}: this hetpart reads version "
                   f"{PROFILE_VERSION}; measure it again with 'hetpart calibrate'")
    devices = {string(SpecError, k, source, "devices"): _device(v, source, f"devices.{k}", k)
               for k, v in require_mapping(SpecError, data["devices"], source, "devices").items()}
    if not devices:
        raise fail(SpecError, source, "devices", "empty; a profile names at least the device it measured")
    types = {string(SpecError, k, source, "device_types"): _binding(v, source, f"device_types.{k}", devices)
             for k, v in require_mapping(SpecError, data["device_types"], source, "device_types").items()}
    compute = tuple(_compute(e, source, f"compute[{i}]", devices)
                    for i, e in enumerate(_list(data.get("compute", []), source, "compute")))
    links = tuple(_link(e, source, f"links[{i}]", devices)
                  for i, e in enumerate(_list(data.get("links", []), source, "links")))
    tensor_parallel = tuple(_tensor_parallel(e, source, f"tensor_parallel[{i}]", devices)
                            for i, e in enumerate(_list(data.get("tensor_parallel", []), source, "tensor_parallel")))
    return Profile(devices=devices, device_types=types, compute=compute, links=links, tensor_parallel=tensor_parallel,
                   model=dict(require_mapping(SpecError, data.get("model", {}), source, "model")),
                   meta=dict(require_mapping(SpecError, data.get("meta", {}), source, "meta")),
                   source=str(data.get("source") or source),
                   core_sharing=_core_sharing(data["core_sharing"], source) if "core_sharing" in data else None)


def _core_sharing(v: Any, source: str) -> CoreSharing:
    v = require_mapping(SpecError, v, source, "core_sharing")
    require_keys(SpecError, v, source, "core_sharing", ("processes", "threads", "cores"), ())
    return CoreSharing(*(integer(SpecError, v[k], source, f"core_sharing.{k}", maximum=1 << 20)
                         for k in ("processes", "threads", "cores")))


def _list(value: Any, source: str, name: str) -> list:
    if not isinstance(value, list):
        raise fail(SpecError, source, name, "expected a list of entries")
    return value


def _device(v: Any, source: str, where: str, name: str) -> DeviceClass:
    v = require_mapping(SpecError, v, source, where)
    require_keys(SpecError, v, source, where, ("kind",), ("name", "description", "adam_s_per_param", "adam_fixed_s"))
    if v["kind"] not in ("cpu", "cuda", "imported"):
        raise fail(SpecError, source, f"{where}.kind", f"{v['kind']!r}; use cpu, cuda or imported")
    adam = v.get("adam_s_per_param")
    return DeviceClass(name=name, kind=v["kind"], description=str(v.get("description", "")),
                       adam_s_per_param=None if adam is None else number(SpecError, adam, source,
                                                                         f"{where}.adam_s_per_param"),
                       adam_fixed_s=number(SpecError, v.get("adam_fixed_s", 0.0), source, f"{where}.adam_fixed_s",
                                           strict=False, maximum=1e3))


def _binding(v: Any, source: str, where: str, devices: dict) -> DeviceBinding:
    v = require_mapping(SpecError, v, source, where)
    require_keys(SpecError, v, source, where, ("device", "stand_in"), ())
    if v["device"] not in devices:
        raise fail(SpecError, source, f"{where}.device", f"{v['device']!r} is not under 'devices'; name one of "
                   f"{', '.join(sorted(devices))}")
    return DeviceBinding(device=v["device"], stand_in=boolean(SpecError, v["stand_in"], source, f"{where}.stand_in"))


def _pair(v: Any, source: str, where: str) -> tuple[float, float]:
    if not isinstance(v, list) or len(v) != 2:
        raise fail(SpecError, source, where, "expected [fastest, slowest] seconds")
    lo, hi = (number(SpecError, x, source, where, strict=False) for x in v)
    return lo, hi


_COMPUTE_KEYS = ("device", "precision", "unit", "params", "seq_len", "micro_batch", "fwd_flops", "fwd_s", "bwd_s")


def _unit_call(v: dict, source: str, where: str, devices: dict) -> dict[str, Any]:
    """The checked :class:`_UnitCall` fields of an entry (its keys already required)."""
    if v["device"] not in devices:
        raise fail(SpecError, source, f"{where}.device", f"{v['device']!r} is not under 'devices'; name one of "
                   f"{', '.join(sorted(devices))}")
    if v["precision"] not in _PRECISIONS:
        raise fail(SpecError, source, f"{where}.precision", f"{v['precision']!r}; use one of {', '.join(_PRECISIONS)}")
    if v["unit"] not in _UNIT_KINDS:
        raise fail(SpecError, source, f"{where}.unit", f"{v['unit']!r}; use one of {', '.join(_UNIT_KINDS)}")
    return dict(device=v["device"], precision=v["precision"], unit=v["unit"],
                params=integer(SpecError, v["params"], source, f"{where}.params", minimum=0, maximum=10**13),
                seq_len=integer(SpecError, v["seq_len"], source, f"{where}.seq_len"),
                micro_batch=integer(SpecError, v["micro_batch"], source, f"{where}.micro_batch"),
                fwd_flops=number(SpecError, v["fwd_flops"], source, f"{where}.fwd_flops", strict=False, maximum=1e21))


def _ranges(v: dict, source: str, where: str) -> dict[str, Any]:
    """An entry's fastest and slowest call (default: its median) and its repeats."""
    return dict(fwd_range_s=_pair(v.get("fwd_range_s", [v["fwd_s"], v["fwd_s"]]), source, f"{where}.fwd_range_s"),
                bwd_range_s=_pair(v.get("bwd_range_s", [v["bwd_s"], v["bwd_s"]]), source, f"{where}.bwd_range_s"),
                repeats=integer(SpecError, v.get("repeats", 1), source, f"{where}.repeats"))


def _compute(v: Any, source: str, where: str, devices: dict) -> ComputeEntry:
    v = require_mapping(SpecError, v, source, where)
    require_keys(SpecError, v, source, where, _COMPUTE_KEYS,
                 ("fwd_range_s", "bwd_range_s", "repeats", "activation_gb", "peak_memory_gb", "width"))
    call = _unit_call(v, source, where, devices)
    optional_gb = {k: None if v.get(k) is None else number(SpecError, v[k], source, f"{where}.{k}", strict=False)
                   for k in ("activation_gb", "peak_memory_gb")}
    return ComputeEntry(
        **call,
        fwd_s=number(SpecError, v["fwd_s"], source, f"{where}.fwd_s (seconds)", maximum=1e5),
        bwd_s=number(SpecError, v["bwd_s"], source, f"{where}.bwd_s (seconds)", maximum=1e5),
        **_ranges(v, source, where),
        width=integer(SpecError, v.get("width", 0), source, f"{where}.width", minimum=0), **optional_gb)


_TP_ENGINES = ("dtensor", "megatron")
_TP_KEYS = ("device", "precision", "unit", "params", "seq_len", "micro_batch", "fwd_flops", "tp", "fwd_s", "bwd_s",
            "collective_fwd_s", "collective_bwd_s")


def _tensor_parallel(v: Any, source: str, where: str, devices: dict) -> TensorParallelEntry:
    v = require_mapping(SpecError, v, source, where)
    require_keys(SpecError, v, source, where, _TP_KEYS, ("collectives_fwd", "collectives_bwd", "collective_bytes",
                                                         "fwd_range_s", "bwd_range_s", "repeats", "backend", "engine"))
    if v.get("engine", "dtensor") not in _TP_ENGINES:
        raise fail(SpecError, source, f"{where}.engine", f"{v['engine']!r}; use one of {', '.join(_TP_ENGINES)}")
    call = _unit_call(v, source, where, devices)
    seconds = {k: number(SpecError, v[k], source, f"{where}.{k} (seconds)", strict=k.startswith("fwd")
                         or k.startswith("bwd"), maximum=1e5)
               for k in ("fwd_s", "bwd_s", "collective_fwd_s", "collective_bwd_s")}
    return TensorParallelEntry(
        **call, tp=integer(SpecError, v["tp"], source, f"{where}.tp", minimum=2, maximum=1024), **seconds,
        collectives_fwd=integer(SpecError, v.get("collectives_fwd", 0), source, f"{where}.collectives_fwd", minimum=0),
        collectives_bwd=integer(SpecError, v.get("collectives_bwd", 0), source, f"{where}.collectives_bwd", minimum=0),
        collective_bytes=number(SpecError, v.get("collective_bytes", 0.0), source, f"{where}.collective_bytes",
                                strict=False, maximum=1e15),
        **_ranges(v, source, where), backend=str(v.get("backend", "")), engine=v.get("engine", "dtensor"))


def _link(v: Any, source: str, where: str, devices: dict) -> LinkEntry:
    v = require_mapping(SpecError, v, source, where)
    require_keys(SpecError, v, source, where, ("kind", "devices", "scope", "latency_us", "bandwidth_gbyte_s"),
                 ("members", "backend", "sweep"))
    if v["kind"] not in ("p2p", "allreduce"):
        raise fail(SpecError, source, f"{where}.kind", f"{v['kind']!r}; use p2p or allreduce")
    pair = v["devices"]
    if not isinstance(pair, list) or len(pair) != 2 or any(d not in devices for d in pair):
        raise fail(SpecError, source, f"{where}.devices", f"{pair!r}; give two names from 'devices' "
                   f"({', '.join(sorted(devices))})")
    if v["scope"] not in _SCOPES:
        raise fail(SpecError, source, f"{where}.scope", f"{v['scope']!r}; use one of {', '.join(_SCOPES)}")
    sweep = tuple(require_mapping(SpecError, p, source, f"{where}.sweep[{i}]")
                  for i, p in enumerate(_list(v.get("sweep", []), source, f"{where}.sweep")))
    return LinkEntry(kind=v["kind"], devices=(pair[0], pair[1]), scope=v["scope"],
                     latency_us=number(SpecError, v["latency_us"], source, f"{where}.latency_us", strict=False),
                     bandwidth_gbyte_s=number(SpecError, v["bandwidth_gbyte_s"], source,
                                              f"{where}.bandwidth_gbyte_s (GB/s)", maximum=1e6),
                     members=integer(SpecError, v.get("members", 2), source, f"{where}.members", minimum=2),
                     backend=str(v.get("backend", "")), sweep=sweep)


def fit_latency_bandwidth(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """``(latency_s, seconds_per_byte)`` of ``t = latency + bytes * per_byte`` by least squares on
    relative errors (small and large messages count alike), both kept >= 0."""
    x = np.array([p[0] for p in points], dtype=float)
    t = np.array([p[1] for p in points], dtype=float)
    w = 1.0 / np.maximum(t, 1e-12)
    a = np.column_stack([np.ones_like(x), x]) * w[:, None]
    (lat, per_byte), *_ = np.linalg.lstsq(a, np.ones_like(x), rcond=None)
    if per_byte <= 0:  # latency-bound over the whole sweep: the largest message's rate
        per_byte = float(t[-1] / x[-1]) if x[-1] > 0 else 1e-12
        lat = 0.0
    if lat < 0:
        lat, per_byte = 0.0, float(np.sum(w * w * x) / np.sum(w * w * x * x))
    return float(lat), float(per_byte)


# ------------------------------------------------------------------------------------------ using it
class _Curve:
    """Measured points of one unit on one device class: time against work per call (:attr:`ComputeEntry.work`)."""

    def __init__(self, entries: list[ComputeEntry]) -> None:
        by_x: dict[float, list[ComputeEntry]] = {}
        for e in entries:
            by_x.setdefault(e.work, []).append(e)
        self.x = sorted(by_x)
        self.fwd = [float(np.median([e.fwd_s for e in by_x[x]])) for x in self.x]
        self.bwd = [float(np.median([e.bwd_s for e in by_x[x]])) for x in self.x]

    def at(self, flops: float) -> tuple[float, float]:
        return _interp(self.x, self.fwd, flops), _interp(self.x, self.bwd, flops)


def _interp(xs: list[float], ts: list[float], x: float) -> float:
    """Piecewise-linear through the points; below the first along the first segment (a fixed cost per
    call; between the proportional share and the first point's time); above the last in proportion
    to the FLOPs."""
    if len(xs) == 1 or x > xs[-1]:
        return ts[-1] * x / xs[-1]
    i = bisect_left(xs, x)
    if xs[i] == x:
        return ts[i]
    if i == 0:
        slope = (ts[1] - ts[0]) / (xs[1] - xs[0])
        return min(max(ts[0] + slope * (x - xs[0]), ts[0] * x / xs[0]), ts[0])
    slope = (ts[i] - ts[i - 1]) / (xs[i] - xs[i - 1])
    return ts[i - 1] + slope * (x - xs[i - 1])


class BoundProfile:
    """A profile bound to one model and one cluster: the simulator's overrides (module docstring).

    Every method returns None (or leaves the analytic numbers) where the profile has no entry.
    """

    def __init__(self, profile: Profile, model: "ModelGraph", cluster: "Cluster") -> None:
        self.profile, self.model, self.cluster = profile, model, cluster
        curves: dict[tuple, list[ComputeEntry]] = {}
        for e in profile.compute:
            curves.setdefault((e.device, e.precision, e.unit, e.params), []).append(e)
        self._curves = {k: _Curve(v) for k, v in curves.items()}
        self._tp: dict[tuple, list[TensorParallelEntry]] = {}
        for t in profile.tensor_parallel:
            self._tp.setdefault((t.device, t.precision, t.unit, t.params, t.engine), []).append(t)
        self._tp_overheads: dict[tuple, tuple[float, float]] = {}
        self._measured_units: dict[tuple[str, str], int] = {}
        self._link_clusters: dict[str, "Cluster"] = {}
        measured = {(k[0], k[2], k[3]) for k in self._curves}
        self._units_of: dict[str, int] = {
            d: sum((d, u.kind, int(u.params)) in measured for u in model.units) for d in profile.devices}
        """Per device class: how many of the model's units it measured (at any precision)."""

    # ------------------------------------------------------------------ which entries apply
    def device_class(self, gpu: "GPUSpec") -> str | None:
        """The measured device class the profile names for ``gpu``'s type (None: none), whether or not its
        entries apply (:meth:`applying_class`)."""
        binding = self.profile.binding(gpu.name)
        if binding is not None:
            return binding.device
        return gpu.name if gpu.name in self.profile.devices else None

    def stand_in(self, gpu: "GPUSpec") -> bool:
        """Whether ``gpu``'s type is priced by a class that is not that type (this CPU for an A100)."""
        binding = self.profile.binding(gpu.name)
        return binding is not None and binding.stand_in

    def applying_class(self, gpu: "GPUSpec") -> str | None:
        """The measured device class whose entries (units, links, optimizer) price ``gpu``, None where none do.

        A class measured as ``gpu``'s own type applies entry by entry: what it measured on that device holds
        there whatever the model. A STAND-IN (this machine measured for a cluster that names A100s) prices
        running the plan on the measuring machine: that holds only when the profile measured this model's
        units (``calibrate --scale`` of the model ``run --scale`` runs; provenance counts how many). Otherwise
        none of its entries apply: its links and optimizer step beside the analytic compute of another device
        would price a machine that is neither (:meth:`not_applied_reason`)."""
        device = self.device_class(gpu)
        if device is None or (self.stand_in(gpu) and not self._units_of[device]):
            return None
        return device

    def not_applied_reason(self, gpu: "GPUSpec") -> str | None:
        """Why none of the profile's entries price ``gpu`` (None: some may)."""
        device = self.device_class(gpu)
        if device is None:
            return f"no entry for {gpu.name}"
        if self.applying_class(gpu) is not None:
            return None
        m = self.profile.model
        what = ", ".join(str(x) for x in (m.get("name"), f"scale {m['scale']}" if m.get("scale") else "",
                                          f"hidden {m['hidden_size']}" if m.get("hidden_size") else "",
                                          m.get("precision")) if x)
        return (f"{device} stands in for {gpu.name} and measured none of this model's {self.model.num_units} units"
                f"{f' (it measured {what})' if what else ''}: a stand-in prices running this model on the measuring "
                "machine, so none of its entries (units, links, optimizer) apply")

    # ------------------------------------------------------------------ compute
    def precision_for(self, device: str, precision: str, stand_in: bool = False) -> str | None:
        """The measured precision that answers ``precision`` on ``device``: the same one, or for a CPU or
        a ``stand_in`` whatever it measured (a run on the measuring machine computes in what it measured
        whatever the plan says: fp32 on a CPU), or for an imported class the other 16-bit format (bf16 for
        fp16 and back)."""
        measured = {k[1] for k in self._curves if k[0] == device}
        if precision in measured:
            return precision
        if (stand_in or self.profile.devices[device].kind == "cpu") and measured:
            return "fp32" if "fp32" in measured else sorted(measured)[0]
        twin = {"bf16": "fp16", "fp16": "bf16"}.get(precision)
        if self.profile.devices[device].kind == "imported" and twin in measured:
            # another tool's file says one 16-bit format; the tensor cores run bf16 and fp16 at one rate
            return twin
        return None

    def _curve(self, device: str, precision: str, unit: "Unit") -> _Curve | None:
        return self._curves.get((device, precision, unit.kind, int(unit.params)))

    def unit_compute_s(self, gpu: "GPUSpec", tp: "float | np.ndarray", micro_batch: int, precision: str, recompute: str,
                       fwd: np.ndarray, bwd: np.ndarray, selective: str = "core", engine_tp: int | None = None,
                       engine: str = "dtensor") -> tuple[np.ndarray, np.ndarray]:
        """``(fwd_s, bwd_s)`` per unit: measured where the profile has the unit, else the given analytic ones.

        ``tp``: the tensor-parallel degree, or per unit ``1 / the device's share`` of an uneven split. A measured
        unit's backward gains the share of its forward that ``recompute`` runs again: the whole forward under
        ``full``; under ``selective`` the attention core, or with ``selective="sublayer"`` (hetpart's runtime,
        :data:`~hetpart.costmodel.compute.SELECTIVE_SCOPES`) the attention sublayer, projections included.
        ``engine_tp``: the tensor-parallel degree the engine runs these units at (None: ``tp`` when it is one
        number, else 1), ``engine`` how (``dtensor``: an even split; ``megatron``: an uneven one, by hand); a
        measured unit then also pays the engine's price of that degree (:meth:`tp_overhead_s`)."""
        device = self.applying_class(gpu)
        if engine_tp is None:
            engine_tp = int(round(float(tp))) if np.ndim(tp) == 0 else 1
        measured_precision = self.precision_for(device, precision, self.stand_in(gpu)) if device is not None else None
        if measured_precision is None:
            return fwd, bwd
        fwd, bwd = fwd.copy(), bwd.copy()
        hits = 0
        projections = np.zeros(len(self.model.units))
        if recompute == "selective" and selective == "sublayer":
            from hetpart.costmodel.compute import sublayer_recompute_flops

            projections = sublayer_recompute_flops(self.model, "eager")[0]  # eager: the core is counted below
        for i, u in enumerate(self.model.units):
            curve = self._curve(device, measured_precision, u)
            if curve is None:
                continue
            shard = (float(tp[i]) if np.ndim(tp) else tp) if u.tp_shardable else 1
            work = u.fwd_flops * micro_batch / shard if u.fwd_flops > 0 else float(micro_batch * self.model.seq_len)
            f, b = curve.at(work)
            share = (u.recompute_flops[recompute] + projections[i]) / u.fwd_flops if u.fwd_flops > 0 else 0.0
            if engine_tp > 1 and u.tp_shardable:
                of, ob = self.tp_overhead_s(device, measured_precision, u, micro_batch, engine_tp, engine)
                f, b = f + of, b + ob
            fwd[i], bwd[i] = f, b + share * f
            hits += 1
        self._measured_units[(gpu.name, precision)] = hits
        return fwd, bwd

    def tp_overhead_s(self, device: str, precision: str, unit: "Unit", micro_batch: int, tp: int,
                      engine: str = "dtensor") -> tuple[float, float]:
        """Forward and backward seconds one call of ``unit`` costs tensor-parallel ``tp`` ways beyond its
        ``1/tp`` share of the single-process curve and its all-reduces (:class:`TensorParallelEntry`):
        measured minus both, never below 0; ``(0, 0)`` where the profile measured no such unit.

        The all-reduces are priced as the simulator prices them on the measured link, a ring on the
        profile's all-reduce entry of the device class (:meth:`_collectives_s`), so that at a measured
        point the prediction adds up to the measured call. Between measured micro-batches the excess is
        interpolated linearly in tokens per call, beyond them it keeps the nearest one's; a degree that
        was not measured takes the nearest measured degree's (dispatch per sharded operator and waiting
        at each all-reduce do not shrink with the degree; they may grow with more ranks to wait for)."""
        key = (device, precision, unit.kind, int(unit.params), engine, micro_batch, tp)
        hit = self._tp_overheads.get(key)  # every block of a model asks the same
        if hit is None:
            hit = self._tp_overheads[key] = self._tp_overhead_s(device, precision, unit, micro_batch, tp, engine)
        return hit

    def _tp_overhead_s(self, device: str, precision: str, unit: "Unit", micro_batch: int, tp: int,
                       engine: str) -> tuple[float, float]:
        entries = self._tp.get((device, precision, unit.kind, int(unit.params), engine))
        curve = self._curve(device, precision, unit)
        if not entries or curve is None:
            return 0.0, 0.0
        degree = min({e.tp for e in entries}, key=lambda d: (abs(d - tp), -d))
        points: dict[int, list[tuple[float, float]]] = {}
        for e in entries:
            if e.tp != degree:
                continue
            f, b = curve.at(e.fwd_flops / e.tp if e.fwd_flops > 0 else float(e.micro_batch * e.seq_len))
            cf, cb = self._collectives_s(e)
            points.setdefault(e.micro_batch * e.seq_len, []).append(
                (max(0.0, e.fwd_s - cf - f), max(0.0, e.bwd_s - cb - b)))
        xs = sorted(points)
        over = [tuple(float(np.median([p[k] for p in points[x]])) for k in (0, 1)) for x in xs]
        tokens = micro_batch * self.model.seq_len
        return tuple(float(np.interp(tokens, xs, [o[k] for o in over])) for k in (0, 1))  # type: ignore[return-value]

    def _collectives_s(self, e: TensorParallelEntry) -> tuple[float, float]:
        """The forward's and the backward's all-reduces of ``e`` as rings on the measured all-reduce link
        of its device class (scope ``intra_node``, else ``any``); without one, as timed alone."""
        from hetpart.costmodel.collectives import ring_allreduce_time_s

        found = {x.scope: x for x in self.profile.links if x.kind == "allreduce" and x.devices == (e.device, e.device)}
        link = found.get("intra_node") or found.get("any")
        if link is None or e.collective_bytes <= 0:
            return e.collective_fwd_s, e.collective_bwd_s
        one = ring_allreduce_time_s(e.collective_bytes, e.tp, link.bandwidth_gbyte_s, link.latency_us)
        return e.collectives_fwd * one, e.collectives_bwd * one

    def units_measured(self, device_type: str, precision: str) -> int | None:
        """How many of the model's units the profile priced for ``device_type`` (None: not asked yet)."""
        return self._measured_units.get((device_type, precision))

    def adam_s(self, gpu: "GPUSpec", params: float) -> float | None:
        """Measured seconds of an Adam step over ``params`` parameters on ``gpu``'s class (None: not measured)."""
        device = self.applying_class(gpu)
        cls = self.profile.devices[device] if device is not None else None
        if cls is None or cls.adam_s_per_param is None:
            return None
        return cls.adam_fixed_s + params * cls.adam_s_per_param

    # ------------------------------------------------------------------ links
    def link_cluster(self, kind: Literal["p2p", "allreduce"]) -> "Cluster":
        """The cluster with its links replaced by the measured ``kind`` entries where the profile has them.

        Each node group's intra-node link takes the entry of its device class with itself in scope
        ``intra_node`` (or ``any``), its NIC the one in scope ``inter_node`` (or ``any``); zone links
        take the ``any`` entries (a stand-in: every link of a run on the measured machine is its
        loopback). The analytic algorithms (rings, hierarchical all-reduce, NIC sharing) then run on
        measured hops. A pair of different classes uses the slower of their own entries.
        """
        hit = self._link_clusters.get(kind)
        if hit is None:
            hit = self._link_clusters[kind] = self._relinked(kind)
        return hit

    def _relinked(self, kind: str) -> "Cluster":
        import dataclasses

        from hetpart.cluster import ZoneLink
        from hetpart.costmodel.links import RDMA_EFFICIENCY, TCP_FRAMING_EFFICIENCY

        groups, anywhere = [], []
        for g in self.cluster.groups:
            intra, inter = self._link(kind, g.gpu, "intra_node"), self._link(kind, g.gpu, "inter_node")
            # A measured bandwidth is what transfers reached already: the achieved-rate discounts of
            # hetpart.costmodel.links must not apply to it a second time.
            if intra is not None:  # the spec's kind stays; its achieved share becomes 1
                g = dataclasses.replace(g, intra_node=dataclasses.replace(
                    g.intra_node, bandwidth_gbyte_s=intra.bandwidth_gbyte_s, latency_us=intra.latency_us,
                    efficiency=1.0, source=f"profile {self.profile.source}"))
            if inter is not None:  # a line rate that nic_gbyte_s turns back into the measured rate
                share = RDMA_EFFICIENCY if g.nic.rdma else TCP_FRAMING_EFFICIENCY
                g = dataclasses.replace(g, nic=dataclasses.replace(
                    g.nic, bandwidth_gbit_s=inter.bandwidth_gbyte_s / share * 8, latency_us=inter.latency_us,
                    source=f"profile {self.profile.source}"))
                if inter.scope == "any":
                    anywhere.append(inter)
            groups.append(g)
        zones = self.cluster.zone_links
        if anywhere and len(anywhere) == len(groups):
            bw = min(e.bandwidth_gbyte_s for e in anywhere) * 8
            lat = max(e.latency_us for e in anywhere)
            zones = tuple(ZoneLink(z.zones, bw, lat) for z in zones)
        return dataclasses.replace(self.cluster, groups=tuple(groups), zone_links=zones)

    def _link(self, kind: str, gpu: "GPUSpec", scope: str) -> LinkEntry | None:
        """The entry of ``gpu``'s device class with itself in ``scope`` (else ``any``), where it applies."""
        device = self.applying_class(gpu)
        if device is None:
            return None
        found = {e.scope: e for e in self.profile.links if e.kind == kind and e.devices == (device, device)}
        entry = found.get(scope) or found.get("any")
        sharing = self.profile.core_sharing
        if entry is None or kind != "allreduce" or sharing is None or self.profile.devices[device].kind != "cpu":
            return entry
        # Every process of the run reaches the gradient all-reduce at the step's end; each hop is CPU work
        # (copies through the loopback, the reduction), measured with a core per process: on fewer cores
        # the ring's hops run at cores / processes of a core.
        from dataclasses import replace

        stretch = max(1.0, sharing.processes / sharing.capacity)
        return replace(entry, bandwidth_gbyte_s=entry.bandwidth_gbyte_s / stretch, latency_us=entry.latency_us * stretch)
