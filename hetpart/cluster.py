"""Heterogeneous clusters: typed node groups, zones and links, devices, and the network between them.

A cluster is read from YAML (shared/CONTRACT.md) or taken from the bundled catalog. Device ids are
``"<node-group>/<node>/<gpu>"``, 0-based, in file order.

Example:
    >>> c = load_cluster("a100-v100-16")
    >>> c.num_devices, c.device("1/0/3").gpu.name
    (16, 'V100-16GB')
    >>> round(c.link_between("0/0/0", "1/0/0").bandwidth_gbyte_s, 1)
    12.5
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import networkx as nx

from hetpart import _validate as v
from hetpart.catalog.hardware import GPU_CATALOG, LINK_CATALOG, NIC_CATALOG
from hetpart.vocabulary import ARCHITECTURES
from hetpart.errors import SpecError
from hetpart.hardware import GPUSpec, LinkSpec, NICSpec

__all__ = ["NodeGroup", "ZoneLink", "Device", "PathLink", "Cluster", "load_cluster", "parse_cluster",
           "cluster_to_dict", "cluster_catalog"]

MAX_DEVICES = 1_000_000


@dataclass(frozen=True)
class NodeGroup:
    """``count`` identical nodes."""

    count: int
    """Number of nodes in the group."""
    gpus_per_node: int
    """Devices per node."""
    gpu: GPUSpec
    """Device type."""
    intra_node: LinkSpec
    """Link between the devices of one node."""
    nic: NICSpec
    """Network card type of the nodes."""
    nics_per_node: int = 1
    """Number of NICs per node; the node's network bandwidth is ``nics_per_node * nic``."""
    zone: str = "default"
    """Zone (data centre, region) of the nodes."""
    host_memory_gb: float = 0.0
    """Host (CPU) memory of one node, GB; 0: not given (offloaded plans then assume
    :func:`hetpart.costmodel.offload.host_memory_gb`'s default)."""
    host_memory_gbyte_s: float = 0.0
    """Memory bandwidth of one node's CPUs (a STREAM triad), GB/s; 0: not given (assumed, as above). Prices the
    optimizer step an offloaded plan runs on the CPU."""
    mixed: tuple[tuple[GPUSpec, int], ...] = ()
    """Nodes holding several device types: ``(type, count)`` runs in local GPU order (``gpu`` is then
    the first run's type and ``gpus_per_node`` their total); empty when every device is ``gpu``."""

    def __post_init__(self) -> None:
        if self.mixed and sum(n for _, n in self.mixed) != self.gpus_per_node:
            raise ValueError(f"mixed node: {sum(n for _, n in self.mixed)} GPUs listed but gpus_per_node is "
                             f"{self.gpus_per_node}")

    @property
    def gpu_counts(self) -> tuple[tuple[GPUSpec, int], ...]:
        """``(type, count)`` runs of one node in local GPU order (one run unless the node is mixed)."""
        return self.mixed or ((self.gpu, self.gpus_per_node),)

    def gpu_at(self, local: int) -> GPUSpec:
        """The device type of local GPU ``local`` of a node."""
        for gpu, n in self.gpu_counts:
            if local < n:
                return gpu
            local -= n
        raise IndexError(f"local GPU {local} beyond the node's {self.gpus_per_node}")

    @property
    def node_bandwidth_gbyte_s(self) -> float:
        """Aggregate network bandwidth of one node, GB/s."""
        return self.nics_per_node * self.nic.bandwidth_gbyte_s

    @property
    def num_devices(self) -> int:
        return self.count * self.gpus_per_node


@dataclass(frozen=True)
class ZoneLink:
    """A link between two zones (shared by every flow between them)."""

    zones: tuple[str, str]
    bandwidth_gbit_s: float
    """Bandwidth of the link in Gbit/s."""
    latency_us: float
    """One-way latency, microseconds."""

    @property
    def bandwidth_gbyte_s(self) -> float:
        return self.bandwidth_gbit_s / 8.0


@dataclass(frozen=True)
class Device:
    """One accelerator of the cluster."""

    id: str
    """``"<node-group>/<node>/<gpu>"``."""
    index: int
    """Position in cluster order (group, node, gpu)."""
    group: int
    node: int
    local: int
    gpu: GPUSpec
    zone: str
    speed: float = 1.0
    """Measured speed factor of this device against its type's figures (``slow:`` in the cluster
    file; 0.6: a throttled card that computes at 60%)."""

    def peak_flops(self, precision: str) -> float:
        """The peak FLOP/s MFU is taken against: the type's datasheet figure, times the speed factor where the
        device is declared faster than its type (so MFU stays at most 1); a throttled device keeps the
        datasheet's (its MFU says how much of the nominal hardware it gives)."""
        return self.gpu.tflops(precision) * 1e12 * max(1.0, self.speed)

    @property
    def node_key(self) -> tuple[int, int]:
        return (self.group, self.node)


@dataclass(frozen=True)
class PathLink:
    """The effective link between two devices: the slowest hop of the path."""

    bandwidth_gbyte_s: float
    """Bandwidth of the slowest hop, GB/s (inf for a device to itself)."""
    latency_us: float
    """Sum of the hop latencies, microseconds."""
    kind: Literal["self", "intra_node", "nic", "inter_zone"]
    """The slowest kind of hop on the path."""

    def transfer_time_s(self, num_bytes: float) -> float:
        """Time to send ``num_bytes`` point to point over this path."""
        if self.kind == "self":
            return 0.0
        return self.latency_us * 1e-6 + num_bytes / (self.bandwidth_gbyte_s * 1e9)


@dataclass(frozen=True)
class Cluster:
    """A heterogeneous cluster: node groups in file order and the links between zones."""

    name: str
    groups: tuple[NodeGroup, ...]
    zone_links: tuple[ZoneLink, ...] = ()
    source: str = field(default="<memory>", compare=False)
    """Where it was read from (for error messages)."""
    slow: tuple[tuple[str, float], ...] = ()
    """``(device id, speed factor)`` of devices that run slower (or faster) than their type's figures."""
    unused_links: tuple[str, ...] = field(default=(), compare=False)
    """Why each link of the file left out carries no traffic (it names a zone no node group is in)."""

    @cached_property
    def devices(self) -> tuple[Device, ...]:
        speed = dict(self.slow)
        out = []
        for g, group in enumerate(self.groups):
            types = [group.gpu_at(i) for i in range(group.gpus_per_node)]
            for n in range(group.count):
                for i in range(group.gpus_per_node):
                    did = f"{g}/{n}/{i}"
                    out.append(Device(did, len(out), g, n, i, types[i], group.zone, speed.get(did, 1.0)))
        return tuple(out)

    @cached_property
    def _by_id(self) -> dict[str, Device]:
        return {d.id: d for d in self.devices}

    @property
    def num_devices(self) -> int:
        return sum(g.num_devices for g in self.groups)

    @property
    def zones(self) -> list[str]:
        return list(dict.fromkeys(g.zone for g in self.groups))

    @property
    def gpu_types(self) -> list[str]:
        """Device type names in order of first appearance."""
        return list(dict.fromkeys(gpu.name for g in self.groups for gpu, _ in g.gpu_counts))

    @property
    def uniform_speed(self) -> bool:
        """True when no device carries a speed factor other than 1."""
        return all(f == 1.0 for _, f in self.slow)

    def has_device(self, device_id: str) -> bool:
        return device_id in self._by_id

    def device(self, device_id: str) -> Device:
        """The device with id ``"g/n/i"``; raises :class:`SpecError` for an unknown id."""
        try:
            return self._by_id[device_id]
        except KeyError:
            raise SpecError(f"{self.source}: device {device_id!r} does not exist in cluster {self.name!r} "
                            f"({self.num_devices} devices, ids 'group/node/gpu' from 0/0/0)") from None

    def group_of(self, device_id: str) -> NodeGroup:
        return self.groups[self.device(device_id).group]

    @cached_property
    def _zone_link_map(self) -> dict[frozenset, ZoneLink]:
        return {frozenset(link.zones): link for link in self.zone_links}

    def zone_link(self, zone_a: str, zone_b: str) -> ZoneLink | None:
        """The link between two different zones, or None when they are not connected."""
        return self._zone_link_map.get(frozenset((zone_a, zone_b)))

    def zones_connected(self, zone_a: str, zone_b: str) -> bool:
        return zone_a == zone_b or self.zone_link(zone_a, zone_b) is not None

    def link_between(self, a: str, b: str) -> PathLink | None:
        """The effective point-to-point link between devices ``a`` and ``b`` (slowest hop).

        One flow between two nodes uses one NIC on each side. Returns None when the zones of the
        two devices have no link.
        """
        da, db = self.device(a), self.device(b)
        if a == b:
            return PathLink(math.inf, 0.0, "self")
        ga, gb = self.groups[da.group], self.groups[db.group]
        if da.node_key == db.node_key:
            return PathLink(ga.intra_node.bandwidth_gbyte_s, ga.intra_node.latency_us, "intra_node")
        bw = min(ga.nic.bandwidth_gbyte_s, gb.nic.bandwidth_gbyte_s)
        lat = max(ga.nic.latency_us, gb.nic.latency_us)
        kind: Literal["nic", "inter_zone"] = "nic"
        if da.zone != db.zone:
            link = self.zone_link(da.zone, db.zone)
            if link is None:
                return None
            if link.bandwidth_gbyte_s < bw:
                kind = "inter_zone"
            bw = min(bw, link.bandwidth_gbyte_s)
            lat += link.latency_us
        return PathLink(bw, lat, kind)

    @cached_property
    def graph(self) -> nx.Graph:
        """A networkx view: device nodes, one switch per node, one per zone; edges carry
        ``bandwidth_gbyte_s``, ``latency_us`` and ``kind`` (``intra_node``, ``nic``, ``inter_zone``)."""
        g = nx.Graph(name=self.name)
        for zone in self.zones:
            g.add_node(f"zone:{zone}", kind="zone")
        for gi, group in enumerate(self.groups):
            for n in range(group.count):
                switch = f"node:{gi}/{n}"
                g.add_node(switch, kind="node", group=gi)
                g.add_edge(switch, f"zone:{group.zone}", kind="nic", latency_us=group.nic.latency_us,
                           bandwidth_gbyte_s=group.node_bandwidth_gbyte_s)
        for d in self.devices:
            group = self.groups[d.group]
            g.add_node(d.id, kind="device", gpu=d.gpu.name, zone=d.zone, speed=d.speed)
            g.add_edge(d.id, f"node:{d.group}/{d.node}", kind="intra_node",
                       bandwidth_gbyte_s=group.intra_node.bandwidth_gbyte_s, latency_us=group.intra_node.latency_us)
        for link in self.zone_links:
            a, b = link.zones
            g.add_edge(f"zone:{a}", f"zone:{b}", kind="inter_zone", bandwidth_gbyte_s=link.bandwidth_gbyte_s,
                       latency_us=link.latency_us)
        return g

    def summary(self) -> dict[str, Any]:
        """A JSON-ready description (``hetpart inspect cluster --json``)."""
        return {
            "name": self.name,
            "source": self.source,
            "num_devices": self.num_devices,
            "zones": self.zones,
            "node_groups": [
                {"index": i, "count": g.count, "gpus_per_node": g.gpus_per_node,
                 "gpu": "+".join(gpu.name for gpu, _ in g.gpu_counts),
                 "vendor": g.gpu.vendor, "tflops_bf16": g.gpu.tflops_bf16, "memory_gb": g.gpu.memory_gb,
                 "gpus": [{"gpu": gpu.name, "count": n, "local_ids": f"{lo}..{lo + n - 1}", "vendor": gpu.vendor,
                           "tflops_bf16": gpu.tflops_bf16, "memory_gb": gpu.memory_gb}
                          for (gpu, n), lo in zip(g.gpu_counts, _starts(g.gpu_counts))],
                 "intra_node": g.intra_node.name, "intra_node_gbyte_s": g.intra_node.bandwidth_gbyte_s,
                 "nic": g.nic.name, "nic_rdma": g.nic.rdma, "nics_per_node": g.nics_per_node,
                 "node_bandwidth_gbit_s": g.nics_per_node * g.nic.bandwidth_gbit_s, "zone": g.zone,
                 **{k: getattr(g, k) for k in ("host_memory_gb", "host_memory_gbyte_s") if getattr(g, k)},
                 "device_ids": f"{i}/0/0 .. {i}/{g.count - 1}/{g.gpus_per_node - 1}"}
                for i, g in enumerate(self.groups)
            ],
            "slow": dict(self.slow),
            "links": [{"zones": list(z.zones), "bandwidth_gbit_s": z.bandwidth_gbit_s, "latency_us": z.latency_us}
                      for z in self.zone_links],
            "peak_tflops_bf16": sum(d.gpu.tflops_bf16 for d in self.devices),
        }


def _starts(counts: tuple[tuple[GPUSpec, int], ...]) -> list[int]:
    out, lo = [], 0
    for _, n in counts:
        out.append(lo)
        lo += n
    return out


# --------------------------------------------------------------------------------------------- writing
def cluster_to_dict(cluster: Cluster) -> dict[str, Any]:
    """``cluster`` in the cluster YAML schema (shared/CONTRACT.md), losslessly:
    ``parse_cluster(cluster_to_dict(c)) == c``. Catalog parts are written by name; anything else (an
    inline or emulated GPU, link or NIC) inline with every field, its provenance included.

    Example:
        >>> c = load_cluster("a100-v100-16")
        >>> parse_cluster(cluster_to_dict(c)) == c
        True
    """
    out: dict[str, Any] = {"name": cluster.name, "nodes": [_group_to_dict(g) for g in cluster.groups]}
    if cluster.zone_links:
        out["links"] = [{"zones": list(z.zones), "bandwidth_gbit_s": z.bandwidth_gbit_s, "latency_us": z.latency_us}
                        for z in cluster.zone_links]
    if cluster.slow:
        out["slow"] = dict(cluster.slow)
    return out


_GPU_FIELDS = ("name", "tflops_bf16", "tflops_fp32", "memory_gb", "hbm_gbyte_s", "vendor", "supports_bf16", "source",
               "arch", "tflops_tf32", "tflops_fp8")


def _group_to_dict(g: NodeGroup) -> dict[str, Any]:
    intra = _named_or_inline(g.intra_node, LINK_CATALOG, ("name", "bandwidth_gbyte_s", "latency_us", "efficiency",
                                                          "source"))
    nic = _named_or_inline(g.nic, NIC_CATALOG, ("name", "bandwidth_gbit_s", "latency_us", "rdma", "source"))
    if g.mixed:
        gpus: dict[str, Any] = {"gpus": [{"gpu": _named_or_inline(gpu, GPU_CATALOG, _GPU_FIELDS), "count": n}
                                         for gpu, n in g.mixed]}
    else:
        gpus = {"gpus_per_node": g.gpus_per_node, "gpu": _named_or_inline(g.gpu, GPU_CATALOG, _GPU_FIELDS)}
    host = {k: getattr(g, k) for k in ("host_memory_gb", "host_memory_gbyte_s") if getattr(g, k)}
    return {"count": g.count, **gpus, "intra_node": intra, "nic": nic, "nics_per_node": g.nics_per_node,
            "zone": g.zone, **host}


def _named_or_inline(spec: Any, catalog: dict[str, Any], fields: tuple[str, ...]) -> str | dict[str, Any]:
    if catalog.get(spec.name) == spec:
        return spec.name
    return {f: getattr(spec, f) for f in fields}


# --------------------------------------------------------------------------------------------- loading


def _inline_or_catalog(value, catalog, kind, source, field, build):
    if isinstance(value, str):
        if value not in catalog:
            raise v.unknown_name(SpecError, kind, value, catalog, source, field, extra=" (or give it inline)")
        return catalog[value]
    data = v.require_mapping(SpecError, value, source, field)
    return build(data, source, field)


def _gpu(data: dict, source: str, field: str) -> GPUSpec:
    # hbm_gbyte_s is required: the optimizer step and memory-bound kernels are priced with it, and a
    # guessed default would be a number nobody measured.
    v.require_keys(SpecError, data, source, field, ["name", "tflops_bf16", "memory_gb", "hbm_gbyte_s"],
                   ["tflops_fp32", "vendor", "supports_bf16", "source", "arch", "tflops_tf32", "tflops_fp8"])
    tflops = _number(data["tflops_bf16"], source, f"{field}.tflops_bf16", maximum=1e5)
    vendor = data.get("vendor", "other")
    if vendor not in ("nvidia", "amd", "huawei", "intel", "other"):
        raise v.fail(SpecError, source, f"{field}.vendor", f"unknown vendor {vendor!r}; use nvidia, amd, huawei, intel or other")
    gpu = GPUSpec(
        name=v.string(SpecError, data["name"], source, f"{field}.name"),
        tflops_bf16=tflops,
        tflops_fp32=_number(data.get("tflops_fp32", tflops / 8), source, f"{field}.tflops_fp32", maximum=1e5),
        memory_gb=_number(data["memory_gb"], source, f"{field}.memory_gb", maximum=1e5),
        hbm_gbyte_s=_number(data["hbm_gbyte_s"], source, f"{field}.hbm_gbyte_s", maximum=1e6),
        vendor=vendor,
        supports_bf16=v.boolean(SpecError, data.get("supports_bf16", True), source, f"{field}.supports_bf16"),
        source=_provenance(data, source, field),
        arch=_arch(data, source, field),
        tflops_tf32=_number(data.get("tflops_tf32", 0.0), source, f"{field}.tflops_tf32", strict=False,
                            maximum=1e5),
        tflops_fp8=_number(data.get("tflops_fp8", 0.0), source, f"{field}.tflops_fp8", strict=False,
                           maximum=1e5),
    )
    known = GPU_CATALOG.get(gpu.name)
    if known is not None and replace(gpu, source=known.source) != known:  # outputs per GPU type are keyed by name
        raise v.fail(SpecError, source, f"{field}.name", f"{gpu.name!r} is a catalog GPU with other specs; rename it "
                     "or drop the inline specs to use the catalog's")
    if "tflops_fp32" not in data:
        _note_assumed_fp32(gpu, source, field)
    return gpu


def _note_assumed_fp32(gpu: GPUSpec, source: str, field: str) -> None:
    """One ``hetpart: note:`` line (the CLI prints :class:`~hetpart.graph.load.ModelNote` warnings so) for an inline
    GPU without ``tflops_fp32``: fp32 work is then priced at a guessed bf16/8, a ratio real cards do not share
    (NVIDIA data sheets, dense: A100 19.5/312 = 1/16, V100 15.7/125 = 1/8, RTX 4090 82.6/165 = 1/2)."""
    import warnings

    from hetpart.graph.load import ModelNote

    warnings.warn(ModelNote(f"{source}: {field}: {gpu.name} gives no tflops_fp32; assumed {gpu.tflops_fp32:g} "
                            f"(tflops_bf16 {gpu.tflops_bf16:g} / 8); set {field}.tflops_fp32 (the card's dense fp32 "
                            "TFLOPS, from its data sheet) to price fp32 work right"), stacklevel=2)


def _number(value: Any, source: str, field: str, **limits: Any) -> float:
    """:func:`hetpart._validate.number`, also of text such as ``1e2``: YAML 1.1 reads a number with an exponent
    but no decimal point as text."""
    return v.number(SpecError, v.number_text(value), source, field, **limits)


def _arch(data: dict, source: str, field: str) -> str:
    arch = data.get("arch", "")
    if arch != "" and arch not in ARCHITECTURES:
        raise v.fail(SpecError, source, f"{field}.arch", f"unknown architecture {arch!r}; use one of "
                     f"{', '.join(ARCHITECTURES)} (or leave it out: the assumed curve)")
    return arch


def _link(data: dict, source: str, field: str) -> LinkSpec:
    v.require_keys(SpecError, data, source, field, ["bandwidth_gbyte_s"], ["latency_us", "name", "efficiency", "source"])
    efficiency = _number(data.get("efficiency", 1.0), source, f"{field}.efficiency", maximum=1.0)
    return LinkSpec(
        name=str(data.get("name", "inline")),
        bandwidth_gbyte_s=_number(data["bandwidth_gbyte_s"], source, f"{field}.bandwidth_gbyte_s", maximum=1e5),
        latency_us=_number(data.get("latency_us", 2.0), source, f"{field}.latency_us", strict=False, maximum=1e7),
        source=_provenance(data, source, field),
        efficiency=efficiency,
    )


RDMA_MAX_LATENCY_US = 10.0
"""An inline NIC without ``rdma`` whose ``latency_us`` is below this is taken as RDMA (InfiniBand, RoCE): kernel
bypass gives 1-3 us, while TCP through the kernel stack takes 20-30 us (the catalog's Ethernet entries)."""
RDMA_MIN_GBIT_S = 100.0
"""An inline NIC without ``rdma`` or ``latency_us`` is taken as RDMA from this line rate up: training fabrics of
100 Gbit/s and more are InfiniBand or RoCE, and a TCP socket would carry a fraction of the rate written."""


def _nic(data: dict, source: str, field: str) -> NICSpec:
    v.require_keys(SpecError, data, source, field, ["bandwidth_gbit_s"], ["latency_us", "name", "rdma", "source"])
    bandwidth = _number(data["bandwidth_gbit_s"], source, f"{field}.bandwidth_gbit_s", maximum=1e5)
    latency = _number(data.get("latency_us", 5.0), source, f"{field}.latency_us", strict=False, maximum=1e7)
    if "rdma" in data:
        rdma = v.boolean(SpecError, data["rdma"], source, f"{field}.rdma")
    else:  # what the figures written say: a kernel-bypass latency, or a training fabric's line rate
        rdma = latency < RDMA_MAX_LATENCY_US if "latency_us" in data else bandwidth >= RDMA_MIN_GBIT_S
    return NICSpec(name=str(data.get("name", "inline")), bandwidth_gbit_s=bandwidth, latency_us=latency, rdma=rdma,
                   source=_provenance(data, source, field))


def _provenance(data: dict, source: str, field: str) -> str:
    """Where an inline spec's figures come from: its optional ``source`` key, else the file."""
    if "source" in data:
        return v.string(SpecError, data["source"], source, f"{field}.source")
    return f"inline in {source}"


def _zone(value: Any, source: str, field: str) -> str:
    if (isinstance(value, bool) or not isinstance(value, (str, int)) or not str(value).strip()
            or not str(value).isprintable() or len(str(value)) > v.MAX_STRING_CHARS):
        raise v.fail(SpecError, source, field, f"expected a zone name (printable, one line), got {v.show(value)}")
    return str(value)


def _unique_inline(value: Any, gpu: GPUSpec, seen: dict[str, tuple[GPUSpec, str]] | None, source: str,
                   field: str) -> GPUSpec:
    """Refuse an inline GPU whose name an earlier inline GPU of the file already has with other specs:
    outputs per GPU type (pools, ``peak_memory_gb``, reports) are keyed by name and would merge the two."""
    if seen is None or not isinstance(value, dict):
        return gpu
    first = seen.get(gpu.name)
    if first is None:
        seen[gpu.name] = (gpu, field)
    elif replace(first[0], source="") != replace(gpu, source=""):
        raise v.fail(SpecError, source, f"{field}.name", f"{gpu.name!r} is already defined with other specs "
                     f"({first[1]}); give it another name")
    return gpu


def _gpu_runs(data: dict, source: str, field: str, seen: dict[str, tuple[GPUSpec, str]] | None = None,
              ) -> tuple[int, GPUSpec, tuple[tuple[GPUSpec, int], ...]]:
    """``(gpus_per_node, first type, mixed runs)`` from ``gpu`` + ``gpus_per_node`` or from ``gpus``;
    ``seen`` collects the file's inline GPUs by name (one name, one set of specs)."""
    if "gpus" not in data:
        for key in ("gpus_per_node", "gpu"):
            if key not in data:
                raise v.fail(SpecError, source, f"{field}.{key}", "missing required field; add it (or list the "
                             "node's devices as gpus: [{gpu: NAME, count: N}, ...])")
        return (v.integer(SpecError, data["gpus_per_node"], source, f"{field}.gpus_per_node", maximum=64),
                _unique_inline(data["gpu"], _inline_or_catalog(data["gpu"], GPU_CATALOG, "GPU", source,
                                                               f"{field}.gpu", _gpu), seen, source, f"{field}.gpu"), ())
    if "gpu" in data:
        raise v.fail(SpecError, source, f"{field}.gpu", "give either gpu (one type) or gpus (a list), not both")
    runs_raw = data["gpus"]
    if not isinstance(runs_raw, list) or not runs_raw:
        raise v.fail(SpecError, source, f"{field}.gpus", "expected a non-empty list of {gpu: NAME, count: N}")
    runs = []
    for i, raw in enumerate(runs_raw):
        where = f"{field}.gpus[{i}]"
        raw = v.require_mapping(SpecError, raw, source, where)
        v.require_keys(SpecError, raw, source, where, ["gpu", "count"], [])
        gpu = _inline_or_catalog(raw["gpu"], GPU_CATALOG, "GPU", source, f"{where}.gpu", _gpu)
        runs.append((_unique_inline(raw["gpu"], gpu, seen, source, f"{where}.gpu"),
                     v.integer(SpecError, raw["count"], source, f"{where}.count", maximum=64)))
    total = sum(n for _, n in runs)
    if total > 64:
        raise v.fail(SpecError, source, f"{field}.gpus", f"{total} GPUs in one node is absurdly many (limit 64)")
    if "gpus_per_node" in data and data["gpus_per_node"] != total:
        raise v.fail(SpecError, source, f"{field}.gpus_per_node", f"{v.show(data['gpus_per_node'])} but gpus lists "
                     f"{total}; drop gpus_per_node or make them agree")
    merged: list[tuple[GPUSpec, int]] = []
    for gpu, n in runs:  # adjacent runs of one type are one run
        if merged and merged[-1][0] == gpu:
            merged[-1] = (gpu, merged[-1][1] + n)
        else:
            merged.append((gpu, n))
    return total, merged[0][0], (tuple(merged) if len(merged) > 1 else ())


def _node_group(data: Any, source: str, field: str, seen: dict[str, tuple[GPUSpec, str]] | None = None) -> NodeGroup:
    data = v.require_mapping(SpecError, data, source, field)
    v.require_keys(SpecError, data, source, field, ["count", "intra_node", "nic"],
                   ["gpus_per_node", "gpu", "gpus", "nics_per_node", "zone", "host_memory_gb", "host_memory_gbyte_s"])
    gpus_per_node, gpu, mixed = _gpu_runs(data, source, field, seen)
    return NodeGroup(
        count=v.integer(SpecError, data["count"], source, f"{field}.count", maximum=100_000),
        gpus_per_node=gpus_per_node,
        gpu=gpu,
        mixed=mixed,
        intra_node=_inline_or_catalog(data["intra_node"], LINK_CATALOG, "intra-node link", source,
                                      f"{field}.intra_node", _link),
        nic=_inline_or_catalog(data["nic"], NIC_CATALOG, "NIC", source, f"{field}.nic", _nic),
        nics_per_node=v.integer(SpecError, data.get("nics_per_node", 1), source, f"{field}.nics_per_node", maximum=64),
        zone=_zone(data.get("zone", "default"), source, f"{field}.zone"),
        host_memory_gb=_number(data["host_memory_gb"], source, f"{field}.host_memory_gb",
                               maximum=1e6) if "host_memory_gb" in data else 0.0,
        host_memory_gbyte_s=_number(data["host_memory_gbyte_s"], source, f"{field}.host_memory_gbyte_s",
                                    maximum=1e5) if "host_memory_gbyte_s" in data else 0.0,
    )


def _absent_zone(link: "ZoneLink", zones: list[str], field: str) -> str:
    """Why ``link`` carries no traffic ('' when both its zones hold a node group): it names a zone no group is in.
    Such a link is left out, not refused (a file may describe links to sites it does not use, as CONTRACT.md's
    example does); a misspelt zone leaves the zones it meant unlinked, and the error that reports them
    (:func:`hetpart.costmodel.pools.check_zones_connected`) quotes this."""
    missing = [z for z in link.zones if z not in zones]
    if not missing:
        return ""
    hint = v.closest_name(missing[0], zones)
    return (f"{field} names zone {missing[0]!r}, which no node group is in"
            + (f" (did you mean {hint!r}?)" if hint else ""))


def _zone_link(data: Any, source: str, field: str, zones: list[str]) -> ZoneLink:
    data = v.require_mapping(SpecError, data, source, field)
    v.require_keys(SpecError, data, source, field, ["zones", "bandwidth_gbit_s"], ["latency_us"])
    pair = data["zones"]
    if not isinstance(pair, list) or len(pair) != 2:
        raise v.fail(SpecError, source, f"{field}.zones", f"expected a list of two zone names, got {pair!r}")
    a, b = (_zone(z, source, f"{field}.zones") for z in pair)
    if a == b:
        raise v.fail(SpecError, source, f"{field}.zones", f"a link joins two different zones, got {a!r} twice")
    return ZoneLink(
        zones=(a, b),
        bandwidth_gbit_s=_number(data["bandwidth_gbit_s"], source, f"{field}.bandwidth_gbit_s", maximum=1e6),
        latency_us=_number(data.get("latency_us", 1000.0), source, f"{field}.latency_us", strict=False, maximum=1e8),
    )


def parse_cluster(data: Any, source: str = "<cluster>") -> Cluster:
    """Validate a parsed YAML mapping into a :class:`Cluster`; raises :class:`SpecError` with one line."""
    data = v.require_mapping(SpecError, data, source, "")
    v.require_keys(SpecError, data, source, "", ["name", "nodes"], ["links", "description", "slow"])
    name = v.string(SpecError, data["name"], source, "name")
    nodes = data["nodes"]
    if not isinstance(nodes, list) or not nodes:
        raise v.fail(SpecError, source, "nodes", "expected a non-empty list of node groups")
    inline_gpus: dict[str, tuple[GPUSpec, str]] = {}
    groups = tuple(_node_group(g, source, f"nodes[{i}]", inline_gpus) for i, g in enumerate(nodes))
    total = sum(g.num_devices for g in groups)
    if total > MAX_DEVICES:
        raise v.fail(SpecError, source, "nodes", f"{total} devices is more than hetpart handles ({MAX_DEVICES})")
    zones = list(dict.fromkeys(g.zone for g in groups))
    links_raw = data.get("links") or []
    if not isinstance(links_raw, list):
        raise v.fail(SpecError, source, "links", "expected a list of {zones: [a, b], bandwidth_gbit_s, latency_us}")
    parsed = [(i, _zone_link(raw, source, f"links[{i}]", zones)) for i, raw in enumerate(links_raw)]
    seen = set()
    for i, link in parsed:
        key = frozenset(link.zones)
        if key in seen:
            raise v.fail(SpecError, source, f"links[{i}]", f"zones {list(link.zones)} are linked twice; keep one entry")
        seen.add(key)
    unused = tuple(hint for i, link in parsed if (hint := _absent_zone(link, zones, f"links[{i}]")))
    links = tuple(link for i, link in parsed if not _absent_zone(link, zones, f"links[{i}]"))
    cluster = Cluster(name=name, groups=groups, zone_links=links, source=source, unused_links=unused)
    slow = _slow(data.get("slow"), cluster, source)
    return replace(cluster, slow=slow) if slow else cluster


MAX_SPEED_FACTOR = 4.0
"""A measured speed factor above this is a typo (a factor, not a percentage)."""


def _slow(raw: Any, cluster: Cluster, source: str) -> tuple[tuple[str, float], ...]:
    """``slow: {"g/n/i": factor}``: devices measured slower (or faster) than their type's figures."""
    if raw is None:
        return ()
    raw = v.require_mapping(SpecError, raw, source, "slow")
    out = []
    for key, value in raw.items():
        where = f"slow.{key}" if isinstance(key, str) and key.isprintable() and len(key) < 40 else "slow"
        if not isinstance(key, str) or not cluster.has_device(key):
            raise v.fail(SpecError, source, where, f"device {v.show(key)} does not exist ({cluster.num_devices} "
                         "devices, ids 'group/node/gpu' from 0/0/0; quote them in YAML: \"0/3/5\": 0.6)")
        factor = _number(value, source, where, maximum=MAX_SPEED_FACTOR)
        if factor != 1.0:
            out.append((key, factor))
    return tuple(sorted(out, key=lambda kv: cluster.device(kv[0]).index))


def _read_yaml(path: Path) -> Any:
    from hetpart._yaml import load_yaml_file

    return load_yaml_file(SpecError, path, "the cluster YAML")


def cluster_catalog() -> dict[str, Path]:
    """Bundled clusters by name."""
    root = resources.files("hetpart") / "catalog" / "clusters"
    return {Path(str(p)).stem: Path(str(p)) for p in root.iterdir() if str(p).endswith(".yaml")}


def load_cluster(spec: str | Path) -> Cluster:
    """A cluster from a catalog name or a YAML file path."""
    text = str(spec)
    catalog = cluster_catalog()
    if text in catalog:
        return parse_cluster(_read_yaml(catalog[text]), source=f"catalog:{text}")
    path = Path(text)
    if not v.path_exists(path) and (text.endswith((".yaml", ".yml")) or "/" in text):
        raise SpecError(f"--cluster: {v.show(text, 200)}: no such file; check the path (or give a catalog cluster: "
                        f"{', '.join(sorted(catalog))})")
    if not v.path_exists(path):
        raise v.unknown_name(SpecError, "cluster", text, catalog, "--cluster", "",
                             extra=" (or give the path of a cluster YAML file)")
    return parse_cluster(_read_yaml(path), source=str(path))
