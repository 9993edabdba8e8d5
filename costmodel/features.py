"""Size-independent numeric features of a model graph, a cluster and a plan (numpy only).

One featurizer for everything learned: the learned cost model (:mod:`hetpart.costmodel.learned`), the
planning environment and its policy read the same arrays, so a unit, a device pool or a link means
the same thing to all of them.

* **Units** (:func:`unit_features`): one row per partitionable unit: its kind, its cost as a share of
  the model's (FLOPs, parameters, activation bytes) and as an absolute log magnitude (what sets a
  device's efficiency), its width and its position in the chain.
* **Pools** (:func:`pool_features`): one row per *pool* of identical nodes
  (:func:`hetpart.costmodel.pools.device_pools`), never one per device: a cluster of 16,384 GPUs in
  three node types has three rows. A pool carries its device type (peak at the workload's precision,
  memory, HBM bandwidth, vendor, how its efficiency curve was calibrated), its node shape and links,
  and its size as a share of the cluster.
* **Links** (:func:`link_features`): one row per ordered pair of pools (a pool with itself means two
  of its nodes): the point-to-point bandwidth and latency between their nodes, and whether it
  crosses zones or is missing.
* **Stages** (:func:`stage_features`): one row per pipeline stage of a plan: which units, on how
  many devices of which pools, its tensor-parallel degree and where its replica's batch share sits.

Features are normalised per instance: shares of the model or cluster total, log magnitudes centred
on typical values, ratios to the fastest device of the cluster. Nothing depends on how many units or
devices there are, and nothing names a device, so relabelling devices inside a node or nodes inside
a group changes no feature.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hetpart.cluster import Cluster
from hetpart.graph.model_graph import ModelGraph
from hetpart.plan import Plan

from hetpart.costmodel.efficiency import curve_for
from hetpart.costmodel.pools import Pool, device_pools

__all__ = ["UNIT_FEATURES", "POOL_FEATURES", "LINK_FEATURES", "STAGE_FEATURES", "UNIT_KINDS", "VENDORS",
           "ClusterPools", "unit_features", "cluster_pools", "pool_features", "link_features", "stage_features",
           "log_scale"]

UNIT_KINDS = ("embedding", "block", "head", "module")
VENDORS = ("nvidia", "amd", "huawei", "intel", "other")
_CALIBRATION = ("fitted", "anchored", "assumed")

UNIT_FEATURES = (
    *(f"kind_{k}" for k in UNIT_KINDS),
    "fwd_flops_share", "bwd_flops_share", "params_share", "act_none_share",
    "log_fwd_flops", "log_params", "log_act_none", "log_act_selective", "log_act_full", "log_out_act",
    "log_tp_comm", "log_width", "bwd_over_fwd", "recompute_selective_over_fwd", "recompute_full_over_fwd",
    "tp_shardable", "shares_params", "position",
)
POOL_FEATURES = (
    "log_tflops", "tflops_over_max", "log_memory_gb", "log_hbm_gbyte_s", *(f"vendor_{v}" for v in VENDORS),
    *(f"calibration_{c}" for c in _CALIBRATION), "devices_share", "log_devices", "log_gpus_per_node",
    "log_intra_gbyte_s", "log_intra_latency_us", "log_nic_gbyte_s", "log_nic_latency_us", "log_node_gbyte_s",
)
LINK_FEATURES = ("log_gbyte_s", "log_latency_us", "same_pool", "cross_zone", "missing")
STAGE_FEATURES = (
    "first_share", "last_share", "units_share", "fwd_flops_share", "params_share", "log_tp", "log_devices",
    "nodes_spanned", "stage_position", "log_pp", "batch_share", "log_micro_batch", "mixed_pools",
)


def log_scale(x, centre: float, spread: float = 3.0):
    """``(log10(x) - centre) / spread``: a magnitude mapped to about [-1, 1]; zero (and anything
    below ``10 ** (centre - 2 * spread)``) maps to -2."""
    floor = 10.0 ** (centre - 2.0 * spread)
    return (np.log10(np.maximum(np.asarray(x, dtype=float), floor)) - centre) / spread


def _share(x: np.ndarray) -> np.ndarray:
    total = float(x.sum())
    return x / total if total > 0 else np.zeros_like(x)


def unit_features(model: ModelGraph) -> np.ndarray:
    """One row of :data:`UNIT_FEATURES` per unit of ``model``.

    Shapes:
        ``[num_units, len(UNIT_FEATURES)]``, float32.
    """
    units = model.units
    n = len(units)
    kind = np.array([[u.kind == k for k in UNIT_KINDS] for u in units], dtype=float).reshape(n, len(UNIT_KINDS))
    fwd = np.array([u.fwd_flops for u in units], dtype=float)
    bwd = np.array([u.bwd_flops for u in units], dtype=float)
    params = np.array([u.params for u in units], dtype=float)
    act = {m: np.array([u.act_bytes[m] for u in units], dtype=float) for m in ("none", "selective", "full")}
    rec = {m: np.array([u.recompute_flops[m] for u in units], dtype=float) for m in ("selective", "full")}
    safe = np.maximum(fwd, 1.0)
    cols = [
        kind, _share(fwd), _share(bwd), _share(params), _share(act["none"]),
        log_scale(fwd, 10.0), log_scale(params, 7.0), log_scale(act["none"], 7.0), log_scale(act["selective"], 7.0),
        log_scale(act["full"], 6.0), log_scale([u.out_act_bytes for u in units], 6.0),
        log_scale([u.tp_comm_bytes_fwd for u in units], 6.0), log_scale([max(u.width, 1) for u in units], 3.0, 1.0),
        bwd / safe, rec["selective"] / safe, rec["full"] / safe,
        [u.tp_shardable for u in units], [u.shared_params > 0 for u in units],
        (np.arange(n) + 0.5) / max(n, 1),
    ]
    return np.column_stack([np.asarray(c, dtype=float).reshape(n, -1) for c in cols]).astype(np.float32)


@dataclass(frozen=True)
class ClusterPools:
    """A cluster's pools and where each device sits in them."""

    pools: tuple[Pool, ...]
    pool_of: dict[str, int]
    """Device id -> pool index."""
    node_of: dict[str, tuple[int, int]]
    """Device id -> (pool index, node index inside the pool)."""


def cluster_pools(cluster: Cluster) -> ClusterPools:
    """The pools of ``cluster`` (:func:`~hetpart.costmodel.pools.device_pools`) and a device index."""
    pools = tuple(device_pools(cluster))
    pool_of, node_of = {}, {}
    for p, pool in enumerate(pools):
        for n, node in enumerate(pool.nodes):
            for d in node:
                pool_of[d] = p
                node_of[d] = (p, n)
    return ClusterPools(pools, pool_of, node_of)


def _calibration(gpu) -> list[float]:
    status = curve_for(gpu).status.split(":")[0]
    status = "anchored" if status == "published" else status  # one published figure sets e_max, as anchoring does
    if curve_for(gpu).name == "ampere" and not gpu.name.startswith("A100"):
        status = "assumed"  # the Ampere curve scaled to another device is an assumption
    return [status == c for c in _CALIBRATION]


def pool_features(cluster: Cluster, precision: str = "bf16", pools: ClusterPools | None = None) -> np.ndarray:
    """One row of :data:`POOL_FEATURES` per pool of identical nodes.

    Shapes:
        ``[num_pools, len(POOL_FEATURES)]``, float32.
    """
    pools = pools or cluster_pools(cluster)
    top = max(p.gpu.tflops(precision) for p in pools.pools)
    total = sum(p.num_devices for p in pools.pools)
    rows = []
    for pool in pools.pools:
        group = cluster.groups[cluster.device(pool.nodes[0][0]).group]
        gpu, peak = pool.gpu, pool.gpu.tflops(precision)
        rows.append([
            float(log_scale(peak, 2.0, 1.0)), peak / top, float(log_scale(gpu.memory_gb, 1.5, 1.0)),
            float(log_scale(gpu.hbm_gbyte_s, 3.0, 1.0)), *[gpu.vendor == v for v in VENDORS], *_calibration(gpu),
            pool.num_devices / total, float(log_scale(pool.num_devices, 1.5, 2.0)),
            math.log2(pool.gpus_per_node) / 3.0,
            float(log_scale(group.intra_node.bandwidth_gbyte_s, 2.0, 1.0)),
            float(log_scale(group.intra_node.latency_us, 0.5, 1.0)),
            float(log_scale(group.nic.bandwidth_gbyte_s, 1.0, 1.0)), float(log_scale(group.nic.latency_us, 0.5, 1.0)),
            float(log_scale(group.node_bandwidth_gbyte_s, 1.5, 1.0)),
        ])
    return np.asarray(rows, dtype=np.float32)


def link_features(cluster: Cluster, pools: ClusterPools | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(index [2, P*P], features [P*P, len(LINK_FEATURES)])``: the link between a node of pool ``i`` and
    another node of pool ``j``, for every ordered pair (``i == j``: two nodes of one pool)."""
    pools = pools or cluster_pools(cluster)
    index, rows = [], []
    for i, a in enumerate(pools.pools):
        for j, b in enumerate(pools.pools):
            src = a.nodes[0][0]
            dst = b.nodes[1 if i == j and len(b.nodes) > 1 else 0][0]
            link = cluster.link_between(src, dst) if src != dst else None
            index.append((i, j))
            if link is None:
                rows.append([0.0, 0.0, i == j, a.zone != b.zone, src != dst])
            else:
                rows.append([float(log_scale(link.bandwidth_gbyte_s, 1.5, 1.0)),
                             float(log_scale(link.latency_us, 0.5, 1.0)), i == j, a.zone != b.zone, 0.0])
    return np.asarray(index, dtype=np.int64).T.reshape(2, -1), np.asarray(rows, dtype=np.float32)


def stage_features(model: ModelGraph, plan: Plan, pools: ClusterPools) -> tuple[np.ndarray, np.ndarray]:
    """``(features [S, len(STAGE_FEATURES)], pool_counts [S, P])`` for every stage of every replica in
    plan order; ``pool_counts[s, p]`` is the share of stage ``s``'s devices that sit in pool ``p``."""
    n = model.num_units
    fwd = np.concatenate([[0.0], np.cumsum([u.fwd_flops for u in model.units])])
    par = np.concatenate([[0.0], np.cumsum([u.params for u in model.units])])
    rows, counts = [], []
    samples = plan.replica_samples()
    for r, rep in enumerate(plan.replicas):
        for k, s in enumerate(rep.stages):
            a, z = s.layers
            share = np.zeros(len(pools.pools))
            for d in s.devices:
                share[pools.pool_of[d]] += 1.0 / len(s.devices)
            nodes = len({pools.node_of[d] for d in s.devices})
            rows.append([a / n, z / n, (z - a) / n, (fwd[z] - fwd[a]) / fwd[-1], (par[z] - par[a]) / max(par[-1], 1),
                         math.log2(s.tp) / 3.0, math.log2(len(s.devices)) / 3.0, nodes / len(s.devices),
                         (k + 0.5) / rep.pp, math.log2(rep.pp) / 5.0, samples[r] / plan.global_batch,
                         math.log2(plan.micro_batch) / 3.0, float((share > 0).sum() > 1)])
            counts.append(share)
    return np.asarray(rows, dtype=np.float32), np.asarray(counts, dtype=np.float32)
