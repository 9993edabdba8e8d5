"""Per-unit costs for the search's inner loop, built once from the simulator's primitives.

For a pool, tensor-parallel degree, micro-batch and recompute mode, :class:`StageCosts` holds

* the per-micro-batch time of every unit (forward + backward with recompute, plus the
  tensor-parallel all-reduces) as range matrices ``[n + 1, n + 1]`` (prefix sums), and
* the memory of a stage holding any range ``[a, b)``, split like
  :func:`hetpart.costmodel.memory.stage_memory_gb` into model states, activations per micro-batch in
  flight and the running unit's working set (its activations again under full recompute), so that a mask for any number of
  micro-batches in flight costs a few array operations.

``tests/test_search.py`` checks both against the simulator's own functions on random ranges.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from collections import OrderedDict
from functools import cached_property, lru_cache, partial
from typing import Callable

import numpy as np

from hetpart.cluster import Cluster
from hetpart.costmodel.activations import (DEFAULT_KERNELS, FP8_WEIGHT_CACHE_BYTES, unit_fp8_cached_params,
                                          unit_fp8_saved_delta, unit_saved_bytes, unit_working_bytes)
from hetpart.costmodel.compute import unit_compute_s, unit_tp_comm_s
from hetpart.costmodel.device_group import device_group_facts
from hetpart.costmodel.memory import GRAD_BYTES, memory_capacity_gb, state_bytes_per_param
from hetpart.costmodel.sharding import sharded_state_bytes, state_bytes, tied_params_held, working_set_bytes
from hetpart.policies.partition import on_or_below_diagonal, range_cost_matrix
from hetpart.costmodel.pools import Pool, tp_groups
from hetpart.graph.model_graph import ModelGraph

__all__ = ["StageCosts", "CostTable"]


@dataclass(frozen=True, eq=False)
class StageCosts:
    """Costs of a stage on one pool with one (tp, micro-batch, recompute).

    Shapes: every matrix is ``[n + 1, n + 1]`` over ranges ``[a, b)`` (``inf`` time where ``a >= b``).
    """

    states_gb: np.ndarray
    """Model-state memory of the range (weights, grads, optimizer states; tied copy included)."""
    acts_gb: np.ndarray
    """Activation memory of the range per micro-batch in flight."""
    extra_gb: np.ndarray
    """Memory of the one unit recomputed at a time (full recompute), else 0."""
    grad_bytes: np.ndarray
    """Gradient bytes per device of the range, as the data-parallel reduction moves them
    (:data:`~hetpart.costmodel.memory.GRAD_BYTES`: fp32 under bf16 and fp32, 16-bit under fp16)."""
    capacity_gb: float
    """Usable memory of one device of the pool."""
    unit_params: np.ndarray
    """``[n]``: parameters one device gathers or reduces of each unit, as the simulator counts them
    (``Simulator._largest_unit_params``: a head's tied copy included; under the ``torch`` kernel set less the tied
    weights, which hetpart's runtime keeps whole): the unsharded working set of ZeRO 2-3."""
    unit_times: Callable[[], np.ndarray] = field(repr=False)
    """Computes :attr:`unit_time_s` on first use (the policy's memory masks build hundreds of these and
    price few of them)."""
    unit_forwards: Callable[[], np.ndarray] | None = field(default=None, repr=False)
    """Computes the per-unit forward (+ its TP all-reduces) seconds of :attr:`forward_s` on first use."""
    precision: str = "bf16"
    optimizer: str = "adam"
    offload: str = "none"
    """What the plan keeps in host memory (:mod:`hetpart.costmodel.offload`)."""
    fp8_cache_gb: np.ndarray | None = None
    """An fp8 run's cached fp8 weights and transposes of the range (Transformer Engine, below level 3:
    :func:`~hetpart.costmodel.memory.fp8_stage_bytes`), else None."""
    kernels: str = DEFAULT_KERNELS
    """The engine's kernel set, whose level-3 working set the masks count (:func:`_working_gb`)."""
    unit_gather: np.ndarray | None = None
    """``[n]``: parameters one device all-gathers of each unit after a level 1-2 step, one collective per unit, as
    the simulator runs them (``Simulator._shard_comm``: ``params_per_device`` of the unit alone, a tied copy
    included under either kernel set, less :attr:`unit_copy` on a stage holding the owner); None: :attr:`unit_params`."""
    unit_copy: np.ndarray | None = None
    """``[n]``: the tied copy each unit holds (a head's of its embedding, per device), which a stage holding the tied
    weights' owner (:attr:`tied_owner`) gathers once, with the owner (``Simulator._unit_shard_params``)."""
    tied_owner: int = -1
    """Index of the unit owning the tied weights; -1 for a model without any."""

    @cached_property
    def unit_time_s(self) -> np.ndarray:
        """``[n]``: the per-unit times :attr:`time_s` sums."""
        return self.unit_times()

    @cached_property
    def time_s(self) -> np.ndarray:
        """Per-micro-batch time of the range (forward + backward + recompute + TP all-reduces)."""
        return range_cost_matrix(self.unit_time_s)

    @cached_property
    def forward_s(self) -> np.ndarray:
        """``[n + 1, n + 1]``: one micro-batch's forward of the range (with its TP all-reduces), seconds."""
        return _range_sum(self.unit_forwards() if self.unit_forwards is not None else np.zeros(len(self.unit_params)))

    def gather_s(self, first: int, last: int, lines: "tuple[tuple[float, float], ...]") -> float:
        """Seconds of the level 1-2 all-gather of units ``[first, last)``'s updated 16-bit parameters, one
        collective per unit (:attr:`unit_gather`; a tied copy only on a stage without its owner), each at the
        fastest of NCCL's ``(fixed_s, per_byte_s)`` ``lines`` of its ring, as ``Simulator._reduce_scatter_s``
        prices it (0 for a unit of no parameters)."""
        from hetpart.workload import DTYPE_BYTES

        units = (self.unit_gather if self.unit_gather is not None else self.unit_params)[first:last]
        if self.unit_copy is not None and first <= self.tied_owner < last:  # one tied weight: the owner's
            units = units - self.unit_copy[first:last]
        nbytes = units * DTYPE_BYTES[self.precision]
        nbytes = nbytes[nbytes > 0]
        if not lines or not len(nbytes):
            return 0.0
        fixed, per_byte = np.asarray(lines, dtype=float).T
        return float((fixed[:, None] + per_byte[:, None] * nbytes[None, :]).min(axis=0).sum())

    def masked(self, in_flight: float, ignore_memory: bool = False, zero: int = 0, fraction: float = 1.0
               ) -> np.ndarray:
        """Time matrix with ``inf`` where a stage holding ``in_flight`` micro-batches does not fit, its
        states sharded at level ``zero`` with ``fraction`` of them held (:mod:`hetpart.costmodel.sharding`)."""
        if ignore_memory:
            return self.time_s
        return _masked(self, in_flight, zero, fraction if zero else 1.0)

    def memory_gb(self, first: int, last: int, in_flight: float, zero: int = 0, fraction: float = 1.0) -> float:
        return float(_need_gb(self, in_flight, zero, fraction if zero else 1.0, (first, last)))

    def fits_from(self, first: int, stop: int, in_flight: float, zero: int = 0, fraction: float = 1.0) -> np.ndarray:
        """Whether each range ``[first, b)``, ``first < b < stop``, fits (the mask of :meth:`masked`, one row)."""
        return _need_gb(self, in_flight, zero, fraction if zero else 1.0, (first, slice(first + 1, stop))) <= \
            self.capacity_gb

    def first_unfit(self, first: int, stop: int, in_flight: float, zero: int = 0, fraction: float = 1.0) -> int:
        """The first end ``b``, ``first < b < stop``, whose range ``[first, b)`` does not fit (``stop`` when all
        do): :meth:`fits_from`'s first False. The first :data:`SCAN_RANGES` ranges are summed one at a time in
        plain floats (the same memory summed in the same order), the rest as :meth:`fits_from`'s row: the
        policy's memory masks (:func:`~hetpart.policies.structure.greedy_fits`) walk deep pipelines whose
        stages mostly end within a few units, where a row's dozen array operations per stage cost more."""
        fraction = fraction if zero else 1.0
        cap = self.capacity_gb
        zero = _memory_zero(self, zero, fraction)
        scaled = bool(zero) or self.offload != "none"
        kept = 0.0
        if scaled:
            kept = _state_scales(self.precision, self.optimizer, self.offload, zero, fraction)
        working = _working_gb(self, zero, fraction)
        working = working.item if working is not None else None
        states, acts, extra = self.states_gb.item, self.acts_gb.item, self.extra_gb.item
        cache = self.fp8_cache_gb.item if self.fp8_cache_gb is not None and zero < 3 else None  # as _need_gb
        b, scan = first + 1, min(stop, first + 1 + SCAN_RANGES)
        while b < scan:
            held = states(first, b)
            need = held + in_flight * acts(first, b) + extra(first, b)
            if scaled:
                need = need - held * kept
            if working is not None:
                need = need + working(first, b)
            if cache is not None:
                need = need + cache(first, b)
            if not need <= cap:
                return b
            b += 1
        if b >= stop:
            return stop
        ok = _need_gb(self, in_flight, zero, fraction, (first, slice(b, stop))) <= cap
        return b + int(ok.argmin()) if not ok.all() else stop


def _need_gb(costs: StageCosts, in_flight: float, zero: int, fraction: float, at=(slice(None), slice(None))
             ) -> np.ndarray:
    """Memory of the ranges ``[a, b)`` at ``at`` (default all; a row of ranges: ``(a, slice(b0, b1))``)."""
    states = costs.states_gb[at]
    need = states + in_flight * costs.acts_gb[at] + costs.extra_gb[at]
    zero = _memory_zero(costs, zero, fraction)
    if zero or costs.offload != "none":
        need = need - states * _state_scales(costs.precision, costs.optimizer, costs.offload, zero, fraction)
    working = _working_gb(costs, zero, fraction)
    if working is not None:
        need = need + working[at]
    if costs.fp8_cache_gb is not None and zero < 3:
        # level 3 gathers each weight and caches none; one replica (all its states held) runs unsharded
        # unless its states are offloaded (ZeRO-Offload gathers them at level 3 even then)
        need = need + costs.fp8_cache_gb[at]
    return need


SCAN_RANGES = 24
""":meth:`StageCosts.first_unfit` sums this many ranges one at a time before it takes the rest of the row at once."""


def _memory_zero(costs: StageCosts, zero: int, fraction: float) -> int:
    """The level whose memory applies (:func:`~hetpart.costmodel.sharding.memory_zero`): one replica
    (``fraction`` 1) has nothing to shard unless its states are offloaded."""
    return zero if fraction < 1.0 or costs.offload != "none" else 0


@lru_cache(maxsize=4096)
def _state_scales(precision: str, optimizer: str, offload: str, zero: int, fraction: float) -> float:
    """1 - the kept share of the model states at level ``zero`` with ``fraction`` held: the same for every
    range, so computed once (the search's memory masks ask tens of thousands of times)."""
    scale = (sharded_state_bytes(1.0, precision, zero, fraction, optimizer, offload)
             / state_bytes_per_param(optimizer, precision))
    return 1.0 - scale


def _working_gb(costs: StageCosts, zero: int, fraction: float) -> np.ndarray | None:
    """``[n + 1, n + 1]``: the unsharded states alive on top of a range's shards at level ``zero`` (after
    :func:`_memory_zero`), GB, as the simulator counts them (``Simulator._device_memory_and_optimizer``,
    :func:`~hetpart.costmodel.sharding.working_set_bytes`); None below level 2. ``offload="full"`` gathers the
    units as level 3 does."""
    level = 3 if costs.offload == "full" else zero
    if level < 2:
        return None
    # hetpart's runtime makes each unit its own FSDP root over several replicas: one unit gathered at a time
    return _working_table(costs, level, costs.kernels == "torch" and level >= 3 and fraction < 1.0)


@lru_cache(maxsize=256)
def _working_table(costs: StageCosts, level: int, one_unit: bool) -> np.ndarray:
    w, g, _ = state_bytes(costs.precision)
    if level >= 3 and costs.kernels == "fused":
        return _frozen(gathered_working_ranges(costs.unit_params, w, g) / 1e9)
    per_param = working_set_bytes(1.0, costs.precision, level) - (w if one_unit else 0.0)
    return _frozen(_range_max(costs.unit_params) * per_param / 1e9)


def gathered_working_ranges(units: np.ndarray, w: float, g: float) -> np.ndarray:
    """``[n + 1, n + 1]``: :func:`~hetpart.costmodel.sharding.gathered_working_bytes` of every range ``[a, b)``
    of ``units`` (0 where ``a >= b``). Its terms over ``[a, b)``: the backward of the first unit with its
    gradient, ``(w + g) p_a``; the backward of unit ``j + 1`` with ``j`` prefetched, ``w p_j + (w + g) p_{j+1}``,
    for ``a <= j < b - 1``, which is never below the forward of ``j`` with ``j + 1`` prefetched
    (``w (p_j + p_{j+1})``), nor the last unit's forward with nothing after it below the last backward."""
    p = np.asarray(units, dtype=float)
    n = len(p)
    out = np.zeros((n + 1, n + 1))
    first = (w + g) * p  # row a: the range's first unit
    out[:n, 1:] = np.where(on_or_below_diagonal(n).T, first[:, None], 0.0)
    if n > 1:
        pairs = _range_max(w * p[:-1] + (w + g) * p[1:])  # [n, n]: pairs j in [a, c) at [a, c]
        out[:n, 2:] = np.maximum(out[:n, 2:], pairs[:, 1:])  # range [a, b) takes the pairs [a, b - 1)
    return out


MASKED_CACHE_BYTES = 1 << 30
"""Most bytes of masked matrices kept (:func:`_masked`, least recently used out first). A count of entries
(4,096 before) held 32 GB for a model of 1,000 layers, whose matrices take 8 MB each, and the kernel killed
the search."""
_MASKED: OrderedDict[tuple, np.ndarray] = OrderedDict()
_MASKED_BYTES = [0]


def _masked(costs: StageCosts, in_flight: float, zero: int = 0, fraction: float = 1.0) -> np.ndarray:
    key = (costs, in_flight, zero, fraction)  # StageCosts hash by identity
    hit = _MASKED.get(key)
    if hit is not None:
        _MASKED.move_to_end(key)
        return hit
    out = _frozen(np.where(_need_gb(costs, in_flight, zero, fraction) <= costs.capacity_gb, costs.time_s, np.inf))
    _MASKED[key] = out
    _MASKED_BYTES[0] += out.nbytes
    while _MASKED_BYTES[0] > MASKED_CACHE_BYTES and len(_MASKED) > 1:
        _MASKED_BYTES[0] -= _MASKED.popitem(last=False)[1].nbytes
    return out


def _frozen(array: np.ndarray) -> np.ndarray:
    """``array`` made read-only: cost tables share their arrays."""
    array.flags.writeable = False
    return array


def _range_sum(values: np.ndarray) -> np.ndarray:
    prefix = np.concatenate(([0.0], np.cumsum(values)))
    return prefix[None, :] - prefix[:, None]


def _range_max(values: np.ndarray) -> np.ndarray:
    """``[n + 1, n + 1]``: ``max(values[a:b])`` for ``a < b``, 0 elsewhere (one running maximum per row)."""
    n = len(values)
    upper = on_or_below_diagonal(n).T  # on and above the diagonal
    ahead = np.where(upper, np.asarray(values, dtype=float)[None, :], -np.inf)  # row a: -inf, ..., values[a:]
    out = np.zeros((n + 1, n + 1))
    out[:n, 1:] = np.where(upper, np.maximum.accumulate(ahead, axis=1), 0.0)
    return out


class CostTable:
    """Caches :class:`StageCosts` per (pool, tp, micro-batch, recompute, speed factor) for one model and cluster."""

    def __init__(self, model: ModelGraph, cluster: Cluster, precision: str, optimizer: str = "adam",
                 attention: str = "fused", kernels: str = DEFAULT_KERNELS, offload: str = "none") -> None:
        self.model = model
        self.kernels = kernels
        self.cluster = cluster
        self.precision = precision
        self.optimizer = optimizer
        self.attention = attention
        self.offload = offload
        self.get = lru_cache(maxsize=None)(self._build)
        self._states = lru_cache(maxsize=None)(self._tp_states)
        self._activations = lru_cache(maxsize=None)(self._tp_activations)

    def _build(self, pool: Pool, tp: int, micro_batch: int, recompute: str, speed: float = 1.0) -> StageCosts:
        """``speed``: the group's speed factor (its slowest device's, ``slow:`` in the cluster file): device work
        takes ``1 / speed`` as long, the host's dispatch and the tensor-parallel collectives do not."""
        _, unit, states, grads, gather, copy = self._states(tp)
        saved, work = self._activations(tp, recompute)
        return StageCosts(states_gb=states, acts_gb=_frozen(saved * micro_batch / 1e9),
                          extra_gb=_frozen(work * micro_batch / 1e9), grad_bytes=grads,
                          capacity_gb=memory_capacity_gb(pool.gpu), unit_params=unit, unit_gather=gather,
                          unit_copy=copy, tied_owner=self.model.tied_owner_index,
                          unit_times=partial(self._unit_time_s, pool, tp, micro_batch, recompute, False, speed),
                          unit_forwards=partial(self._unit_time_s, pool, tp, micro_batch, recompute, True, speed),
                          precision=self.precision, optimizer=self.optimizer, offload=self.offload,
                          fp8_cache_gb=self._fp8_cache(tp) if self.precision == "fp8" else None, kernels=self.kernels)

    def _tp_states(self, tp: int) -> tuple[np.ndarray, ...]:
        """``(divisor, params gathered per unit at levels 2-3, model-state GB, gradient bytes, params gathered per
        unit after a level 1-2 step, the tied copy per unit)`` of every unit or range at ``tp`` (the same for every
        micro-batch and recompute mode)."""
        model = self.model
        div = np.array([tp if u.tp_shardable else 1 for u in model.units], dtype=float)
        own = np.array([u.params for u in model.units], dtype=float) / div
        state_bytes = state_bytes_per_param(self.optimizer, self.precision)
        states = _range_sum(own) * state_bytes / 1e9
        grads = _range_sum(own) * GRAD_BYTES[self.precision]
        shared = np.array([u.shared_params for u in model.units], dtype=float) / div
        # what each unit gathers and reduces-scatters at levels 2-3: its copy too (PrefixTables.params_per_device
        # of the unit alone); the runtime keeps tied weights whole (Simulator._largest_unit_params)
        gather = unit = own + shared
        if self.kernels == "torch":
            unit = unit - np.array([tied_params_held(model, u, u + 1) for u in range(model.num_units)])
        owner = model.tied_owner_index if model.tied_owner_index >= 0 else None
        if shared.any():
            held = _range_sum(shared)
            if owner is not None:
                held[: owner + 1, owner + 1:] = 0.0  # ranges that hold the owner keep no copy
            states = states + held * state_bytes / 1e9
            if self.kernels == "fused":  # Megatron reduces a copy in its stage's buffer (Simulator._tied_pairs)
                grads = grads + held * GRAD_BYTES[self.precision]
        return _frozen(div), _frozen(unit), _frozen(states), _frozen(grads), _frozen(gather), _frozen(shared)

    def _tp_activations(self, tp: int, recompute: str) -> tuple[np.ndarray, np.ndarray]:
        """Bytes per sequence of a micro-batch: the activations a range saves, and the largest working set
        of one of its units (its backward's transients; under full recompute its activations again)."""
        div = self._states(tp)[0]
        saved = np.array(unit_saved_bytes(self.model, recompute, self.attention, self.kernels))
        if self.precision == "fp8":  # Transformer Engine saves fp8 copies of the linear inputs
            saved = saved + np.array(unit_fp8_saved_delta(self.model, recompute, self.kernels))
        work = np.array(unit_working_bytes(self.model, recompute, self.attention, self.kernels))
        return _range_sum(saved / div), _range_max(work / div)

    def _fp8_cache(self, tp: int) -> np.ndarray:
        """:attr:`StageCosts.fp8_cache_gb` at ``tp`` (the simulator's :func:`~hetpart.costmodel.memory.fp8_stage_bytes`)."""
        cached = np.array(unit_fp8_cached_params(self.model, self.kernels)) * FP8_WEIGHT_CACHE_BYTES / tp
        return _frozen(_range_sum(cached) / 1e9)

    def _unit_time_s(self, pool: Pool, tp: int, micro_batch: int, recompute: str, forward: bool = False,
                     speed: float = 1.0) -> np.ndarray:
        """Per-unit fwd + bwd (+ recompute) + TP all-reduce seconds, exactly as the simulator costs them
        (``forward``: the forward and its all-reduces alone)."""
        fwd, bwd = unit_compute_s(self.model, pool.gpu, tp, micro_batch, self.precision, recompute,
                                  attention=self.attention, kernels=self.kernels, speed=speed)
        if tp == 1:
            return fwd if forward else fwd + bwd
        facts = device_group_facts(self.cluster, tp_groups(pool, tp)[0])  # a pool's groups are alike
        tpf, tpb = unit_tp_comm_s(self.model, tp, micro_batch, recompute, *facts.tp_link)
        return fwd + tpf if forward else fwd + bwd + tpf + tpb
