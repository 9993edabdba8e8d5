"""Device grouping for the planners: pools of identical nodes, tensor-parallel groups, sub-clusters.

A *pool* is every node of one node type: the same device type, node size, intra-node link, NIC
and zone. Planners reason about pools (how many stages of which tensor-parallel degree a pool
contributes) and only at the end hand out concrete device ids.

A node holding several device types (``gpus: [{gpu: A, count: 2}, {gpu: B, count: 2}]``) gives each
type's run of GPUs to that type's pool as a node of its own (its "nodes" are then slices of one real
node; links between them are still intra-node, as ``cluster.link_between`` says). Speed factors
(``slow:``) do not split pools: the simulator prices each device at its own speed, and the search
gives unlike tensor-parallel groups an uneven split (:mod:`hetpart.costmodel.tp_split`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

from hetpart.cluster import Cluster, NodeGroup
from hetpart.errors import WorkloadError
from hetpart.graph.model_graph import ModelGraph
from hetpart.hardware import GPUSpec

__all__ = ["Pool", "device_pools", "tp_options", "tp_groups", "check_zones_connected", "type_subcluster", "type_view",
           "divisors", "zone_components", "zone_path_ok", "zones_linked", "speed_typed", "fewer_nodes"]


@dataclass(frozen=True, eq=False)
class Pool:
    """All nodes of one node type (merged over node groups that describe the same hardware).

    Compared and hashed by identity: planners key caches by pool, and a pool of 512 GPUs would
    otherwise hash all its device ids on every lookup."""

    key: str
    """``"<gpu>@<zone>"`` (with the node group index when two groups share it)."""
    gpu: GPUSpec
    """Device type."""
    zone: str
    """Zone of the nodes."""
    gpus_per_node: int
    """Devices per node."""
    nodes: tuple[tuple[str, ...], ...]
    """Device ids, node by node, in cluster order."""

    @property
    def num_devices(self) -> int:
        return len(self.nodes) * self.gpus_per_node

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(d for node in self.nodes for d in node)


def _hardware_key(group: NodeGroup, gpu: GPUSpec, per_node: int) -> tuple:
    return (gpu, per_node, group.intra_node, group.nic, group.nics_per_node, group.zone, bool(group.mixed))


def device_pools(cluster: Cluster) -> list[Pool]:
    """The pools of ``cluster`` in order of first appearance."""
    merged: dict[tuple, list[tuple[str, ...]]] = {}
    first_group: dict[tuple, int] = {}
    for gi, group in enumerate(cluster.groups):
        lo = 0
        for gpu, count in group.gpu_counts:
            key = _hardware_key(group, gpu, count)
            first_group.setdefault(key, gi)
            nodes = merged.setdefault(key, [])
            for n in range(group.count):
                nodes.append(tuple(f"{gi}/{n}/{i}" for i in range(lo, lo + count)))
            lo += count
    names = [f"{k[0].name}@{k[5]}" for k in merged]
    pools = []
    for key, nodes in merged.items():
        name = f"{key[0].name}@{key[5]}"
        if names.count(name) > 1:
            name += f"#{first_group[key]}"
        pools.append(Pool(name, key[0], key[5], key[1], tuple(nodes)))
    return pools


def divisors(n: int) -> list[int]:
    """Divisors of ``n`` in increasing order."""
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def tp_options(pool: Pool, model: ModelGraph) -> list[int]:
    """Tensor-parallel degrees a stage on this pool may use: the runtime's rules
    (:func:`hetpart.rules.allowed_tp_degrees`: inside one node, dividing heads, key/value heads and MLP)."""
    from hetpart.rules import allowed_tp_degrees

    shardable = any(u.tp_shardable and u.kind == "block" for u in model.units) and not model.traced
    if not shardable:
        return [1]
    return list(allowed_tp_degrees(model, pool.gpus_per_node))


def tp_groups(pool: Pool, tp: int) -> list[tuple[str, ...]]:
    """The pool's devices cut into groups of ``tp`` consecutive GPUs of one node, in cluster order."""
    if pool.gpus_per_node % tp:
        raise ValueError(f"tp {tp} does not divide the {pool.gpus_per_node} GPUs per node of {pool.key}")
    return list(_tp_groups(pool, tp))


@lru_cache(maxsize=1024)
def _tp_groups(pool: Pool, tp: int) -> tuple[tuple[str, ...], ...]:
    """:func:`tp_groups`, cut once per pool and degree (the planners ask for the same pool's groups again
    and again)."""
    return tuple(node[i:i + tp] for node in pool.nodes for i in range(0, pool.gpus_per_node, tp))


def check_zones_connected(cluster: Cluster) -> None:
    """Raise :class:`WorkloadError` when some zones of ``cluster`` cannot reach each other, not even through
    other zones. Zones linked only in a chain (a-b, b-c) pass: a pipeline a -> b -> c needs no a-c link, and
    the planners keep every stage boundary and gradient sync on linked zones (:meth:`Plan.validate`)."""
    components = zone_components(cluster)
    if len(components) > 1:
        a, b = min(components[0]), min(components[1])
        raise WorkloadError(
            f"{cluster.source}: links: zones {a!r} and {b!r} have no link, so no plan over the whole cluster "
            f"can pass activations or sync gradients between them; add "
            f"'- {{zones: [{a}, {b}], bandwidth_gbit_s: ..., latency_us: ...}}' under 'links', "
            "or plan each zone as its own cluster" + "".join(f"; {why}" for why in cluster.unused_links))


def zone_path_ok(cluster: Cluster, zones: Sequence[str], tied: bool = False) -> bool:
    """Whether a pipeline whose stages lie in ``zones`` (in stage order) crosses each zone once and only
    between linked zones: zones contiguous, every change of zone over a link; with ``tied`` weights (the
    first stage's embedding and the last stage's head), the first and last zones linked too."""
    changes = [(a, b) for a, b in zip(zones, zones[1:]) if a != b]
    return (len(changes) == len(set(zones)) - 1 and all(cluster.zones_connected(a, b) for a, b in changes)
            and (not tied or not zones or cluster.zones_connected(zones[0], zones[-1])))


def zones_linked(cluster: Cluster, zones: Iterable[str]) -> bool:
    """Whether every two of ``zones`` have a link (data-parallel copies in them sync gradients)."""
    names = sorted(set(zones))
    return all(cluster.zones_connected(a, b) for i, a in enumerate(names) for b in names[i + 1:])


def zone_components(cluster: Cluster) -> list[set[str]]:
    """Zones grouped by reachability over the cluster's direct links."""
    components: list[set[str]] = []
    for zone in cluster.zones:
        linked = [c for c in components if any(cluster.zones_connected(zone, z) for z in c)]
        merged = {zone}.union(*linked)
        components = [c for c in components if c not in linked] + [merged]
    return components


def type_subcluster(cluster: Cluster, gpu_name: str, zones: set[str] | None = None) -> Cluster:
    """The cluster made of only the devices of type ``gpu_name`` (in ``zones`` when given), with the
    links between their zones: whole node groups, and from mixed nodes that type's GPUs as nodes of
    their own kind. Speed factors follow their devices (renumbered)."""
    return type_view(cluster, gpu_name, zones)[0]


def type_view(cluster: Cluster, gpu_name: str, zones: set[str] | None = None) -> tuple[Cluster, dict[str, str]]:
    """:func:`type_subcluster` and the map from its device ids to the same devices' ids in ``cluster``
    (a plan made on the view runs on ``cluster`` through it, the other types idle)."""
    groups, slow, to_real = [], [], {}
    speed = dict(cluster.slow)
    for gi, g in enumerate(cluster.groups):
        if zones is not None and g.zone not in zones:
            continue
        lo = 0
        for gpu, count in g.gpu_counts:
            if gpu.name == gpu_name:
                new = len(groups)
                groups.append(replace(g, gpu=gpu, gpus_per_node=count, mixed=()))
                slow += [(f"{new}/{n}/{i}", speed[f"{gi}/{n}/{lo + i}"]) for n in range(g.count)
                         for i in range(count) if f"{gi}/{n}/{lo + i}" in speed]
                to_real.update({f"{new}/{n}/{i}": f"{gi}/{n}/{lo + i}" for n in range(g.count) for i in range(count)})
            lo += count
    if not groups:
        raise ValueError(f"no {gpu_name} in {cluster.name}")
    zones = {g.zone for g in groups}
    links = tuple(link for link in cluster.zone_links if set(link.zones) <= zones)
    return replace(cluster, name=f"{cluster.name}[{gpu_name}]", groups=tuple(groups), zone_links=links,
                   slow=tuple(slow)), to_real


def _scaled_type(gpu: GPUSpec, factor: float) -> GPUSpec:
    """``gpu`` running at ``factor`` of its figures, as a device type of its own."""
    return replace(gpu, name=f"{gpu.name}@{factor:g}x", tflops_bf16=gpu.tflops_bf16 * factor,
                   tflops_fp32=gpu.tflops_fp32 * factor, tflops_tf32=gpu.tflops_tf32 * factor,
                   tflops_fp8=gpu.tflops_fp8 * factor, hbm_gbyte_s=gpu.hbm_gbyte_s * factor)


def _add_plain(groups: list[NodeGroup], to_real: dict[str, str], group: NodeGroup, gi: int, nodes: list[int]) -> None:
    """Nodes ``nodes`` of ``group`` (number ``gi``), consecutive and without slow devices, as one new group."""
    if nodes:
        g = len(groups)
        groups.append(replace(group, count=len(nodes)))
        for k, n in enumerate(nodes):
            to_real.update({f"{g}/{k}/{i}": f"{gi}/{n}/{i}" for i in range(group.gpus_per_node)})


def speed_typed(cluster: Cluster) -> tuple[Cluster, dict[str, str]] | None:
    """``cluster`` with every device that carries a speed factor (``slow:``) turned into a device type of
    its own (its peaks and memory bandwidth scaled by the factor), and the map from the new device ids to
    the real ones; None when every device runs at its type's speed.

    Pools are per device type, so a planner that reasons about pools sees a throttled GPU only through
    this view: it can then give the slow device its own replica with a smaller batch share, a pipeline
    stage with fewer layers, or leave it out. A node holding slow devices becomes a group of its own whose
    local order puts its normal GPUs first (a mixed node, :class:`~hetpart.cluster.NodeGroup`); the
    other nodes of its group keep their order in groups of their own. Plans made on the view run on the
    real devices through the map (links are those of the same nodes)."""
    speed = {d: f for d, f in cluster.slow if f != 1.0}
    if not speed:
        return None
    groups: list[NodeGroup] = []
    to_real: dict[str, str] = {}
    for gi, group in enumerate(cluster.groups):
        plain: list[int] = []  # consecutive nodes without a slow device, not yet added
        for n in range(group.count):
            factors = {i: speed[f"{gi}/{n}/{i}"] for i in range(group.gpus_per_node) if f"{gi}/{n}/{i}" in speed}
            if not factors:
                plain.append(n)
                continue
            _add_plain(groups, to_real, group, gi, plain)
            plain = []
            order = [i for i in range(group.gpus_per_node) if i not in factors] + sorted(
                factors, key=lambda i: (factors[i], i))
            runs: list[tuple[GPUSpec, int]] = []
            for i in order:
                gpu = group.gpu_at(i) if i not in factors else _scaled_type(group.gpu_at(i), factors[i])
                if runs and runs[-1][0] == gpu:
                    runs[-1] = (gpu, runs[-1][1] + 1)
                else:
                    runs.append((gpu, 1))
            g = len(groups)
            groups.append(replace(group, count=1, gpu=runs[0][0], mixed=tuple(runs) if len(runs) > 1 else ()))
            to_real.update({f"{g}/0/{k}": f"{gi}/{n}/{i}" for k, i in enumerate(order)})
        _add_plain(groups, to_real, group, gi, plain)
    return replace(cluster, groups=tuple(groups), slow=(), name=f"{cluster.name} (speed-typed)"), to_real


def _halved(group, halvings: int, extra: int):
    """``group`` on its first ``ceil(count / 2**halvings)`` nodes, and ``extra`` halvings of its one node's GPUs."""
    nodes = max(1, math.ceil(group.count / 2 ** halvings))
    if extra <= 0 or group.mixed:
        return replace(group, count=nodes)
    return replace(group, count=1, gpus_per_node=max(1, math.ceil(group.gpus_per_node / 2 ** extra)))


def fewer_nodes(cluster: Cluster, halvings: int) -> Cluster | None:
    """``cluster`` on the first ``ceil(count / 2**halvings)`` nodes of each node group (at least one), the
    rest left out, and once every group is down to one node, the first half of each node's GPUs for each further
    halving (at least one; a node mixing GPU types keeps them all); None when that leaves out nothing. Device ids
    are those of the same devices in ``cluster`` (the first nodes and GPUs keep their numbers), so a plan made on
    it runs on ``cluster`` as it is, the rest idle; speed factors of the devices kept stay. (One node of two RTX
    4090 over PCIe: gpt2-small, 4 sequences of 128 tokens, runs 28% faster on one of them than at TP 2 on both.)"""
    to_one = max(math.ceil(math.log2(g.count)) if g.count > 1 else 0 for g in cluster.groups)
    groups = tuple(_halved(g, halvings, halvings - to_one) for g in cluster.groups)
    if all(a.count == b.count and a.gpus_per_node == b.gpus_per_node for a, b in zip(groups, cluster.groups)):
        return None
    kept = {f"{gi}/{n}/{i}" for gi, g in enumerate(groups) for n in range(g.count) for i in range(g.gpus_per_node)}
    slow = tuple((d, f) for d, f in cluster.slow if d in kept)
    nodes, all_nodes = sum(g.count for g in groups), sum(g.count for g in cluster.groups)
    devices = sum(g.count * g.gpus_per_node for g in groups)
    part = (f"{nodes} of {all_nodes} nodes" if all(a.gpus_per_node == b.gpus_per_node for a, b in zip(groups, cluster.groups))
            else f"{devices} of {cluster.num_devices} GPUs")
    return replace(cluster, groups=groups, slow=slow, name=f"{cluster.name} ({part})")
