"""A (model, cluster, plan, workload) as a PyTorch Geometric heterogeneous graph.

Node types (features from :mod:`hetpart.costmodel.features`; no node names a device):

* ``unit``: one per partitionable unit (:data:`~hetpart.costmodel.features.UNIT_FEATURES`);
* ``pool``: one per pool of identical nodes (:data:`~hetpart.costmodel.features.POOL_FEATURES`),
  so a 16,384-GPU cluster of three node types has three pool nodes;
* ``stage``: one per pipeline stage of every replica (:data:`~hetpart.costmodel.features.STAGE_FEATURES`),
  plus the workload's micro-batch, recompute mode and schedule.

Edge types:

* ``(unit, runs_on, stage)``: the stage holds the unit;
* ``(pool, hosts, stage)``: the stage's devices sit in the pool (attribute: their share);
* ``(stage, sends_to, stage)``: consecutive stages of a replica (attributes: the link's bandwidth and
  latency, the activation bytes per micro-batch);
* ``(stage, syncs_with, stage)``: stages of different replicas holding a common unit (their gradients
  are all-reduced together);
* ``(pool, link, pool)``: the link between nodes of two pools (:data:`~hetpart.costmodel.features.LINK_FEATURES`).

torch-geometric is imported inside :func:`to_pyg` only.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from hetpart.cluster import Cluster
from hetpart.graph.model_graph import ModelGraph
from hetpart.plan import Plan

from hetpart.costmodel.features import cluster_pools, link_features, log_scale, pool_features, stage_features, \
    unit_features

__all__ = ["to_pyg", "graph_arrays"]


def graph_arrays(model: ModelGraph, cluster: Cluster, plan: Plan) -> dict[str, Any]:
    """The graph as numpy arrays: ``{node type: x}`` and ``{(src, rel, dst): (index [2, E], attr [E, F])}``."""
    pools = cluster_pools(cluster)
    stage_x, pool_share = stage_features(model, plan, pools)
    workload = np.array([math.log2(plan.micro_batch) / 3, *[plan.recompute == m for m in ("none", "selective", "full")],
                         *[plan.schedule == s for s in ("1f1b", "gpipe", "interleaved")]], np.float32)
    stage_x = np.concatenate([stage_x, np.repeat(workload[None], len(stage_x), 0)], 1)
    runs_on, sends, syncs, ranges = [], [], ([], []), []
    sid = 0
    for rep in plan.replicas:
        for k, s in enumerate(rep.stages):
            runs_on += [(u, sid) for u in range(*s.layers)]
            ranges.append((s.layers, sid))
            if k + 1 < len(rep.stages):
                link = cluster.link_between(s.devices[0], rep.stages[k + 1].devices[0])
                bw, lat = (link.bandwidth_gbyte_s, link.latency_us) if link else (0.0, 0.0)
                nbytes = model.units[s.layers[1] - 1].out_act_bytes * plan.micro_batch / max(s.tp, 1)
                sends.append(((sid, sid + 1), [float(log_scale(min(bw, 1e4), 1.5, 1.0)),
                                               float(log_scale(lat, 0.5, 1.0)), float(log_scale(nbytes, 6.0, 2.0))]))
            sid += 1
    for (a, i), (b, j) in ((x, y) for x in ranges for y in ranges if x[1] != y[1]):
        if a[0] < b[1] and b[0] < a[1]:
            syncs[0].append((i, j))
    hosts = np.nonzero(pool_share.T)
    link_index, link_x = link_features(cluster, pools)

    def index(pairs):
        return np.asarray(pairs, np.int64).reshape(-1, 2).T

    return {
        "x": {"unit": unit_features(model), "pool": pool_features(cluster, plan.precision, pools), "stage": stage_x},
        "edges": {
            ("unit", "runs_on", "stage"): (index(runs_on), None),
            ("pool", "hosts", "stage"): (np.stack(hosts).astype(np.int64),
                                         pool_share.T[hosts][:, None].astype(np.float32)),
            ("stage", "sends_to", "stage"): (index([e for e, _ in sends]),
                                             np.asarray([a for _, a in sends], np.float32).reshape(-1, 3)),
            ("stage", "syncs_with", "stage"): (index(syncs[0]), None),
            ("pool", "link", "pool"): (link_index, link_x),
        },
    }


def to_pyg(model: ModelGraph, cluster: Cluster, plan: Plan):
    """A ``torch_geometric.data.HeteroData`` of the plan (see the module docstring)."""
    import torch
    from torch_geometric.data import HeteroData

    arrays = graph_arrays(model, cluster, plan)
    data = HeteroData()
    for kind, x in arrays["x"].items():
        data[kind].x = torch.from_numpy(np.ascontiguousarray(x))
    for key, (idx, attr) in arrays["edges"].items():
        data[key].edge_index = torch.from_numpy(np.ascontiguousarray(idx))
        if attr is not None:
            data[key].edge_attr = torch.from_numpy(np.ascontiguousarray(attr))
    return data
