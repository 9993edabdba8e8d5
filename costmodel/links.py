"""What transfers really reach over the cluster's links: bandwidth as NCCL moves data, not the datasheet.

The cluster describes hardware at its line rate (``hetpart.cluster``: the runtime's emulation shapes
links to exactly that). The cost model prices every transfer at the rate a collective library reaches:

* **Inside a node**: ``LinkSpec.bandwidth_gbyte_s * efficiency``; the catalog takes the efficiencies
  from NCCL's own topology model (NVLink bricks at 20 of 25 GB/s, PCIe Gen3 x16 at 12 of 15.75, host
  staging across CPU sockets at the socket link's rate; see ``hetpart.catalog.hardware``).
* **RDMA NICs** (InfiniBand, RoCE): ``RDMA_EFFICIENCY`` of the line rate: NCCL's topology model prices
  a 100 Gbit/s port at 12 GB/s (``NET_BW`` in NVIDIA/nccl src/graph/topo.h), 96% of its 12.5.
* **TCP Ethernet** (NCCL's socket transport): the TCP payload share of each Ethernet frame,
  ``TCP_FRAMING_EFFICIENCY`` = 1460 / 1538 at MTU 1500 (20 B IP + 20 B TCP headers in a 1500 B packet;
  14 B header, 4 B FCS, 8 B preamble and 12 B inter-frame gap on the wire), and at most
  ``TCP_SOCKET_GBYTE_S`` per NIC: the socket transport copies through host memory with a few CPU
  threads, and a published nccl-tests run over 100 GbE TCP stopped at 4.7 GB/s bus bandwidth (NVIDIA/nccl
  issue 398, AWS p3dn, default socket settings) where the wire would allow 11.9.
* **Between zones**: the zone link at the same TCP framing efficiency (WAN traffic is TCP/IP), shared by
  every transfer and ring that crosses it at once, as a node's NICs are (:func:`zone_gbyte_s`).
* **Hybrid cube-mesh NVLink** (``NVLink2-cube-mesh``: DGX-1 with V100, the 8-GPU V100 cloud boards):
  no switch; each GPU has 6 NVLink bricks to 4 of the 7 others (``CUBE_MESH_BRICKS``, the published
  ``nvidia-smi topo -m`` matrix of these boards). NCCL packs rings onto the bricks; a ring runs at one
  brick's rate (NCCL topo.h ``SM70_NVLINK_BW`` = 20 GB/s), so a group reaches 20 GB/s per directed
  Hamiltonian cycle over its members that fits in the bricks (:func:`cube_mesh_ring_gbyte_s`): 120
  for all 8 GPUs (6 rings), 80 for a quad, 20 for a pair joined by one brick -- where an NVSwitch
  board gives every group 120. Members with no NVLink cycle go through PCIe and the CPU socket link.
* **MI300X full mesh** (``xGMI-mesh``; a node of cdna3 GPUs whose file says ``xGMI`` gets it, the catalog's
  ``xGMI`` being MI250X's pairs): one 64 GB/s xGMI link from each GPU to each of its 7 peers, ~48 GB/s of it
  usable by RCCL (AMD ROCm blog on RCCL over xGMI); a pair talks over its one link, a ring over ``k`` GPUs
  spreads RCCL's channels over the ``k - 1`` links each member has to the others: 336 GB/s for all 8, 48 for a
  pair (an NVSwitch node gives every group its whole NVLink rate).
* **GH200 quad nodes** (``NVLink4-mesh``; a GH200 node of 2 or 4 GPUs whose file says ``NVLink4`` gets it):
  the GPUs are wired to each other with no NVSwitch (HPE Cray EX254n; CSCS Alps documentation), so a pair
  talks over its own 6 links (150 GB/s per direction) and a ring over ``k`` GPUs over the ``k - 1`` peers'
  links, as the MI300X mesh: 450 GB/s line rate for all 4, 150 for a pair; and no NVLink SHARP. The 12
  directed links of 4 GPUs hold no 3 disjoint directed rings (the complete directed graph on 4 vertices has no
  Hamiltonian decomposition: Bermond and Faber 1976; checked here by enumerating its 6 directed rings), but
  NCCL's channels spread over all 6 at half rate each load every link equally: 6 x 75 = 450 GB/s.
* **GeForce and TITAN boards over PCIe** (``NO_PCIE_P2P``): NVIDIA's driver gives them no PCIe peer-to-peer
  (nccl-tests issue 117: RTX 2080 Ti "CANNOT Access Peer"; wohlbier/gpu-micro README: the same on 8 TITAN RTX;
  tinygrad/open-gpu-kernel-modules issue 17: RTX 4090 P2P only with a patched kernel module), so a
  ``PCIe3/4/5`` link between them is priced as its ``-host`` entry: NCCL's SHM transport stages every ring hop
  through host memory (the sender writes it there, the receiver reads it back), and a ring over ``k`` of a
  node's GPUs runs at the slowest of three shares (:func:`host_staged_ring_gbyte_s`):

  - **the root port**: each member sends and receives at once, both through host memory, and a CPU's root
    complex moves such staged traffic in both directions together at about the rate of one
    (:data:`STAGED_DUPLEX_GBYTE_S`, from published ``P2P=Disabled`` copies and SHM all-reduces); GPUs behind one PCIe switch share its uplink (:data:`GPU_PORTS_PER_SOCKET`: the 8-GPU
    GeForce servers of the PCIe 3 era hang pairs of GPUs off one x16 port), and without peer-to-peer their
    traffic cannot stay in the switch (NVIDIA/nccl issue 1309, NCCL's maintainer: "a 2x increase in load on
    the PCI link to the CPU");
  - **the CPU socket link**, where the ring spans both sockets of a two-socket server (the ``-host`` entry's
    own rate: NCCL topo.h ``SKL_QPI_BW`` / ``SRP_QPI_BW``); a node of at most 4 GPUs is ASSUMED one socket
    (:data:`TWO_SOCKET_MIN_GPUS`), so nothing crosses one there;
  - **host memory**: every staged byte is written to DRAM and read back, by all ``k`` members at once, so
    ``2 k`` times the ring's rate comes out of the memory bandwidth of the sockets it touches (the node's
    ``host_memory_gbyte_s`` where the file gives it, else :data:`HOST_DRAM_GBYTE_S`). NCCL's maintainer on
    8 x RTX 5090: "on PCI systems, the performance you get is usually determined by the bandwidth your CPU
    and memory can deliver ... 8 flows at 28GB/s in both directions" (NVIDIA/nccl issue 1639).

  A 2-GPU transfer (a pipeline send) is priced as a ring of the pair, at the duplex rate: in 1F1B's steady
  state activations go one way while gradients come back the other. A lone one-way copy (warm-up, GPipe's
  forward phase) could run up to about twice as fast (11.4 GB/s one way against 5.7 each way on PCIe 3
  above), which this leaves out: it errs slow by at most that on such sends. Not modelled: rings of other groups
  staging through the same host memory at the same time (each all-reduce is priced alone), and NCCL's SHM
  path in which the receiving GPU's kernel reads host memory itself, which a published 2 x RTX 5070 Ti run
  puts at 1.9 GB/s against 12.5 with ``NCCL_SHM_USE_CUDA_MEMCPY=1`` (sgl-project/sglang pull request 39605).
"""

from __future__ import annotations

from collections import Counter
from functools import lru_cache
from itertools import permutations
from math import ceil

from hetpart.catalog.hardware import LINK_CATALOG
from hetpart.cluster import Cluster, NodeGroup, PathLink
from hetpart.hardware import LinkSpec, NICSpec

__all__ = ["RDMA_EFFICIENCY", "TCP_FRAMING_EFFICIENCY", "TCP_SOCKET_GBYTE_S", "NO_PCIE_P2P", "CUBE_MESH_BRICKS",
           "MESH_LINKS", "SWITCHLESS_NVLINK_GPUS", "STAGED_DUPLEX_GBYTE_S", "GPU_PORTS_PER_SOCKET", "HOST_DRAM_GBYTE_S",
           "TWO_SOCKET_MIN_GPUS", "host_staged_ring_gbyte_s",
           "nic_gbyte_s", "node_nic_gbyte_s", "intra_node_link", "achieved_link", "cube_mesh_ring_gbyte_s",
           "intra_node_ring_gbyte_s", "zone_gbyte_s", "zone_cap_gbyte_s"]

RDMA_EFFICIENCY = 12.0 / 12.5
"""NCCL topo.h ``NET_BW``: 12 GB/s for a 100 Gbit/s (12.5 GB/s) port."""
TCP_FRAMING_EFFICIENCY = 1460.0 / 1538.0
"""TCP payload bytes per Ethernet wire bytes at MTU 1500."""
TCP_SOCKET_GBYTE_S = 4.7
"""Bus bandwidth NCCL's socket transport reached over one 100 GbE NIC (NVIDIA/nccl issue 398)."""
NO_PCIE_P2P = frozenset({"RTX2080Ti-11GB", "TitanRTX-24GB", "RTX3090-24GB", "RTX4090-24GB"})
"""Catalog GPUs (GeForce and TITAN boards) without PCIe peer-to-peer access: the driver answers
``cudaDeviceCanAccessPeer`` no for every pair. RTX 2080 Ti: NVIDIA/nccl-tests issue 117; TITAN RTX: 8 boards of
one Lambda server, every pair "CANNOT Access Peer" (p2pBandwidthLatencyTest, github.com/wohlbier/gpu-micro
README); RTX 3090: NVIDIA/nccl issue 1127; RTX 4090: only with a patched kernel module
(tinygrad/open-gpu-kernel-modules). An NVLink bridge between two boards is a link of its own, not this."""


STAGED_DUPLEX_GBYTE_S: dict[str, float] = {"PCIe3-host": 11.4 / 2, "PCIe4-host": (20.2 + 16.77) / 2 / 2,
                                           "PCIe5-host": 35.0}
"""Per direction, GB/s: what one GPU with its own x16 port stages through host memory while it receives as much
staged data at the same time (a ring member does both), by host link. PCIe 3: 8 TITAN RTX on a two-socket Xeon
server copy 11.4 GB/s one way with ``P2P=Disabled`` and 11.4 in both directions together
(p2pBandwidthLatencyTest, github.com/wohlbier/gpu-micro README), so 5.7 each way; NCCL's maintainer on a 2-GPU SHM
run at 3.9 GB/s all-reduce against 10.3 broadcast: "some CPUs do not handle bidirectional traffic well"
(NVIDIA/nccl issue 384). PCIe 4: 8 A40 on two EPYC 7302 stage 19.1-21.2 GB/s (20.2 mid) in both directions
together (NVIDIA/nccl-tests issue 74), 2 RTX 3090 on one EPYC 16.77 (11.28 one way; noonghunna/club-3090
docs/PCIE_P2P.md): the mean, halved. PCIe 5: 4 RTX 5090 on two Xeon 8480+ reach a 35 GB/s all-reduce bus
bandwidth, each GPU sending and receiving that much (NVIDIA/nccl issue 1639). That figure is measured
differently from the other two: an all-reduce's bus bandwidth is already a per-direction rate with both
directions busy, so it is taken as it is, not halved; and it is a whole ring's rate, so the root port's own is
at least that (ASSUMED equal: no published PCIe 5 ``P2P=Disabled`` copy figure was found)."""
GPU_PORTS_PER_SOCKET: dict[str, int] = {"PCIe3-host": 2, "PCIe4-host": 4, "PCIe5-host": 4}
"""ASSUMED: x16 ports per CPU socket that GPUs of a ``-host`` node hang off; GPUs beyond that share a port
through a PCIe switch. PCIe 3 servers are Xeon Scalable (48 lanes a socket, Intel's datasheet), and the
published 8-GPU GeForce servers show GPUs in pairs under one switch (bus ids 04/05, 08/09, 84/85, 88/89 of
8 x RTX 2080 Ti, NVIDIA/nccl-tests issue 117; 1a/1b, 3d/3e, 88/89, b1/b2 of 8 x TITAN RTX, wohlbier/gpu-micro;
04/05, 08/09, 83/84, 87/88 of 8 x RTX 3090, NVIDIA/nccl issue 1439). PCIe 4 and 5: EPYC (128 lanes) and
Xeon 4th-generation (80) hosts give each of 4 GPUs per socket its own x16 port (8 x RTX 4090 at bus ids
01, 25, ..., e1, NVIDIA/nccl-tests issue 269; a switchless 2 x EPYC 7542 8 x RTX 4090 server,
blog.chlc.cc "RTX4090 GPUDirect P2P Unlocked"); some Xeon boards put 4 behind one switch (NVIDIA/nccl-tests
issue 307), which this does not know."""
HOST_DRAM_GBYTE_S: dict[str, float] = {"PCIe3-host": 150.0, "PCIe4-host": 150.0, "PCIe5-host": 450.0}
"""ASSUMED: a ``-host`` node's CPU memory bandwidth where the cluster file gives no ``host_memory_gbyte_s``,
GB/s. PCIe 3/4: the offload model's two-socket DDR4 figure (``hetpart.costmodel.offload``); PCIe 5: two
Sapphire Rapids sockets (8 channels of DDR5-4800 each, 614 GB/s on paper), at least the 448 GB/s that
8 x RTX 5090 staged at 28 GB/s in both directions (NVIDIA/nccl issue 1639)."""
TWO_SOCKET_MIN_GPUS = 5
"""ASSUMED: a ``-host`` node of this many GPUs or more is a two-socket server (the 8-GPU servers above);
smaller nodes are one-socket workstations, whose rings cross no socket link."""
_STAGED_COPIES = 2
"""Host-memory transfers per staged byte: the sender's write and the receiver's read."""

CUBE_MESH_BRICKS = {(0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2, (1, 2): 2, (1, 3): 1, (1, 5): 2, (2, 3): 2,
                    (2, 6): 1, (3, 7): 1, (4, 5): 1, (4, 6): 1, (4, 7): 2, (5, 6): 2, (5, 7): 1, (6, 7): 2}
"""NVLink bricks between the GPUs of a hybrid cube-mesh board (DGX-1V / AWS p3.16xlarge ``nvidia-smi topo -m``:
NV1 / NV2); pairs not listed have none."""
_BRICK_GBYTE_S = 20.0
"""What NCCL moves over one V100 NVLink brick per direction (topo.h ``SM70_NVLINK_BW``)."""


@lru_cache(maxsize=512)
def cube_mesh_ring_gbyte_s(members: frozenset[int]) -> float:
    """Ring bandwidth NCCL reaches among ``members`` (local GPU indices 0-7) of a hybrid cube-mesh board:
    20 GB/s per directed ring through all members that fits in the bricks with the rings already
    packed (an exact search: at most 5,040 orders); 0 when no ring over NVLink exists."""
    nodes = sorted(members)
    if len(nodes) < 2:
        return float("inf")
    cap = {}
    for (a, b), n in CUBE_MESH_BRICKS.items():
        cap[(a, b)] = cap[(b, a)] = n
    first, rest = nodes[0], nodes[1:]
    rings = []
    for order in permutations(rest):
        cycle = (first,) + order
        hops = [(cycle[i], cycle[(i + 1) % len(cycle)]) for i in range(len(cycle))]
        if len(cycle) == 2:
            hops = hops[:1]  # a pair: one direction of one brick per ring
        if all(cap.get(h, 0) > 0 for h in hops):
            rings.append(hops)

    def most(start: int, used: dict) -> int:
        best = 0
        for i in range(start, len(rings)):
            if all(used.get(h, 0) < cap[h] for h in rings[i]):
                for h in rings[i]:
                    used[h] = used.get(h, 0) + 1
                best = max(best, 1 + most(i, used))
                for h in rings[i]:
                    used[h] -= 1
        return best

    return most(0, {}) * _BRICK_GBYTE_S


MESH_LINKS = frozenset({"xGMI-mesh", "NVLink4-mesh"})
"""Intra-node links that join every GPU to each peer directly (no switch): a ring over ``k`` GPUs runs over the
``k - 1`` links each member has (:func:`intra_node_ring_gbyte_s`)."""

SWITCHLESS_NVLINK_GPUS: dict[str, tuple[int, ...]] = {"GH200-96GB": (2, 4)}
"""GPUs whose nodes of these sizes join their GPUs by NVLink with no NVSwitch (GH200 quad boards, HPE Cray EX254n:
CSCS Alps documentation, "there is no NVSwitch"); a file's ``NVLink4`` there is ``NVLink4-mesh``. A larger GH200
node (DGX GH200's NVLink Switch System) keeps the switched ``NVLink4``."""


def intra_node_ring_gbyte_s(group: NodeGroup, local: list[int]) -> float:
    """Bandwidth of a ring among the GPUs ``local`` (indices inside one node of ``group``)."""
    link = intra_node_link(group)
    if link.name == "NVLink2-cube-mesh" and LINK_CATALOG.get(link.name) == link and group.gpus_per_node == 8:
        ring = cube_mesh_ring_gbyte_s(frozenset(local))
        return ring if ring > 0 else LINK_CATALOG["PCIe3-host"].achieved_gbyte_s
    if link.name in MESH_LINKS and LINK_CATALOG.get(link.name) == link:  # one link to each peer, all in use
        return max(len(set(local)) - 1, 1) * link.achieved_gbyte_s
    if link.name in STAGED_DUPLEX_GBYTE_S and LINK_CATALOG.get(link.name) == link:
        return host_staged_ring_gbyte_s(group, tuple(sorted(set(local))))
    return link.achieved_gbyte_s


@lru_cache(maxsize=4096)
def host_staged_ring_gbyte_s(group: NodeGroup, local: tuple[int, ...]) -> float:
    """Bandwidth of a ring among the GPUs ``local`` (sorted local indices) of a node whose GPUs stage through
    host memory (a catalog ``PCIe3/4/5-host`` link; module docstring): the slowest of the root-port share, the
    socket link where the ring spans two sockets, and the host memory all members stage through at once.

    Members sit in local order: the first half of a two-socket node on socket 0, and within a socket
    ``ceil(gpus per socket / ports)`` consecutive GPUs on each port (:data:`GPU_PORTS_PER_SOCKET`)."""
    link = intra_node_link(group)
    sockets = 2 if group.gpus_per_node >= TWO_SOCKET_MIN_GPUS else 1
    per_socket = ceil(group.gpus_per_node / sockets)
    per_port = ceil(per_socket / GPU_PORTS_PER_SOCKET[link.name])
    if len(local) < 2:
        return float("inf")
    sharing = max(Counter((i // per_socket, i % per_socket // per_port) for i in local).values())
    bw = STAGED_DUPLEX_GBYTE_S[link.name] / sharing
    touched = len({i // per_socket for i in local})
    if touched > 1:
        bw = min(bw, link.achieved_gbyte_s)  # the socket link, crossed once each way
    dram = (group.host_memory_gbyte_s or HOST_DRAM_GBYTE_S[link.name]) * touched / sockets
    return min(bw, dram / (_STAGED_COPIES * len(local)))


def intra_node_link(group: NodeGroup) -> LinkSpec:
    """The link a node of ``group`` really has between its GPUs: its ``intra_node`` entry, that entry's
    host-staged twin when its GPUs cannot reach each other over PCIe (``NO_PCIE_P2P``), the MI300X's full
    mesh (``xGMI-mesh``) where cdna3 GPUs name the catalog's ``xGMI``, or a GH200 quad's switchless mesh
    (``NVLink4-mesh``, :data:`SWITCHLESS_NVLINK_GPUS`) where it names the catalog's ``NVLink4``. Whatever
    depends on the hardware between the GPUs (ring rates, NVLS) reads this link, not the file's name."""
    link = group.intra_node
    if group.gpu.name in NO_PCIE_P2P and f"{link.name}-host" in LINK_CATALOG and LINK_CATALOG.get(link.name) == link:
        return LINK_CATALOG[f"{link.name}-host"]
    if link.name == "xGMI" and LINK_CATALOG.get(link.name) == link and group.gpu.arch == "cdna3":
        return LINK_CATALOG["xGMI-mesh"]  # the catalog's xGMI is MI250X's; an MI300X node is a full mesh
    if (link.name == "NVLink4" and LINK_CATALOG.get(link.name) == link and group.gpu.name in SWITCHLESS_NVLINK_GPUS
            and group.gpus_per_node in SWITCHLESS_NVLINK_GPUS[group.gpu.name]):
        return LINK_CATALOG["NVLink4-mesh"]  # a GH200 quad (or pair) board: no NVSwitch
    return link


def nic_gbyte_s(nic: NICSpec) -> float:
    """Bandwidth one NIC really carries for NCCL, GB/s."""
    if nic.rdma:
        return nic.bandwidth_gbyte_s * RDMA_EFFICIENCY
    return min(nic.bandwidth_gbyte_s * TCP_FRAMING_EFFICIENCY, TCP_SOCKET_GBYTE_S)


def node_nic_gbyte_s(group: NodeGroup) -> float:
    """What all NICs of one node of ``group`` carry together, GB/s."""
    return group.nics_per_node * nic_gbyte_s(group.nic)


def zone_gbyte_s(cluster: Cluster, zone_a: str, zone_b: str) -> float:
    """What the link between two different zones carries for all the flows crossing it together, GB/s
    (inf when the zones are one; the caller divides it among the flows crossing it at once)."""
    if zone_a == zone_b:
        return float("inf")
    link = cluster.zone_link(zone_a, zone_b)
    return 0.0 if link is None else link.bandwidth_gbyte_s * TCP_FRAMING_EFFICIENCY


def zone_cap_gbyte_s(cluster: Cluster, zones: list[str]) -> float:
    """The slowest zone link a ring crosses, whole (``zones``: its members' zones in ring order; inf when
    it stays in one zone)."""
    cap = float("inf")
    for a, b in set(zip(zones, zones[1:] + zones[:1])):
        if a != b:
            cap = min(cap, zone_gbyte_s(cluster, a, b))
    return cap


def achieved_link(cluster: Cluster, a: str, b: str) -> PathLink | None:
    """:meth:`Cluster.link_between` at the bandwidth transfers reach (one flow, one NIC per side);
    None when the two zones have no link."""
    link = cluster.link_between(a, b)
    if link is None or link.kind == "self":
        return link
    ga, gb = cluster.group_of(a), cluster.group_of(b)
    if link.kind == "intra_node":
        inside = intra_node_link(ga)
        pair = [cluster.device(a).local, cluster.device(b).local]
        return PathLink(intra_node_ring_gbyte_s(ga, pair), inside.latency_us, "intra_node")
    bw = min(nic_gbyte_s(ga.nic), nic_gbyte_s(gb.nic))
    kind = link.kind
    da, db = cluster.device(a), cluster.device(b)
    if da.zone != db.zone:
        zone = cluster.zone_link(da.zone, db.zone)
        wan = zone.bandwidth_gbyte_s * TCP_FRAMING_EFFICIENCY
        kind = "inter_zone" if wan < bw else "nic"
        bw = min(bw, wan)
    return PathLink(bw, link.latency_us, kind)
