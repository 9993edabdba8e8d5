"""Which devices a plan leaves idle, and why: the line ``hetpart plan`` prints (and its ``--json`` key ``idle``).

A planner may leave devices out: ``search`` runs ``dp`` replicas that take ``groups // dp`` tensor-parallel groups of a
pool each, the rest sitting out (:func:`~hetpart.policies.plan_search.replica_counts`), searches the cluster on fewer
nodes (:attr:`~hetpart.policies.plan_search.SearchOptions.fewer_nodes`) and leaves out device types that only slow
the plan down. The plan file lists only the devices it uses; this says what the rest are, pool by pool (a pool is
every node of one node type, :func:`~hetpart.costmodel.pools.device_pools`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hetpart.costmodel.pools import device_pools
from hetpart.plan import compress_device_ids

if TYPE_CHECKING:  # pragma: no cover
    from hetpart.cluster import Cluster
    from hetpart.plan import Plan

__all__ = ["idle_devices", "idle_lines"]


def idle_devices(plan: "Plan", cluster: "Cluster") -> dict[str, Any]:
    """``{devices, of, by_pool}``: how many of the cluster's devices ``plan`` leaves idle, and per pool that has idle
    devices: its ``pool`` key, ``gpu``, ``idle`` of ``of`` devices, their ids (``ids``, compressed), the most devices
    of the pool one replica holds (``per_replica``) and ``why`` in words."""
    used = {d for r in plan.replicas for s in r.stages for d in s.devices}
    by_pool = []
    for pool in device_pools(cluster):
        idle = [d for d in pool.devices if d not in used]
        if not idle:
            continue
        mine = set(pool.devices)
        per_replica = max(len(mine.intersection(d for s in r.stages for d in s.devices)) for r in plan.replicas)
        by_pool.append({"pool": pool.key, "gpu": pool.gpu.name, "idle": len(idle), "of": pool.num_devices,
                        "ids": compress_device_ids(idle), "per_replica": per_replica,
                        "why": _why(len(idle), pool.num_devices, per_replica, plan)})
    return {"devices": sum(p["idle"] for p in by_pool), "of": cluster.num_devices, "by_pool": by_pool}


def _why(idle: int, total: int, per_replica: int, plan: "Plan") -> str:
    dp, batch = plan.dp, plan.global_batch
    if idle == total:
        return "no device of this type in the plan: the plans the planner priced with them were slower"
    if idle < per_replica:
        return (f"fewer than one replica's share ({per_replica}); the other {total - idle} hold the plan's {dp} "
                f"replica{'s' if dp > 1 else ''}")
    if batch <= dp:
        return f"the batch's {batch} sequences give each of the {dp} replicas one: another replica would have none"
    if len({round(r.batch_share, 12) for r in plan.replicas}) == 1:  # even shares: dp divides the batch
        more = (next(d for d in range(dp + 1, batch + 1) if batch % d == 0) - dp) * per_replica
        if more > idle:
            return (f"the replicas share the batch's {batch} sequences evenly, and the next count that divides them "
                    f"needs {more:,} more of this type than the {idle:,} left over")
    return (f"enough for another replica ({per_replica} each), but the plans with more replicas were priced slower "
            "(more gradient sync, fewer sequences per replica)")


def idle_lines(plan: "Plan", cluster: "Cluster") -> list[str]:
    """:func:`idle_devices` as text, one line per pool with idle devices (none when every device is used)."""
    summary = idle_devices(plan, cluster)
    if not summary["devices"]:
        return []
    out = [f"  idle: {summary['devices']:,} of {summary['of']:,} devices"]
    for p in summary["by_pool"]:
        runs = p["ids"].split(",")
        ids = p["ids"] if len(runs) <= 4 else f"{','.join(runs[:2])},...,{runs[-1]}"
        out.append(f"    {p['idle']:,} of {p['of']:,} {p['gpu']} ({ids}): {p['why']}")
    return out
