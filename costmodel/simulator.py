"""The analytical step-time simulator of a plan on a heterogeneous cluster.

One training step of a :class:`~hetpart.plan.Plan`:

1. every replica runs its pipeline (:mod:`hetpart.costmodel.schedule`): per virtual stage and
   micro-batch, compute (:mod:`~hetpart.costmodel.compute`, fitted efficiency) plus tensor-parallel
   all-reduces inside the stage; point-to-point transfers between stages over the actual link at the
   bandwidth NCCL reaches (:mod:`~hetpart.costmodel.links`; with sequence parallelism each of the
   ``tp`` ranks sends its ``1/tp`` shard, Megatron's scatter/gather). Replicas run in step, so the
   transfers of every replica leaving a node at once share its NICs (:meth:`Simulator._pipeline_flows`).
   A send blocks its sender (Megatron-LM's 1F1B waits for each transfer; ``overlap_p2p=True``: only the
   receiver waits, except over TCP);
2. data-parallel gradient all-reduces, per unit, among the replicas holding it (replicas may cut the
   model differently and mix device types: the slowest member paces the ring), in fp32 under bf16 as
   Megatron-LM does. Gradients go out in buckets of ``grad_bucket_params`` (Megatron's 40M), one NCCL
   call each, priced at NCCL's fastest algorithm and protocol for the bucket's bytes
   (:mod:`~hetpart.costmodel.nccl`; the breakdown's ``dp_collective`` names it): a bucket
   leaves when its last gradient is ready in every holder's last backward, so the all-reduces overlap
   with the rest of that backward and with the backward of earlier stages, and the last bucket of a
   stage is exposed (``overlap_grad_reduce=False``: they start once every holder's backward is over,
   Megatron's default and hetpart's runtime; over TCP NICs likewise, as NCCL's socket transport does
   not overlap compute the way RDMA does); all-reduces that share a device group run one after
   another, those of different device groups on one node share its NICs. Tied embedding copies on
   different stages are all-reduced the same way;
3. the optimizer step, memory-bandwidth bound: 30 bytes moved per parameter held under Adam and bf16 (read
   the fp32 gradient, fp32 master and two moments; write them back and the 16-bit weight; 28 under fp16
   and fp32; SGD and 8-bit Adam move less, :func:`~hetpart.costmodel.memory.optimizer_step_bytes`) over
   HBM bandwidth,
   after the slowest gradient all-reduce (global gradient-norm clipping needs them all). With host offload
   (``plan.offload``, :mod:`~hetpart.costmodel.offload`) the step runs on the CPU at the node's memory
   bandwidth, shared by the node's devices, reading the fp32 gradient (``cpu_step_bytes``: Adam 30 bytes a
   parameter under fp16 too), plus the host copies (``host_copy_bytes``: the gradient out in fp32, the
   parameters back in the training dtype): per unit and micro-batch beside the sharded collectives where the
   states live on the host unit by unit, else once per step.

Memory per device follows :mod:`~hetpart.costmodel.memory`; an offloaded plan's states in host memory are
checked against each node's (:meth:`Simulator.host_state_gb`).

Context parallelism (``plan.cp > 1``, :mod:`~hetpart.costmodel.context_parallel`): each stage's ``cp``
tensor-parallel groups run ``1/cp`` of every sequence, pay the key/value ring beside their attention,
send ``1/cp`` of each pipeline transfer, and reduce (or shard) gradients over ``dp x cp`` ranks.

:meth:`Simulator.estimate` runs the same model and returns only the step time and the memory fit
(the planners' and the RL reward's inner loop); :meth:`Simulator.simulate` adds metrics, the
breakdown and, on request, the timeline.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, NamedTuple, Sequence

import numpy as np

from hetpart.cluster import Cluster, PathLink
from hetpart.errors import PlanError, WorkloadError
from hetpart.graph.model_graph import ModelGraph
from hetpart.hardware import GPUSpec
from hetpart.plan import Plan, Replica, Stage, TPSplit
from hetpart.workload import DTYPE_BYTES, Workload

from hetpart.costmodel.collectives import allreduce_cost, allreduce_lines, nic_flows, p2p_time_s, zone_concurrency
from hetpart.costmodel.compute import DISPATCH_MODES, unit_attention_core_s, unit_compute_s, unit_tp_comm_s
from hetpart.costmodel.context_parallel import kv_bytes_per_step, ring_exposed_s, ring_hops, ring_step_s
from hetpart.costmodel.device_group import DeviceGroupFacts, device_group_facts
from hetpart.costmodel.efficiency import EfficiencyCurve
from hetpart.costmodel.links import achieved_link, node_nic_gbyte_s, zone_gbyte_s
from hetpart.costmodel.activations import DEFAULT_KERNELS, check_kernels, effective_attention
from hetpart.costmodel.memory import (GRAD_BYTES, MOMENT_BYTES, OPTIMIZER_STEP_BYTES, PrefixTables, chunk_flights,
                                      in_flight_microbatches, pipeline_recv_buffer_bytes,
                                      optimizer_step_bytes, state_bytes_per_param)
from hetpart.costmodel.offload import (cpu_step_bytes, cpu_step_s, device_state_parts, host_copy_bytes, host_link_gbyte_s,
                                      host_memory_gb, host_state_bytes)
from hetpart.costmodel.sharding import collective_pad, exposed_unit_comm_s, memory_zero, microbatches_run, sharded_delta_gb, \
    state_bytes, tied_params_held
from hetpart.costmodel.profile import BoundProfile, Profile
from hetpart.costmodel.schedule import SharedPipeline, pipeline_summary, pipeline_timing, simulate_shared_cores
from hetpart.costmodel.tp_split import param_shares, unit_shares

__all__ = ["Prediction", "Estimate", "Simulator", "simulate", "simulator_predictor", "OPTIMIZER_BYTES_PER_PARAM",
           "MEGATRON_BUCKET_PARAMS", "grad_reduce_bytes", "TP_COMM"]

TP_COMM = ("ring", "nccl", "nccl-sp")
"""How the tensor-parallel collectives can be priced (``Simulator(tp_comm=...)``)."""

OPTIMIZER_BYTES_PER_PARAM = OPTIMIZER_STEP_BYTES["adam"]
"""HBM bytes an Adam step moves per parameter with 16-bit or fp32 gradients (see the module docstring; by
optimizer and precision: :func:`hetpart.costmodel.memory.optimizer_step_bytes`)."""
MEGATRON_BUCKET_PARAMS = 40_000_000
"""Gradients per data-parallel bucket in Megatron-LM's DDP (``bucket_size = max(40M, 1M x dp)`` elements):
a bucket's all-reduce starts once its last gradient is ready, so the last bucket of a stage is exposed."""


def grad_reduce_bytes(precision: str) -> int:
    """Bytes per gradient element that the data-parallel all-reduce moves: Megatron-LM reduces bf16 (and
    fp8) training's gradients in fp32 (``accumulate_allreduce_grads_in_fp32`` is forced for bf16), fp16
    training's in fp16, fp32 training's in fp32: the bytes the memory model keeps them in
    (:data:`~hetpart.costmodel.memory.GRAD_BYTES`)."""
    return GRAD_BYTES[precision]

_VECTOR_MIN_REPLICAS = 16
"""From this many data-parallel replicas the all-reduces run over numpy stage tables; below it, scalar
Python has less overhead (``tests/test_simulator.py`` checks that both give the same step)."""
_BOUND_SLACK = 1.0 - 1e-9
""":meth:`Simulator.lower_bound_s` is scaled down by this so that rounding never prunes the optimum."""


@dataclass(frozen=True)
class Prediction:
    """What the simulator predicts for one plan."""

    step_time_s: float
    tokens_per_s: float
    samples_per_s: float
    fits_in_memory: bool
    metrics: dict[str, Any]
    """The CONTRACT metrics (step_time_s, tokens_per_s, ..., peak_memory_gb per device type, fits_in_memory)."""
    memory_gb: dict[str, float]
    """Predicted peak memory of each device of the plan, GB."""
    breakdown: list[dict[str, Any]]
    """Per replica and pipeline device group (seconds per step): compute_s, tp_comm_s, zero_comm_s and
    pp_blocked_s (busy; zero_comm_s is what sharded collectives add inside the micro-batches, levels
    2-3; pp_blocked_s the pipeline sends the device waits for),
    bubble_s (idle inside the pipeline), sync_wait_s (after the pipeline, until every gradient
    all-reduce is done: exposed DP communication or a slower replica), optimizer_s; pp_comm_s and
    dp_comm_s are link time (overlapped or not); plus devices, gpu, tp, layers, memory_gb,
    capacity_gb; with context parallelism (``cp > 1``) also cp, cp_comm_s (the ring's exposed seconds:
    busy, like tp_comm_s) and cp_link_s (its transfer time, overlapped or not). For every entry, busy +
    bubble_s + sync_wait_s + the slowest optimizer_s = step."""
    timeline: list[dict[str, Any]] = field(default_factory=list)
    """With ``trace=True``: events ``{replica, stage, microbatch, kind, start_s, end_s}``, kind in
    ``fwd``, ``bwd``, ``send``, ``dp_sync``, ``optim`` (stage = pipeline device group)."""
    provenance: dict[str, Any] = field(default_factory=dict)
    """Per device type of the plan: where its compute came from (measured profile, fitted or assumed
    curve) and the error band of that kind (:mod:`hetpart.costmodel.provenance`)."""

    def to_dict(self) -> dict[str, Any]:
        return {"step_time_s": self.step_time_s, "tokens_per_s": self.tokens_per_s,
                "samples_per_s": self.samples_per_s, "fits_in_memory": self.fits_in_memory,
                "metrics": dict(self.metrics), "memory_gb": dict(self.memory_gb),
                "breakdown": [dict(b) for b in self.breakdown], "timeline": [dict(e) for e in self.timeline],
                "provenance": dict(self.provenance)}


@dataclass(frozen=True)
class Estimate:
    """The inner-loop answer: step time and whether every device fits."""

    step_time_s: float
    tokens_per_s: float
    fits_in_memory: bool
    memory_headroom_gb: float
    """Smallest (capacity - predicted peak) over the plan's devices; negative when something does not fit."""


class _UnitPrefix(NamedTuple):
    """Prefix sums over the units of one stage configuration (``[n + 1]`` each, seconds per micro-batch)."""

    fwd: list[float]
    bwd: list[float]
    tp_fwd: list[float]
    """Tensor-parallel all-reduces of the forward."""
    tp_bwd: list[float]
    bwd_np: np.ndarray
    """``bwd`` as an array (gradient readiness of many replicas at once)."""
    tp_bwd_np: np.ndarray
    cp_fwd: list[float] | None = None
    """With context parallelism: the ring's exposed seconds (:mod:`~hetpart.costmodel.context_parallel`),
    also counted in ``tp_fwd`` (communication inside the stage); None without."""
    cp_bwd: list[float] | None = None
    cp_link: list[float] | None = None
    """The ring's whole transfer time, forward and backward, overlapped or not."""


@dataclass
class _Pipe:
    """One replica's pipeline: per virtual stage costs of one micro-batch and when things finished."""

    pp: int
    m: int
    fwd: list[float]
    bwd: list[float]
    compute: list[float]
    tp: list[float]
    p2p: list[float]
    makespan: float
    last_bwd: list[float]
    bwd_prefix: list[_UnitPrefix] = field(default_factory=list)
    """Per virtual stage: its units' prefix sums (backward compute and backward TP communication)."""
    timing: Any = None
    fwd_send: list[float] = field(default_factory=list)
    """Per virtual stage: seconds its device stays blocked sending one micro-batch's activations on
    (included in ``fwd``; 0 where the send overlaps compute)."""
    bwd_send: list[float] = field(default_factory=list)
    """The same for the gradients sent back after each backward (included in ``bwd``)."""
    cp: list[float] = field(default_factory=list)
    """Per virtual stage with context parallelism: the ring's exposed seconds (in ``fwd`` and ``bwd``,
    not in ``tp``); empty without."""
    cp_link: list[float] = field(default_factory=list)
    """Per virtual stage with context parallelism: the ring's transfer seconds, overlapped or not."""

    def grad_ready_s(self, k: int, first: int, unit: int) -> float:
        """When virtual stage ``k`` (units from ``first``) has the gradient of ``unit`` for the step:
        its last backward runs from its last unit down, so ``unit`` is done once the units below it
        are all that is left (and before the blocking send that ends the operation)."""
        b, tb = self.bwd_prefix[k].bwd, self.bwd_prefix[k].tp_bwd
        return self.last_bwd[k] - self.bwd_send[k] - (b[unit] - b[first]) - (tb[unit] - tb[first])


class _StageTable(NamedTuple):
    """Every (replica, virtual stage) of a plan, numbered flat (``offsets[r] + k``)."""

    offsets: np.ndarray
    first_device: list[str]
    node: np.ndarray
    """Node number of the stage's first device (all-reduce cost depends on nodes only)."""
    tp: np.ndarray
    group: np.ndarray
    """Pipeline device group (replica, device stage) numbered flat: interleaved chunks share their device's."""
    last_bwd: np.ndarray
    """When the stage's last backward ends (with pipes)."""
    device_done: np.ndarray
    """When the stage's device finishes its whole backward (with pipes)."""
    shard_tp: np.ndarray
    """``tp``, or for an uneven split 1 / the largest device share (what a gradient exchange is padded to)."""
    first_unit: np.ndarray
    """The stage's first unit."""
    ready_base: np.ndarray
    """``last_bwd`` less the blocking send that ends it: when the stage's first unit has its gradient (with pipes)."""
    prefix_row: np.ndarray
    """Row of the stage's unit prefix sums in ``bwd_prefix`` and ``tp_bwd_prefix`` (with pipes)."""
    bwd_prefix: np.ndarray
    """``[prefixes, units + 1]``: backward compute prefix sums of the plan's stage configurations."""
    tp_bwd_prefix: np.ndarray
    """The same for the backward's TP all-reduces."""

    def grad_ready_s(self, flat: np.ndarray, unit: np.ndarray) -> np.ndarray:
        """When stage ``flat`` has the gradient of ``unit`` (:meth:`_Pipe.grad_ready_s`, element by element)."""
        row, first = self.prefix_row[flat], self.first_unit[flat]
        b, tb = self.bwd_prefix, self.tp_bwd_prefix
        return (self.ready_base[flat] - (b[row, unit] - b[row, first])) - (tb[row, unit] - tb[row, first])


class _Segment(NamedTuple):
    """One gradient all-reduce: units ``[a, z)`` (``-1, -1``: a tied copy) among ``holders``."""

    holders: Any
    """(replica, virtual stage) of each holder: an ``[h, 2]`` array, or a tuple of pairs for few replicas."""
    a: int
    z: int
    nbytes: float
    last_bytes: float
    """Bytes of the last bucket the backward finishes (unit ``a``)."""


class _Job(NamedTuple):
    first: float
    """When the first bucket is ready."""
    last: float
    """When the last bucket is ready."""
    groups: Any
    """Device groups the all-reduce occupies: flat numbers (array), or (replica, device stage) pairs."""
    time_s: float
    last_time_s: float
    order: Any
    """Sort key without overlap (largest first)."""
    collective: str = ""
    """NCCL's algorithm/protocol for one bucket of the all-reduce (``ring/Simple``, ``tree/LL128``, ...)."""
    after_sync: bool = False
    """Issued once its device groups' data-parallel sync is done (Megatron's tied pairs, ``Simulator._tied_pairs``)."""


def _job_order(jobs: list[_Job], overlap: bool) -> list[_Job]:
    """Jobs in the order they are issued: by readiness (with overlap) or largest first (without), the
    jobs that follow the data-parallel sync after all others (each still waits only for its own groups)."""
    return sorted(jobs, key=lambda j: (j.after_sync, j.first) if overlap else (j.after_sync, j.order))


def _rest_s(parts: Iterable[tuple[float, float]]) -> float:
    """What ``(whole, known parts)`` leave over, summed; a remainder within rounding of the whole (the parts make
    it up exactly, and float subtraction left -5e-17) is 0.0."""
    rest = whole_sum = 0.0
    for whole, known in parts:
        rest += whole - known
        whole_sum += abs(whole)
    return 0.0 if abs(rest) <= 1e-12 * max(whole_sum, 1e-300) else float(rest)


@dataclass
class _Step:
    pipes: list[_Pipe]
    dp_end: float
    dp_spent: dict[tuple[int, int], float]
    dp_events: list[dict[str, Any]]
    optim: dict[tuple[int, int], float]
    memory: dict[tuple[int, int], float]
    sync_end: float
    step: float
    dp_collective: dict[tuple[int, int], str] = field(default_factory=dict)
    """Per (replica, device group): the algorithm/protocol of its largest gradient all-reduce's buckets."""


class Simulator:
    """Simulates plans of one model on one cluster; caches unit costs and links between plans.

    Example:
        >>> from hetpart import Workload, load_cluster, load_model
        >>> from hetpart.costmodel import Simulator, megatron_plan
        >>> model, cluster = load_model("gpt2-small", seq_len=256), load_cluster("a100-8")
        >>> plan = megatron_plan(model, cluster, Workload(16, 256), tp=2, pp=2, dp=2, micro_batch=2)
        >>> Simulator(model, cluster).simulate(plan).fits_in_memory
        True
    """

    def __init__(self, model: ModelGraph, cluster: Cluster,
                 curve_of: Callable[[GPUSpec], EfficiencyCurve] | None = None, *,
                 overlap_grad_reduce: bool = True, overlap_p2p: bool = False,
                 grad_bucket_params: float = MEGATRON_BUCKET_PARAMS, profile: "Profile | None" = None,
                 kernels: str = DEFAULT_KERNELS, op_counts: str = "engine", tp_comm: str = "ring",
                 dispatch: str = "overlap") -> None:
        """``curve_of`` overrides the efficiency curve per device type (calibration fits through it);
        ``overlap_grad_reduce=False`` starts gradient all-reduces after the backward; ``overlap_p2p=True``
        models an engine whose pipeline sends run beside compute; ``grad_bucket_params``: gradients per
        data-parallel bucket (Megatron-LM's 40M; PyTorch DDP's 25 MB is 6.25M fp32) (module docstring);
        ``profile``: measured entries replace the analytic terms where it has them
        (:mod:`hetpart.costmodel.profile`); ``kernels``: the engine's kernel set, whose saved activations the
        memory model counts (``fused``: Megatron-Core/Transformer Engine, ``torch``: hetpart's runtime;
        :mod:`~hetpart.costmodel.activations`); ``op_counts``: which operator counts pay the fixed host cost
        per operator (:func:`~hetpart.costmodel.compute.unit_ops`): ``engine`` (default), the kernel set's own
        (Megatron-Core/TE's derived counts under ``fused``, the runtime's measured ones under ``torch``), or
        ``measured``, the runtime's counted ones whatever the kernel set (the default until 2026-12-01:
        docs/BENCHMARKS.md, sections *Engine-specific operator counts* and *Host operator counts follow the
        kernel set*); ``tp_comm``: how the tensor-parallel collectives are priced: ``ring``
        (default: one ring on the group's slowest hop at its catalog latency per step), ``nccl`` (each call an
        all-reduce at NCCL's fastest algorithm and protocol, :func:`~hetpart.costmodel.collectives.allreduce_cost`)
        or ``nccl-sp`` (each call sequence parallelism's reduce-scatter plus all-gather of the same buffer, at
        NCCL's fastest ring protocol); both tried and not adopted as the default (same section); ``dispatch``:
        how a unit's host cost meets its device work (:data:`~hetpart.costmodel.compute.DISPATCH_MODES`):
        ``overlap`` (default, measured on an H100: the longer of the two) or ``serial`` (their sum)."""
        self.model = model
        self.grad_bucket_params = float(grad_bucket_params)
        self.profile = profile
        self._sharing = profile.core_sharing if profile is not None else None
        """The profile's :class:`~hetpart.costmodel.profile.CoreSharing`: the plan's processes share fewer cores."""
        self._profiled = BoundProfile(profile, model, cluster) if profile is not None else None
        # the links the transfers and collectives run over: measured ones where the profile has them
        self._p2p_cluster = self._profiled.link_cluster("p2p") if self._profiled is not None else cluster
        self._ar_cluster = self._profiled.link_cluster("allreduce") if self._profiled is not None else cluster
        self.overlap_grad_reduce = overlap_grad_reduce
        self.overlap_p2p = overlap_p2p
        self.cluster = cluster
        self._curve_of = curve_of
        self.kernels = check_kernels(kernels)
        if op_counts not in ("measured", "engine"):
            raise PlanError(f"op_counts: unknown {op_counts!r}; use measured or engine")
        self.op_counts = op_counts
        if tp_comm not in TP_COMM:
            raise PlanError(f"tp_comm: unknown {tp_comm!r}; use {', '.join(TP_COMM)}")
        self.tp_comm = tp_comm
        if dispatch not in DISPATCH_MODES:
            raise PlanError(f"dispatch: unknown {dispatch!r}; use {', '.join(DISPATCH_MODES)}")
        self.dispatch = dispatch
        self._tp_lines_of: dict[tuple[str, ...], tuple[tuple[float, float], ...]] = {}
        self._op_kernels = self.kernels if op_counts == "engine" else "torch"
        # what selective recomputation re-runs: the runtime checkpoints the attention sublayer, Megatron its core
        self._selective = "sublayer" if self.kernels == "torch" else "core"
        """The kernel set whose operator counts pay the per-operator host cost."""
        self._tables = PrefixTables(model, kernels)
        self._out_bytes = [u.out_act_bytes for u in model.units]
        self._units: dict[tuple, tuple[list[float], ...]] = {}
        self._groups: dict[tuple[str, ...], DeviceGroupFacts] = {}
        self._facts: dict[DeviceGroupFacts, DeviceGroupFacts] = {}
        self._p2p: dict[tuple, PathLink] = {}
        """Pipeline links by :meth:`_p2p_key`."""
        self._ar: dict[tuple, tuple[tuple[float, float], ...]] = {}
        """All-reduce cost lines by ring key (:meth:`_ring`); their names in ``_ar_names``."""
        self._ar_names: dict[tuple, tuple[str, ...]] = {}
        self._hop_links: dict[tuple, PathLink | None] = {}
        """Links between ring neighbours on the all-reduce cluster (:func:`allreduce_cost`'s cache)."""
        numbers: dict[tuple[int, int], int] = {}
        self._nodes: dict[str, int] = {d.id: numbers.setdefault(d.node_key, len(numbers)) for d in cluster.devices}
        """Node number of each device (cluster order)."""
        self._places: dict[str, tuple[int, int]] = {d.id: (d.group, d.local) for d in cluster.devices}
        """Node group and place in its node of each device."""
        self._node_rdma = np.array([cluster.groups[g].nic.rdma for g, _ in numbers], dtype=bool)
        """Per node number: whether its NICs are RDMA (:meth:`_crosses_tcp`)."""
        zones = cluster.zones
        self._node_zone = np.array([zones.index(cluster.groups[g].zone) for g, _ in numbers], dtype=np.int64)
        """Per node number: its zone's index (the rings crossing a zone link share it)."""
        self._zoned = len(zones) > 1
        self._unit_params: dict[int, list[float]] = {}
        self._offload_node_cache: dict[tuple[str, ...], dict[tuple[int, int], int]] = {}
        self._stage_units: dict[tuple, _UnitPrefix] = {}
        """(devices, tp, split, (micro_batch, precision, recompute, attention)) -> :meth:`_unit_prefix`."""
        self._peaks: dict[tuple, tuple[tuple[str, ...], tuple[float, ...]]] = {}
        self._cp_rings: dict[tuple, tuple[tuple[PathLink, ...], bool]] = {}
        """Context-parallel rings by (devices, tp, cp, NIC flows of their nodes): :meth:`_cp_ring`."""
        self._bound_terms: dict[tuple, dict[tuple, tuple[float, float, float]]] = {}
        """(micro_batch, precision, recompute, attention) -> a stage's :meth:`lower_bound_s` terms by its
        :meth:`_bound_stages` key."""
        self._bound_groups: dict[tuple[str, ...], object] = {}
        """:meth:`_bound_group` per device tuple."""
        self._node_nic_bps = np.array([node_nic_gbyte_s(cluster.groups[g]) * 1e9 for g, _ in numbers])
        """Per node number: what all its NICs carry together, bytes/s (:meth:`_sync_bound_s`)."""
        self._zone_bps = max((zone_gbyte_s(cluster, *sorted(link.zones)) for link in cluster.zone_links),
                             default=0.0) * 1e9
        """The fastest zone link, bytes/s (:meth:`_sync_bound_s`; 0 without zone links)."""
        self._unit_grads: dict[str, np.ndarray] = {}
        """Per precision: :meth:`_unit_grad_bytes`."""

    # --------------------------------------------------------------------------------- cached facts
    def _tp_lines(self, devices: tuple[str, ...]) -> tuple[tuple[float, float], ...]:
        """NCCL's candidate lines of one tensor-parallel call among ``devices`` under ``tp_comm`` (empty
        under ``ring``), on the all-reduce cluster (a profile's measured links where it has them)."""
        if self.tp_comm == "ring":
            return ()
        hit = self._tp_lines_of.get(devices)
        if hit is None:
            if self.tp_comm == "nccl":
                hit = allreduce_cost(list(devices), self._ar_cluster)
            else:  # sequence parallelism: reduce-scatter + all-gather of the same buffer, NCCL's rings
                hit = tuple((2 * line.fixed_s, 2 * line.per_byte_s) for line in
                            allreduce_lines(list(devices), self._ar_cluster, collective="reduce_scatter"))
            self._tp_lines_of[devices] = hit
        return hit

    def _group(self, devices: tuple[str, ...]) -> DeviceGroupFacts:
        hit = self._groups.get(devices)
        if hit is None:  # equal facts are one object (caches key on it)
            facts = device_group_facts(self.cluster, devices)
            hit = self._groups[devices] = self._facts.setdefault(facts, facts)
        return hit

    def _unit_prefix(self, devices: tuple[str, ...], tp: int, mb: int, precision: str, recompute: str,
                     split: TPSplit | None = None, attention: str = "fused") -> _UnitPrefix:
        attention = self._attention(attention)
        g = self._group(devices)
        if split is not None or not g.alike:
            return self._uneven_prefix(g, tp, mb, precision, recompute, split, attention, devices)
        lines = self._tp_lines(devices) if tp > 1 else ()
        key = (g.gpu, g.tp_link if tp > 1 else None, tp, mb, precision, recompute, attention, lines)
        hit = self._units.get(key)
        if hit is None:
            curve = self._curve_of(g.gpu) if self._curve_of else None
            fwd, bwd = unit_compute_s(self.model, g.gpu, tp, mb, precision, recompute, curve, attention,
                                      kernels=self._op_kernels, dispatch=self.dispatch, selective=self._selective)
            tp_link = g.tp_link
            if self._profiled is not None:
                fwd, bwd = self._profiled.unit_compute_s(g.gpu, tp, mb, precision, recompute, fwd, bwd,
                                                         self._selective)
                tp_link = device_group_facts(self._ar_cluster, devices).tp_link if tp > 1 else tp_link
            tpf, tpb = unit_tp_comm_s(self.model, tp, mb, recompute, *tp_link, lines, self._selective)
            arrays = [np.concatenate([[0.0], np.cumsum(a)]) for a in (fwd, bwd, tpf, tpb)]
            hit = _UnitPrefix(*(a.tolist() for a in arrays), arrays[1], arrays[3])
            self._units[key] = hit
        return hit

    def _uneven_prefix(self, g: DeviceGroupFacts, tp: int, mb: int, precision: str, recompute: str,
                       split: TPSplit | None, attention: str = "fused", devices: tuple[str, ...] = ()) -> _UnitPrefix:
        """Unlike devices or an uneven split: per unit, the slowest device's time for its share of the
        split work (at its local width) plus the work every rank repeats, over its speed factor. The
        Megatron all-reduces keep their full size (each rank adds a full-width partial sum)."""
        attention = self._attention(attention)
        lines = self._tp_lines(devices) if tp > 1 and devices else ()
        key = ("uneven", g.gpus, g.speeds, split, g.tp_link if tp > 1 else None, tp, mb, precision, recompute,
               attention, lines)
        hit = self._units.get(key)
        if hit is None:
            shares = unit_shares(self.model, tp, split)
            fwd = bwd = None
            for i, (gpu, speed) in enumerate(zip(g.gpus, g.speeds)):
                curve = self._curve_of(gpu) if self._curve_of else None
                f, b = unit_compute_s(self.model, gpu, 1.0 / shares[i], mb, precision, recompute, curve, attention,
                                      kernels=self._op_kernels, dispatch=self.dispatch, speed=speed,
                                      selective=self._selective)
                if self._profiled is not None:  # measured units at this device's share of each, slowed by its
                    # speed factor as much as the analytic terms say it slows that unit (device work, not host)
                    f1, b1 = unit_compute_s(self.model, gpu, 1.0 / shares[i], mb, precision, recompute, curve,
                                            attention, kernels=self._op_kernels, dispatch=self.dispatch, selective=self._selective)
                    mf, mb1 = self._profiled.unit_compute_s(gpu, 1.0 / shares[i], mb, precision, recompute, f1, b1,
                                                            self._selective, engine_tp=tp,
                                                            engine="dtensor" if split is None else "megatron")
                    f = mf * np.divide(f, f1, out=np.ones_like(f), where=f1 > 0)
                    b = mb1 * np.divide(b, b1, out=np.ones_like(b), where=b1 > 0)
                fwd, bwd = (f, b) if fwd is None else (np.maximum(fwd, f), np.maximum(bwd, b))
            tp_link = g.tp_link
            if self._profiled is not None and tp > 1 and devices:  # the measured all-reduce hops, as for alike groups
                tp_link = device_group_facts(self._ar_cluster, devices).tp_link
            tpf, tpb = unit_tp_comm_s(self.model, tp, mb, recompute, *tp_link, lines, self._selective)
            arrays = [np.concatenate([[0.0], np.cumsum(a)]) for a in (fwd, bwd, tpf, tpb)]
            hit = self._units[key] = _UnitPrefix(*(a.tolist() for a in arrays), arrays[1], arrays[3])
        return hit

    def _cp_unit_prefix(self, stage, plan: Plan, flows: dict[int, int]) -> _UnitPrefix:
        """A stage's unit costs under context parallelism (:mod:`~hetpart.costmodel.context_parallel`): per
        unit, the slowest device of any of its ``cp`` tensor-parallel groups on its ``1/cp`` of the tokens,
        the slowest group's TP all-reduces on ``1/cp`` of the bytes, plus the ring's exposed seconds (in
        ``tp_fwd`` / ``tp_bwd``, and alone in ``cp_fwd`` / ``cp_bwd``). Measured profile entries (taken at
        whole sequences) are scaled by the analytic ratio of the split to the whole."""
        cp, tp, mb = plan.cp, stage.tp, plan.micro_batch
        links, overlap = self._cp_ring(stage.devices, tp, cp, flows)
        subs = {}
        for c in range(cp):
            devices = stage.devices[c * tp:(c + 1) * tp]
            subs.setdefault(self._group(devices), devices)
        key = ("cp", tuple(subs), links, overlap, tp, cp, mb, plan.precision, plan.recompute)
        hit = self._units.get(key)
        if hit is not None:
            return hit
        model, precision, recompute = self.model, plan.precision, plan.recompute
        fwd = bwd = core_f = core_b = None
        bandwidth, latency = float("inf"), 0.0
        tpf = tpb = None
        for g, devices in subs.items():
            for gpu, speed in dict.fromkeys(zip(g.gpus, g.speeds)):
                curve = self._curve_of(gpu) if self._curve_of else None
                f, b = unit_compute_s(model, gpu, tp, mb, precision, recompute, curve, "fused", cp, self._op_kernels,
                                      self.dispatch, speed, self._selective)
                if self._profiled is not None:
                    f1, b1 = unit_compute_s(model, gpu, tp, mb, precision, recompute, curve, "fused",
                                            kernels=self._op_kernels, dispatch=self.dispatch, selective=self._selective)
                    mf, mb1 = self._profiled.unit_compute_s(gpu, tp, mb, precision, recompute, f1, b1, self._selective)
                    f = mf * np.divide(f, f1, out=np.ones_like(f), where=f1 > 0)
                    b = mb1 * np.divide(b, b1, out=np.ones_like(b), where=b1 > 0)
                cf, cb = unit_attention_core_s(model, gpu, tp, mb, precision, curve, cp)
                cf, cb = cf / speed, cb / speed  # f, b: the speed factor slowed their device work above
                if fwd is None:
                    fwd, bwd, core_f, core_b = f, b, cf, cb
                else:
                    fwd, bwd = np.maximum(fwd, f), np.maximum(bwd, b)
                    core_f, core_b = np.maximum(core_f, cf), np.maximum(core_b, cb)
            tp_link = g.tp_link
            if self._profiled is not None and tp > 1:
                tp_link = device_group_facts(self._ar_cluster, devices).tp_link
            bandwidth, latency = min(bandwidth, tp_link[0]), max(latency, tp_link[1])
            lines = self._tp_lines(devices) if tp > 1 else ()
            if lines:  # each of the cp groups runs its own collectives on 1/cp of the tokens: the slowest paces
                gf, gb = unit_tp_comm_s(model, tp, mb / cp, recompute, *tp_link, lines, self._selective)
                tpf, tpb = (gf, gb) if tpf is None else (np.maximum(tpf, gf), np.maximum(tpb, gb))
        if tpf is None:
            tpf, tpb = unit_tp_comm_s(model, tp, mb / cp, recompute, bandwidth, latency, (), self._selective)
        kv = kv_bytes_per_step(model, tp, cp, mb)
        xf, xb, link = ring_exposed_s(core_f, core_b, ring_step_s(kv, links), ring_step_s(2 * kv, links), cp,
                                      overlap, recompute == "full")
        arrays = [np.concatenate([[0.0], np.cumsum(a)]) for a in (fwd, bwd, tpf + xf, tpb + xb, xf, xb, link)]
        lists = [a.tolist() for a in arrays]
        hit = self._units[key] = _UnitPrefix(*lists[:4], arrays[1], arrays[3], *lists[4:])
        return hit

    def _cp_flows(self, plan: Plan) -> dict:
        """Per node: the context-parallel ring transfers leaving it at once: per stage (interleaved chunks
        of one device group once), each hop that leaves its node carries the ``tp`` shards of its rank.
        Every replica's stages compute attention at about the same time, so their rings share the NICs,
        and per pair of zones (a ``frozenset`` key) the link between them: the larger of the hops'
        shards crossing it one way and the other."""
        out: dict = {}
        seen = set()
        zoned = bool(self.cluster.zone_links)
        for rep in plan.replicas:
            for s in rep.stages:
                if s.devices in seen:
                    continue
                seen.add(s.devices)
                for a, b in ring_hops(s.devices, s.tp, plan.cp):
                    na = self._node_id(a)
                    if na != self._node_id(b):
                        out[na] = out.get(na, 0) + s.tp
                        za, zb = (self.cluster.device(a).zone, self.cluster.device(b).zone) if zoned else (0, 0)
                        if za != zb:
                            out[(za, zb)] = out.get((za, zb), 0) + s.tp
        for za, zb in [n for n in out if isinstance(n, tuple)]:
            out[frozenset((za, zb))] = max(out[(za, zb)], out.get((zb, za), 0))
        return {n: c for n, c in out.items() if not isinstance(n, tuple)}

    def _cp_ring(self, devices: tuple[str, ...], tp: int, cp: int, flows: dict[int, int]
                 ) -> tuple[tuple[PathLink, ...], bool]:
        """The links of a stage's context-parallel ring (one per hop, NICs shared by ``flows``) and whether
        its transfers overlap compute (not when a hop leaves a node over a TCP NIC)."""
        hops = ring_hops(devices, tp, cp)
        nodes = [(self._node_id(a), self._node_id(b)) for a, b in hops]
        zones = [frozenset((self.cluster.device(a).zone, self.cluster.device(b).zone)) for a, b in hops] \
            if self.cluster.zone_links else [frozenset()] * len(hops)
        key = (devices, tp, cp, tuple(flows.get(n, tp) for pair in nodes for n in pair),
               tuple(flows.get(z, tp) for z in zones if len(z) > 1))
        hit = self._cp_rings.get(key)
        if hit is None:
            links, overlap = [], True
            for (a, b), (na, nb), z in zip(hops, nodes, zones):
                if achieved_link(self._p2p_cluster, a, b) is None:
                    raise PlanError(f"cp: devices {a} and {b} of a context-parallel ring sit in zones without a "
                                    "link; add one under 'links'")
                share = (flows.get(na, tp), flows.get(nb, tp))
                links.append(self._p2p_link(a, b, share + (flows.get(z, tp),) if len(z) > 1 else share))
                if na != nb and not (self._node_rdma[na] and self._node_rdma[nb]):
                    overlap = False
            hit = self._cp_rings[key] = (tuple(links), overlap)
        return hit

    @staticmethod
    def _dp_view(plan: Plan) -> Plan:
        """The plan as its gradient reduction sees it: each context-parallel rank of a replica as a replica
        of its own (stages of ``tp`` devices, ``1/cp`` of the replica's share and of its shard fraction),
        so the data-parallel all-reduces and the sharding run over ``dp x cp`` ranks, in the rank order
        ``(replica, cp rank)`` (Megatron-Core's data-parallel group with context parallelism)."""
        cp = plan.cp
        replicas = tuple(Replica(r.batch_share / cp, tuple(Stage(s.layers, s.devices[c * s.tp:(c + 1) * s.tp], s.tp)
                                                           for s in r.stages))
                         for r in plan.replicas for c in range(cp))
        fractions = (tuple(f / cp for f in plan.shard_fractions for _ in range(cp))
                     if plan.shard_fractions is not None else None)
        return replace(plan, replicas=replicas, cp=1, shard_group=plan.shard_group * cp, shard_fractions=fractions)

    @staticmethod
    def _fraction(plan: Plan, replica: int) -> float:
        """The fraction of the sharded states each device of ``replica`` holds: sharding runs over the
        ``dp x cp`` ranks holding a unit (:meth:`_dp_view`)."""
        if plan.cp == 1:
            return plan.shard_fraction(replica)
        return plan.shard_fraction(replica) / plan.cp if plan.zero else 1.0

    def _dp_sync_cp(self, plan: Plan, pipes: list[_Pipe], trace: bool) -> tuple[float, dict, list, dict]:
        """:meth:`_dp_sync` with context parallelism: over :meth:`_dp_view`, each replica's pipe standing for
        its ``cp`` ranks; per (replica, device group) the busiest rank's seconds, events once each."""
        cp = plan.cp
        end, spent, events, chosen = self._dp_sync(self._dp_view(plan), [p for p in pipes for _ in range(cp)], trace)
        merged: dict[tuple[int, int], float] = {}
        names: dict[tuple[int, int], str] = {}
        for (r, d), t in spent.items():
            if t >= merged.get((r // cp, d), 0.0) and (r, d) in chosen:
                names[(r // cp, d)] = chosen[(r, d)]
            merged[(r // cp, d)] = max(merged.get((r // cp, d), 0.0), t)
        unique = {}
        for e in events:
            e = dict(e, replica=e["replica"] // cp)
            unique.setdefault(tuple(e.items()), e)
        return end, merged, list(unique.values()), names

    def _cp_memory_gb(self, s, plan: Plan, flight: float) -> float:
        """:meth:`PrefixTables.memory_gb` of a stage with context parallelism, without the working set:
        model states whole, the saved activations (per token) over ``cp``."""
        a, z = s.layers
        args = (a, z, s.tp, plan.micro_batch, flight, plan.recompute, plan.optimizer, plan.attention)
        total = self._tables.memory_gb(*args, working_set=False, precision=plan.precision, zero=3)
        states = self._tables.params_per_device(a, z, s.tp) * state_bytes_per_param(plan.optimizer, plan.precision) / 1e9
        # an fp8 run's cached weights (level 3 counts none) stay whole, like the states
        cache = self._tables.memory_gb(*args, working_set=False, precision=plan.precision,
                                       zero=memory_zero(plan)) - total
        return states + cache + (total - states) / plan.cp

    def _device_params(self, stage, a: int, z: int) -> list[float]:
        """Parameters each device of ``stage`` holds for units ``[a, z)`` (its share of the split ones)."""
        if stage.tp_split is None:
            return [self._tables.params_per_device(a, z, stage.tp)] * stage.tp
        return [self._tables.params_per_device(a, z, 1.0 / f) for f in param_shares(self.model, stage.tp, stage.tp_split)]

    def _device_tps(self, stage) -> list[float]:
        """Per device of ``stage``, the divisor of its split units: ``tp``, or 1 / its share of an uneven split."""
        if stage.tp_split is None:
            return [stage.tp] * stage.tp
        return [1.0 / f for f in param_shares(self.model, stage.tp, stage.tp_split)]

    def _device_memory_gb(self, stage, micro_batch: int, flight: float, recompute: str, optimizer: str,
                          attention: str, precision: str, zero: int = 0) -> list[float]:
        """Per device of ``stage``, its chunk's memory without the working set (added once per device)."""
        a, z = stage.layers
        return [self._tables.memory_gb(a, z, tp, micro_batch, flight, recompute, optimizer, attention, working_set=False,
                                       precision=precision, zero=zero)
                for tp in self._device_tps(stage)]

    def _device_working_gb(self, stage, plan: Plan) -> list[float]:
        """Per device of ``stage``, its chunk's largest working set, GB."""
        a, z = stage.layers
        return [self._tables.working_gb(a, z, tp, plan.micro_batch, plan.recompute, plan.attention)
                for tp in self._device_tps(stage)]

    def _shard_tp(self, stage) -> float:
        """``tp``, or for an uneven split 1 / the largest fraction of a split gradient one device holds.

        Replicas split differently exchange gradients either padded to the largest shard (every rank
        all-reduces a buffer of that size: ``1 / _shard_tp`` of the split part) or exactly, as the full
        tensor (``all_to_all_single`` + all-reduce of the whole); padded moves fewer bytes whenever a
        shard is under the whole, so it is the one priced."""
        if stage.tp_split is None:
            return stage.tp
        return 1.0 / float(param_shares(self.model, stage.tp, stage.tp_split).max())

    def _p2p_s(self, src, dst, micro_batch: int, flows: dict[int, int], cp: int = 1) -> float:
        """One pipeline transfer: each of the ``tp`` ranks of the wider side sends its shard; with context
        parallelism each context-parallel rank ``c`` of one stage sends its ``1/cp`` of the sequence to rank
        ``c`` of the next, and the slowest of those pairs paces the transfer."""
        tp = src.tp if src.tp >= dst.tp else dst.tp
        nbytes = self._out_bytes[src.layers[1] - 1] * micro_batch / tp
        if cp == 1:
            return p2p_time_s(nbytes, self._pair_link(src.devices[0], dst.devices[0], tp, flows))
        return max(p2p_time_s(nbytes / cp, self._pair_link(src.devices[c * src.tp], dst.devices[c * dst.tp], tp, flows))
                   for c in range(cp))

    def _pair_link(self, a: str, b: str, tp: int, flows: dict[int, int]) -> PathLink:
        """The link of a pipeline transfer from ``a``'s group to ``b``'s (first devices), cached by :meth:`_p2p_key`."""
        na, nb = self._nodes.get(a), self._nodes.get(b)
        share = (flows.get(na, tp), flows.get(nb, tp)) if na != nb or na is None else (tp, tp)
        if na != nb and self.cluster.zone_links:
            za, zb = self.cluster.device(a).zone, self.cluster.device(b).zone
            if za != zb:
                share += (flows.get(frozenset((za, zb)), tp),)
        key = self._p2p_key(a, b, na, nb, share)
        link = self._p2p.get(key)
        if link is None:
            self._node_id(a), self._node_id(b)  # an unknown device: its clear error
            link = self._p2p[key] = self._p2p_link(a, b, share)
        return link

    def _p2p_key(self, a: str, b: str, na: int | None, nb: int | None, share: tuple[int, int]) -> tuple:
        """What :meth:`_p2p_link` depends on: inside a node, the node group and the two GPUs' places (a
        cube-mesh wires some pairs only); between nodes, the two node groups (their NICs, zones and
        the link between the zones) and the flows sharing each node's NICs; nothing for one device."""
        if a == b:
            return ("self",)
        (ga, la), (gb, lb) = self._places.get(a, (a, a)), self._places.get(b, (b, b))
        return (ga, la, lb) if na == nb and na is not None else (ga, gb, share)

    def _pipeline_flows(self, plan: Plan) -> dict:
        """Per node: how many pipeline transfers cross its NICs at once, shards counted (each of a
        stage's ``tp`` ranks sends its ``1/tp``). Replicas run in step, so the transfers of every
        replica's boundary leave together; a node sends forward on its outgoing boundaries while its
        incoming ones send gradients back to it, so the larger of the two counts is what shares its NICs.
        Interleaved chunks of one device pair send one after another and count once. Per pair of zones
        (a ``frozenset`` key), the same count for the link between them: the larger of the transfers
        crossing it one way and the other."""
        return self._pipeline_flows_plain(plan) if plan.cp == 1 else self._pipeline_flows_walk(plan)

    def _pipeline_flows_walk(self, plan: Plan) -> dict:
        """:meth:`_pipeline_flows` boundary by boundary and context-parallel rank by rank (any plan)."""
        out: dict = {}
        into: dict = {}
        zoned = bool(self.cluster.zone_links)
        for r, rep in enumerate(plan.replicas):
            pp = plan.pipeline_devices(r)
            seen = set()
            for k in range(rep.pp - 1):
                src, dst = rep.stages[k], rep.stages[k + 1]
                pair = (k % pp, (k + 1) % pp)
                for c in range(plan.cp):  # context-parallel rank c sends to rank c of the next stage
                    na = self._node_id(src.devices[c * src.tp])
                    nb = self._node_id(dst.devices[c * dst.tp])
                    if na == nb or (pair, c) in seen:
                        continue
                    seen.add((pair, c))
                    shards = max(src.tp, dst.tp)
                    out[na] = out.get(na, 0) + shards
                    into[nb] = into.get(nb, 0) + shards
                    if zoned:
                        za = self.cluster.device(src.devices[c * src.tp]).zone
                        zb = self.cluster.device(dst.devices[c * dst.tp]).zone
                        if za != zb:  # one way a -> b is what b -> a receives
                            out[(za, zb)] = out.get((za, zb), 0) + shards
        flows = {n: max(out.get(n, 0), into.get(n, 0)) for n in out.keys() | into.keys() if not isinstance(n, tuple)}
        for za, zb in [n for n in out if isinstance(n, tuple)]:
            flows[frozenset((za, zb))] = max(out.get((za, zb), 0), out.get((zb, za), 0))
        return flows

    def _pipeline_flows_plain(self, plan: Plan) -> dict:
        """:meth:`_pipeline_flows` without context parallelism: a replica's distinct device pairs are its first
        ``pp`` boundaries (an interleaved pipeline's later chunks repeat them), counted at once; the same dict as
        :meth:`_pipeline_flows_walk` (``tests/test_bound_s53_soundness.py``), a 1,024-GPU plan's in a
        fraction of the time."""
        v = plan.chunks_per_device
        node_id = self._node_id
        paths = []
        for rep in plan.replicas:
            stages = rep.stages
            hops = min(len(stages) - 1, len(stages) // v)
            if hops >= 1:
                ends = stages[:hops + 1]
                paths.append(([node_id(s.devices[0]) for s in ends], [s.tp for s in ends]))
        return self._flows_of_paths(paths)

    def _flows_of_paths(self, paths: Iterable[tuple[Sequence[int], Sequence[int]]]) -> dict:
        """:meth:`_pipeline_flows_plain` from each replica's distinct hops: (the nodes of its stages, their ``tp``)."""
        out: Counter = Counter()
        into: Counter = Counter()
        crossing: list[tuple[int, int, int]] = []
        for ends, tps in paths:
            for k in range(len(ends) - 1):
                na, nb = ends[k], ends[k + 1]
                if na != nb:
                    src, dst = tps[k], tps[k + 1]
                    shards = src if src >= dst else dst
                    out[na] += shards
                    into[nb] += shards
                    crossing.append((na, nb, shards))
        flows: dict = {n: max(out.get(n, 0), into.get(n, 0)) for n in out.keys() | into.keys()}
        if self.cluster.zone_links and crossing:
            zone_of, names = self._node_zone, self.cluster.zones
            ways: Counter = Counter()
            for na, nb, shards in crossing:
                za, zb = zone_of[na], zone_of[nb]
                if za != zb:  # one way a -> b is what b -> a receives
                    ways[(int(za), int(zb))] += shards
            for za, zb in list(ways):
                flows[frozenset((names[za], names[zb]))] = max(ways[(za, zb)], ways.get((zb, za), 0))
        return flows

    def _send_blocks(self, src, dst) -> bool:
        """Whether the sender of a pipeline transfer waits for it: always in Megatron-style engines
        (``overlap_p2p=False``); otherwise only over TCP (the socket transport's proxy threads and
        host-memory copies do not run beside compute the way RDMA does)."""
        if not self.overlap_p2p:
            return True
        a, b = src.devices[0], dst.devices[0]
        if self.cluster.device(a).node_key == self.cluster.device(b).node_key:
            return False
        return not (self.cluster.group_of(a).nic.rdma and self.cluster.group_of(b).nic.rdma)

    def _p2p_link(self, a: str, b: str, flows: tuple[int, ...]) -> PathLink:
        """The link one transfer from ``a``'s node to ``b``'s gets when ``flows`` transfers (on ``a``'s
        node, on ``b``'s) share each node's NICs and, a third count, the link between their zones."""
        link = achieved_link(self._p2p_cluster, a, b)
        if link is None:
            raise PlanError(f"pipeline: devices {a} and {b} sit in zones without a link; add one under 'links'")
        if link.kind in ("nic", "inter_zone"):
            share = min(node_nic_gbyte_s(self._p2p_cluster.group_of(d)) / n for d, n in zip((a, b), flows))
            if len(flows) > 2:
                wan = zone_gbyte_s(self._p2p_cluster, self.cluster.device(a).zone, self.cluster.device(b).zone)
                share = min(share, wan / max(flows[2], 1))
            if share < link.bandwidth_gbyte_s:
                link = PathLink(share, link.latency_us, link.kind)
        return link

    # --------------------------------------------------------------------------------- pipelines
    def _pipe(self, plan: Plan, r: int, trace: bool, seen: dict, flows: dict[int, int],
              shard_comm: dict | None = None, alike: dict | None = None, cp_flows: dict[int, int] | None = None) -> _Pipe:
        """Replica ``r``'s pipeline. ``seen``: pipeline timings by their stage costs, and ``alike``: pipes
        by what they are computed from, both shared by the replicas of one plan (equal replicas share one
        :class:`_Pipe`; nothing changes a pipe once built). ``cp_flows``: :meth:`_cp_flows` (``cp > 1``)."""
        rep = plan.replicas[r]
        stages = rep.stages
        v = plan.chunks_per_device
        m = microbatches_run(plan, r)
        settings = (plan.micro_batch, plan.precision, plan.recompute, plan.attention)
        stage_units = self._stage_units
        prefix = []
        for s in stages:
            if plan.cp > 1:
                prefix.append(self._cp_unit_prefix(s, plan, cp_flows))
                continue
            units = stage_units.get((s.devices, s.tp, s.tp_split, settings))
            if units is None:
                units = stage_units[(s.devices, s.tp, s.tp_split, settings)] = self._unit_prefix(
                    s.devices, s.tp, plan.micro_batch, plan.precision, plan.recompute, s.tp_split, plan.attention)
            prefix.append(units)
        k_total = rep.pp
        p2p = [self._p2p_s(stages[k], stages[k + 1], plan.micro_batch, flows, plan.cp) for k in range(k_total - 1)]
        blocks = [self._send_blocks(stages[k], stages[k + 1]) for k in range(k_total - 1)] if self.overlap_p2p else None
        key = None
        if alike is not None and not trace and not shard_comm:  # unit costs live in caches: their ids are stable
            key = (m, tuple(map(id, prefix)), tuple(s.layers for s in stages), tuple(p2p),
                   tuple(blocks) if blocks is not None else None)
            hit = alike.get(key)
            if hit is not None:
                return hit
        fwd, bwd, compute, tp, ring, ring_link = [], [], [], [], [], []
        for k, (s, units) in enumerate(zip(stages, prefix)):
            f, b, tf, tb = units.fwd, units.bwd, units.tp_fwd, units.tp_bwd
            a, z = s.layers
            cf, cb, tpf, tpb = f[z] - f[a], b[z] - b[a], tf[z] - tf[a], tb[z] - tb[a]
            xf, xb = self._shard_exposed_s(plan, shard_comm.get((r, k)), units) if shard_comm else (0.0, 0.0)
            fwd.append(cf + tpf + xf)
            bwd.append(cb + tpb + xb)
            compute.append(cf + cb)
            if units.cp_fwd is None:
                tp.append(tpf + tpb)
                continue
            exposed = (units.cp_fwd[z] - units.cp_fwd[a]) + (units.cp_bwd[z] - units.cp_bwd[a])
            tp.append(tpf + tpb - exposed)
            ring.append(exposed)
            ring_link.append(units.cp_link[z] - units.cp_link[a])
        # a blocking send keeps its device busy after the operation and the receiver gets the data
        # when it ends; an overlapped one only delays the receiver
        if blocks is not None:
            fwd_send = [p2p[k] if k < k_total - 1 and blocks[k] else 0.0 for k in range(k_total)]
            bwd_send = [p2p[k - 1] if k > 0 and blocks[k - 1] else 0.0 for k in range(k_total)]
            delay = [0.0 if blocked else t for t, blocked in zip(p2p, blocks)]
        else:  # every send blocks
            fwd_send, bwd_send, delay = p2p + [0.0], [0.0] + p2p, [0.0] * (k_total - 1)
        fwd = [f + x for f, x in zip(fwd, fwd_send)]
        bwd = [b + x for b, x in zip(bwd, bwd_send)]
        pipe = _Pipe(rep.pp // v, m, fwd, bwd, compute, tp, p2p, 0.0, [], prefix, fwd_send=fwd_send,
                     bwd_send=bwd_send, cp=ring, cp_link=ring_link)
        if trace:
            timing = pipeline_timing(np.repeat(np.array(fwd)[:, None], m, axis=1),
                                     np.repeat(np.array(bwd)[:, None], m, axis=1), delay, plan.schedule, v)
            pipe.timing, pipe.makespan = timing, timing.makespan_s
            pipe.last_bwd = timing.last_backward_end_s(rep.pp).tolist()
            return pipe
        timing_key = (tuple(fwd), tuple(bwd), tuple(delay), m)  # equal pipelines are simulated once
        if timing_key not in seen:
            seen[timing_key] = pipeline_summary(fwd, bwd, delay, plan.schedule, m, v)
        pipe.makespan, pipe.last_bwd = seen[timing_key]
        if key is not None:
            alike[key] = pipe
        return pipe

    def _sharing_cores(self, plan: Plan, pipes: list[_Pipe], trace: bool) -> list[_Pipe]:
        """The pipes of ``plan`` when all its processes share the host's cores (the profile's
        :class:`~hetpart.costmodel.profile.CoreSharing`): every replica's operations run at once under
        processor sharing (:func:`~hetpart.costmodel.schedule.simulate_shared_cores`), each stage's
        tensor-parallel ranks being that many processes; a blocking send counts as its device's work, an
        overlapped one as a wait. New pipes with their finish times (the others are shared)."""
        v = plan.chunks_per_device
        shared = []
        for rep, pipe in zip(plan.replicas, pipes):
            delay = [t - sent for t, sent in zip(pipe.p2p, pipe.fwd_send)]
            shared.append(SharedPipeline(np.repeat(np.array(pipe.fwd)[:, None], pipe.m, axis=1),
                                         np.repeat(np.array(pipe.bwd)[:, None], pipe.m, axis=1), np.array(delay),
                                         plan.schedule, v, tuple(len(s.devices) for s in rep.stages[:rep.pp // v])))
        out = []
        for rep, pipe, timing in zip(plan.replicas, pipes, simulate_shared_cores(shared, self._sharing.capacity)):
            # the report's busy seconds are wall seconds: an operation time-sliced to half a core is busy
            # twice as long, not idle (its device's bubble stays the pipeline's own)
            wall = timing.busy_s()
            stretch = [float(wall[k % pipe.pp] / max(1e-300, sum(pipe.fwd[j] + pipe.bwd[j]
                                                                for j in range(k % pipe.pp, rep.pp, pipe.pp)) * pipe.m))
                       for k in range(rep.pp)]

            def wall_s(values: list[float], stretch: list[float] = stretch) -> list[float]:
                return [x * f for x, f in zip(values, stretch)] if values else values

            out.append(replace(pipe, fwd=wall_s(pipe.fwd), bwd=wall_s(pipe.bwd), compute=wall_s(pipe.compute),
                               tp=wall_s(pipe.tp), fwd_send=wall_s(pipe.fwd_send), bwd_send=wall_s(pipe.bwd_send),
                               cp=wall_s(pipe.cp), makespan=timing.makespan_s,
                               last_bwd=timing.last_backward_end_s(rep.pp).tolist(),
                               timing=timing if trace else pipe.timing))
        return out

    # --------------------------------------------------------------------------------- data parallel
    def _stage_table(self, plan: Plan, pipes: list[_Pipe] | None = None) -> _StageTable:
        """Every (replica, virtual stage) of ``plan`` numbered flat, with what the all-reduces need."""
        offsets, first_device, tp, group, shard_tp, first_unit = [], [], [], [], [], []
        last_bwd, device_done, sends, rows = [], [], [], []
        prefixes: dict[int, int] = {}
        tables: list[_UnitPrefix] = []
        group_count = 0
        for r, rep in enumerate(plan.replicas):
            offsets.append(len(first_device))
            pp = plan.pipeline_devices(r)
            stages = rep.stages
            first_device += [s.devices[0] for s in stages]
            tp += [s.tp for s in stages]
            shard_tp += [self._shard_tp(s) if s.tp_split is not None else s.tp for s in stages]
            first_unit += [s.layers[0] for s in stages]
            group += [group_count + k % pp for k in range(len(stages))]
            if pipes is not None:
                pipe = pipes[r]
                ends = pipe.last_bwd
                last_bwd += ends
                sends += pipe.bwd_send
                for units in pipe.bwd_prefix:
                    row = prefixes.get(id(units))
                    if row is None:
                        row = prefixes[id(units)] = len(tables)
                        tables.append(units)
                    rows.append(row)
                if pp == len(ends):
                    device_done += ends
                else:  # interleaved: a device is done after the last backward of all its chunks
                    done = [max(ends[d::pp]) for d in range(pp)]
                    device_done += [done[k % pp] for k in range(len(ends))]
            group_count += pp
        nodes = self._nodes
        last = np.array(last_bwd)
        width = self.model.num_units + 1
        return _StageTable(np.array(offsets), first_device, np.array([nodes[d] for d in first_device]), np.array(tp),
                           np.array(group), last, np.array(device_done), np.array(shard_tp, dtype=float),
                           np.array(first_unit), last - np.array(sends), np.array(rows, dtype=np.int64),
                           np.array([u.bwd_np for u in tables]).reshape(-1, width),
                           np.array([u.tp_bwd_np for u in tables]).reshape(-1, width))

    def _bucket_params(self, plan: Plan) -> float:
        """Gradients per data-parallel bucket: Megatron-LM's ``max(40M, 1M x dp)`` (dp counting the context-parallel
        ranks, ``DistributedDataParallel``'s default ``bucket_size``, so each rank's share of a bucket holds at
        least 1M) where the simulator keeps Megatron's 40M, else the engine's own ``grad_bucket_params``."""
        if self.grad_bucket_params != MEGATRON_BUCKET_PARAMS:
            return self.grad_bucket_params
        return max(self.grad_bucket_params, 1_000_000.0 * plan.dp * plan.cp)

    def _dp_segments(self, plan: Plan, table: _StageTable | None = None) -> list[_Segment]:
        """Runs of consecutive units ``[a, z)`` held by the same (replica, stage) set, with their gradient
        bytes per device (the smallest TP shard among the holders) and those of unit ``a`` alone (the
        last bucket the backward finishes), plus tied-embedding copies (one bucket each, ``a = z = -1``)."""
        return self._dp_runs(plan, table or self._stage_table(plan))[0]

    def _dp_runs(self, plan: Plan, table: _StageTable) -> tuple[list[_Segment], np.ndarray]:
        """:meth:`_dp_segments`, and ``[runs, dp]``: the flat stage numbers of each run's holders, one per
        replica in replica order (the segments before the tied copies, row by row)."""
        grad_bytes = grad_reduce_bytes(plan.precision)
        bucket = self._bucket_params(plan) * grad_bytes
        units = self.model.num_units
        cuts = np.array(sorted(set(table.first_unit.tolist()) | {units}))
        # the stage of each replica holding each run, [runs, dp]: one search over every replica's stage
        # starts, each replica's shifted past the last one's (a replica's stages start in ascending order)
        replica_of = np.repeat(np.arange(plan.dp), np.diff(np.append(table.offsets, len(table.first_unit))))
        keys = replica_of * (units + 1) + table.first_unit
        flat = np.searchsorted(keys, np.arange(plan.dp)[None, :] * (units + 1) + cuts[:-1, None], side="right") - 1
        held = flat - table.offsets[None, :]
        replicas = np.arange(plan.dp)
        out, rows = [], []
        if plan.dp > 1:
            tp_min = table.shard_tp[flat].min(axis=1).tolist()
            for i, (a, z) in enumerate(zip(cuts[:-1].tolist(), cuts[1:].tolist())):
                sharded, whole = self._run_params(a, z)
                first_sharded, first_whole = self._run_params(a, a + 1)
                nbytes = (sharded / tp_min[i] + whole) * grad_bytes
                if nbytes > 0:
                    first = (first_sharded / tp_min[i] + first_whole) * grad_bytes
                    out.append(_Segment(np.column_stack((replicas, held[i])), a, z, nbytes,
                                        min(nbytes, max(first, bucket))))
                    rows.append(i)
        return out + self._tied_segments(plan, cuts, held, table, grad_bytes), flat[rows]

    def _tied_segments(self, plan: Plan, cuts: np.ndarray, held: np.ndarray, table: _StageTable,
                       grad_bytes: int) -> list[_Segment]:
        owner = self._tables.owner
        if owner < 0:
            return []

        def holders_of(u):
            run = int(np.searchsorted(cuts, u, side="right")) - 1
            return {(r, int(k)) for r, k in enumerate(held[run])}

        out = []
        for u in self._tables.sharers:
            hu, ho = holders_of(u), holders_of(owner)
            if hu == ho:
                continue
            if self._tied_pairs:  # one pair per replica whose copy and owner sit on different stages
                groups = [np.array(sorted({(r, k), (r, ko)})) for (r, k), (_, ko) in zip(sorted(hu), sorted(ho))
                          if k != ko]
            else:
                groups = [np.array(sorted(hu | ho))]
            for holders in groups:
                tp_min = float(table.shard_tp[holders[:, 1] + table.offsets[holders[:, 0]]].min())
                nbytes = self.model.units[u].shared_params * grad_bytes / tp_min
                if len(holders) > 1 and nbytes > 0:  # ready when both copies' units are done
                    out.append(_Segment(holders, -1, -1, nbytes, nbytes))
        return out

    @property
    def _tied_pairs(self) -> bool:
        """How a tied weight's copies (a head sharing its embedding) sum their gradients. Megatron-LM (the
        ``fused`` kernel set): each copy is reduced with the rest of its stage's gradients, in that stage's
        data-parallel buffer, then ``finalize_model_grads`` all-reduces the copy with its owner in each
        pipeline's embedding group (its first and last stage, one 2-member group per pipeline and
        tensor-parallel rank, all at once: megatron/core/distributed/finalize_model_grads.py,
        ``_allreduce_word_embedding_grads``). hetpart's runtime (``torch``) reduces a tied weight once, in one
        bucket over every rank holding a copy (runtime.groups)."""
        return self.kernels == "fused"

    def _run_params(self, a: int, z: int) -> tuple[float, float]:
        """(sharded, replicated) parameters whose gradients a run ``[a, z)`` reduces in its data-parallel
        buckets: its units' own and, under Megatron's tied sync (:attr:`_tied_pairs`), a copy it holds apart
        from the copy's owner."""
        sharded, whole = self._tables.params(a, z)
        if self._tied_pairs and not a <= self._tables.owner < z:
            copy_sharded, copy_whole = self._tables.shared(a, z)
            sharded, whole = sharded + copy_sharded, whole + copy_whole
        return sharded, whole

    def _allreduce_lines(self, ring: tuple, collective: str = "allreduce") -> tuple[tuple[float, float], ...]:
        """``(fixed_s, per_byte_s)`` of NCCL's candidate lines for ``ring`` (from :meth:`_ring`); a
        ``reduce_scatter`` (or all-gather) of the whole buffer takes NCCL's rings only."""
        key, members, (concurrent, zone) = ring
        key = key if collective == "allreduce" else (collective, key)
        lines = self._ar.get(key)
        if lines is None:
            found = allreduce_lines(members(), self._ar_cluster, concurrent, self._hop_links, collective, zone)
            lines = self._ar[key] = tuple((line.fixed_s, line.per_byte_s) for line in found)
            self._ar_names[key] = tuple(line.name for line in found)
        return lines

    def _reduce_scatter_s(self, nbytes: float, ring: tuple) -> float:
        """Reduce-scatter (or all-gather) of a buffer of ``nbytes`` over ``ring``: NCCL's fastest ring."""
        if nbytes <= 0:
            return 0.0
        return min((fixed + per_byte * nbytes for fixed, per_byte in self._allreduce_lines(ring, "reduce_scatter")),
                   default=0.0)

    def _allreduce_s(self, nbytes: float, ring: tuple) -> float:
        """All-reduce of ``nbytes`` over ``ring`` (from :meth:`_ring`): NCCL's fastest line."""
        if nbytes <= 0:
            return 0.0
        return min((fixed + per_byte * nbytes for fixed, per_byte in self._allreduce_lines(ring)), default=0.0)

    def _bucketed_s(self, nbytes: float, bucket_bytes: float, ring: tuple) -> float:
        """A run of ``nbytes`` of gradients all-reduced as ``ceil(nbytes / bucket_bytes)`` equal calls:
        each call pays NCCL's latency (a ring's grows with its members) at its own algorithm."""
        if nbytes <= 0:
            return 0.0
        calls = max(1, math.ceil(nbytes / bucket_bytes - 1e-9)) if bucket_bytes > 0 else 1
        return calls * self._allreduce_s(nbytes / calls, ring)

    def _collective(self, nbytes: float, ring: tuple, collective: str = "allreduce") -> str:
        """The name (``algorithm/protocol``) of the line NCCL runs for ``nbytes`` over ``ring``."""
        lines = self._allreduce_lines(ring, collective)
        if nbytes <= 0 or not lines:
            return ""
        best = min(range(len(lines)), key=lambda i: lines[i][0] + lines[i][1] * nbytes)
        return self._ar_names[ring[0] if collective == "allreduce" else (collective, ring[0])][best]

    def _ring(self, plan: Plan, holders: np.ndarray, table: _StageTable | None = None,
              flows: dict[int, int] | None = None) -> tuple:
        """``(cache key, members, (concurrent rings, rings across its zone links))`` of the all-reduce among
        the holding stages (one member per stage; its ``tp`` ranks run ``tp`` such rings at once). ``flows``
        (:meth:`_ring_flows`) counts the shards of crossing rings on each node; divided by this ring's own
        members there it is how many such all-reduces share the node's NICs at once; per zone (``("zone",
        z)`` keys) the same for the zone links (:func:`~hetpart.costmodel.collectives.zone_concurrency`).
        The cost depends only on which nodes the members sit on and on that sharing, so that is the key;
        ``members()`` lists them when needed."""
        table = table or self._stage_table(plan)
        flat = table.offsets[holders[:, 0]] + holders[:, 1]
        tp = int(table.tp[flat].max())
        concurrent = tp
        if flows:
            nodes, here = np.unique(table.node[flat], return_counts=True)
            concurrent = max([concurrent] + [flows.get(n, 0) / c for n, c in zip(nodes.tolist(), here.tolist())])
        zone = self._zone_concurrency(table.node[flat].tolist(), tp, flows)

        def members() -> tuple[str, ...]:
            return tuple(dict.fromkeys(table.first_device[i] for i in flat.tolist()))

        return (np.sort(table.node[flat]).tobytes(), concurrent, zone), members, (concurrent, zone)

    def _zone_concurrency(self, nodes: list[int], tp: int, flows: dict | None) -> float | None:
        """:func:`~hetpart.costmodel.collectives.zone_concurrency` of a ring whose members sit on ``nodes``."""
        if not self._zoned:
            return None
        return zone_concurrency([("zone", z) for z in self._node_zone[nodes].tolist()], tp, flows or {})

    def _ring_flows(self, rings) -> dict:
        """:func:`~hetpart.costmodel.collectives.nic_flows` of ``rings`` (members ``(node, device group, tp)``)
        and, where the cluster has zones, the same count per zone over the rings crossing a zone link
        (``("zone", z)`` keys): the rings crossing a zone link share it as those leaving a node share its NICs."""
        rings = [list(members) for members in rings]
        flows = nic_flows(rings)
        if self._zoned:
            zone = self._node_zone
            by_zone = nic_flows([[(int(zone[n]), g, tp) for n, g, tp in members] for members in rings])
            flows.update({("zone", z): c for z, c in by_zone.items()})
        return flows

    def _crosses_tcp(self, devices) -> bool:
        """Whether an all-reduce among ``devices`` leaves a node over a TCP NIC: NCCL's socket transport
        (proxy threads, copies through host memory) does not run beside the backward the way RDMA
        does, so such an all-reduce is not overlapped."""
        nodes = {self.cluster.device(d).node_key for d in devices}
        return len(nodes) > 1 and not all(self.cluster.groups[g].nic.rdma for g, _ in nodes)

    def _node_id(self, device_id: str) -> int:
        try:
            return self._nodes[device_id]
        except KeyError:
            self.cluster.device(device_id)  # raises SpecError naming the unknown id
            raise

    def _dp_jobs(self, plan: Plan, pipes: list[_Pipe], table: _StageTable, segments: list[_Segment],
                 runs: np.ndarray) -> list[_Job]:
        """One job per all-reduce of :meth:`_dp_sync` over stage tables: the runs (``runs``, one row each)
        all at once in numpy, then the tied copies one by one."""
        overlap = self.overlap_grad_reduce
        if overlap:  # when every holder has the gradient of a run's first (last bucket) and last unit (first)
            last = table.grad_ready_s(runs, np.array([seg.a for seg in segments[:len(runs)]], dtype=np.int64)[:, None])
            first = table.grad_ready_s(runs, np.array([seg.z - 1 for seg in segments[:len(runs)]], dtype=np.int64)[:, None])
            ready_last, ready_first = last.max(axis=1).tolist(), first.max(axis=1).tolist()
        pad = collective_pad(plan, range(plan.dp)) if plan.zero else 1.0  # padded bytes for uneven shards
        tied = [table.offsets[seg.holders[:, 0]] + seg.holders[:, 1] for seg in segments[len(runs):]]
        nodes = table.node[runs]
        crossing = nodes.min(axis=1) != nodes.max(axis=1)
        flows = self._table_flows(table, runs[crossing], tied)
        zones = None
        if self._zoned:
            place = self._node_zone[table.node]
            zones = place[runs]
            across = zones.min(axis=1) != zones.max(axis=1)
            flows.update({("zone", z): c for z, c in self._table_flows(table, runs[across], tied, place).items()})
        rings = self._run_rings(table, runs, nodes, flows, zones)
        pairs = np.array(tied) if tied and all(len(f) == 2 for f in tied) else None
        if pairs is not None:  # Megatron's tied pairs (one per pipeline): their rings at once, as the runs'
            rings += self._run_rings(table, pairs, table.node[pairs], flows,
                                     self._node_zone[table.node][pairs] if self._zoned else None)
            pair_groups = np.sort(table.group[pairs], axis=1)
            pair_groups = [g[:1] if g[0] == g[1] else g for g in pair_groups]
        tcp = (crossing & ~self._node_rdma[nodes].all(axis=1)).tolist()  # _crosses_tcp of each run
        groups = list(table.group[runs])  # one per replica, ascending: np.unique's order
        done = table.device_done[runs].max(axis=1).tolist() if not overlap else None
        priced: dict = {}  # (ring, bytes) -> (seconds, collective) of the tied copies (pairs repeat)
        jobs = []
        for i, seg in enumerate(segments):
            if plan.zero >= 2 and seg.a >= 0:
                continue  # reduce-scattered every micro-batch, inside the backward (_shard_comm)
            if seg.a >= 0:
                ring, group = rings[i], groups[i]
            else:
                flat = tied[i - len(runs)]
                if pairs is not None:
                    ring, group = rings[i], pair_groups[i - len(runs)]
                else:
                    ring, group = self._ring(plan, seg.holders, table, flows), np.unique(table.group[flat])
                key = (ring[0], seg.nbytes)
                if key not in priced:
                    priced[key] = (self._allreduce_s(seg.nbytes, ring), self._collective(seg.nbytes, ring))
                t, name = priced[key]
                jobs.append(_Job(*self._tied_ready(table, flat, overlap), group, t, t, (-seg.nbytes, seg.a), name,
                                 self._tied_pairs))
                continue
            # sharded plans reduce-scatter the run as one call (as sharding_reference prices them), of the
            # padded bytes (the ring's latency once)
            scatter = bool(plan.zero) and seg.a >= 0
            t = (self._reduce_scatter_s(seg.nbytes * pad, ring) if scatter
                 else self._bucketed_s(seg.nbytes, seg.last_bytes, ring))
            last_t = self._reduce_scatter_s(seg.last_bytes * pad, ring) if scatter else \
                self._allreduce_s(seg.last_bytes, ring)
            name = self._collective(seg.last_bytes, ring, "reduce_scatter" if scatter else "allreduce")
            if not overlap:  # the runtime's order: largest first (runtime.groups.fuse_buckets)
                jobs.append(_Job(done[i], done[i], group, t, t, (-seg.nbytes, seg.a), name))
            elif tcp[i]:  # after the backward that holds it: no overlap over TCP
                jobs.append(_Job(ready_last[i], ready_last[i], group, t, t, None, name))
            else:
                jobs.append(_Job(ready_first[i], ready_last[i], group, t, last_t, None, name))
        return jobs

    @staticmethod
    def _tied_ready(table: _StageTable, flat: np.ndarray, overlap: bool) -> tuple[float, float]:
        """When a tied copy's all-reduce may start: its stages' last backwards (with overlap), else their
        devices' whole backward; the same for its first and last bucket (it is one)."""
        end = float(table.last_bwd[flat].max() if overlap else table.device_done[flat].max())
        return end, end

    @staticmethod
    def _table_flows(table: _StageTable, crossing: np.ndarray, tied: list[np.ndarray],
                     place: np.ndarray | None = None) -> dict[int, float]:
        """:func:`~hetpart.costmodel.collectives.nic_flows` over stage tables: ``crossing``, the runs whose holders span nodes (a row
        each: one stage of every replica, so one device group per replica); ``tied``, the flat holders of
        each tied copy. A device group's stages share its devices, so its node and ``tp`` are those of
        any of its stages. ``place``: per flat stage what the flows are counted by (default its node; its
        zone for the zone links)."""
        place = table.node if place is None else place
        size = int(table.group.max()) + 1
        groups = table.group[crossing]  # [runs, replicas]
        out = [np.unique(table.group[flat]) for flat in tied if place[flat].min() != place[flat].max()]
        if not len(groups) and not out:
            return {}
        busy = np.bincount(groups.ravel(), minlength=size)
        for g in out:
            busy[g] += 1
        active = np.zeros(size)
        if len(groups):
            np.add.at(active, groups.ravel(), np.repeat(1.0 / busy[groups].max(axis=1), groups.shape[1]))
        for g in out:
            active[g] += 1.0 / busy[g].max()
        mask = active > 0
        group_tp = np.zeros(size, dtype=np.int64)
        np.maximum.at(group_tp, table.group, table.tp)
        group_node = np.zeros(size, dtype=np.int64)
        group_node[table.group] = place
        per_node = np.bincount(group_node[mask], weights=(group_tp * np.minimum(active, 1.0))[mask])
        return {n: float(c) for n, c in enumerate(per_node.tolist()) if c}

    @staticmethod
    def _run_rings(table: _StageTable, runs: np.ndarray, nodes: np.ndarray, flows: dict,
                   zones: np.ndarray | None = None) -> list[tuple]:
        """:meth:`_ring` of every run at once (``runs``: flat holders, a row each; ``nodes``: their nodes;
        ``zones``: their zones, where the cluster has several): the same keys and concurrency, element by element."""
        if not len(runs):
            return []
        concurrent = Simulator._run_concurrency(table, runs, nodes, {n: c for n, c in flows.items() if type(n) is int})
        zone = [None] * len(runs)
        if zones is not None:
            across = (zones.min(axis=1) != zones.max(axis=1)).tolist()
            by_zone = Simulator._run_concurrency(table, runs, zones, {z: c for (_, z), c in
                                                                       (i for i in flows.items() if type(i[0]) is tuple)})
            zone = [c if a else None for c, a in zip(by_zone, across)]
        ordered = np.sort(nodes, axis=1)

        def members(row: np.ndarray) -> Callable[[], tuple[str, ...]]:
            return lambda: tuple(dict.fromkeys(table.first_device[i] for i in row.tolist()))

        return [((ordered[i].tobytes(), c, z), members(runs[i]), (c, z)) for i, (c, z) in enumerate(zip(concurrent, zone))]

    @staticmethod
    def _run_concurrency(table: _StageTable, runs: np.ndarray, nodes: np.ndarray, flows: dict) -> list:
        """Per run: its ``tp``, or the largest ``flows`` count on one of its ``nodes`` over its members there."""
        concurrent = table.tp[runs].max(axis=1).tolist()
        if flows:
            width = max(int(nodes.max()), max(flows)) + 1
            count = np.bincount((np.arange(len(runs))[:, None] * width + nodes).ravel(),
                                minlength=len(runs) * width).reshape(len(runs), width)
            share = np.zeros(width)
            share[list(flows)] = list(flows.values())
            # flows.get(n, 0) / (members on n), the largest over the ring's nodes
            most = np.divide(share, count, out=np.zeros(count.shape), where=count > 0).max(axis=1).tolist()
            concurrent = [c if c >= m else m for c, m in zip(concurrent, most)]
        return concurrent

    def _dp_sync(self, plan: Plan, pipes: list[_Pipe], trace: bool) -> tuple[float, dict, list, dict]:
        """(end of the last gradient all-reduce, dp seconds per (replica, device group), events).

        A run of units is all-reduced bucket by bucket while the last backward still runs: it ends at
        the later of "first unit ready + all buckets' time" and "last unit ready + the last bucket's
        time", the last bucket holding ``grad_bucket_params`` gradients (or the whole run, or the
        first unit if larger) -- exact for equal units, whose readiness is evenly spaced. Runs sharing a device group go one after another.
        Without ``overlap_grad_reduce`` a run starts once every holder's device has finished its whole
        backward, largest run first (the order hetpart's runtime all-reduces its fused buckets in).
        """
        if plan.dp < _VECTOR_MIN_REPLICAS or (plan.zero and plan.shard_group):
            return self._dp_sync_small(plan, pipes, trace)
        table = self._stage_table(plan, pipes)
        segments, runs = self._dp_runs(plan, table)
        if not segments:
            return 0.0, {}, [], {}
        jobs = _job_order(self._dp_jobs(plan, pipes, table, segments, runs), self.overlap_grad_reduce)
        free = np.zeros(int(table.group.max()) + 1)
        spent = np.zeros_like(free)
        used = np.zeros(free.shape, dtype=bool)
        largest = np.zeros_like(free)  # per group: its largest all-reduce's seconds and job
        which = np.full(free.shape, -1, dtype=np.int64)
        events = []
        end_all = 0.0
        keys = [(r, d) for r, pipe in enumerate(pipes) for d in range(pipe.pp)]  # flat group -> (replica, device)
        for j, job in enumerate(jobs):
            start = max(job.first, float(free[job.groups].max()))
            end = max(start + job.time_s, job.last + job.last_time_s)
            free[job.groups] = end
            spent[job.groups] += job.time_s
            used[job.groups] = True
            bigger = job.groups[largest[job.groups] < job.time_s]
            largest[bigger], which[bigger] = job.time_s, j
            end_all = max(end_all, end)
            if trace:
                events += [{"replica": r, "stage": d, "microbatch": -1, "kind": "dp_sync", "start_s": start,
                            "end_s": end} for r, d in (keys[g] for g in job.groups.tolist())]
        groups = np.flatnonzero(used).tolist()
        per_group = {keys[g]: float(spent[g]) for g in groups}
        chosen = {keys[g]: jobs[which[g]].collective for g in groups if which[g] >= 0}
        return end_all, per_group, events, chosen

    # --------------------------------------------------------------------------------- data parallel, few replicas
    def _dp_segments_small(self, plan: Plan) -> list[_Segment]:
        """:meth:`_dp_segments` with holders as tuples of (replica, stage) pairs."""
        grad_bytes = grad_reduce_bytes(plan.precision)
        bucket = self._bucket_params(plan) * grad_bytes
        cuts = sorted({s.layers[0] for rep in plan.replicas for s in rep.stages} | {self.model.num_units})
        starts = [[s.layers[0] for s in rep.stages] for rep in plan.replicas]
        out = []
        spans: list[tuple[int, int, tuple]] = []
        for a, z in zip(cuts[:-1], cuts[1:]):
            holders = tuple((r, bisect_right(starts[r], a) - 1) for r in range(plan.dp))
            spans.append((a, z, holders))
            if plan.dp > 1:
                tp_min = min(self._shard_tp(plan.replicas[r].stages[k]) for r, k in holders)
                sharded, whole = self._run_params(a, z)
                first_sharded, first_whole = self._run_params(a, a + 1)
                nbytes = (sharded / tp_min + whole) * grad_bytes
                first = (first_sharded / tp_min + first_whole) * grad_bytes
                out.append(_Segment(holders, a, z, nbytes, min(nbytes, max(first, bucket))))
        out += self._tied_segments_small(plan, spans, grad_bytes)
        return [seg for seg in out if len(seg.holders) > 1 and seg.nbytes > 0]

    def _tied_segments_small(self, plan: Plan, spans, grad_bytes: int) -> list[_Segment]:
        owner = self._tables.owner
        if owner < 0:
            return []

        def holders_of(u):
            return next(h for a, z, h in spans if a <= u < z)

        out = []
        for u in self._tables.sharers:
            hu, ho = holders_of(u), holders_of(owner)
            if hu == ho:
                continue
            if self._tied_pairs:  # one pair per replica whose copy and owner sit on different stages
                groups = [tuple(sorted({(r, k), (r, ko)})) for (r, k), (_, ko) in zip(hu, ho) if k != ko]
            else:
                groups = [tuple(sorted(set(hu) | set(ho)))]
            for holders in groups:
                tp_min = min(self._shard_tp(plan.replicas[r].stages[k]) for r, k in holders)
                nbytes = self.model.units[u].shared_params * grad_bytes / tp_min
                out.append(_Segment(holders, -1, -1, nbytes, nbytes))  # ready when both copies' units are done
        return out

    def _ring_small(self, plan: Plan, holders, flows: dict[int, int] | None = None) -> tuple:
        """:meth:`_ring` of holders given as (replica, stage) pairs."""
        stages = [plan.replicas[r].stages[k] for r, k in holders]
        members = tuple({s.devices[0]: None for s in stages})
        nodes = tuple(sorted(self._node_id(d) for d in members))
        tp = max(s.tp for s in stages)
        concurrent = tp
        if flows:
            concurrent = max([concurrent] + [flows.get(n, 0) / nodes.count(n) for n in set(nodes)])
        zone = self._zone_concurrency(list(nodes), tp, flows)
        return (nodes, concurrent, zone), lambda: members, (concurrent, zone)

    def _segment_ready_small(self, plan: Plan, pipes: list[_Pipe], holders, a: int, z: int) -> tuple[float, float]:
        """When every holder has the gradients of unit ``z-1`` (the first bucket) and of unit ``a`` (the
        last); a tied copy (``a < 0``) is ready when its stages' last backwards are done."""
        first = last = 0.0
        for r, k in holders:
            if a < 0:
                done = pipes[r].last_bwd[k]
                first, last = max(first, done), max(last, done)
                continue
            start = plan.replicas[r].stages[k].layers[0]
            first = max(first, pipes[r].grad_ready_s(k, start, z - 1))
            last = max(last, pipes[r].grad_ready_s(k, start, a))
        return first, last

    def _dp_sync_small(self, plan: Plan, pipes: list[_Pipe], trace: bool) -> tuple[float, dict, list, dict]:
        """:meth:`_dp_sync` for plans of few replicas: the same model in scalar Python (less overhead).

        A run of units is all-reduced bucket by bucket while the last backward still runs: it ends at
        the later of "first unit ready + all buckets' time" and "last unit ready + the last bucket's
        time", the last bucket holding ``grad_bucket_params`` gradients (or the whole run, or the
        first unit if larger) -- exact for equal units, whose readiness is evenly spaced. Runs sharing a device group go one after another.
        Without ``overlap_grad_reduce`` a run starts once every holder's device has finished its whole
        backward, largest run first (the order hetpart's runtime all-reduces its fused buckets in).
        """
        jobs = []
        segments = self._dp_segments_small(plan)
        flows = self._ring_flows([(self._node_id(plan.replicas[r].stages[k].devices[0]), (r, k % pipes[r].pp),
                                   plan.replicas[r].stages[k].tp) for r, k in seg.holders] for seg in segments)
        for seg in segments:
            holders = seg.holders
            ring = self._ring_small(plan, holders, flows)
            if plan.zero and seg.a >= 0:
                if plan.zero >= 2 and not plan.shard_group:
                    continue  # reduce-scattered every micro-batch, inside the backward (_shard_comm)
                t, t_last = (self._sharded_sync_s(plan, holders, n, flows) for n in (seg.nbytes, seg.last_bytes))
            else:
                t, t_last = self._bucketed_s(seg.nbytes, seg.last_bytes, ring), self._allreduce_s(seg.last_bytes, ring)
            name = self._collective(seg.last_bytes, ring)
            groups = {(r, k % pipes[r].pp) for r, k in holders}
            after = seg.a < 0 and self._tied_pairs
            if self.overlap_grad_reduce:
                first, last = self._segment_ready_small(plan, pipes, holders, seg.a, seg.z)
                if self._crosses_tcp(ring[1]()):  # after the backward that holds it: no overlap over TCP
                    jobs.append(_Job(last, last, groups, t, t, None, name, after))
                else:
                    jobs.append(_Job(first, last, groups, t, t_last, None, name, after))
            else:  # the runtime's order: largest first (hetpart.runtime.groups.fuse_buckets)
                done = max(e for r, k in holders for j, e in enumerate(pipes[r].last_bwd)
                           if j % pipes[r].pp == k % pipes[r].pp)  # the device's whole backward
                jobs.append(_Job(done, done, groups, t, t, (-seg.nbytes, seg.a), name, after))
        jobs = _job_order(jobs, self.overlap_grad_reduce)
        free: dict[tuple[int, int], float] = {}
        spent: dict[tuple[int, int], float] = {}
        largest: dict[tuple[int, int], tuple[float, str]] = {}
        events = []
        end_all = 0.0
        for job in jobs:
            start = max([job.first] + [free.get(g, 0.0) for g in job.groups])
            end = max(start + job.time_s, job.last + job.last_time_s)
            for g in job.groups:
                free[g] = end
                spent[g] = spent.get(g, 0.0) + job.time_s
                if job.time_s > largest.get(g, (0.0, ""))[0]:
                    largest[g] = (job.time_s, job.collective)
                if trace:
                    events.append({"replica": g[0], "stage": g[1], "microbatch": -1, "kind": "dp_sync",
                                   "start_s": start, "end_s": end})
            end_all = max(end_all, end)
        return end_all, spent, events, {g: name for g, (_, name) in largest.items()}

    # --------------------------------------------------------------------------------- sharded data parallel
    def _sharded_sync_s(self, plan: Plan, holders, nbytes: float, flows: dict[int, int] | None = None) -> float:
        """The once-per-step gradient sync of a sharded plan among ``holders`` ((replica, stage) pairs):
        a reduce-scatter inside each shard group (NCCL's rings, padded for uneven shards), plus,
        under hybrid sharding, the all-reduce of each shard across the groups. ``flows``
        (:func:`~hetpart.costmodel.collectives.nic_flows`): the rings crossing each node's NICs at once, which they share, as the
        unsharded all-reduces do."""
        by_replica = dict(holders)
        t = 0.0
        groups = plan.shard_groups()
        for members in groups:
            ring = self._ring_small(plan, tuple((r, by_replica[r]) for r in members), flows)
            t = max(t, self._reduce_scatter_s(nbytes * collective_pad(plan, members), ring))
        if len(groups) > 1:
            shard = nbytes * max(plan.shard_fraction(r) for r in by_replica)
            across = tuple((g[0], by_replica[g[0]]) for g in groups)
            t += self._allreduce_s(shard, self._ring_small(plan, across, flows))
        return t

    def _shard_comm(self, plan: Plan) -> dict[tuple[int, int], list[tuple[int, float, float]]]:
        """(replica, virtual stage) -> ``(unit, gather_s, scatter_s)``: one all-gather of each of its units'
        parameters and one reduce-scatter of its gradients among the stage's shard group (the holders of the
        unit in its group). The gather moves the parameters in the training dtype (``DTYPE_BYTES``: Megatron's
        distributed optimizer and FSDP2 gather 16-bit parameters), the reduce-scatter the gradients in the bytes
        the rest of the model reduces and keeps them in (:func:`grad_reduce_bytes`: fp32 under bf16 and fp8, as
        Megatron-LM's ``accumulate_allreduce_grads_in_fp32`` and torchtitan's FSDP2 ``reduce_dtype`` do;
        DeepSpeed's bf16 default communicates in bf16 and is not the engine modelled here).

        Every stage of every replica runs these collectives at once (after the optimizer step at levels 1-2,
        inside each micro-batch at levels 2-3, when a pipeline's stages all compute), so the rings of
        different device groups leaving one node share its NICs (:func:`~hetpart.costmodel.collectives.nic_flows`), as the gradient
        all-reduces do.

        A tied weight counts once per stage (:meth:`_unit_shard_params`): a head's copy of its embedding is gathered
        and reduce-scattered only where a holder's stage does not hold the embedding (gpt2-small on one stage
        gathered 163.0 M parameters a step, the 124.4 M of the model plus the head's 38.6 M copy again)."""
        param_bytes, grad_bytes = DTYPE_BYTES[plan.precision], grad_reduce_bytes(plan.precision)
        out: dict[tuple[int, int], list[tuple[int, float, float]]] = {}
        cuts = sorted({s.layers[0] for rep in plan.replicas for s in rep.stages} | {self.model.num_units})
        starts = [[s.layers[0] for s in rep.stages] for rep in plan.replicas]
        groups = plan.shard_groups()
        pp = [plan.pipeline_devices(r) for r in range(plan.dp)]
        rings = []
        for a, z in zip(cuts[:-1], cuts[1:]):
            holders = [(r, bisect_right(starts[r], a) - 1) for r in range(plan.dp)]
            for members in groups:
                held = tuple(holders[r] for r in members)
                if len(held) >= 2:
                    rings.append((a, z, held))
        flows = self._ring_flows([(self._node_id(plan.replicas[r].stages[k].devices[0]), (r, k % pp[r]),
                                   plan.replicas[r].stages[k].tp) for r, k in held] for _, _, held in rings)
        for a, z, held in rings:
            members = [r for r, _ in held]
            # an uneven split gathers each device's own slice: the largest of them paces the group
            tp_min = min(self._shard_tp(plan.replicas[r].stages[k]) for r, k in held)
            ring = self._ring_small(plan, held, flows)
            pad = collective_pad(plan, members)  # padded bytes; the ring's latency once
            owner = self._tables.owner
            apart = not all(plan.replicas[r].stages[k].layers[0] <= owner < plan.replicas[r].stages[k].layers[1]
                            for r, k in held)
            times = []
            for u in range(a, z):
                nbytes = self._unit_shard_params(u, tp_min, apart) * pad
                # a gather and a reduce-scatter of the same bytes cost the same (reduce_scatter_time_s)
                times.append((u, self._reduce_scatter_s(nbytes * param_bytes, ring),
                              self._reduce_scatter_s(nbytes * grad_bytes, ring)))
            for key in held:
                out.setdefault(key, []).extend(times)
        return out

    def _unit_shard_params(self, u: int, tp: int, apart: bool) -> float:
        """Parameters one device gathers and reduce-scatters of unit ``u`` in a ``tp``-way stage: its own and, where
        ``apart`` (some holder's stage does not hold the tied weights' owner: Megatron's last pipeline stage keeps
        its own copy of the word embeddings), the tied copy it uses. A stage holding the owner too has one tied
        weight, gathered and reduced with the owner's unit, not again with the head's."""
        n = self._tables.params_per_device(u, u + 1, tp)
        if not apart and u != self._tables.owner:
            sharded, whole = self._tables.shared(u, u + 1)
            n -= sharded / tp + whole
        return n

    def _shard_exposed_s(self, plan: Plan, times: list[tuple] | None, units: _UnitPrefix
                         ) -> tuple[float, float]:
        """Per micro-batch, the (forward, backward) seconds a stage adds for its sharded collectives at
        level 2 or 3 (:mod:`~hetpart.costmodel.sharding`): level 3 gathers each unit before its forward and
        before its backward; both reduce-scatter each unit's gradient after its backward. ``times``: per unit
        ``(unit, before, after)``: the gather (:meth:`_shard_comm`), and the reduce-scatter, plus the host
        copies of an offloaded plan (:meth:`_unit_comm`)."""
        if not times:
            return 0.0, 0.0
        f, b = units.fwd, units.bwd
        fwd_s = [f[x[0] + 1] - f[x[0]] for x in times]
        bwd_s = [b[x[0] + 1] - b[x[0]] for x in times]
        pre = [x[1] for x in times]
        post = [x[-1] for x in times]
        if plan.zero >= 3:
            # the forward runs first unit up (gathering ahead), the backward last unit down
            x_fwd = exposed_unit_comm_s(fwd_s, pre_s=pre)
            x_bwd = exposed_unit_comm_s(bwd_s[::-1], pre_s=pre[::-1], post_s=post[::-1])
            return x_fwd, x_bwd
        return 0.0, exposed_unit_comm_s(bwd_s[::-1], post_s=post[::-1])  # the last reduce-scatter trails

    def _unit_comm(self, plan: Plan, shard_comm: dict | None) -> dict | None:
        """The per-unit, per-micro-batch communication of each (replica, virtual stage): the sharded collectives
        of :meth:`_shard_comm` plus the host copies of an offloaded plan (:mod:`~hetpart.costmodel.offload`):
        ``full`` copies each unit's parameter shard to the device before its gathers and its gradient shard
        to the host after its reduce-scatter, ``optimizer`` at level 2-3 only the gradient shard to the host.
        The gradient crosses in fp32, the parameters in the training dtype
        (:func:`~hetpart.costmodel.offload.host_copy_bytes`). Values are ``(unit, before, after)``; None when
        there is nothing per unit."""
        zero = memory_zero(plan)
        both = plan.offload == "full"
        if not both and not (plan.offload == "optimizer" and zero >= 2):
            return shard_comm
        out_bytes, back_bytes = host_copy_bytes(plan.precision)
        out: dict[tuple[int, int], list[tuple[int, float, float]]] = {}
        for r, rep in enumerate(plan.replicas):
            fraction = self._fraction(plan, r) if zero else 1.0
            for k, st in enumerate(rep.stages):
                link = min(host_link_gbyte_s(g) for g in self._group(st.devices).gpus) * 1e9
                tp = self._shard_tp(st)
                base = {x[0]: x[1:] for x in (shard_comm or {}).get((r, k), ())}
                rows = []
                for u in range(*st.layers):
                    shard = self._tables.params_per_device(u, u + 1, tp) * fraction / link
                    gather, scatter = base.get(u, (0.0, 0.0))
                    rows.append((u, gather + (shard * back_bytes if both else 0.0), scatter + shard * out_bytes))
                out[(r, k)] = rows
        return out

    def _param_gather_exposed(self, plan: Plan, pipes: list[_Pipe], shard_comm: dict) -> dict[tuple[int, int], float]:
        """Levels 1-2, per pipeline device: the all-gather of its updated parameters after the optimizer step
        less the next step's first forward of the device, which hides it (negative where it hides it all)."""
        out = {}
        for r, pipe in enumerate(pipes):
            for d in range(pipe.pp):
                ks = range(d, plan.replicas[r].pp, pipe.pp)
                gather = sum(x[1] for k in ks for x in shard_comm.get((r, k), ()))
                out[(r, d)] = gather - sum(pipe.fwd[k] for k in ks)
        return out

    def _add_param_gather(self, plan: Plan, pipes: list[_Pipe], shard_comm: dict, optim: dict) -> None:
        """Levels 1-2: the all-gather of the updated parameters after the optimizer step, hidden behind the
        next step's first forward of the device up to that forward's length, and beyond it behind the time its
        replica's pipeline ends before the slowest replica's (it ends that much later, still first); the rest
        joins optimizer_s. (A device 1.5x faster than its peers hid less behind its shorter forward, and its
        exposed rest lengthened the whole step: a faster device predicted a slower step.)"""
        slowest = max(p.makespan for p in pipes)
        for (r, d), exposed in self._param_gather_exposed(plan, pipes, shard_comm).items():
            optim[(r, d)] += max(0.0, exposed - (slowest - pipes[r].makespan))

    # --------------------------------------------------------------------------------- memory, optimizer
    def _memory_and_optimizer(self, plan: Plan, pipes: list[_Pipe]) -> tuple[dict, dict]:
        memory: dict[tuple[int, int], float] = {}
        optim: dict[tuple[int, int], float] = {}
        alike: dict[tuple, tuple[float, float]] = {}  # device groups of one kind, cut alike, hold and step alike
        for r, rep in enumerate(plan.replicas):
            pp, m = pipes[r].pp, pipes[r].m
            fraction = self._fraction(plan, r)
            for d in range(pp):
                s = rep.stages[d]
                key = (id(self._group(s.devices)), d, pp, m, fraction, s.layers, s.tp, s.tp_split,
                       tuple((c.layers, c.tp, c.tp_split) for c in rep.stages[d + pp::pp]) if rep.pp > pp else ())
                hit = alike.get(key)
                if hit is None:
                    hit = alike[key] = self._device_memory_and_optimizer(plan, rep, d, pp, m, fraction)
                memory[(r, d)], optim[(r, d)] = hit
        return memory, optim

    def _device_memory_and_optimizer(self, plan: Plan, rep, d: int, pp: int, m: int,
                                     fraction: float) -> tuple[float, float]:
        """(peak memory GB, optimizer step s) of device group ``d`` of a replica (``pp`` device groups,
        ``m`` micro-batches, ``fraction`` of the sharded states)."""
        v = plan.chunks_per_device
        tables = self._tables
        zero = memory_zero(plan)
        flight = in_flight_microbatches(plan.schedule, d, pp, m, v)
        flights = self._chunk_flights(plan, rep, d, pp, m)  # per chunk of the device (interleaved: unlike)
        group = self._group(rep.stages[d].devices)
        largest = 0.0
        chunk_units = None  # level 3 under the engine's kernels: the running unit's actual neighbour is prefetched
        if zero >= 2 or plan.offload == "full":
            largest = max(self._largest_unit_params(rep.stages[k].layers, rep.stages[k].tp)
                          for k in range(d, rep.pp, pp))
            if self.kernels == "fused":
                chunk_units = [self._chunk_unit_params(rep.stages[k].layers, rep.stages[k].tp)
                               for k in range(d, rep.pp, pp)]
        if rep.stages[d].tp_split is None and all(rep.stages[k].tp_split is None for k in range(d, rep.pp, pp)):
            gb = params = work = 0.0
            for k, in_flight in zip(range(d, rep.pp, pp), flights):
                s = rep.stages[k]
                if plan.cp > 1:
                    gb += self._cp_memory_gb(s, plan, in_flight)
                else:
                    gb += tables.memory_gb(s.layers[0], s.layers[1], s.tp, plan.micro_batch, in_flight, plan.recompute,
                                           plan.optimizer, plan.attention, working_set=False, precision=plan.precision,
                                           zero=zero)
                # one unit runs at a time: the device's working set is its chunks' largest, once
                work = max(work, tables.working_gb(s.layers[0], s.layers[1], s.tp, plan.micro_batch, plan.recompute,
                                                   plan.attention) / plan.cp)
                params += tables.params_per_device(s.layers[0], s.layers[1], s.tp)
            gb += work
            # hetpart's runtime shards no tied weight (a GPT-2's token embedding): its states stay whole
            tied = self._tied_held(rep, d, pp) if self.kernels == "torch" and zero else 0.0
            # the states tables.memory_gb counted whole, sharded instead
            memory = gb + sharded_delta_gb(params - tied, largest, plan.precision, zero, fraction, plan.optimizer,
                                           plan.offload, chunk_units)
            if self.kernels == "torch" and flight >= m:
                memory -= self._late_grads_gb(plan, rep, d, pp, params, zero, fraction, tied)
            if self.kernels == "torch" and zero in (1, 2) and not _uneven(plan) and plan.dp * plan.cp > 1:
                # hetpart's runtime runs even levels 1-2 on FSDP2 without resharding after the forward:
                # each parameter's shard stays allocated beside its gathered copy (uneven fractions run
                # on hetpart.runtime.dist_optimizer, whose parameters stay whole, unsharded)
                memory += (params - tied) * fraction * state_bytes(plan.precision, plan.optimizer)[0] / 1e9
            if self.kernels == "torch" and (zero >= 3 or plan.offload == "full") and plan.dp * plan.cp > 1:
                # hetpart's runtime makes each unit its own FSDP2 root, so no unit prefetches the next one's
                # all-gather (torch 2.13, FSDPParamGroup._backward_prefetch walks its root's order only): one
                # unit's parameters are gathered at a time, not the two working_set_bytes counts
                memory -= largest * state_bytes(plan.precision, plan.optimizer)[0] / 1e9
            if self.kernels == "torch" and not zero and plan.offload == "none":
                memory = max(memory, self._optimizer_step_gb(plan, params))
            if self.kernels == "torch" and rep.pp > 1 and plan.cp == 1:
                # torch's pipelining keeps a receive buffer per micro-batch through the step and between steps
                memory += pipeline_recv_buffer_bytes(self.model, [st.layers for st in rep.stages], d, pp,
                                                     plan.micro_batch, m, flights) / 1e9
            return memory, self._step_s(plan, rep.stages[d].devices, params, fraction, zero)
        gbs = np.zeros(len(group.gpus))
        held = np.zeros(len(group.gpus))
        work = np.zeros(len(group.gpus))
        for k, in_flight in zip(range(d, rep.pp, pp), flights):
            s = rep.stages[k]
            gbs += self._device_memory_gb(s, plan.micro_batch, in_flight, plan.recompute, plan.optimizer,
                                          plan.attention, plan.precision, zero)
            work = np.maximum(work, self._device_working_gb(s, plan))
            held += self._device_params(s, *s.layers)
        gbs += work
        gbs += np.array([sharded_delta_gb(float(n), largest, plan.precision, zero, fraction, plan.optimizer,
                                          plan.offload, chunk_units) for n in held])
        if plan.offload != "none":
            return float(gbs.max()), self._step_s(plan, rep.stages[d].devices, float(held.max()), fraction, zero)
        return (float(gbs.max()),  # against the smallest capacity of the group
                max(self._adam_s(gpu, n * fraction, plan.optimizer, plan.precision) / speed
                    for n, gpu, speed in zip(held, group.gpus, self._speeds(group))))

    @staticmethod
    def _optimizer_step_gb(plan: Plan, params: float) -> float:
        """Peak of an unsharded device during hetpart's runtime's optimizer step (``torch.optim.Adam``), GB: its
        weights, gradients and moments, the activations freed, plus Adam's temporary square roots of the
        second moments, one moment's bytes per parameter (foreach, CUDA's default: ``_foreach_sqrt`` over the
        whole group; single-tensor, the CPU's: two of the tensor being stepped, which never exceeds it where the
        largest tensor is under half the device's parameters). The device's peak where its activations are
        smaller than that transient (a full-recompute stage: the first of a 2-stage run, 0.875 of its measured
        peak without it)."""
        temporary = MOMENT_BYTES[plan.optimizer] / 2 if plan.optimizer == "adam" else 0.0
        return params * (state_bytes_per_param(plan.optimizer, plan.precision) + temporary) / 1e9

    def _chunk_flights(self, plan: Plan, rep, d: int, pp: int, m: int) -> tuple[float, ...]:
        """Micro-batches in flight in each chunk of device group ``d`` at its peak
        (:func:`~hetpart.costmodel.memory.chunk_flights`; a chunk split unevenly weighed on its most loaded
        device)."""
        chunks = [(*rep.stages[k].layers, min(self._device_tps(rep.stages[k]))) for k in range(d, rep.pp, pp)]
        return chunk_flights(self._tables, plan.schedule, d, pp, m, plan.chunks_per_device, chunks, plan.recompute,
                             plan.attention)

    def _late_grads_gb(self, plan: Plan, rep, d: int, pp: int, params: float, zero: int, fraction: float,
                       tied: float = 0.0) -> float:
        """What a device's peak holds less when its engine frees the gradients at each step's start (hetpart's
        runtime: ``p.grad = None``) and runs every forward before its first backward: the gradients are then
        allocated while that backward frees one micro-batch's activations, so the peak holds the larger of
        the two, not both: ``min(gradients, one micro-batch's activations)``, GB (``tied`` of the
        ``params`` keep their gradient whole at every level)."""
        sharded = (params - tied) * (fraction if zero >= 2 else 1.0) + tied
        grads = sharded * state_bytes(plan.precision, plan.optimizer)[1] / 1e9
        one = sum(self._tables.saved_gb(*rep.stages[k].layers, rep.stages[k].tp, plan.micro_batch, plan.recompute,
                                        plan.attention) for k in range(d, rep.pp, pp))
        return min(grads, one if plan.cp == 1 else one / plan.cp)

    def _chunk_unit_params(self, layers: tuple[int, int], tp: int) -> list[float]:
        """Parameters one device holds of each unit in ``layers`` (:meth:`_largest_unit_params`' list)."""
        self._largest_unit_params(layers, tp)
        return self._unit_params[tp][layers[0]:layers[1]]

    def _largest_unit_params(self, layers: tuple[int, int], tp: int) -> float:
        """Parameters one device holds of the largest unit in ``layers`` (its unsharded working set; under
        the ``torch`` kernel set less the tied weights, which hetpart's runtime never shards, gathers or
        reduce-scatters: they count whole among the states, :meth:`_tied_held`)."""
        per_unit = self._unit_params.get(tp)
        if per_unit is None:
            t, torch_set = self._tables, self.kernels == "torch"
            per_unit = self._unit_params[tp] = [
                t.params_per_device(u, u + 1, tp) - (tied_params_held(self.model, u, u + 1) if torch_set else 0.0)
                for u in range(self.model.num_units)]
        return max(per_unit[layers[0]:layers[1]], default=0.0)

    def _tied_held(self, rep, d: int, pp: int) -> float:
        """Parameters of tied weights device group ``d`` of ``rep`` holds (over its chunks, counted once)."""
        return max((tied_params_held(self.model, *rep.stages[k].layers) for k in range(d, rep.pp, pp)), default=0.0)

    def _adam_s(self, gpu: GPUSpec, params: float, optimizer: str, precision: str) -> float:
        """Optimizer step of ``params`` parameters on one ``gpu``: measured (profile, Adam), else its bytes
        per parameter (:func:`~hetpart.costmodel.memory.optimizer_step_bytes`) over its HBM."""
        measured = self._profiled.adam_s(gpu, params) if self._profiled is not None and optimizer == "adam" else None
        return (measured if measured is not None
                else params * optimizer_step_bytes(optimizer, precision) / (gpu.hbm_gbyte_s * 1e9))

    def _step_s(self, plan: Plan, devices: tuple[str, ...], params: float, fraction: float, zero: int) -> float:
        """The optimizer step of one device holding ``params`` parameters (``fraction`` of their states):
        on the device (:meth:`_optimizer_s`), or for an offloaded plan on the CPU, sharing the node's memory
        bandwidth with the node's other devices of the plan, plus the host copies that are not per unit
        (:mod:`~hetpart.costmodel.offload`): the fp32 gradient shard to the host at levels 0-1 and, at
        ``optimizer``, the updated shard back in the training dtype
        (:func:`~hetpart.costmodel.offload.host_copy_bytes`). The CPU reads the fp32 gradient
        (:func:`~hetpart.costmodel.offload.cpu_step_bytes`: Adam 30 bytes a parameter under fp16 and bf16)."""
        share = params * fraction
        if plan.offload == "none":
            return self._optimizer_s(devices, share, plan.optimizer, plan.precision)
        node_of = self._offload_nodes(plan)
        sharing = max(node_of[(dev.group, dev.node)] for dev in map(self.cluster.device, devices))
        first = self.cluster.device(devices[0])
        t = cpu_step_s(share, cpu_step_bytes(plan.optimizer, plan.precision), self.cluster.groups[first.group],
                       sharing)
        if plan.offload == "optimizer":
            out_bytes, back_bytes = host_copy_bytes(plan.precision)
            link = min(host_link_gbyte_s(gpu) for gpu in self._group(devices).gpus) * 1e9
            t += share * back_bytes / link + (share * out_bytes / link if zero <= 1 else 0.0)
        return t

    def _offload_nodes(self, plan: Plan) -> dict[tuple[int, int], int]:
        """Devices of ``plan`` per (node group, node): they run their CPU optimizer steps at once."""
        key = tuple(plan.devices)
        hit = self._offload_node_cache.get(key)
        if hit is None:
            hit = self._offload_node_cache[key] = dict(Counter(
                (dev.group, dev.node) for dev in map(self.cluster.device, plan.devices)))
        return hit

    def host_state_gb(self, plan: Plan) -> dict[tuple[int, int], float]:
        """Host memory an offloaded plan's states take on each (node group, node) it uses, GB (empty when nothing
        is offloaded): every device's :func:`~hetpart.costmodel.offload.host_state_bytes` on its node."""
        if plan.offload == "none":
            return {}
        zero = memory_zero(plan)
        w, g, opt = state_bytes(plan.precision, plan.optimizer)
        out: dict[tuple[int, int], float] = {}
        for r, rep in enumerate(plan.replicas):
            fraction = self._fraction(plan, r) if zero else 1.0
            per_byte = host_state_bytes(w, g, opt, fraction, plan.offload)
            for st in rep.stages:
                params = self._tables.params_per_device(st.layers[0], st.layers[1], st.tp)
                for did in st.devices:
                    dev = self.cluster.device(did)
                    out[(dev.group, dev.node)] = out.get((dev.group, dev.node), 0.0) + params * per_byte / 1e9
        return out

    def host_metrics(self, plan: Plan) -> dict[str, Any]:
        """For an offloaded plan: the most host memory one node's states take (``host_memory_gb``), that node's
        capacity (``host_capacity_gb``: :func:`~hetpart.costmodel.offload.host_memory_gb`) and whether every
        node holds its states (``host_fits``); empty otherwise."""
        need = self.host_state_gb(plan)
        if not need:
            return {}
        room = {key: host_memory_gb(self.cluster.groups[key[0]]) for key in need}
        worst = max(need, key=lambda key: need[key] / room[key])
        return {"host_memory_gb": float(need[worst]), "host_capacity_gb": float(room[worst]),
                "host_fits": all(need[key] <= room[key] for key in need)}

    def _optimizer_s(self, devices: tuple[str, ...], params: float, optimizer: str, precision: str) -> float:
        """Optimizer step of ``params`` parameters per device: measured (profile, Adam), else its bytes per
        parameter (:func:`~hetpart.costmodel.memory.optimizer_step_bytes`) over the slowest device's HBM."""
        return self._bound_optimizer_s(devices, params, optimizer, optimizer_step_bytes(optimizer, precision))

    # --------------------------------------------------------------------------------- the step
    def _run(self, plan: Plan, trace: bool = False) -> _Step:
        seen: dict = {}
        cp = plan.cp
        if cp == 1:
            shard_comm = self._shard_comm(plan) if plan.zero and plan.dp > 1 else None
        else:  # sharded over dp x cp; each replica's pipe takes its first rank's collectives (all alike)
            whole = self._shard_comm(self._dp_view(plan)) if plan.zero else None
            shard_comm = {(r // cp, k): t for (r, k), t in whole.items() if r % cp == 0} if whole else None
        flows = self._pipeline_flows(plan)
        cp_flows = self._cp_flows(plan) if cp > 1 else None
        alike: dict = {}
        unit_comm = self._unit_comm(plan, shard_comm) if plan.zero >= 2 else None
        pipes = [self._pipe(plan, r, trace, seen, flows, unit_comm, alike, cp_flows) for r in range(plan.dp)]
        if self._sharing is not None and cp == 1:
            pipes = self._sharing_cores(plan, pipes, trace)
        if cp == 1:
            dp_end, dp_spent, dp_events, dp_collective = self._dp_sync(plan, pipes, trace)
        else:
            dp_end, dp_spent, dp_events, dp_collective = self._dp_sync_cp(plan, pipes, trace)
        memory, optim = self._memory_and_optimizer(plan, pipes)
        if shard_comm and plan.zero <= 2:
            self._add_param_gather(plan, pipes, shard_comm, optim)
        sync_end = max(max(p.makespan for p in pipes), dp_end)
        return _Step(pipes, dp_end, dp_spent, dp_events, optim, memory, sync_end, sync_end + max(optim.values()),
                     dp_collective)

    def estimate(self, plan: Plan, *, validate: bool = False) -> Estimate:
        """Step time and memory fit only: the same model as :meth:`simulate`, without the report."""
        self._check(plan, None, validate)
        run = self._run(plan)
        headroom = min(self._group(plan.replicas[r].stages[d].devices).capacity_gb - gb
                       for (r, d), gb in run.memory.items())
        fits = headroom >= 0 and self.host_metrics(plan).get("host_fits", True)
        return Estimate(run.step, plan.global_batch * plan.seq_len / run.step, fits, headroom)

    # --------------------------------------------------------------------------------- Predictor
    name = "simulator"
    """Registry name (:mod:`hetpart.costmodel.predictor`)."""
    fork_safe = True
    """Pure Python and NumPy (no torch, no threads): a forked child may price plans with a copy of it
    (:func:`hetpart.policies.policy_planner.decode` runs its baseline that way)."""

    @property
    def version(self) -> str:
        """The code version, and the options that change its numbers."""
        from hetpart import __version__

        return (f"{__version__}" + ("" if self.overlap_grad_reduce else "+no-overlap-grad-reduce")
                + ("+overlap-p2p" if self.overlap_p2p else "") + ("" if self._curve_of is None else "+calibrated")
                + ("" if self.profile is None else f"+profile:{self.profile.fingerprint}")
                + ("" if self.kernels == DEFAULT_KERNELS else f"+kernels:{self.kernels}")
                + ("" if self.op_counts == "engine" or self.kernels == "torch" else f"+op-counts:{self.op_counts}")
                + ("" if self.tp_comm == "ring" else f"+tp-comm:{self.tp_comm}")
                + ("" if self.dispatch == "overlap" else f"+dispatch:{self.dispatch}"))

    def estimate_batch(self, plans) -> list[Estimate]:
        """:meth:`estimate` of each plan, in order (unit costs are cached across the batch)."""
        return [self.estimate(p) for p in plans]

    def predict(self, plan: Plan, workload: Workload | None = None, *, validate: bool = True,
                trace: bool = False) -> "Prediction":
        """The full report (:meth:`simulate`)."""
        return self.simulate(plan, workload, validate=validate, trace=trace)

    def lower_bound_s(self, plan: Plan, *,
                      whole: Sequence[tuple[Sequence[str], Sequence[int], Sequence[int]]] | None = None) -> float:
        """A step time :meth:`estimate` never goes below, from per-stage costs and the gradients' traffic.

        Per pipeline device ``d`` of a replica with ``m`` micro-batches: it computes ``m`` forwards and
        backwards of its stages, and before its first forward every earlier device ran one forward
        while after its last backward every earlier device runs one backward, so the pipeline takes
        at least ``sum_{k<d} (f_k + b_k) + m (f_d + b_d)``; the optimizer step comes after all of it.
        It also comes after every gradient all-reduce (:meth:`_sync_bound_s`: each device's all-reduces,
        one after another from its last backward, at most at its node's NIC rate and the fastest zone
        link's). The costs are this simulator's own (same cache, same efficiency curve, same lines), so
        the bound is sound for it and for nothing else; branch and bound uses it to skip plans.

        The pipeline terms are maxima over replicas, so a replica alike to one already walked in everything
        they read (:meth:`_bound_stages`, micro-batches, shard fraction) adds nothing and is skipped: a
        1,024-GPU plan's 16-128 replicas are a few classes. Each stage's terms are memoised by the same key.
        ``tests/test_policy_speed_s48b_bound.py`` compares it with the replica-by-replica walk, bit for bit.

        ``whole``: where ``plan`` holds some replicas of a larger plan (one per class of replicas alike,
        :func:`hetpart.policies.plan_proportional._class_bounds`), that plan's replicas as (the first device of
        each stage, the stages' layer boundaries, their ``tp``): the sends share the NICs with the whole plan's
        (:meth:`_whole_flows`) and the gradient term counts the nodes holding each unit in it, so the bound is the
        whole plan's where ``plan`` has one replica of each class (without building it: at 1,024 GPUs a plan of
        128 replicas takes as long to build as its bound).
        """
        v = plan.chunks_per_device
        pipe = optim = 0.0
        cp_flows = self._cp_flows(plan) if plan.cp > 1 else None
        seen: dict[tuple, list[float]] = {}
        several = len(plan.replicas) > 1
        step_bytes = optimizer_step_bytes(plan.optimizer, plan.precision)
        memo = (self._bound_terms.setdefault((plan.micro_batch, plan.precision, plan.recompute, plan.attention), {})
                if cp_flows is None else None)
        sync = (several or whole is not None) and self._sync_bounded(plan, whole)
        flows = None
        if self._sharing is None and any(rep.pp > 1 for rep in plan.replicas):
            flows = self._pipeline_flows(plan) if whole is None or plan.cp > 1 else self._whole_flows(whole, v)
        ready: list[list[float]] = []  # per replica, per pipeline device: its last backward's earliest start
        for r, rep in enumerate(plan.replicas):
            m, fraction = plan.num_microbatches(r), self._fraction(plan, r)
            sends = self._bound_sends(plan, rep, flows) if flows is not None else None
            stages = None
            if memo is not None:
                stages = self._bound_stages(rep)
                if several:  # a class already walked adds nothing to the pipeline terms
                    key = (m, fraction, stages, sends)
                    hit = seen.get(key)
                    if hit is not None:
                        if sync:
                            ready.append(hit)
                        continue
            p, o, starts = self._replica_bound(plan, rep, m, fraction, v, cp_flows, stages, memo, step_bytes, sends)
            if memo is not None and several:
                seen[key] = starts
            if sync:
                ready.append(starts)
            pipe, optim = max(pipe, p), max(optim, o)
        if sync:
            pipe = max(pipe, self._sync_bound_s(plan, ready, whole))
        return (pipe + optim) * _BOUND_SLACK

    def _replica_bound(self, plan: Plan, rep, m: int, fraction: float, v: int, cp_flows: dict[int, int] | None,
                       stages: tuple | None, memo: dict | None, step_bytes: float, sends: tuple | None = None
                       ) -> tuple[float, float, list[float]]:
        """:meth:`lower_bound_s`'s terms for one replica: its pipeline's least time, its slowest optimizer
        step, and per pipeline device the earliest start of its last backward (all ``m`` forwards of its
        chunks and ``m - 1`` backwards of one before it, after the first forward's way to it when not
        interleaved). Each stage's terms come from ``memo`` by its :meth:`_bound_stages` key where there is
        one (not under context parallelism, whose ring depends on the plan's flows). ``sends``
        (:meth:`_bound_sends`): the replica's blocking sends, its devices' work as :meth:`_pipe` counts it."""
        pp = rep.pp // v
        per_device = [0.0] * pp
        params = [0.0] * pp
        forward = [0.0] * pp
        least_bwd = [math.inf] * pp
        for k, s in enumerate(rep.stages):
            if memo is None:
                busy, held, fwd = self._stage_bound_terms(s, plan, cp_flows)
            else:
                busy, held, fwd = memo.get(stages[k]) or memo.setdefault(stages[k],
                                                                         self._stage_bound_terms(s, plan, None))
            per_device[k % pp] += busy
            params[k % pp] += held
            forward[k % pp] += fwd
            least_bwd[k % pp] = min(least_bwd[k % pp], busy - fwd)
        if sends is not None:  # the sender's forward, and the receiver's backward sending back
            for k, t in enumerate(sends):
                per_device[k % pp] += t
                per_device[(k + 1) % pp] += t
        pipe = optim = before = ahead = 0.0
        starts = []
        for d in range(pp):
            pipe = max(pipe, (before if v == 1 else 0.0) + m * per_device[d])
            before += per_device[d]
            starts.append((ahead if v == 1 else 0.0) + m * forward[d] + (m - 1) * least_bwd[d])
            ahead += forward[d]
            optim = max(optim, self._bound_optimizer_s(rep.stages[d].devices, params[d] * fraction, plan.optimizer,
                                                       step_bytes))
        return pipe, optim, starts

    def _whole_flows(self, whole: Sequence, v: int) -> dict:
        """:meth:`_pipeline_flows` of the plan :meth:`lower_bound_s`'s ``whole`` describes (without context
        parallelism)."""
        nodes = self._nodes
        paths = []
        for firsts, _, tps in whole:
            hops = min(len(firsts) - 1, len(firsts) // v)
            if hops >= 1:
                paths.append(([nodes[d] for d in firsts[:hops + 1]], tps[:hops + 1]))
        return self._flows_of_paths(paths)

    def _bound_sends(self, plan: Plan, rep, flows: dict) -> tuple[float, ...]:
        """Per boundary of ``rep``'s pipeline: the seconds its transfer keeps the sender (and, sending the
        gradient back, the receiver) busy, as :meth:`_pipe` prices it (0 where the send does not block)."""
        stages = rep.stages
        mb, cp = plan.micro_batch, plan.cp
        try:
            return tuple([self._p2p_s(stages[k], stages[k + 1], mb, flows, cp)
                          if self._send_blocks(stages[k], stages[k + 1]) else 0.0 for k in range(len(stages) - 1)])
        except PlanError:  # a boundary between zones without a link: the plan is refused when priced; no sends here
            return (0.0,) * (len(stages) - 1)

    def _sync_bounded(self, plan: Plan, whole: Sequence | None = None) -> bool:
        """Whether :meth:`_sync_bound_s` prices ``plan``'s gradient traffic (or that of the ``whole`` plan it is part
        of): data parallelism without sharded gradients (levels 0-1: one all-reduce or reduce-scatter per run
        after the backward); not context parallelism, host offload, a profile's measured links or shared host
        cores (their own pricing)."""
        return ((plan.dp if whole is None else len(whole)) > 1 and plan.zero <= 1 and plan.cp == 1 and plan.offload == "none"
                and self._profiled is None and self._sharing is None)

    def _sync_bound_s(self, plan: Plan, ready: list[list[float]], whole: Sequence | None = None) -> float:
        """The latest any device's gradient all-reduces can end: from the earliest start of its last backward
        (``ready[r][d]``: no bucket of it is ready before), its runs one after another (a device group's
        all-reduces do not overlap, :meth:`_dp_jobs`), each at least ``2 (N - 1) / N`` of its gradient bytes
        (a reduce-scatter at level 1: half) over its node's NICs, ``N`` the nodes holding the run, and over
        the fastest zone link where the run spans zones. Every line :func:`~hetpart.costmodel.collectives.allreduce_lines`
        prices is at least that: a ring's (or tree's, or the hierarchical all-reduce's) bandwidth is at most
        its node's NICs, and the zone link it crosses, over the rings sharing them, at least its ``tp``
        shards; the shards of a device group carry its gradients whole. Tied copies' syncs, the latencies and
        other groups' rings sharing the NICs only add. ``whole``: as :meth:`lower_bound_s`'s, the plan whose
        nodes hold the units (``plan``'s own replicas otherwise)."""
        units = self.model.num_units
        nodes = self._nodes
        node, bounds, group, starts = [], [], [], []
        for r, rep in enumerate(plan.replicas):
            pp = len(ready[r])
            base = len(starts)
            starts += ready[r]
            node += [nodes[s.devices[0]] for s in rep.stages]  # a chunk sits on its device group's devices
            bounds += [s.layers for s in rep.stages]
            group += [base + k % pp for k in range(len(rep.stages))] if pp < len(rep.stages) else \
                range(base, base + pp)
        node_a = np.array(node)
        first_a, last_a = np.array(bounds).T
        # a replica's stages cover the units in order, once: each unit's holding node per replica, [dp, units]
        if whole is None:
            holder = np.repeat(node_a, last_a - first_a).reshape(plan.dp, units)
        else:
            firsts = [nodes[d] for devices, _, _ in whole for d in devices]
            cuts = np.concatenate([np.diff(np.asarray(b)) for _, b, _ in whole])
            holder = np.repeat(np.array(firsts), cuts).reshape(len(whole), units)
        spread = 1 + (np.diff(np.sort(holder, axis=0), axis=0) != 0).sum(axis=0)  # nodes holding each unit
        nbytes = (2.0 if plan.zero == 0 else 1.0) * (spread - 1) / spread * self._unit_grad_bytes(plan.precision)
        zoned = self._zoned and self._zone_bps > 0
        if zoned:
            zones = np.sort(self._node_zone[holder], axis=0)
            across = (zones[0] != zones[-1]) / self._zone_bps
        rates = self._node_nic_bps[node_a]
        kinds, kind_of = np.unique(rates, return_inverse=True)
        seconds = nbytes[None, :] / kinds[:, None]
        if zoned:
            seconds = np.maximum(seconds, nbytes * across)
        cum = np.zeros((len(kinds), units + 1))
        np.cumsum(seconds, axis=1, out=cum[:, 1:])
        per_stage = cum[kind_of, last_a] - cum[kind_of, first_a]
        busy = np.bincount(np.array(group), weights=per_stage, minlength=len(starts))
        return float((np.array(starts) + busy).max())

    def _unit_grad_bytes(self, precision: str) -> np.ndarray:
        """Per unit: the bytes of its own gradients (tensor-parallel shards and replicated parameters whole)
        that its data-parallel all-reduce moves; tied copies left out."""
        hit = self._unit_grads.get(precision)
        if hit is None:
            per = [sum(self._tables.params(u, u + 1)) for u in range(self.model.num_units)]
            hit = self._unit_grads[precision] = np.array(per, dtype=float) * grad_reduce_bytes(precision)
        return hit

    def _bound_optimizer_s(self, devices: tuple[str, ...], params: float, optimizer: str, step_bytes: float) -> float:
        """:meth:`_optimizer_s` with the plan's :func:`~hetpart.costmodel.memory.optimizer_step_bytes` computed
        once per bound (the same arithmetic; the bound's test compares the two)."""
        g = self._group(devices)
        speeds = self._speeds(g)
        if self._profiled is not None and optimizer == "adam":
            measured = [self._profiled.adam_s(gpu, params) for gpu in g.gpus]
            if all(m is not None for m in measured):
                return max(m / v for m, v in zip(measured, speeds))
        # a device's speed factor (``slow:``) slows its memory-bound work too (compute.unit_compute_s)
        return max(params * step_bytes / (gpu.hbm_gbyte_s * 1e9 * v) for gpu, v in zip(g.gpus, speeds))

    @staticmethod
    def _speeds(g) -> tuple[float, ...]:
        """The speed factors of a device group's devices, in its order (1 where the facts carry none)."""
        return g.speeds if len(g.speeds) == len(g.gpus) else (1.0,) * len(g.gpus)

    def _stage_bound_terms(self, s, plan: Plan, cp_flows: dict[int, int] | None) -> tuple[float, float, float]:
        """One stage's compute and tensor-parallel seconds per micro-batch, its parameters per device, and the
        forward's part of those seconds."""
        u = (self._cp_unit_prefix(s, plan, cp_flows) if cp_flows is not None else
             self._unit_prefix(s.devices, s.tp, plan.micro_batch, plan.precision, plan.recompute, s.tp_split,
                               plan.attention))
        f, b, tf, tb = u.fwd, u.bwd, u.tp_fwd, u.tp_bwd
        a, z = s.layers
        return ((f[z] - f[a]) + (b[z] - b[a]) + (tf[z] - tf[a]) + (tb[z] - tb[a]),
                self._tables.params_per_device(a, z, s.tp), (f[z] - f[a]) + (tf[z] - tf[a]))

    def _bound_stages(self, rep) -> tuple:
        """Everything :meth:`_replica_bound` reads of a replica's stages besides the plan-wide fields: per
        stage its device facts (:meth:`_bound_group`; the optimizer step reads the same facts), layers, TP
        degree and split."""
        get = self._bound_groups.get
        return tuple([(get(s.devices) or self._bound_group(s.devices), s.layers, s.tp, s.tp_split)
                      for s in rep.stages])

    def _bound_group(self, devices: tuple[str, ...]) -> object:
        """What a stage's bound terms read of its devices: their :meth:`_group` facts (one object per distinct
        facts, so its ``id`` names them) where the ring prices tensor parallelism from those facts alone, else
        the devices themselves (NCCL's lines and a profile's measured links are per device). Memoised per
        device tuple."""
        hit = self._bound_groups.get(devices)
        if hit is None:
            hit = self._bound_groups[devices] = (id(self._group(devices)) if self.tp_comm == "ring"
                                                 and self._profiled is None else devices)
        return hit

    def simulate(self, plan: Plan, workload: Workload | None = None, *, validate: bool = True,
                 trace: bool = False) -> Prediction:
        """Predict one training step of ``plan`` (see :func:`simulate`)."""
        self._check(plan, workload, validate)
        run = self._run(plan, trace)
        breakdown = self._breakdown(plan, run)
        metrics = self._metrics(plan, run)
        per_device = {dev: b["memory_gb"] for b in breakdown for dev in b["devices"]}
        timeline = self._timeline(run) if trace else []
        return Prediction(step_time_s=float(run.step), tokens_per_s=metrics["tokens_per_s"],
                          samples_per_s=metrics["samples_per_s"], fits_in_memory=metrics["fits_in_memory"],
                          metrics=metrics, memory_gb=per_device, breakdown=breakdown, timeline=timeline,
                          provenance=self.provenance(plan))

    def predict_metrics(self, plan: Plan, workload: Workload | None = None, *, validate: bool = True) -> dict[str, Any]:
        """The CONTRACT metrics of ``plan`` alone: ``predict(plan).metrics``, without building the breakdown,
        per-device memory and provenance (the batch scorer's path, :mod:`hetpart.costmodel.batch`)."""
        self._check(plan, workload, validate)
        return self._metrics(plan, self._run(plan))

    def provenance(self, plan: Plan) -> dict[str, Any]:
        """Where each device type's compute came from and how far to trust it, and which attention kernel this
        simulator's kernel set priced and why (:mod:`~hetpart.costmodel.provenance`; ``attention``: a 32-bit
        run is the unfused core under ``fused``, SDPA's memory-efficient kernel under ``torch``)."""
        from hetpart.costmodel.provenance import prediction_provenance

        return prediction_provenance(self.cluster, plan, self._profiled, self._curve_of, kernels=self.kernels)

    def _attention(self, attention: str) -> str:
        """The attention this simulator prices for a plan asking for ``attention``: the engine's kernel set
        decides (:func:`~hetpart.costmodel.activations.effective_attention`; a 32-bit run under ``fused`` falls
        back to the unfused core), whichever operator counts (``op_counts``) pay the host cost; the memory
        tables decide alike (:class:`~hetpart.costmodel.memory.PrefixTables` of the same kernel set)."""
        return effective_attention(attention, self.model.dtype_bytes, self.kernels)

    def _check(self, plan: Plan, workload: Workload | None, validate: bool) -> None:
        if validate:
            plan.check(self.model, self.cluster)
        if plan.seq_len != self.model.seq_len:
            raise PlanError(f"plan: seq_len: {plan.seq_len} but the model graph was built for {self.model.seq_len} "
                            f"tokens; load the model with seq_len={plan.seq_len}")
        if DTYPE_BYTES[plan.precision] != self.model.dtype_bytes:
            raise PlanError(f"plan: precision: {plan.precision!r} but the model graph was built with "
                            f"{self.model.dtype_bytes}-byte activations; "
                            f"load the model with precision={plan.precision!r}")
        if plan.precision == "fp8":
            lacking = sorted({self.cluster.device(d).gpu.name for d in plan.devices
                              if not self.cluster.device(d).gpu.supports_fp8})
            if lacking:
                raise PlanError(f"plan: precision: fp8 is not supported by {', '.join(lacking)} (fp8 matrix units exist "
                                "on Hopper, Ada and MI300 only); use precision bf16 (or fp16)")
        if workload is not None and (workload.global_batch, workload.seq_len) != (plan.global_batch, plan.seq_len):
            raise WorkloadError(f"workload: global_batch {workload.global_batch} and seq_len {workload.seq_len} differ "
                                f"from the plan's {plan.global_batch} and {plan.seq_len}; plan for this workload")

    # --------------------------------------------------------------------------------- report
    def _breakdown(self, plan: Plan, run: _Step) -> list[dict[str, Any]]:
        out = []
        held: dict[tuple, float] = {}  # parameters per device group's chunks (replicas cut alike share them)
        for r, rep in enumerate(plan.replicas):
            pipe = run.pipes[r]
            for d in range(pipe.pp):
                ks = range(d, rep.pp, pipe.pp)
                group = self._group(rep.stages[d].devices)
                # activations sent down to k+1, gradients sent up to k-1
                sends = sum((pipe.p2p[k] if k < rep.pp - 1 else 0.0) + (pipe.p2p[k - 1] if k > 0 else 0.0)
                            for k in ks) * pipe.m
                entry = {
                    "replica": r, "stage": d, "layers": [list(rep.stages[k].layers) for k in ks],
                    "devices": list(rep.stages[d].devices), "gpu": group.gpu.name, "tp": rep.stages[d].tp,
                    "compute_s": sum(pipe.compute[k] for k in ks) * pipe.m,
                    "tp_comm_s": sum(pipe.tp[k] for k in ks) * pipe.m,
                    "zero_comm_s": _rest_s([(pipe.fwd[k] + pipe.bwd[k], pipe.compute[k] + pipe.tp[k] + pipe.fwd_send[k]
                                             + pipe.bwd_send[k] + (pipe.cp[k] if pipe.cp else 0.0)) for k in ks]) * pipe.m,
                    "pp_blocked_s": sum(pipe.fwd_send[k] + pipe.bwd_send[k] for k in ks) * pipe.m,
                    "pp_comm_s": float(sends),
                    "dp_comm_s": run.dp_spent.get((r, d), 0.0),
                    "dp_collective": run.dp_collective.get((r, d), ""),
                    "bubble_s": self._bubble_s(rep, pipe, d),
                    "sync_wait_s": float(run.sync_end - pipe.makespan),
                    "optimizer_s": run.optim[(r, d)],
                    "memory_gb": run.memory[(r, d)],
                    "memory_parts_gb": self._memory_parts_gb(plan, r, d, pipe.pp, run.memory[(r, d)], held),
                    "capacity_gb": group.capacity_gb,
                }
                if plan.cp > 1:  # context parallelism's ring: exposed (busy) and its whole link time
                    entry.update(cp=plan.cp, cp_comm_s=sum(pipe.cp[k] for k in ks) * pipe.m,
                                 cp_link_s=sum(pipe.cp_link[k] for k in ks) * pipe.m)
                out.append(entry)
        return out

    def _memory_parts_gb(self, plan: Plan, r: int, d: int, pp: int, peak_gb: float,
                         held: dict[tuple, float]) -> dict[str, float]:
        """What device group ``d`` of replica ``r`` holds at its peak, GB: its model states as the level and the
        offload leave them (:func:`~hetpart.costmodel.offload.device_state_parts`; under an uneven
        tensor-parallel split, the device holding the most parameters) and the rest of ``peak_gb``: saved
        activations, the running unit's working set, gathered parameters and transients."""
        rep = plan.replicas[r]
        zero = memory_zero(plan)
        fraction = self._fraction(plan, r) if zero else 1.0
        key = tuple((rep.stages[k].layers, rep.stages[k].tp, rep.stages[k].tp_split) for k in range(d, rep.pp, pp))
        params = held.get(key)
        if params is None:
            per_device = np.zeros(len(self._device_tps(rep.stages[d])))
            for k in range(d, rep.pp, pp):
                per_device = per_device + np.asarray(self._device_params(rep.stages[k], *rep.stages[k].layers))
            params = held[key] = float(per_device.max())
        parts = device_state_parts(*state_bytes(plan.precision, plan.optimizer), zero, fraction, plan.offload)
        weights, grads, states = (params * b / 1e9 for b in parts)
        return {"weights": weights, "gradients": grads, "optimizer_states": states,
                "activations_and_working_set": max(0.0, peak_gb - weights - grads - states)}

    @staticmethod
    def _bubble_s(rep, pipe: _Pipe, d: int) -> float:
        """Seconds device group ``d`` of a replica idles inside its pipeline."""
        busy = sum(pipe.fwd[k] + pipe.bwd[k] for k in range(d, rep.pp, pipe.pp)) * pipe.m
        return float(pipe.makespan - busy)

    def _group_peaks(self, devices: tuple[str, ...], precision: str) -> tuple[tuple[str, ...], tuple[float, ...], float]:
        """The group's GPU names (once each), each device's peak FLOP/s at ``precision`` in the group's
        order (:meth:`~hetpart.cluster.Device.peak_flops`: a device declared faster than its type counts its
        factor), and the group's memory capacity."""
        key = (devices, precision)
        hit = self._peaks.get(key)
        if hit is None:
            group = self._group(devices)
            hit = self._peaks[key] = (tuple(dict.fromkeys(g.name for g in group.gpus)),
                                      tuple(self.cluster.device(d).peak_flops(precision) for d in devices),
                                      group.capacity_gb)
        return hit

    def _metrics(self, plan: Plan, run: _Step) -> dict[str, Any]:
        samples = plan.global_batch
        model_flops = self.model.train_flops * samples
        # what the recompute mode runs again (Narayanan et al.'s hardware FLOPs); under fused attention
        # selective recomputation runs nothing beyond what the flash backward always does (the attention
        # priced: a 32-bit run under the engine's fused kernels recomputes the unfused core, :meth:`_attention`)
        mode = plan.recompute if self._attention(plan.attention) == "eager" or plan.recompute == "full" else "none"
        recompute = sum(u.recompute_flops[mode] for u in self.model.units) * samples
        peak = span = bubble = 0.0
        n = 0
        fits = True
        peak_mem: dict[str, float] = {}
        bubbles: dict[tuple[int, int], float] = {}  # pipes of equal replicas share their last_bwd list
        for r, rep in enumerate(plan.replicas):  # per (replica, device group), in the breakdown's order
            pipe = run.pipes[r]
            for d in range(pipe.pp):
                names, flops, capacity = self._group_peaks(rep.stages[d].devices, plan.precision)
                memory = run.memory[(r, d)]
                for name in names:
                    peak_mem[name] = max(peak_mem.get(name, 0.0), memory)
                for f in flops:
                    peak += f
                n += len(flops)
                span += pipe.makespan
                key = (id(pipe.last_bwd), d)
                idle = bubbles.get(key)
                if idle is None:
                    idle = bubbles[key] = self._bubble_s(rep, pipe, d)
                bubble += idle
                fits = fits and memory <= capacity
        step = float(run.step)
        host = self.host_metrics(plan)
        fits = fits and host.get("host_fits", True)
        return {
            **{k: v for k, v in host.items() if k != "host_fits"},
            "step_time_s": step,
            "tokens_per_s": samples * plan.seq_len / step,
            "samples_per_s": samples / step,
            "hardware_tflops_per_device": float((model_flops + recompute) / step / n / 1e12),
            "model_tflops_per_device": float(model_flops / step / n / 1e12),
            "mfu": float(model_flops / step / peak),
            "bubble_fraction": max(0.0, float(bubble / span)) if span > 0 else 0.0,  # not -1e-16 from rounding
            "peak_memory_gb": {k: float(x) for k, x in peak_mem.items()},
            "fits_in_memory": fits,
        }

    def _timeline(self, run: _Step) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        for r, pipe in enumerate(run.pipes):
            for op in pipe.timing.ops():
                k = op.stage
                blocked = pipe.fwd_send[k] if op.kind == "fwd" else pipe.bwd_send[k]
                done = op.end_s - blocked  # a blocking send ends the operation
                events.append({"replica": r, "stage": op.device, "microbatch": op.microbatch, "kind": op.kind,
                               "start_s": op.start_s, "end_s": done})
                if op.kind == "fwd" and k < len(pipe.p2p):
                    events.append({"replica": r, "stage": op.device, "microbatch": op.microbatch, "kind": "send",
                                   "start_s": done, "end_s": done + pipe.p2p[k]})
                elif op.kind == "bwd" and k > 0:
                    events.append({"replica": r, "stage": op.device, "microbatch": op.microbatch, "kind": "send",
                                   "start_s": done, "end_s": done + pipe.p2p[k - 1]})
        events += run.dp_events
        for (r, d), t in run.optim.items():
            events.append({"replica": r, "stage": d, "microbatch": -1, "kind": "optim", "start_s": run.sync_end,
                           "end_s": run.sync_end + t})
        return events


def simulate(model: ModelGraph, cluster: Cluster, plan: Plan, workload: Workload | None = None, *,
             validate: bool = True, trace: bool = False, overlap_grad_reduce: bool = True,
             overlap_p2p: bool = False) -> Prediction:
    """Predict step time, throughput, memory and a breakdown for ``plan``.

    Args:
        model: the unit graph (built for the plan's ``seq_len`` and precision).
        cluster: the cluster the plan's device ids refer to.
        plan: the plan.
        workload: optional; when given its global batch and sequence length must match the plan's.
        validate: check the plan first (:meth:`Plan.check` raises :class:`PlanError`).
        trace: also return the per-operation timeline (for a Gantt chart).
        overlap_grad_reduce: gradient buckets go out while the backward runs (DDP, Megatron's
            ``--overlap-grad-reduce``); False: after it (Megatron's default, hetpart's runtime).
        overlap_p2p: pipeline sends run beside compute (engines with asynchronous p2p); False: the
            sender waits for each send, as Megatron-LM's 1F1B does (sends over TCP always wait).

    For many plans of one model on one cluster, reuse a :class:`Simulator` (it caches unit costs).
    """
    return Simulator(model, cluster, overlap_grad_reduce=overlap_grad_reduce, overlap_p2p=overlap_p2p).simulate(
        plan, workload, validate=validate, trace=trace)


def simulator_predictor(model: ModelGraph, cluster: Cluster, workload: Workload | None = None, *,
                        overlap_grad_reduce: bool = True, overlap_p2p: bool = False,
                        curve_of: Callable[[GPUSpec], EfficiencyCurve] | None = None,
                        profile: "Profile | None" = None, kernels: str = DEFAULT_KERNELS, op_counts: str = "engine",
                        tp_comm: str = "ring", dispatch: str = "overlap", **unknown: Any) -> Simulator:
    """The registry's ``simulator`` factory (:func:`hetpart.costmodel.predictor.get_predictor`).

    Raises:
        PlanError: an option the simulator does not take.
    """
    del workload  # every plan carries its own batch, sequence length, precision and recompute mode
    if isinstance(profile, dict):  # a run record keeps the profile its prediction used as JSON
        from hetpart.costmodel.profile import parse_profile

        profile = parse_profile(profile, "predictor option 'profile'")
    if unknown:
        raise PlanError(f"predictor 'simulator': unknown option(s) {', '.join(sorted(unknown))}; it takes "
                        "overlap_grad_reduce, overlap_p2p, curve_of, profile, kernels, op_counts, tp_comm, dispatch")
    return Simulator(model, cluster, curve_of, overlap_grad_reduce=overlap_grad_reduce, overlap_p2p=overlap_p2p,
                     profile=profile, kernels=kernels, op_counts=op_counts, tp_comm=tp_comm, dispatch=dispatch)


def _uneven(plan: Plan) -> bool:
    """Uneven shard fractions or an uneven tensor-parallel split anywhere in the plan: levels 1-2 run them on
    hetpart's distributed optimizer, not FSDP2 (:func:`hetpart.runtime.dist_optimizer.uses_sharded_adam`)."""
    fractions = plan.shard_fractions is not None and len(set(plan.shard_fractions)) > 1
    return fractions or any(s.tp_split is not None for r in plan.replicas for s in r.stages)
