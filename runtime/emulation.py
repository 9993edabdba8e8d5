"""Emulated heterogeneity on one machine: slower devices and slower links for local CPU processes.

The emulated cluster is the plan's real cluster slowed down uniformly by a time factor ``T``:

* the fastest device type of the plan runs at this machine's speed; a device type ``r`` times
  slower (dense peak for the plan's precision) sleeps ``t * (r - 1)`` after every compute that was
  MEASURED to take ``t`` seconds, so it runs at ``1/r`` of the measured speed whatever the load;
* every link keeps its shape but runs ``T`` times slower: bandwidth / T, latency * T, where
  ``T = fastest real peak TFLOPS / emulated peak TFLOPS`` (default) so that compute and
  communication are dilated by the same factor. The emulated peak is calibrated: what one process
  of this machine MEASURABLY achieves on the model that runs, divided by the simulator's efficiency. Sends and collectives take the
  simulator's own transfer time on that dilated cluster (``p2p_time_s``, ``allreduce_time_s``): a send
  delays its receiver until then, a collective sleeps it less the time this machine's own transport
  measurably takes for it (:func:`hetpart.runtime.worker.transport_costs`), so the emulated link
  replaces the loopback instead of adding to it.

:func:`emulated_cluster` builds that dilated cluster as a :class:`~hetpart.cluster.Cluster`, so
the simulator predicts exactly what the processes emulate.

:class:`EmulationEffects` optionally adds what real hardware does and the simulator does not model
(``hetpart loop``'s emulated ground): a device type whose efficiency collapses at small micro-batches,
a fixed cost per layer and pass, and inter-node links that congest when several ranks of a node use
them at once. With effects on, the simulator no longer predicts the run exactly: that is the point.
"""

from __future__ import annotations

import dataclasses
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from hetpart.cluster import Cluster, NodeGroup, ZoneLink
from hetpart.errors import PlanError
from hetpart.hardware import GPUSpec, LinkSpec, NICSpec

if TYPE_CHECKING:  # pragma: no cover
    from hetpart.plan import Plan

__all__ = ["ArrivalBoard", "EmulationParams", "EmulationEffects", "resolve_emulation", "speed_ratios", "calibrated_peak_tflops", "default_time_factor", "emulated_cluster", "Emulator"]


def speed_ratios(plan: "Plan", cluster: Cluster, precision: str | None = None) -> dict[str, float]:
    """``device id -> slowdown >= 1`` relative to the fastest device type of the plan.

    Ratios of dense peaks at ``precision`` (default the plan's): the precision the REAL cluster
    would train in, not the fp32 that the emulating CPU processes use.
    """
    precision = precision or plan.precision
    peak = {d: _effective_tflops(cluster, d, precision) for d in plan.devices}
    fastest = max(peak.values())
    return {d: fastest / p for d, p in peak.items()}


def _effective_tflops(cluster: Cluster, device: str, precision: str) -> float:
    """A device's dense peak times its measured speed factor (``slow:`` in the cluster file)."""
    d = cluster.device(device)
    return d.gpu.tflops(precision) * d.speed


def calibrated_peak_tflops(achieved_tflops: float, width: float, tokens: float) -> float:
    """The peak an emulated device needs so that the simulator's efficiency curve yields ``achieved_tflops``.

    The simulator multiplies a device's peak by ``matmul_efficiency(gpu, width, tokens)``; the fastest
    emulated device really achieves ``achieved_tflops`` (measured), so its peak is that divided by the
    efficiency at that peak (a fixed point; the curve barely moves at CPU-sized peaks).
    """
    from hetpart.costmodel.efficiency import matmul_efficiency

    if not achieved_tflops > 0:
        raise ValueError(f"achieved_tflops must be > 0, got {achieved_tflops!r}")
    peak = achieved_tflops
    for _ in range(20):
        probe = GPUSpec(name="emu-probe", tflops_bf16=peak, tflops_fp32=peak, memory_gb=1.0, hbm_gbyte_s=1.0)
        peak = achieved_tflops / matmul_efficiency(probe, width, tokens, "fp32")
    return peak


def default_time_factor(plan: "Plan", cluster: Cluster, emulated_peak_tflops: float, precision: str | None = None) -> float:
    """``T``: how much slower than the real cluster the emulation runs (fastest real peak / emulated peak)."""
    if not emulated_peak_tflops > 0:
        raise ValueError(f"emulated_peak_tflops must be > 0, got {emulated_peak_tflops!r}")
    fastest = max(_effective_tflops(cluster, d, precision or plan.precision) for d in plan.devices)
    return fastest / emulated_peak_tflops


def emulated_cluster(cluster: Cluster, plan: "Plan", peak_tflops: float, time_factor: float,
                     memory_gbyte_s: float, precision: str | None = None) -> Cluster:
    """The cluster the local processes emulate: device peaks ``peak_tflops / ratio``, links dilated by ``T``.

    Args:
        cluster: the plan's real cluster.
        plan: the plan (its devices and precision set the speed ratios).
        peak_tflops: emulated peak of the plan's fastest device type (:func:`calibrated_peak_tflops`).
        time_factor: ``T``; every link gets bandwidth / T and latency * T.
        memory_gbyte_s: this machine's measured memory rate: the optimizer step runs at it, unslowed.
        precision: the precision whose peaks set the speed ratios (default the plan's).

    Device types keep their memory (the shrunken model is far below it) and get the name
    ``emu-<type>``; the plan's device ids stay valid.
    """
    precision = precision or plan.precision
    # Per type: the fastest device of the plan (speed factor included) over the type's peak; the emulated
    # cluster keeps the speed factors, so a device's emulated rate is peak_tflops / speed_ratios[device].
    fastest = max(_effective_tflops(cluster, d, precision) for d in plan.devices)
    groups = tuple(_emulated_group(g, fastest, precision, peak_tflops, time_factor, memory_gbyte_s)
                   for g in cluster.groups)
    links = tuple(ZoneLink(z.zones, z.bandwidth_gbit_s / time_factor, z.latency_us * time_factor)
                  for z in cluster.zone_links)
    return Cluster(name=f"emulated-{cluster.name}", groups=groups, zone_links=links, source=cluster.source,
                   slow=cluster.slow)


def _emulated_gpu(real: GPUSpec, ratio: float, peak_tflops: float, memory_gbyte_s: float) -> GPUSpec:
    rate = peak_tflops / ratio
    return GPUSpec(name=f"emu-{real.name}", tflops_bf16=rate, tflops_fp32=rate, memory_gb=real.memory_gb,
                   hbm_gbyte_s=memory_gbyte_s, vendor=real.vendor, supports_bf16=True,
                   source=f"emulated {real.name}: calibrated CPU peak / {ratio:.3g}")


def _emulated_group(group: NodeGroup, fastest: float, precision: str, peak_tflops: float, t: float,
                    memory_gbyte_s: float) -> NodeGroup:
    runs = tuple((_emulated_gpu(g, fastest / g.tflops(precision), peak_tflops, memory_gbyte_s), n)
                 for g, n in group.gpu_counts)
    gpu = runs[0][0]
    intra = LinkSpec(name=f"emu-{group.intra_node.name}", bandwidth_gbyte_s=group.intra_node.bandwidth_gbyte_s / t,
                     latency_us=group.intra_node.latency_us * t, source="emulated")
    nic = NICSpec(name=f"emu-{group.nic.name}", bandwidth_gbit_s=group.nic.bandwidth_gbit_s / t,
                  latency_us=group.nic.latency_us * t, rdma=group.nic.rdma, source="emulated")
    return dataclasses.replace(group, gpu=gpu, intra_node=intra, nic=nic, mixed=runs if group.mixed else ())


@dataclass(frozen=True)
class Emulator:
    """The delays one rank adds to emulate its device and links.

    Args:
        cluster: the EMULATED cluster (:func:`emulated_cluster`): its links are already dilated.
        rank_devices: device id of every rank (rank ``i`` runs ``rank_devices[i]``).
        rank: this rank.
        speed_ratio: this rank's device slowdown (>= 1).
    """

    cluster: Cluster
    rank_devices: tuple[str, ...]
    rank: int
    speed_ratio: float
    shaped: str = "none"
    """What the network itself emulates under ``--netem``: ``"none"`` (sleeps do it all),
    ``"bandwidth"`` (tc shapes the rate; latency still by sleeps) or ``"all"``."""
    compute_scale: float = 1.0
    """:class:`EmulationEffects`: this rank's compute takes this many times longer (small-batch collapse)."""
    pass_overhead_s: float = 0.0
    """:class:`EmulationEffects`: fixed emulated seconds added to every forward or backward pass."""
    congestion_scale: float = 1.0
    """:class:`EmulationEffects`: a collective that crosses nodes takes this many times longer."""

    @property
    def links_shaped(self) -> bool:
        return self.shaped != "none"

    def __post_init__(self) -> None:
        if not self.speed_ratio >= 1.0:
            raise ValueError(f"speed_ratio must be >= 1, got {self.speed_ratio!r}")
        if not 0 <= self.rank < len(self.rank_devices):
            raise ValueError(f"rank {self.rank} outside the {len(self.rank_devices)} ranks")

    @property
    def device(self) -> str:
        return self.rank_devices[self.rank]

    def compute_delay_s(self, measured_s: float) -> float:
        """Extra sleep after a compute measured at ``measured_s`` seconds."""
        return max(0.0, measured_s) * (self.speed_ratio * self.compute_scale - 1.0)

    def pass_delay_s(self, kind: str) -> float:
        """Extra sleep for the fixed per-pass overhead (:class:`EmulationEffects`; none for the loss)."""
        return self.pass_overhead_s if kind in ("fwd", "bwd") else 0.0

    def send_delay_s(self, num_bytes: float, peer_rank: int) -> float:
        """Emulated transfer time of a point-to-point send to ``peer_rank``."""
        from hetpart.costmodel.collectives import p2p_time_s

        link = self.cluster.link_between(self.device, self.rank_devices[peer_rank])
        if link is None:
            raise PlanError(f"runtime: rank {self.rank} ({self.device}) sends to rank {peer_rank} "
                            f"({self.rank_devices[peer_rank]}) but their zones have no link; add one under 'links'")
        if self.shaped == "all":
            return 0.0
        if self.shaped == "bandwidth":
            return p2p_time_s(1, link)  # the latency; the shaped link takes the bytes' time
        return p2p_time_s(num_bytes, link)

    def collective_delay_s(self, kind: str, num_bytes: float, group_ranks: Sequence[int]) -> float:
        """Emulated time of an all-reduce of ``num_bytes`` among ``group_ranks`` (a ``reduce_scatter`` or
        ``all_gather`` of ``num_bytes``: NCCL's rings for it, as :mod:`hetpart.costmodel.sharding` prices
        them)."""
        from hetpart.costmodel.collectives import allreduce_time_s, reduce_scatter_time_s

        if len(group_ranks) < 2 or num_bytes <= 0 or self.shaped == "all":
            return 0.0
        members = [self.rank_devices[r] for r in group_ranks]
        if self.shaped == "bandwidth":
            return allreduce_time_s(1, members, self.cluster)  # the latency terms only
        congested = self.congestion_scale if len({_node(d) for d in members}) > 1 else 1.0
        if kind in ("reduce_scatter", "all_gather"):
            return reduce_scatter_time_s(num_bytes, members, self.cluster) * congested
        return allreduce_time_s(num_bytes, members, self.cluster) * congested


def _node(device: str) -> str:
    """``group/node`` of a device id ``group/node/gpu``."""
    return device.rsplit("/", 1)[0]


@dataclass(frozen=True)
class EmulationEffects:
    """Effects of real hardware that the emulation adds and the simulator does not model.

    Each is an emulation choice (docs/BENCHMARKS.md names its source); all are off by default.
    """

    small_batch_types: tuple[str, ...] = ()
    """Device types (catalog names) whose efficiency collapses at small micro-batches."""
    small_batch_tokens: int = 0
    """Micro-batch tokens (micro-batch x the plan's sequence length, as planned) below which they collapse."""
    small_batch_slowdown: float = 1.0
    """How many times longer their compute takes below ``small_batch_tokens``."""
    layer_overhead_ms: float = 0.0
    """Fixed milliseconds per layer (unit) per forward or backward pass of a micro-batch, on the real device
    (kernel launches and framework dispatch); the emulation dilates it as much as it dilates the planned
    model's compute (``T`` x the shrunken model's share of the FLOPs), so overhead and compute keep
    their real proportion."""
    congestion: float = 0.0
    """An all-reduce that crosses nodes takes ``1 + congestion x (k - 1)`` times longer, ``k`` the plan's
    ranks on its busiest node (their flows share the node's NIC and congest it)."""

    def __post_init__(self) -> None:
        if self.small_batch_slowdown < 1 or self.layer_overhead_ms < 0 or self.congestion < 0 or self.small_batch_tokens < 0:
            raise ValueError(f"emulation effects must not speed anything up: {self}")

    @property
    def active(self) -> bool:
        return bool(self.small_batch_types and self.small_batch_tokens and self.small_batch_slowdown > 1) or \
            self.layer_overhead_ms > 0 or self.congestion > 0

    def to_dict(self) -> dict:
        return dict(dataclasses.asdict(self), small_batch_types=list(self.small_batch_types))

    @classmethod
    def from_dict(cls, data: dict) -> "EmulationEffects":
        return cls(**dict(data, small_batch_types=tuple(data.get("small_batch_types", ()))))

    def rank_terms(self, plan: "Plan", real: Cluster, rank_devices: Sequence[str], rank: int, planned_seq_len: int,
                   compute_time_factor: float) -> dict[str, float]:
        """The :class:`Emulator` fields of one rank: ``compute_scale``, ``pass_overhead_s``, ``congestion_scale``.

        ``compute_time_factor``: emulated seconds per real second of the planned model's compute.
        """
        device = rank_devices[rank]
        collapse = (real.device(device).gpu.name in self.small_batch_types
                    and plan.micro_batch * planned_seq_len < self.small_batch_tokens)
        units, passes = 0, 0
        for replica in plan.replicas:
            for stage in replica.stages:
                if device in stage.devices:
                    units += stage.layers[1] - stage.layers[0]
                    passes += 1
        per_pass = units / max(passes * max(plan.interleave, 1), 1) * self.layer_overhead_ms / 1e3
        per_node: dict[str, int] = {}
        for d in rank_devices:
            per_node[_node(d)] = per_node.get(_node(d), 0) + 1
        k = max(per_node.values())
        return {"compute_scale": self.small_batch_slowdown if collapse else 1.0,
                "pass_overhead_s": per_pass * compute_time_factor,
                "congestion_scale": 1.0 + self.congestion * (k - 1)}


@dataclass(frozen=True)
class EmulationParams:
    """The numbers that define an emulated cluster (agreed by every rank, recorded with the run)."""

    precision: str
    """Precision of the REAL cluster, whose peaks set the speed ratios."""
    peak_tflops: float
    """Emulated peak of the plan's fastest device type (calibrated)."""
    time_factor: float
    """``T``: the emulation runs ``T`` times slower than the real cluster."""
    memory_gbyte_s: float
    """Emulated memory rate of every device (the optimizer step's pace, measured on Adam)."""
    achieved_tflops: float
    """Measured model rate of one process (mean over the ranks)."""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def cluster(self, real: Cluster, plan: "Plan") -> Cluster:
        return emulated_cluster(real, plan, self.peak_tflops, self.time_factor, self.memory_gbyte_s, self.precision)


def resolve_emulation(plan: "Plan", real: Cluster, precision: str, achieved_tflops: float, optimizer_gbyte_s: float,
                      width: float, time_factor: float | None = None) -> EmulationParams:
    """Emulation parameters from measured rates: calibrated peak, and ``T`` unless given."""
    peak = calibrated_peak_tflops(achieved_tflops, width, plan.micro_batch * plan.seq_len)
    factor = time_factor if time_factor else default_time_factor(plan, real, peak, precision)
    return EmulationParams(precision=precision, peak_tflops=peak, time_factor=factor,
                           memory_gbyte_s=optimizer_gbyte_s, achieved_tflops=achieved_tflops)


class ArrivalBoard:
    """When emulated point-to-point transfers arrive, shared between the ranks of one machine.

    A transfer occupies the link, not the sender (the simulator's model, and a GPU's copy engines):
    the sender posts ``issue time + emulated transfer time`` and goes on; the receiver, when it
    computes on that message, waits until the posted arrival time. Messages between two ranks are
    FIFO, so the ``n``-th post from ``src`` to ``dst`` belongs to ``dst``'s ``n``-th receive from
    ``src``. Times are ``time.time()``, one clock for every process of the machine.
    """

    _RECORD = 8  # one float64 per message

    def __init__(self, directory: str | Path, rank: int) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rank = rank
        self._read: dict[int, int] = {}
        self._fds: dict[tuple[int, int], int] = {}

    def post(self, peer_rank: int, arrival_time: float) -> None:
        """Record that this rank's next message to ``peer_rank`` arrives at ``arrival_time``."""
        os.write(self._fd(self.rank, peer_rank, os.O_WRONLY | os.O_APPEND | os.O_CREAT), struct.pack("<d", arrival_time))

    def next_arrival(self, src_rank: int, timeout_s: float = 30.0) -> float:
        """Arrival time of this rank's next message from ``src_rank`` (waits for the post if needed)."""
        n = self._read.get(src_rank, 0)
        deadline = time.time() + timeout_s
        while True:
            fd = self._fd(src_rank, self.rank, os.O_RDONLY | os.O_CREAT)
            data = os.pread(fd, self._RECORD, n * self._RECORD)
            if len(data) == self._RECORD:
                self._read[src_rank] = n + 1
                return struct.unpack("<d", data)[0]
            if time.time() > deadline:
                raise TimeoutError(f"rank {self.rank}: no emulated transfer posted by rank {src_rank} (message {n})")
            time.sleep(0.0005)

    def _fd(self, src: int, dst: int, flags: int) -> int:
        key = (src, dst)
        if key not in self._fds:
            self._fds[key] = os.open(self.dir / f"p2p_{src}_{dst}.bin", flags, 0o644)
        return self._fds[key]

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
