"""NCCL's choice of all-reduce algorithm and protocol: one ``latency + bytes / bandwidth`` line each.

NCCL prices every collective call once per algorithm x protocol and runs the fastest (its tuner:
``time = latency + bytes / algorithm bandwidth``, NVIDIA/nccl ``src/graph/tuning.cc``, read for its
design and constants, v2.19). hetpart builds the same candidates from the links the members really
use (:mod:`hetpart.costmodel.links`) and takes the minimum:

* **Algorithms.** ``ring``: ``2 (n-1)`` steps, each moving ``bytes / n`` (bus bandwidth = the ring's
  slowest hop; latency linear in ``n``). ``tree`` (NCCL >= 2.4, "Massively Scale Your Deep Learning
  Training with NCCL 2.4", NVIDIA blog 2019): a chain inside each node and a double binary tree
  across nodes; each rank moves the whole buffer up and down, so the bandwidth term is
  ``bytes / (0.5 x bus bandwidth)`` (about that of a long ring) while the latency grows with
  ``log2(nodes)``. ``nvls`` (NVLink SHARP, NCCL >= 2.17, Hopper boards with third-generation
  NVSwitch): the switch reduces; NCCL's maintainer gives ~480 GB/s bus bandwidth (algorithm
  bandwidth ~275 GB/s) on 8 x H100 where the ring reaches 370 (NVIDIA/nccl-tests issue 212), so its
  algorithm bandwidth is :data:`NVLS_ALG_FRACTION` of the per-GPU NVLink rate, at a 23 us latency.
* **Protocols.** ``Simple`` (full bandwidth, a fence and flag per chunk: the slowest step),
  ``LL128`` (128-byte lines with 8 bytes of flag: 120/128 of the bandwidth, NCCL's model uses 0.92
  for rings and 0.7 with one GPU per node; enabled by default only on V100, A100 and H100-class
  GPUs joined by NVLink), ``LL`` (8-byte stores of 4 bytes data + 4 bytes flag; NCCL's model gives
  rings 1/4 and trees 1/3.8 of the bus bandwidth, capped per architecture) -- see :data:`PROTOCOL_BW`.
* **Latency.** ``base + steps x per-step latency``, both per algorithm and protocol
  (:data:`BASE_LAT_US`, :data:`HW_LAT_US`), with NCCL's step latency of the hardware class of each
  hop (NVLink, PCIe, network). A hop whose own latency is longer than anything NCCL's table measured
  (TCP sockets, staging through host memory, links between zones) pays its own latency instead
  (``max``): a protocol saves synchronisation, not wire time.

Reduce-scatter and all-gather (ZeRO's sharded collectives) are rings in NCCL's tuner (no tree): ``n - 1``
steps, each moving ``bytes / n`` of the whole buffer; LL at 1/3 of the bus bandwidth inside one node
(1/4 across nodes). :func:`nccl_lines` gives them with ``collective="reduce_scatter"``.

Not modelled: NVLS for reduce-scatter and all-gather, NCCL's size-dependent tree correction (``treeCorrectionFactor``, up to 2x slower trees
between 64 KB and 8 MB), the ring's "plateau" factor for large multi-node messages, per-channel
bandwidth caps (the channel count is not known here), NVLS across nodes (NVLS-tree) and CollNet
(SHARP switches). AMD (RCCL) and Huawei (HCCL) members are priced with the same algorithms, without
LL128 or NVLS.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

__all__ = ["CollectiveLine", "BASE_LAT_US", "HW_LAT_US", "PROTOCOL_BW", "LL_MAX_GBYTE_S", "TREE_BW_FRACTION",
           "NVLS_ALG_FRACTION", "NET_OVERHEAD_US", "LL128_GPUS", "NVLS_LINKS", "RingShape", "nccl_lines"]

Algorithm = Literal["ring", "tree", "nvls", "hierarchical"]
Protocol = Literal["LL", "LL128", "Simple"]
HwClass = Literal["nvlink", "pci", "net"]
Collective = Literal["allreduce", "reduce_scatter"]

BASE_LAT_US: dict[tuple[str, str], float] = {
    ("tree", "LL"): 6.8, ("tree", "LL128"): 14.0, ("tree", "Simple"): 0.0,
    ("ring", "LL"): 6.6, ("ring", "LL128"): 14.0, ("ring", "Simple"): 8.4,
    ("nvls", "Simple"): 0.0,
}
"""Latency paid once per call, us (NVIDIA/nccl ``src/graph/tuning.cc`` ``baseLat``, v2.19)."""

HW_LAT_US: dict[str, dict[tuple[str, str], float]] = {
    "nvlink": {("tree", "LL"): 0.6, ("tree", "LL128"): 1.25, ("tree", "Simple"): 28.0,
               ("ring", "LL"): 0.6, ("ring", "LL128"): 1.9, ("ring", "Simple"): 3.4, ("nvls", "Simple"): 23.0},
    "pci": {("tree", "LL"): 1.0, ("tree", "LL128"): 1.9, ("tree", "Simple"): 28.0,
            ("ring", "LL"): 1.0, ("ring", "LL128"): 2.5, ("ring", "Simple"): 5.7},
    "net": {("tree", "LL"): 5.0, ("tree", "LL128"): 8.5, ("tree", "Simple"): 28.0,
            ("ring", "LL"): 2.7, ("ring", "LL128"): 4.0, ("ring", "Simple"): 14.0},
}
"""Latency of one step over a hop of each hardware class, us (NVIDIA/nccl ``tuning.cc`` ``hwLat``, v2.19).
A tree step under Simple is one 256 KB chunk through the pipeline (the table's own comment)."""

PROTOCOL_BW: dict[tuple[str, str], float] = {
    ("ring", "LL"): 1 / 4, ("ring", "LL128"): 0.92, ("ring", "Simple"): 1.0,
    ("tree", "LL"): 1 / 3.8, ("tree", "LL128"): 120 / 128, ("tree", "Simple"): 1.0,
}
"""Share of the bus bandwidth each protocol reaches per algorithm (NVIDIA/nccl ``tuning.cc`` model
refinements, v2.19): LL carries 4 data bytes per 8-byte store (and waits on flags), LL128 120 of every
128 bytes. A ring's LL128 falls to :data:`LL128_ONE_PER_NODE` with one GPU per node; a tree's LL128 is
7/9 inside one node. Trees first take :data:`TREE_BW_FRACTION` of the bus bandwidth."""

LL_ONE_PASS_ONE_NODE = 1 / 3
"""A ring's LL share for a reduce-scatter or all-gather inside one node (``tuning.cc``; 1/4 otherwise)."""
LL128_ONE_PER_NODE = 0.7
"""A ring's LL128 share with one GPU per node (sending and receiving through the same NIC; ``tuning.cc``)."""
TREE_BW_FRACTION = 0.92
"""Share of the bus bandwidth a tree reaches before its protocol's share (``tuning.cc``)."""
TREE_LL128_ONE_NODE = 7 / 9
"""A tree's LL128 share inside one node (``tuning.cc``)."""

NET_OVERHEAD_US = 1.0
"""Across nodes, every ring step (inside a node too) launches a network post: at least 1 us (x86 Intel
host; ``getNetOverhead`` in ``tuning.cc``), three times that under Simple."""

LL_MAX_GBYTE_S: dict[str, tuple[float, float, float]] = {
    "volta": (39.0, 39.0, 20.4), "ampere": (87.7, 39.0, 20.4), "hopper": (87.7, 39.0, 20.4)}
"""Cap on LL bus bandwidth by architecture for (1 node, 2 nodes, more), GB/s (``tuning.cc`` ``llMaxBws``:
one node by GPU, several by CPU; the Intel host's figures are taken for several nodes)."""

NVLS_ALG_FRACTION = 275.0 / 370.0
"""NVLS algorithm bandwidth as a share of the per-GPU rate NCCL reaches over NVLink4 (nccl-tests issue
212, NCCL's maintainer: ~275 GB/s algorithm bandwidth with NVLS on 8 x H100 against the ring's 370 GB/s
of NVLink bandwidth)."""

LL128_GPUS = frozenset({"V100-16GB", "V100-32GB", "A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB", "GH200-96GB"})
"""Catalog GPUs of compute capability 7.0, 8.0 and 9.0: the ones on which NCCL enables LL128 by default
(``tuning.cc``: other GPUs are "not tested and may cause silent data corruption")."""
NVLS_LINKS = frozenset({"NVLink4"})
"""Intra-node links with NVLink SHARP (third-generation NVSwitch boards: HGX/DGX H100 and H200). NVLS is a
reduction the NVSwitch runs (NVIDIA/nccl issue 807, NCCL's maintainer: "a new feature of the NVLink4
NVSwitches", "available on systems that have H100 and NVLink4 switches"; issue 1031: an all-reduce offload over
NVLink), so it needs the switch: a GH200 quad board, whose GPUs are wired to each other directly, is
``NVLink4-mesh`` (:func:`hetpart.costmodel.links.intra_node_link`) and has none. Callers test the link
:func:`~hetpart.costmodel.links.intra_node_link` returns, not the file's name."""


@dataclass(frozen=True)
class CollectiveLine:
    """One candidate way to run a collective: ``fixed_s + per_byte_s * bytes``."""

    algorithm: str
    """``ring``, ``tree``, ``nvls`` (NCCL's) or ``hierarchical`` (hetpart's reduce-scatter / cross-node
    rings / all-gather, kept from before NCCL's tuner was modelled)."""
    protocol: str
    """``LL``, ``LL128`` or ``Simple``."""
    fixed_s: float
    per_byte_s: float

    def time_s(self, num_bytes: float) -> float:
        return self.fixed_s + self.per_byte_s * num_bytes

    @property
    def name(self) -> str:
        return f"{self.algorithm}/{self.protocol}"


@dataclass(frozen=True)
class RingShape:
    """What NCCL's tuner needs to know about an all-reduce's members and links."""

    ranks: int
    nodes: int
    per_node: int
    """Members on the fullest node (the tree's chain inside a node)."""
    bus_gbyte_s: float
    """Bus bandwidth of the members' ring: its slowest hop after NIC sharing, GB/s."""
    intra_hw: HwClass
    """Hardware class of the hops inside a node (``nvlink`` or ``pci``)."""
    intra_floor_us: float = 0.0
    """A hop's own latency inside a node where it exceeds NCCL's table (host staging), else 0."""
    inter_floor_us: float = 0.0
    """The latency of a hop between nodes (NIC or zone link): a step never takes less."""
    arch: str = "ampere"
    """Architecture whose LL cap applies (``volta``, ``ampere``, ``hopper``)."""
    ll128: bool = False
    """Whether NCCL enables LL128 for these members (:data:`LL128_GPUS`, NVLink inside the node)."""
    nvls_gbyte_s: float = 0.0
    """Per-GPU NVLink rate of an NVLS-capable node holding every member, else 0."""


def _step_us(shape: RingShape, algorithm: str, protocol: str) -> tuple[float, float]:
    """Per-step latency inside a node and between nodes, us."""
    key = (algorithm, protocol)
    intra = max(HW_LAT_US[shape.intra_hw][key], shape.intra_floor_us)
    inter = max(HW_LAT_US["net"][key], shape.inter_floor_us)
    return intra, inter


def _ll_cap(shape: RingShape) -> float:
    return LL_MAX_GBYTE_S.get(shape.arch, LL_MAX_GBYTE_S["ampere"])[min(shape.nodes, 3) - 1]


def _protocols(shape: RingShape) -> tuple[str, ...]:
    return ("LL", "LL128", "Simple") if shape.ll128 else ("LL", "Simple")


def _ring_lines(shape: RingShape, passes: int = 2) -> list[CollectiveLine]:
    """Ring lines of ``passes`` trips around the ring: 2 for an all-reduce (reduce-scatter, then
    all-gather), 1 for a reduce-scatter or an all-gather."""
    n, nodes = shape.ranks, shape.nodes
    inter_steps = passes * (nodes - 1)
    intra_steps = passes * (n - 1) - inter_steps
    out = []
    for p in _protocols(shape):
        bus = shape.bus_gbyte_s * PROTOCOL_BW[("ring", p)]
        if p == "LL128" and nodes > 1 and shape.per_node < 2:
            bus = shape.bus_gbyte_s * LL128_ONE_PER_NODE
        if p == "LL":
            if passes == 1 and nodes == 1:
                bus = shape.bus_gbyte_s * LL_ONE_PASS_ONE_NODE
            bus = min(bus, _ll_cap(shape))
        intra, inter = _step_us(shape, "ring", p)
        if nodes > 1:
            intra = max(intra, NET_OVERHEAD_US * (3 if p == "Simple" else 1))
        fixed = BASE_LAT_US[("ring", p)] + intra_steps * intra + inter_steps * inter
        out.append(CollectiveLine("ring", p, fixed * 1e-6, passes * (n - 1) / n / (bus * 1e9)))
    return out


def _tree_lines(shape: RingShape) -> list[CollectiveLine]:
    nodes = shape.nodes
    depth = max(1, int(math.log2(nodes))) if nodes > 1 else 0
    out = []
    for p in _protocols(shape):
        bus = shape.bus_gbyte_s * TREE_BW_FRACTION
        bus *= TREE_LL128_ONE_NODE if p == "LL128" and nodes == 1 else PROTOCOL_BW[("tree", p)]
        if p == "LL":
            bus = min(bus, _ll_cap(shape))
        intra, inter = _step_us(shape, "tree", p)
        fixed = BASE_LAT_US[("tree", p)] + 2 * ((shape.per_node - 1) * intra + depth * inter)
        out.append(CollectiveLine("tree", p, fixed * 1e-6, 1 / (0.5 * bus * 1e9)))
    return out


@lru_cache(maxsize=4096)
def nccl_lines(shape: RingShape, collective: Collective = "allreduce") -> tuple[CollectiveLine, ...]:
    """NCCL's candidate lines for ``shape``: for an all-reduce, rings and (across nodes) trees under each
    enabled protocol, and NVLS inside an NVLink SHARP node; for a ``reduce_scatter`` (or an all-gather,
    the same cost) rings only, ``bytes`` being the whole buffer. The call's time is the minimum over them.

    Inside one node the tree is a chain whose Simple step costs 28 us: NCCL's tuner does not prefer it
    to the ring there, so it is only offered across nodes.

    Example:
        >>> def fastest(shape, nbytes):
        ...     return min(nccl_lines(shape), key=lambda line: line.time_s(nbytes)).name
        >>> many = RingShape(ranks=1024, nodes=128, per_node=8, bus_gbyte_s=192.0, intra_hw="nvlink", ll128=True)
        >>> few = RingShape(ranks=16, nodes=2, per_node=8, bus_gbyte_s=192.0, intra_hw="nvlink", ll128=True)
        >>> fastest(many, 1e4), fastest(few, 1e4), fastest(few, 1e9)
        ('tree/LL', 'tree/LL', 'ring/Simple')
    """
    if shape.ranks <= 1:
        return ()
    if collective == "reduce_scatter":
        return tuple(_ring_lines(shape, passes=1))
    out = _ring_lines(shape)
    if shape.nodes > 1:
        out += _tree_lines(shape)
    if shape.nodes == 1 and shape.nvls_gbyte_s > 0:
        lat = HW_LAT_US["nvlink"][("nvls", "Simple")] + BASE_LAT_US[("nvls", "Simple")]
        out.append(CollectiveLine("nvls", "Simple", lat * 1e-6, 1 / (NVLS_ALG_FRACTION * shape.nvls_gbyte_s * 1e9)))
    return tuple(out)
