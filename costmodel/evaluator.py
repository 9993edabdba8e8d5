"""Simulating candidate plans fast: a memory filter, an exact lower bound and branch-and-bound.

Planners produce many candidates; :meth:`Evaluator.best` simulates them in order of a lower bound
on their step time and stops once the bound cannot beat the best simulated plan, so it returns
exactly what simulating every candidate would, at a fraction of the cost.

The bound, per pipeline device ``d`` of a replica with ``m`` micro-batches: the device computes
``m`` forwards and backwards of its stage, and before its first forward every earlier stage ran
one forward while after its last backward every earlier stage runs one backward, so the pipeline
takes at least ``sum_{k<d} (f_k + b_k) + m (f_d + b_d)``; the optimizer step comes after all of
it. Stage times are the simulator's own (:mod:`hetpart.costmodel.compute` on the stage's slowest
device, tensor-parallel all-reduces over its slowest ring hop).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Iterable

import numpy as np

from hetpart.errors import PlanError
from hetpart.plan import Plan

if TYPE_CHECKING:  # pragma: no cover
    from hetpart.cluster import Cluster
    from hetpart.costmodel.simulator import Estimate, Prediction
    from hetpart.graph.model_graph import ModelGraph
    from hetpart.workload import Workload

__all__ = ["Evaluated", "Evaluator", "evaluate", "best_of"]

_SLACK = 1.0 - 1e-9
"""The bound is scaled down by this so that rounding never prunes the optimum."""


@dataclass(frozen=True)
class Evaluated:
    """A plan and the simulator's inner-loop estimate of it (:meth:`Simulator.estimate`: the same
    step time as :func:`simulate`, without the report)."""

    plan: Plan
    estimate: "Estimate"

    @property
    def tokens_per_s(self) -> float:
        return self.estimate.tokens_per_s

    @property
    def step_time_s(self) -> float:
        return self.estimate.step_time_s


def best_of(candidates: Iterable[Evaluated | None]) -> Evaluated | None:
    """The fastest candidate (ties: fewest devices, then first seen)."""
    best = None
    for c in candidates:
        if c is None:
            continue
        if best is None or c.tokens_per_s > best.tokens_per_s * (1 + 1e-12) or (
                c.tokens_per_s >= best.tokens_per_s * (1 - 1e-12) and c.plan.num_devices < best.plan.num_devices):
            best = c
    return best


class Evaluator:
    """Simulates candidate plans of one workload, reusing one :class:`~hetpart.costmodel.simulator.Simulator`."""

    def __init__(self, model: "ModelGraph", cluster: "Cluster", workload: "Workload",
                 ignore_memory: bool = False) -> None:
        from hetpart.costmodel.simulator import Simulator

        self.model, self.cluster, self.workload = model, cluster, workload
        self.ignore_memory = ignore_memory
        self.simulator = Simulator(model, cluster)
        self.simulations = 0
        self._stage_gb: dict[tuple, float] = {}
        self._prefix: dict[tuple, np.ndarray] = {}
        self._params_cache: dict[tuple, float] = {}

    # ------------------------------------------------------------------------------------- filters
    def fits(self, plan: Plan) -> bool:
        """Whether every device of ``plan`` holds its stages (the simulator's memory rule, without
        simulating the schedule)."""
        from hetpart.costmodel.memory import in_flight_microbatches, memory_capacity_gb, stage_memory_gb

        if self.ignore_memory:
            return True
        v = plan.interleave if plan.schedule == "interleaved" else 1
        for r, rep in enumerate(plan.replicas):
            pp, m = rep.pp // v, plan.num_microbatches(r)
            for d in range(pp):
                flight = in_flight_microbatches(plan.schedule, d, pp, m, v)
                need = 0.0
                for k in range(d, rep.pp, pp):
                    s = rep.stages[k]
                    key = (s.layers, s.tp, plan.micro_batch, flight, plan.recompute)
                    if key not in self._stage_gb:
                        self._stage_gb[key] = stage_memory_gb(self.model, *s.layers, s.tp, plan.micro_batch, flight,
                                                              plan.recompute, plan.precision)
                    need += self._stage_gb[key]
                if any(need > memory_capacity_gb(self.cluster.device(x).gpu) for x in rep.stages[d].devices):
                    return False
        return True

    def _stage_s(self, stage, plan: Plan) -> float:
        """Forward + backward (+ recompute, + TP all-reduces) of one micro-batch on ``stage``."""
        from hetpart.costmodel.compute import unit_compute_s, unit_tp_comm_s

        gpu = min((self.cluster.device(d).gpu for d in stage.devices), key=lambda g: g.tflops_bf16)
        link = (1.0, 0.0)
        if stage.tp > 1:
            hops = [self.cluster.link_between(stage.devices[i], stage.devices[(i + 1) % stage.tp])
                    for i in range(stage.tp)]
            hops = [h for h in hops if h is not None and h.kind != "self"]
            link = (min(h.bandwidth_gbyte_s for h in hops), max(h.latency_us for h in hops))
        key = (gpu, stage.tp, plan.micro_batch, plan.precision, plan.recompute, link)
        if key not in self._prefix:
            f, b = unit_compute_s(self.model, gpu, stage.tp, plan.micro_batch, plan.precision, plan.recompute)
            total = f + b
            if stage.tp > 1:
                tf, tb = unit_tp_comm_s(self.model, stage.tp, plan.micro_batch, plan.recompute, *link)
                total = total + tf + tb
            self._prefix[key] = np.concatenate(([0.0], np.cumsum(total)))
        prefix = self._prefix[key]
        return float(prefix[stage.layers[1]] - prefix[stage.layers[0]])

    def lower_bound_s(self, plan: Plan) -> float:
        """A step time no simulation of ``plan`` goes below (see the module docstring)."""
        from hetpart.costmodel.simulator import OPTIMIZER_BYTES_PER_PARAM

        v = plan.interleave if plan.schedule == "interleaved" else 1
        pipe, optim = 0.0, 0.0
        for r, rep in enumerate(plan.replicas):
            pp, m = rep.pp // v, plan.num_microbatches(r)
            per_device = [sum(self._stage_s(rep.stages[k], plan) for k in range(d, rep.pp, pp)) for d in range(pp)]
            before = 0.0
            for d in range(pp):
                pipe = max(pipe, (before if v == 1 else 0.0) + m * per_device[d])
                before += per_device[d]
                params = sum(self._params(rep.stages[k]) for k in range(d, rep.pp, pp))
                optim = max(optim, params * OPTIMIZER_BYTES_PER_PARAM / (self._hbm(rep.stages[d].devices) * 1e9))
        return (pipe + optim) * _SLACK

    def _params(self, stage) -> float:
        from hetpart.costmodel.memory import stage_params_per_device

        key = (stage.layers, stage.tp)
        if key not in self._params_cache:
            self._params_cache[key] = stage_params_per_device(self.model, *stage.layers, stage.tp)
        return self._params_cache[key]

    def _hbm(self, devices: tuple[str, ...]) -> float:
        return min(self.cluster.device(x).gpu.hbm_gbyte_s for x in devices)

    # ------------------------------------------------------------------------------------- simulate
    def __call__(self, plan: Plan) -> Evaluated | None:
        """The plan's prediction; None when it breaks a rule or does not fit (unless ``ignore_memory``)."""
        if plan.validate(self.model, self.cluster) or not self.fits(plan):
            return None
        self.simulations += 1
        try:
            estimate = self.simulator.estimate(plan, validate=False)
        except PlanError:
            return None
        if not (estimate.fits_in_memory or self.ignore_memory):
            return None
        return Evaluated(plan, estimate)

    def predict(self, plan: Plan) -> "Prediction":
        """The full simulator report for ``plan`` (metrics, breakdown, memory)."""
        return self.simulator.simulate(plan, _fixed(self.workload, plan), validate=False)

    def best(self, plans: Iterable[Plan], incumbent: Evaluated | None = None) -> Evaluated | None:
        """The fastest fitting plan of ``plans`` (or ``incumbent``), simulating in order of the lower
        bound and stopping when no remaining plan can win (branch and bound; exact)."""
        queue = sorted(((self.lower_bound_s(p), i, p) for i, p in enumerate(plans) if self.fits(p)),
                       key=lambda t: (t[0], t[1]))
        best = incumbent
        for bound, _, plan in queue:
            if best is not None and bound > best.step_time_s:
                break
            best = best_of([best, self(plan)])
        return best


def evaluate(model: "ModelGraph", cluster: "Cluster", plan: Plan, workload: "Workload",
             ignore_memory: bool = False) -> Evaluated | None:
    """One-off :class:`Evaluator` call."""
    return Evaluator(model, cluster, workload, ignore_memory)(plan)


def _fixed(workload: "Workload", plan: Plan) -> "Workload":
    return replace(workload, recompute=plan.recompute) if workload.recompute == "auto" else workload
