"""Communication costs: point-to-point transfers and all-reduces over the cluster's real links.

Links run at the bandwidth NCCL reaches over them (:mod:`hetpart.costmodel.links`: the catalog's
efficiencies inside a node, RDMA or TCP over NICs); a message pays the path latency once per hop of
the algorithm. An all-reduce is NCCL's choice of the faster of

* a flat ring over all members, paced by its slowest hop: ``2 (n-1)/n * bytes / bw + 2 (n-1) * latency``;
* a hierarchical all-reduce when the members sit on several nodes with the same number ``k > 1`` of
  members each: reduce-scatter inside each node, ``k`` parallel rings across nodes on ``bytes / k``
  each (sharing the node's NICs), all-gather inside each node.

``concurrent`` says how many such all-reduces run at once through the same nodes (the ``tp`` ranks of
a data-parallel group each reduce their own shard): they share each node's NICs, and the link between
zones that the ring crosses (a zone link is shared by the rings crossing it as a NIC is: a link of the
same rate as a NIC gives the same time).
"""

from __future__ import annotations

from collections import Counter
from functools import lru_cache
from operator import attrgetter, eq
from typing import Sequence

from hetpart.cluster import Cluster, PathLink
from hetpart.errors import PlanError

from hetpart.catalog.hardware import LINK_CATALOG
from hetpart.costmodel.links import achieved_link, intra_node_link, intra_node_ring_gbyte_s, nic_gbyte_s, \
    node_nic_gbyte_s, zone_cap_gbyte_s
from hetpart.costmodel.nccl import BASE_LAT_US, HW_LAT_US, LL128_GPUS, NVLS_LINKS, Collective, CollectiveLine, \
    RingShape, nccl_lines

__all__ = ["p2p_time_s", "ring_allreduce_time_s", "allreduce_time_s", "allreduce_cost", "allreduce_lines",
           "allreduce_choice", "reduce_scatter_time_s", "nic_flows", "zone_concurrency"]

_ID, _INDEX, _GROUP, _NODE = attrgetter("id"), attrgetter("index"), attrgetter("group"), attrgetter("node")
_NVLINK_LIKE = ("NVLink", "xGMI", "HCCS")
"""Intra-node link families NCCL (RCCL, HCCL) drives like NVLink: direct GPU-to-GPU, low-latency steps."""


def p2p_time_s(num_bytes: float, path_link: PathLink | None) -> float:
    """Time to send ``num_bytes`` from one device to another over ``path_link`` (latency + bytes / bandwidth).

    Raises:
        PlanError: when ``path_link`` is None (the two zones have no link).
    """
    if path_link is None:
        raise PlanError("pipeline: two consecutive stages sit in zones without a link; add one under 'links'")
    if path_link.kind == "self" or num_bytes <= 0:
        return 0.0
    return path_link.latency_us * 1e-6 + num_bytes / (path_link.bandwidth_gbyte_s * 1e9)


def ring_allreduce_time_s(num_bytes: float, members: int, bandwidth_gbyte_s: float, latency_us: float) -> float:
    """Ring all-reduce of ``num_bytes`` among ``members`` over hops of the given bandwidth and latency."""
    if members <= 1 or num_bytes <= 0:
        return 0.0
    steps = 2 * (members - 1)
    return steps * latency_us * 1e-6 + steps / members * num_bytes / (bandwidth_gbyte_s * 1e9)


def _ring_hops(device_ids: Sequence[str], cluster: Cluster, devices: Sequence | None = None,
               links: dict | None = None) -> tuple[float, float]:
    """Slowest bandwidth and largest latency over the hops of a ring in the given order
    (:func:`_ring_hop_kinds`, all kinds together)."""
    bw, lat = float("inf"), 0.0
    for hop_bw, hop_lat in _ring_hop_kinds(device_ids, cluster, devices, links).values():
        bw, lat = min(bw, hop_bw), max(lat, hop_lat)
    return bw, lat


def _ring_hop_kinds(device_ids: Sequence[str], cluster: Cluster, devices: Sequence | None = None,
                    links: dict | None = None) -> dict[str, tuple[float, float]]:
    """Per kind of hop (``intra_node``, ``nic``, ``inter_zone``): the slowest bandwidth and the largest
    latency over the hops of a ring in the given order.

    A hop's link depends only on the two node groups and whether it stays inside a node, so each
    kind of hop is looked up once, at its first pair in ring order (the kinds of a ring of hundreds
    of members are found with C-level ``zip``/``map``, not a Python loop over the members).
    ``devices``: the members' :class:`Device` objects, if at hand; ``links``: a cache of hop links
    (:func:`_hop_link`) to reuse across calls on the same cluster.
    """
    devices = devices if devices is not None else [cluster.device(d) for d in device_ids]
    n = len(devices)
    groups = list(map(_GROUP, devices))
    keys = list(zip(groups, map(_NODE, devices)))
    ids = list(map(_ID, devices))
    kinds = list(zip(map(eq, keys, keys[1:] + keys[:1]), groups, groups[1:] + groups[:1],
                     map(eq, ids, ids[1:] + ids[:1])))
    first = dict(zip(reversed(kinds), range(n - 1, -1, -1)))  # kind -> its first pair (the smallest index wins)
    out: dict[str, tuple[float, float]] = {}
    for i in sorted(first.values()):
        a, b = devices[i], devices[(i + 1) % n]
        link = _hop_link(cluster, a, b, links)
        if link is None:
            raise PlanError(f"all-reduce: members in zones {a.zone!r} and {b.zone!r} have no link; "
                            "add one under 'links'")
        if link.kind != "self":
            bw, lat = out.get(link.kind, (float("inf"), 0.0))
            out[link.kind] = min(bw, link.bandwidth_gbyte_s), max(lat, link.latency_us)
    return out


def _hop_link(cluster: Cluster, a, b, links: dict | None) -> PathLink | None:
    """:func:`achieved_link` between devices ``a`` and ``b``, through ``links`` when given: between nodes
    it depends on the two node groups only, inside a node on the group and the two GPUs' places."""
    if links is None or a.id == b.id:
        return achieved_link(cluster, a.id, b.id)
    key = (a.group, a.local, b.local) if (a.group, a.node) == (b.group, b.node) else (a.group, b.group)
    if key not in links:
        links[key] = achieved_link(cluster, a.id, b.id)
    return links[key]


def _nic_share_gbyte_s(cluster: Cluster, node_key: tuple[int, int], flows: int) -> float:
    """Bandwidth one of ``flows`` concurrent inter-node flows gets from a node's NICs."""
    group = cluster.groups[node_key[0]]
    return min(nic_gbyte_s(group.nic), node_nic_gbyte_s(group) / max(flows, 1))


def _zone_share_gbyte_s(cluster: Cluster, devices: Sequence, flows: float) -> float:
    """Bandwidth one of ``flows`` concurrent rings gets from the slowest zone link that the ring over
    ``devices`` (in ring order) crosses: the link carries them all at once (inf: one zone)."""
    if not cluster.zone_links:
        return float("inf")
    return zone_cap_gbyte_s(cluster, [d.zone for d in devices]) / max(flows, 1)


def _ring_cost(members: int, bandwidth_gbyte_s: float, latency_us: float) -> tuple[float, float]:
    """``(fixed_s, per_byte_s)`` of a ring all-reduce (see :func:`ring_allreduce_time_s`)."""
    steps = 2 * (members - 1)
    return steps * latency_us * 1e-6, steps / members / (bandwidth_gbyte_s * 1e9)


def allreduce_lines(device_ids: Sequence[str], cluster: Cluster, concurrent: float = 1,
                    links: dict | None = None, collective: Collective = "allreduce",
                    zone_concurrent: float | None = None) -> tuple[CollectiveLine, ...]:
    """The all-reduce among ``device_ids`` as NCCL's candidate algorithm x protocol lines
    (:mod:`hetpart.costmodel.nccl`), plus hetpart's hierarchical all-reduce when every node holds the
    same number ``k > 1`` of members; NCCL runs the fastest, so the time of ``b`` bytes is
    ``min(line.time_s(b))`` (empty: no communication). Over measured links (a profile's) the lines are
    the plain ring and the hierarchical all-reduce on the measured latency and bandwidth.
    ``links``: a dict the caller keeps to cache hop links across calls on the same cluster.
    ``collective="reduce_scatter"``: the lines of a reduce-scatter (or all-gather) of the whole buffer
    instead, NCCL's rings only (half a ring all-reduce's steps and bytes). ``zone_concurrent``: how many
    such rings cross the zone links this one crosses at once (:func:`zone_concurrency`; default
    ``concurrent``).

    Raises:
        PlanError: when two members' zones have no link.
    """
    ids = device_ids if isinstance(device_ids, (list, tuple)) else list(device_ids)
    devices = sorted(dict(zip(ids, map(cluster.device, ids))).values(), key=_INDEX)  # each member once
    n = len(devices)
    if n <= 1:
        return ()
    ids = list(map(_ID, devices))
    nodes = Counter(zip(map(_GROUP, devices), map(_NODE, devices)))  # Device.node_key
    hops = _ring_hop_kinds(ids, cluster, devices, links)
    zc = concurrent if zone_concurrent is None else zone_concurrent
    groups = [cluster.groups[g] for g in sorted({key[0] for key in nodes})]
    per_node = set(nodes.values())
    k = min(per_node)
    if len(nodes) == 1:  # NCCL rings the members as the node's wires allow (a cube-mesh is no switch)
        bus = intra_node_ring_gbyte_s(groups[0], [d.local for d in devices])
    else:
        # NCCL's channels spread a ring over the NICs next to the members: k members per node drive
        # up to k NICs (each flow at most one NIC), shared with the other rings crossing the node
        share = min(_nic_share_gbyte_s(cluster, key, k * concurrent) for key in _one_node_per_group(nodes))
        bus = min(hops.get("intra_node", (float("inf"), 0))[0], k * min(hops.get("nic", (float("inf"), 0))[0], share),
                  hops.get("inter_zone", (float("inf"), 0))[0], _zone_share_gbyte_s(cluster, devices, zc))
        if per_node != {1} and len(per_node) == 1:
            local = [d.local for d in devices if d.node_key == devices[0].node_key]  # every node holds k alike
            bus = min(bus, min(intra_node_ring_gbyte_s(g, local) for g in groups))
    hier = (len(nodes) > 1 and len(per_node) == 1 and per_node != {1}) and collective == "allreduce"
    if any(_measured(g) for g in groups):  # measured hops: the plain ring on their latency
        lat = max(h[1] for h in hops.values())
        fixed, per_byte = _ring_cost(n, bus, lat)
        if collective == "reduce_scatter":
            return (CollectiveLine("ring", "Simple", fixed / 2, per_byte / 2),)
        flat = CollectiveLine("ring", "Simple", fixed, per_byte)
        if not hier:
            return (flat,)
        return flat, CollectiveLine("hierarchical", "Simple",
                                    *_hierarchical_cost(ids, nodes, cluster, concurrent, devices, links, None, zc))
    shape = _shape(n, nodes, groups, bus, hops)
    lines = list(nccl_lines(shape, collective))
    if hier:
        lines.append(CollectiveLine("hierarchical", "Simple",
                                    *_hierarchical_cost(ids, nodes, cluster, concurrent, devices, links, shape, zc)))
    return tuple(lines)


def allreduce_cost(device_ids: Sequence[str], cluster: Cluster, concurrent: float = 1,
                   links: dict | None = None, zone_concurrent: float | None = None) -> tuple[tuple[float, float], ...]:
    """:func:`allreduce_lines` as bare ``(fixed_s, per_byte_s)`` pairs (the time of ``b`` bytes is
    ``min(fixed + per_byte * b)``; empty: no communication).

    Raises:
        PlanError: when two members' zones have no link.
    """
    return tuple((line.fixed_s, line.per_byte_s) for line in
                 allreduce_lines(device_ids, cluster, concurrent, links, zone_concurrent=zone_concurrent))


def allreduce_choice(num_bytes: float, device_ids: Sequence[str], cluster: Cluster,
                     concurrent: float = 1) -> CollectiveLine | None:
    """The line NCCL would run for an all-reduce of ``num_bytes`` among ``device_ids`` (None: nothing to do)."""
    if num_bytes <= 0:
        return None
    return min(allreduce_lines(device_ids, cluster, concurrent), key=lambda line: line.time_s(num_bytes), default=None)


def _measured(group) -> bool:
    """Whether a node group's links come from a measured profile (:meth:`BoundProfile.link_cluster`)."""
    return group.intra_node.source.startswith("profile") or group.nic.source.startswith("profile")


@lru_cache(maxsize=1024)
def _intra_class(group) -> tuple[str, float]:
    """NCCL's hardware class of a node group's GPU-to-GPU hops and the latency floor of a step: direct
    links (NVLink and its kin, PCIe peer-to-peer) take NCCL's table; a link through host memory, or
    one hetpart does not know, never steps faster than its own latency."""
    link = intra_node_link(group)
    if link.name.startswith(_NVLINK_LIKE):
        return "nvlink", 0.0
    if link.name.startswith("PCIe") and not link.name.endswith("-host") and LINK_CATALOG.get(link.name) == link:
        return "pci", 0.0
    return "pci", link.latency_us


def _shape(n: int, nodes: Counter, groups: list, bus: float, hops: dict) -> RingShape:
    inter_floor = max((hops[kind][1] for kind in ("nic", "inter_zone") if kind in hops), default=0.0)
    return _shape_of(n, len(nodes), max(nodes.values()), tuple(groups), bus, inter_floor)


@lru_cache(maxsize=4096)
def _shape_of(n: int, nodes: int, per_node: int, groups: tuple, bus: float, inter_floor: float) -> RingShape:
    classes = [_intra_class(g) for g in groups]
    intra_hw = "nvlink" if all(c == "nvlink" for c, _ in classes) else "pci"
    gpus = {g.gpu for g in groups}
    arch = {"volta": "volta", "turing": "volta", "pascal": "volta", "hopper": "hopper"}.get(groups[0].gpu.arch, "ampere")
    ll128 = (len({g.arch for g in gpus}) == 1 and all(g.name in LL128_GPUS for g in gpus)
             and all(c == "nvlink" or g.gpus_per_node == 1 for (c, _), g in zip(classes, groups))
             and (nodes == 1 or all(g.nic.rdma for g in groups)))
    nvls = 0.0
    if nodes == 1 and intra_node_link(groups[0]).name in NVLS_LINKS and groups[0].gpu.arch == "hopper":
        nvls = intra_node_link(groups[0]).achieved_gbyte_s
    return RingShape(ranks=n, nodes=nodes, per_node=per_node, bus_gbyte_s=bus, intra_hw=intra_hw,
                     intra_floor_us=max(f for _, f in classes), inter_floor_us=inter_floor, arch=arch, ll128=ll128,
                     nvls_gbyte_s=nvls)


def _one_node_per_group(nodes: Counter) -> list[tuple[int, int]]:
    return list({key[0]: key for key in nodes}.values())


def reduce_scatter_time_s(num_bytes: float, device_ids: Sequence[str], cluster: Cluster,
                          concurrent: float = 1, zone_concurrent: float | None = None) -> float:
    """Time of a reduce-scatter (or an all-gather) of a buffer of ``num_bytes`` among ``device_ids``:
    NCCL's fastest ring (:func:`allreduce_lines` with ``collective="reduce_scatter"``).

    Raises:
        PlanError: when two members' zones have no link.
    """
    if num_bytes <= 0:
        return 0.0
    return min((line.time_s(num_bytes) for line in
                allreduce_lines(device_ids, cluster, concurrent, collective="reduce_scatter",
                                zone_concurrent=zone_concurrent)), default=0.0)


def allreduce_time_s(num_bytes: float, device_ids: Sequence[str], cluster: Cluster, concurrent: int = 1) -> float:
    """Time of an all-reduce of ``num_bytes`` (per member) among ``device_ids``.

    Args:
        num_bytes: bytes each member contributes (the reduced buffer size).
        device_ids: members, ``"g/n/i"``; order does not matter (members are ringed in cluster order).
        cluster: where they live.
        concurrent: all-reduces of the same shape running at the same time through the same nodes.

    Raises:
        PlanError: when two members' zones have no link.
    """
    if num_bytes <= 0:
        return 0.0
    return min((line.time_s(num_bytes) for line in allreduce_lines(device_ids, cluster, concurrent)), default=0.0)


def _hierarchical_cost(ids: list[str], nodes: Counter, cluster: Cluster, concurrent: float,
                       devices: Sequence, links: dict | None = None,
                       shape: RingShape | None = None, zone_concurrent: float | None = None) -> tuple[float, float]:
    """``(fixed_s, per_byte_s)`` of reduce-scatter inside each node, ``k`` parallel rings across nodes on
    ``bytes / k`` each (sharing the node's NICs), all-gather inside each node. Steps take NCCL's ring
    Simple latencies of ``shape`` (once the call's base latency), or the measured hop latencies."""
    k = next(iter(nodes.values()))
    groups = {key[0] for key in nodes}
    local = [d.local for d in devices if d.node_key == devices[0].node_key]  # every node holds k alike
    intra_bw = min(intra_node_ring_gbyte_s(cluster.groups[g], local) for g in groups)
    intra_lat = max(intra_node_link(cluster.groups[g]).latency_us for g in groups)
    first_on: dict[tuple[int, int], object] = {}
    for d in devices:  # the first member on each node, in ring order
        first_on.setdefault(d.node_key, d)
    leaders = [first_on[key] for key in nodes]
    bw, lat = _ring_hops([d.id for d in leaders], cluster, leaders, links)
    bw = min(bw, min(_nic_share_gbyte_s(cluster, key, k * concurrent) for key in _one_node_per_group(nodes)),
             _zone_share_gbyte_s(cluster, leaders, k * (concurrent if zone_concurrent is None else zone_concurrent)))
    base = 0.0
    if shape is not None:
        intra_lat, lat = max(HW_LAT_US[shape.intra_hw][("ring", "Simple")], shape.intra_floor_us), \
            max(HW_LAT_US["net"][("ring", "Simple")], shape.inter_floor_us)
        base = BASE_LAT_US[("ring", "Simple")] * 1e-6
    # reduce-scatter + all-gather inside the node = one intra-node ring all-reduce's traffic
    inside = _ring_cost(k, intra_bw, intra_lat)
    across = _ring_cost(len(nodes), bw, lat)  # on bytes / k
    return base + inside[0] + across[0], inside[1] + across[1] / k


def nic_flows(rings) -> dict[int, float]:
    """Per node: the all-reduce rings crossing its NICs at once, for sharing them
    (:func:`allreduce_lines`' ``concurrent`` is this over the ring's own members on the node).

    ``rings``: per all-reduce, the ``(node, device group, tp)`` of each member. The ``tp`` shards of a
    device group's ring leave its node at once. A device group runs its crossing rings one after another,
    so a ring whose busiest member is in ``k`` of them is active ``1/k`` of the time (its duty cycle),
    and a device group counts its ``tp`` times the share of the time one of its crossing rings is active
    (at most all of it). Replicas cut alike (one ring per stage) count every crossing group whole; beside
    a replica cut unlike them (a one-stage replica's device is in every stage's ring, so those rings take
    turns) each stage's devices count only while their ring runs.
    """
    crossing = [list(dict.fromkeys(members)) for members in rings]
    crossing = [m for m in crossing if len({node for node, _, _ in m}) > 1]
    busy: dict = {}
    for members in crossing:
        for group in {group for _, group, _ in members}:
            busy[group] = busy.get(group, 0) + 1
    share: dict = {}
    for members in crossing:
        duty = 1.0 / max(busy[group] for _, group, _ in members)
        for node, group, tp in {group: (node, group, tp) for node, group, tp in members}.values():
            _, width, active = share.get(group, (node, 0, 0.0))
            share[group] = (node, max(tp, width), active + duty)
    flows: dict[int, float] = {}
    for node, tp, active in share.values():
        flows[node] = flows.get(node, 0.0) + tp * min(1.0, active)
    return flows


def zone_concurrency(zones: Sequence, tp: int, flows: dict) -> float | None:
    """How many rings share the zone links crossed by the ring whose members sit in ``zones`` (one per
    member), as :func:`nic_flows` over the rings' members by zone counts them per zone (``flows``): the
    ring's ``tp`` shards, or the largest count in one of its zones over its own members there. None when
    the ring stays in one zone (nothing to share)."""
    here = Counter(zones)
    if len(here) < 2:
        return None
    return max([tp] + [flows.get(z, 0) / c for z, c in here.items()])
