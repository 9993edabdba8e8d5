"""The facts of a device group that every cost derivation needs, derived in one place.

A stage's tensor-parallel group split evenly runs at the pace of its slowest GPU (speed factor
included) over the slowest hop of its ring;
it holds what its smallest memory holds and streams its optimizer step at its slowest HBM. The
simulator, the search's stage costs and the featurizer of the learned parts all read these facts
from :func:`device_group_facts`.

Example:
    >>> from hetpart import load_cluster
    >>> facts = device_group_facts(load_cluster("tiny-mixed"), ("0/0/0", "0/0/1"))
    >>> facts.gpu.name, facts.tp_bandwidth_gbyte_s > 0
    ('A100-40GB', True)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

from hetpart.cluster import Cluster
from hetpart.costmodel.links import achieved_link, intra_node_ring_gbyte_s
from hetpart.costmodel.memory import memory_capacity_gb
from hetpart.hardware import GPUSpec

__all__ = ["DeviceGroupFacts", "device_group_facts"]


@dataclass(frozen=True)
class DeviceGroupFacts:
    """What the cost model needs to know about one stage's device group."""

    gpu: GPUSpec
    """The slowest device (dense 16-bit peak): it paces the tensor-parallel group."""
    tp_bandwidth_gbyte_s: float
    """Bandwidth collectives reach over the slowest hop of the group's ring (``inf`` for one device;
    :func:`hetpart.costmodel.links.achieved_link`)."""
    tp_latency_us: float
    """Latency of the slowest hop of the group's ring (0 for one device)."""
    capacity_gb: float
    """Usable memory of the smallest device (:func:`~hetpart.costmodel.memory.memory_capacity_gb`)."""
    hbm_gbyte_s: float
    """HBM bandwidth of the slowest device's memory (paces the optimizer step)."""
    gpus: tuple[GPUSpec, ...]
    """Every device's GPU, in the group's order."""
    speeds: tuple[float, ...] = ()
    """Every device's measured speed factor (``slow:`` in the cluster file; 1.0 for most)."""

    @cached_property
    def alike(self) -> bool:
        """True when every device is the same type at full speed: an even split is then the best one,
        and the simulator prices the group as one device type (the fast path)."""
        return all(g == self.gpus[0] for g in self.gpus) and all(s == 1.0 for s in self.speeds)

    @property
    def tp_link(self) -> tuple[float, float]:
        """``(bandwidth GB/s, latency us)`` of the slowest hop."""
        return self.tp_bandwidth_gbyte_s, self.tp_latency_us


def device_group_facts(cluster: Cluster, devices: Sequence[str]) -> DeviceGroupFacts:
    """The facts of the group ``devices`` (device ids ``g/n/i``) on ``cluster``."""
    gpus = tuple(cluster.device(d).gpu for d in devices)
    speeds = tuple(cluster.device(d).speed for d in devices)
    bandwidth, latency = float("inf"), 0.0
    for i in range(len(devices)):
        link = achieved_link(cluster, devices[i], devices[(i + 1) % len(devices)])
        if link is not None and link.kind != "self":
            bandwidth, latency = min(bandwidth, link.bandwidth_gbyte_s), max(latency, link.latency_us)
    members = [cluster.device(d) for d in devices]
    if len(devices) > 1 and len({m.node_key for m in members}) == 1:  # NCCL rings the group as the wires allow
        bandwidth = intra_node_ring_gbyte_s(cluster.groups[members[0].group], [m.local for m in members])
    return DeviceGroupFacts(gpu=min(gpus, key=lambda g: g.tflops_bf16), tp_bandwidth_gbyte_s=bandwidth,
                            tp_latency_us=latency, capacity_gb=min(memory_capacity_gb(g) for g in gpus),
                            hbm_gbyte_s=min(g.hbm_gbyte_s for g in gpus), gpus=gpus, speeds=speeds)
