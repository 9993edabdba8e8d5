"""Pricing candidate plans fast: a memory filter, a predictor and branch-and-bound.

Planners produce many candidates; :meth:`Evaluator.best` prices them with a predictor
(:mod:`hetpart.costmodel.predictor`). When the predictor has a lower bound (the simulator's:
:meth:`~hetpart.costmodel.simulator.Simulator.lower_bound_s`), candidates are priced in order of
their bound and the loop stops once no bound can beat the best priced plan, so it returns exactly
what pricing every candidate would, at a fraction of the cost. A predictor without a bound (a
learned model bounds nothing) prices every candidate in one batch, and :attr:`Evaluator.pruning`
says so.

The memory filter is the memory model of :mod:`hetpart.costmodel.memory` whatever the predictor.

Every candidate whose tensor-parallel groups mix unlike devices (two types, or a measured speed
factor) gets the uneven split an LP picks (:func:`~hetpart.costmodel.tp_split.fill_tp_splits`) before
it is priced; the even version is priced too and the faster kept, so rounding never costs. Groups of
alike devices are left even at the cost of one check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Iterable, Sequence

from hetpart.errors import PlanError
from hetpart.plan import Plan

if TYPE_CHECKING:  # pragma: no cover
    from hetpart.cluster import Cluster
    from hetpart.costmodel.predictor import Predictor
    from hetpart.costmodel.simulator import Estimate, Prediction
    from hetpart.graph.model_graph import ModelGraph
    from hetpart.workload import Workload

__all__ = ["Evaluated", "Evaluator", "evaluate", "best_of"]

@dataclass(frozen=True)
class Evaluated:
    """A plan and the predictor's inner-loop estimate of it (:meth:`Predictor.estimate_batch`: the
    same step time as the full report, without the report)."""

    plan: Plan
    estimate: "Estimate"

    @property
    def tokens_per_s(self) -> float:
        return self.estimate.tokens_per_s

    @property
    def step_time_s(self) -> float:
        return self.estimate.step_time_s


BOUND_SCREEN = True
"""Whether :meth:`Evaluator.best` drops plans whose first replica's bound is beyond the incumbent (:meth:`Evaluator.
_beyond`) before computing their whole bound (tests turn it off to compare)."""

_RECOMPUTE_RANK = {"none": 0, "selective": 1, "full": 2}
"""Less recomputation first on a tie: the pricing can make selective free (Megatron's, under fused attention)
where hetpart's own runtime pays for it."""


def best_of(candidates: Iterable[Evaluated | None]) -> Evaluated | None:
    """The fastest candidate (ties: fewest devices, then least recomputation, then first seen)."""
    best = None
    for c in candidates:
        if c is None:
            continue
        if best is None or c.tokens_per_s > best.tokens_per_s * (1 + 1e-12) or (
                c.tokens_per_s >= best.tokens_per_s * (1 - 1e-12) and (
                    c.plan.num_devices < best.plan.num_devices or (
                        c.plan.num_devices == best.plan.num_devices
                        and _RECOMPUTE_RANK.get(c.plan.recompute, 3) < _RECOMPUTE_RANK.get(best.plan.recompute, 3)))):
            best = c
    return best


class Evaluator:
    """Prices candidate plans of one workload with one predictor (built once, caches reused).

    Args:
        predictor: a :class:`~hetpart.costmodel.predictor.Predictor` for this model and cluster
            (default: the registry's default predictor).
        ignore_memory: accept plans that do not fit (the upper bound lifts memory limits).
    """

    def __init__(self, model: "ModelGraph", cluster: "Cluster", workload: "Workload",
                 ignore_memory: bool = False, predictor: "Predictor | None" = None) -> None:
        from hetpart.costmodel.predictor import get_predictor, lower_bound_of

        self.model, self.cluster, self.workload = model, cluster, workload
        self.ignore_memory = ignore_memory
        self.predictor = predictor if predictor is not None else get_predictor(None, model, cluster, workload)
        self._bound = lower_bound_of(self.predictor)
        self.simulations = 0
        """Plans priced so far (the work branch and bound saves)."""
        self._stage_gb: dict[tuple, tuple[float, float] | float] = {}
        self._range_gb: dict[tuple, tuple[float, float, float | None]] = {}
        self._alike_groups: dict[tuple[str, ...], bool] = {}
        self._capacity_gb: dict[tuple[str, ...], float] = {}
        self._flights: dict[tuple[str, int, int, int], tuple[float, ...]] = {}
        """Micro-batches in flight per pipeline device, by (schedule, pp, micro-batches, chunks per device)."""
        self._prefix_tables = None
        """The model's :class:`~hetpart.costmodel.memory.PrefixTables`, built for the first interleaved plan."""
        self.split_tp = True
        """Fill uneven tensor-parallel splits into candidates with unlike groups (HAP)."""
        self._unlike = not cluster.uniform_speed or len(cluster.gpu_types) > 1
        self.time_limited: float | None = None
        """Set by a planner that stopped at its time limit (seconds) before visiting its whole space."""
        self.speed_shares = True
        """Also price candidates whose replicas differ only in device speed (``slow:``) with batch shares in
        proportion to those speeds (:mod:`hetpart.costmodel.speed_shares`)."""

    @property
    def pruning(self) -> bool:
        """Whether :meth:`best` prunes (only with a predictor that has a lower bound)."""
        return self._bound is not None

    def describe(self) -> dict[str, object]:
        """The predictor and whether branch and bound could prune, for a planner's result."""
        p = self.predictor
        note = (f"branch and bound on {p.name}'s lower bound (exact)" if self.pruning else
                f"no pruning: predictor {p.name!r} has no lower bound, every candidate was priced")
        out = {"predictor": {"name": p.name, "version": p.version}, "pruned": self.pruning, "pruning": note,
               "complete": self.time_limited is None}
        if self.time_limited is not None:
            out["time_limit_s"] = self.time_limited
        return out

    # ------------------------------------------------------------------------------------- filters
    def fits(self, plan: Plan) -> bool:
        """Whether every device of ``plan`` holds its stages (the simulator's memory rule, without
        simulating the schedule)."""
        if self.ignore_memory:
            return True
        from hetpart.costmodel.memory import in_flight_microbatches
        from hetpart.costmodel.sharding import microbatches_run

        zero = self._zero(plan)
        v = plan.chunks_per_device
        seen = set()
        for r, rep in enumerate(plan.replicas):
            # replicas cut alike, on devices of the same least capacity, with as many micro-batches in flight
            # and the same shard fraction, need the same: one of them is checked (a 1,024-GPU plan has hundreds)
            caps = tuple(self._least_capacity_gb(s.devices) for s in rep.stages)
            pp, m = rep.pp // v, microbatches_run(plan, r)
            flights = self._flights.get((plan.schedule, pp, m, v))
            if flights is None:
                flights = self._flights[(plan.schedule, pp, m, v)] = tuple(
                    in_flight_microbatches(plan.schedule, d, pp, m, v) for d in range(pp))
            key = (tuple((s.layers, s.tp, s.tp_split) for s in rep.stages), caps, flights,
                   plan.shard_fraction(r) if zero else 1.0)
            if key in seen:
                continue
            seen.add(key)
            for d, need in self._replica_needs_gb(plan, r, zero):
                if need > caps[d]:
                    return False
        return True

    @staticmethod
    def _zero(plan: Plan) -> int:
        """The level whose memory applies: one replica shards nothing, unless offloaded (a lone replica then
        streams its gradients to the host)."""
        return plan.zero if plan.dp > 1 or plan.offload != "none" else 0

    def _least_capacity_gb(self, devices: tuple[str, ...]) -> float:
        """The smallest :func:`~hetpart.costmodel.memory.memory_capacity_gb` of ``devices`` (memoised per
        device tuple: a need above it is above some device's capacity, as checking each device says)."""
        devices = tuple(devices)
        least = self._capacity_gb.get(devices)
        if least is None:
            from hetpart.costmodel.memory import memory_capacity_gb

            least = self._capacity_gb[devices] = min(memory_capacity_gb(self.cluster.device(x).gpu)
                                                     for x in devices) if devices else math.inf
        return least

    def device_memory_gb(self, plan: Plan) -> dict[tuple[int, int], float]:
        """(replica, pipeline device group) -> the peak :meth:`fits` checks, GB (its largest device under an
        uneven tensor-parallel split)."""
        return dict(self._needs_gb(plan))

    def _needs_gb(self, plan: Plan):
        """Yields ``((replica, device group), peak GB)`` in plan order."""
        zero = self._zero(plan)
        for r in range(len(plan.replicas)):
            for d, need in self._replica_needs_gb(plan, r, zero):
                yield (r, d), need

    def _replica_needs_gb(self, plan: Plan, r: int, zero: int):
        """Yields ``(device group, peak GB)`` of replica ``r``."""
        from hetpart.costmodel.memory import PrefixTables, chunk_flights
        from hetpart.costmodel.sharding import microbatches_run, sharded_delta_gb
        from hetpart.costmodel.tp_split import param_shares

        v = plan.chunks_per_device
        rep = plan.replicas[r]
        pp, m = rep.pp // v, microbatches_run(plan, r)
        # the largest share's divisor of each stage (its most loaded device)
        tps = [s.tp if s.tp_split is None else 1.0 / float(param_shares(self.model, s.tp, s.tp_split).max())
               for s in rep.stages]
        tables = None
        if plan.schedule == "interleaved" and v > 1:  # chunks hold unlike counts (chunk_flights weighs them)
            tables = self._prefix_tables = self._prefix_tables or PrefixTables(self.model)
        for d in range(pp):
            flights = chunk_flights(tables, plan.schedule, d, pp, m, v,
                                    [(*rep.stages[k].layers, tps[k]) for k in range(d, rep.pp, pp)], plan.recompute,
                                    plan.attention)
            need = params = largest = work = 0.0
            chunk_units = []
            for k, flight in zip(range(d, rep.pp, pp), flights):
                s = rep.stages[k]
                key = (s.layers, s.tp, plan.micro_batch, flight, plan.recompute, s.tp_split, plan.optimizer,
                       plan.attention, plan.precision, zero)
                tp = tps[k]
                if key not in self._stage_gb:  # (chunk without its working set, its working set)
                    self._stage_gb[key] = self._stage_memory_gb(s.layers, tp, plan, flight, zero)
                need += self._stage_gb[key][0]
                work = max(work, self._stage_gb[key][1])  # one unit runs at a time: once per device
                if zero or plan.offload != "none":
                    params += self._range_params(s.layers, tp)
                    largest = max(largest, self._largest_unit(s.layers, tp))
                    if zero >= 3 or plan.offload == "full":  # the working set of levels 0-2 takes the largest
                        chunk_units.append(self._unit_params(s.layers, tp))
            yield d, need + work + sharded_delta_gb(params, largest, plan.precision, zero,
                                                    plan.shard_fraction(r) if zero else 1.0, plan.optimizer,
                                                    plan.offload, chunk_units or None)

    def _stage_memory_gb(self, layers: tuple[int, int], tp: float, plan: Plan, flight: float, zero: int = 0
                         ) -> tuple[float, float]:
        """(:func:`~hetpart.costmodel.memory.stage_memory_gb` without the working set, :func:`~hetpart.costmodel.memory.
        stage_working_gb`) of one chunk: the same sums in the same order over per-unit terms computed once per
        ``(tp, recompute, attention)`` (:meth:`_unit_terms`), where those functions rebuild every unit's lists per
        call (a 1,024-GPU ``proportional`` baseline checks thousands of distinct chunks: most of its time).
        ``tests/test_policy_speed_s48_memory.py`` compares the two."""
        first, last = layers
        known = self._range_gb.get((layers, tp, plan.recompute, plan.attention))
        if known is None:
            kept, working = self._unit_terms(tp, plan.recompute, plan.attention)
            known = self._range_gb[(layers, tp, plan.recompute, plan.attention)] = (
                self.model.range_params(first, last, tp), sum(kept[first:last]),
                max(working[first:last]) if last > first else None)
        params, kept_bytes, working_bytes = known
        from hetpart.costmodel.memory import fp8_range_bytes, state_bytes_per_param

        states = params * state_bytes_per_param(plan.optimizer, plan.precision)
        if plan.precision == "fp8":  # memory.fp8_stage_bytes, its per-unit lists kept
            states += fp8_range_bytes(*self._fp8_sums(layers, plan.recompute), tp, plan.micro_batch, flight, zero)
        acts = kept_bytes * plan.micro_batch * flight
        work = 0.0 if working_bytes is None else working_bytes * plan.micro_batch / 1e9
        return (states + acts) / 1e9, work

    def _unit_terms(self, tp: float, recompute: str, attention: str) -> tuple[list[float], list[float]]:
        """Per unit, the bytes per sequence one device of a ``tp``-way stage keeps per micro-batch in flight and
        its working set (whole part plus the split part over ``tp``), as the memory model's stage functions sum
        and maximise them."""
        key = ("terms", tp, recompute, attention)
        terms = self._stage_gb.get(key)
        if terms is None:
            from hetpart.costmodel.activations import (unit_kept_bytes, unit_replicated_bytes,
                                                       unit_replicated_working_bytes, unit_working_bytes)

            m = self.model
            kept = [(b - r) / tp + r for b, r in zip(unit_kept_bytes(m, recompute, attention),
                                                     unit_replicated_bytes(m, recompute, attention))]
            working = [(b - r) / tp + r for b, r in zip(unit_working_bytes(m, recompute, attention),
                                                        unit_replicated_working_bytes(m, recompute, attention))]
            terms = self._stage_gb[key] = (kept, working)
        return terms

    def _fp8_sums(self, layers: tuple[int, int], recompute: str) -> tuple[float, float]:
        """Units ``layers``' sums of the fp8 cached weights and saved-activation change per sequence
        (:func:`~hetpart.costmodel.memory.fp8_stage_bytes`' sums; 15% of the memory check of fp8 plans at 1,024
        GPUs rebuilt their per-unit lists per stage)."""
        key = ("fp8", layers, recompute)
        hit = self._stage_gb.get(key)
        if hit is None:
            units = self._stage_gb.get(("fp8 units", recompute))
            if units is None:
                from hetpart.costmodel.activations import unit_fp8_cached_params, unit_fp8_saved_delta

                units = self._stage_gb[("fp8 units", recompute)] = (unit_fp8_cached_params(self.model),
                                                                    unit_fp8_saved_delta(self.model, recompute))
            hit = self._stage_gb[key] = (sum(units[0][layers[0]:layers[1]]), sum(units[1][layers[0]:layers[1]]))
        return hit

    def _range_params(self, layers: tuple[int, int], tp: float) -> float:
        key = ("params", layers, tp)
        if key not in self._stage_gb:
            self._stage_gb[key] = self.model.range_params(*layers, tp)
        return self._stage_gb[key]

    def _unit_params(self, layers: tuple[int, int], tp: float) -> list[float]:
        """Parameters one device holds of each unit of ``layers`` (level 3's working set, in forward order)."""
        key = ("units", layers, tp)
        if key not in self._stage_gb:
            self._stage_gb[key] = [self.model.range_params(u, u + 1, tp) for u in range(*layers)]
        return self._stage_gb[key]

    def _largest_unit(self, layers: tuple[int, int], tp: int) -> float:
        key = ("largest", layers, tp)
        if key not in self._stage_gb:
            self._stage_gb[key] = max(self._unit_params(layers, tp))
        return self._stage_gb[key]

    def lower_bound_s(self, plan: Plan,
                      whole: Sequence[tuple[Sequence[str], Sequence[int], Sequence[int]]] | None = None
                      ) -> float | None:
        """The predictor's lower bound on ``plan``'s step time; None when it has none. ``whole``: ``plan`` is some
        replicas of a larger plan, given as (each replica's stages' first devices, their layer boundaries, their
        ``tp``): the bound is then the larger plan's (:meth:`hetpart.costmodel.simulator.Simulator.lower_bound_s`)."""
        if self._bound is None:
            return None
        return self._bound(plan) if whole is None else self._bound(plan, whole=whole)

    # ------------------------------------------------------------------------------------- simulate
    def __call__(self, plan: Plan, *, split: bool = True) -> Evaluated | None:
        """The plan's estimate; None when it breaks a rule or does not fit (unless ``ignore_memory``).
        With ``split``, the best of its :meth:`variants` (the LP-split version where tensor-parallel groups are
        unlike, and that version with speed-proportional batch shares where devices are throttled)."""
        if not split:
            return self._one(plan)
        variants = self.variants(plan)
        if len(variants) > 1:
            return best_of([self._one(p) for p in variants])
        return self._one(plan)

    def variants(self, plan: Plan) -> list[Plan]:
        """``plan``, then its LP-split version (:meth:`with_splits`), then that version with batch shares
        in proportion to its replicas' speeds where throttled devices make them unlike
        (:func:`~hetpart.costmodel.speed_shares.speed_shares`); each distinct plan once."""
        out = [plan]
        filled = self.with_splits(plan)
        if filled is not plan:
            out.append(filled)
        if self.speed_shares and self.cluster.slow:
            from hetpart.costmodel.speed_shares import speed_shares

            shared = speed_shares(self.model, self.cluster, filled)
            if shared is not filled:
                out.append(shared)
        return out

    def _one(self, plan: Plan) -> Evaluated | None:
        if plan.validate(self.model, self.cluster) or not self.fits(plan):
            return None
        return self._priced([plan])[0]

    def with_splits(self, plan: Plan) -> Plan:
        """``plan`` with uneven splits for its unlike tensor-parallel groups (the same object when none)."""
        if not (self.split_tp and self._unlike):
            return plan
        alike = self._alike
        if all(s.tp < 2 or s.tp_split is not None or alike(s.devices) for rep in plan.replicas for s in rep.stages):
            return plan  # what fill_tp_splits returns where no stage has unlike devices to split
        from hetpart.costmodel.tp_split import fill_tp_splits

        return fill_tp_splits(plan, self.model, self.cluster)

    def _alike(self, devices: tuple[str, ...]) -> bool:
        """:func:`~hetpart.costmodel.tp_split.devices_alike` of a stage's devices, memoised per device tuple (a
        1,024-GPU plan has hundreds of tensor-parallel groups, and the plans of one shortlist share them)."""
        known = self._alike_groups.get(devices)
        if known is None:
            from hetpart.costmodel.tp_split import devices_alike

            known = self._alike_groups[devices] = devices_alike(self.cluster, devices)
        return known

    def _priced(self, plans: list[Plan]) -> list[Evaluated | None]:
        """Estimates of valid, memory-filtered plans in one batch (None: the predictor refused or it
        does not fit)."""
        if not plans:
            return []
        self.simulations += len(plans)
        try:
            estimates = self.predictor.estimate_batch(plans)
        except PlanError:
            if len(plans) == 1:
                return [None]
            return [self._priced([p])[0] for p in plans]
        return [Evaluated(p, e) if e.fits_in_memory or self.ignore_memory else None
                for p, e in zip(plans, estimates)]

    def predict(self, plan: Plan) -> "Prediction":
        """The predictor's full report for ``plan`` (metrics, breakdown, memory)."""
        return self.predictor.predict(plan, _fixed(self.workload, plan), validate=False)

    def best(self, plans: Iterable[Plan], incumbent: Evaluated | None = None) -> Evaluated | None:
        """The fastest fitting plan of ``plans`` (or ``incumbent``).

        With a lower bound: priced in order of the bound, stopping when no remaining plan can win
        (branch and bound; exact). Without one: every valid fitting plan priced in one batch."""
        if (self.split_tp and self._unlike) or (self.speed_shares and self.cluster.slow):
            plans = [q for p in plans for q in self.variants(p)]
        if self._bound is None:
            valid = [p for p in plans if not p.validate(self.model, self.cluster) and self.fits(p)]
            return best_of([incumbent, *self._priced(valid)])
        cutoff = incumbent.step_time_s * (1 + 1e-9) if incumbent is not None else math.inf
        queue = sorted(((self._bound(p), i, p) for i, p in enumerate(plans)
                        if self.fits(p) and not self._beyond(p, cutoff)), key=lambda t: (t[0], t[1]))
        best = incumbent
        for bound, _, plan in queue:
            if best is not None and bound > best.step_time_s:
                break
            best = best_of([best, self(plan, split=False)])  # the split versions are in the queue
        return best

    def _beyond(self, plan: Plan, cutoff: float) -> bool:
        """Whether the simulator's bound on ``plan``'s first replica alone is above ``cutoff`` (a hair above the
        incumbent's step time): then so is the whole plan's bound, a maximum over its replicas of the same terms,
        and :meth:`best` would stop before pricing it, so it is dropped before its whole bound is computed (a
        1,024-GPU plan's bound walks every replica; the policy's shortlist has half its plans beyond the walk's
        best). Only where that holds term by term: the simulator itself, no sharding (each replica's shard
        fraction depends on the others), no context parallelism, several replicas."""
        if (not BOUND_SCREEN or cutoff == math.inf or plan.dp < 2 or plan.zero or plan.cp != 1
                or not self._replica_bounds()):
            return False
        return self._bound(replace(plan, replicas=plan.replicas[:1])) > cutoff

    def _replica_bounds(self) -> bool:
        """Whether the bound is the simulator's own (:meth:`~hetpart.costmodel.simulator.Simulator.lower_bound_s`:
        a maximum over replicas), not a wrapper's or another predictor's."""
        known = self.__dict__.get("_replica_bound")
        if known is None:
            from hetpart.costmodel.simulator import Simulator

            known = self._replica_bound = type(self.predictor) is Simulator
        return known


def evaluate(model: "ModelGraph", cluster: "Cluster", plan: Plan, workload: "Workload",
             ignore_memory: bool = False, predictor: "Predictor | None" = None) -> Evaluated | None:
    """One-off :class:`Evaluator` call."""
    return Evaluator(model, cluster, workload, ignore_memory, predictor)(plan)


def _fixed(workload: "Workload", plan: Plan) -> "Workload":
    return replace(workload, recompute=plan.recompute) if workload.recompute == "auto" else workload
