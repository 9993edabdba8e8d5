"""Communication costs: point-to-point transfers and all-reduces over the cluster's real links.

Links run at the bandwidth NCCL reaches over them (:mod:`hetpart.costmodel.links`: the catalog's
efficiencies inside a node, RDMA or TCP over NICs); a message pays the path latency once per hop of
the algorithm. An all-reduce is NCCL's choice of the faster of

* a flat ring over all members, paced by its slowest hop: ``2 (n-1)/n * bytes / bw + 2 (n-1) * latency``;
* a hierarchical all-reduce when the members sit on several nodes with the same number ``k > 1`` of
  members each: reduce-scatter inside each node, ``k`` parallel rings across nodes on ``bytes / k``
  each (sharing the node's NICs), all-gather inside each node.

``concurrent`` says how many such all-reduces run at once through the same nodes (the ``tp`` ranks of
a data-parallel group each reduce their own shard): they share each node's NICs.
"""

from __future__ import annotations

from collections import Counter
from operator import attrgetter, eq
from typing import Sequence

from hetpart.cluster import Cluster, PathLink
from hetpart.errors import PlanError

from hetpart.costmodel.links import achieved_link, intra_node_link, intra_node_ring_gbyte_s, nic_gbyte_s, \
    node_nic_gbyte_s

__all__ = ["p2p_time_s", "ring_allreduce_time_s", "allreduce_time_s", "allreduce_cost"]

_ID, _INDEX, _GROUP, _NODE = attrgetter("id"), attrgetter("index"), attrgetter("group"), attrgetter("node")


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
    """Slowest bandwidth and largest latency over the hops of a ring in the given order.

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
    bw, lat = float("inf"), 0.0
    for i in sorted(first.values()):
        a, b = devices[i], devices[(i + 1) % n]
        link = _hop_link(cluster, a, b, links)
        if link is None:
            raise PlanError(f"all-reduce: members in zones {a.zone!r} and {b.zone!r} have no link; "
                            "add one under 'links'")
        if link.kind != "self":
            bw, lat = min(bw, link.bandwidth_gbyte_s), max(lat, link.latency_us)
    return bw, lat


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


def _ring_cost(members: int, bandwidth_gbyte_s: float, latency_us: float) -> tuple[float, float]:
    """``(fixed_s, per_byte_s)`` of a ring all-reduce (see :func:`ring_allreduce_time_s`)."""
    steps = 2 * (members - 1)
    return steps * latency_us * 1e-6, steps / members / (bandwidth_gbyte_s * 1e9)


def allreduce_cost(device_ids: Sequence[str], cluster: Cluster, concurrent: int = 1,
                   links: dict | None = None) -> tuple[tuple[float, float], ...]:
    """The all-reduce among ``device_ids`` as candidate ``(fixed_s, per_byte_s)`` lines; NCCL takes the
    fastest, so the time of ``b`` bytes is ``min(fixed + per_byte * b)`` (empty: no communication).
    ``links``: a dict the caller keeps to cache hop links across calls on the same cluster.

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
    bw, lat = _ring_hops(ids, cluster, devices, links)
    if len(nodes) == 1:  # NCCL rings the members as the node's wires allow (a cube-mesh is no switch)
        bw = intra_node_ring_gbyte_s(cluster.groups[devices[0].group], [d.local for d in devices])
    if len(nodes) > 1:  # the NIC share depends on the node's group only
        bw = min(bw, min(_nic_share_gbyte_s(cluster, key, concurrent) for key in _one_node_per_group(nodes)))
    flat = _ring_cost(n, bw, lat)
    per_node = set(nodes.values())
    if len(nodes) == 1 or len(per_node) != 1 or per_node == {1}:
        return (flat,)
    return flat, _hierarchical_cost(ids, nodes, cluster, concurrent, devices, links)


def _one_node_per_group(nodes: Counter) -> list[tuple[int, int]]:
    return list({key[0]: key for key in nodes}.values())


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
    return min((fixed + per_byte * num_bytes for fixed, per_byte in allreduce_cost(device_ids, cluster, concurrent)),
               default=0.0)


def _hierarchical_cost(ids: list[str], nodes: Counter, cluster: Cluster, concurrent: int,
                       devices: Sequence, links: dict | None = None) -> tuple[float, float]:
    k = next(iter(nodes.values()))
    groups = {key[0] for key in nodes}
    local = [d.local for d in devices if d.node_key == devices[0].node_key]  # every node holds k alike
    intra_bw = min(intra_node_ring_gbyte_s(cluster.groups[g], local) for g in groups)
    intra_lat = max(intra_node_link(cluster.groups[g]).latency_us for g in groups)
    # reduce-scatter + all-gather inside the node = one intra-node ring all-reduce's traffic
    inside = _ring_cost(k, intra_bw, intra_lat)
    first_on: dict[tuple[int, int], object] = {}
    for d in devices:  # the first member on each node, in ring order
        first_on.setdefault(d.node_key, d)
    leaders = [first_on[key] for key in nodes]
    bw, lat = _ring_hops([d.id for d in leaders], cluster, leaders, links)
    bw = min(bw, min(_nic_share_gbyte_s(cluster, key, k * concurrent) for key in _one_node_per_group(nodes)))
    across = _ring_cost(len(nodes), bw, lat)  # on bytes / k
    return inside[0] + across[0], inside[1] + across[1] / k
