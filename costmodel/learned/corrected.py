"""The corrected model: the simulator's prediction times a correction learned from measured runs.

``step = simulator_step * exp(c(x))``, where ``x`` describes the plan as the simulator sees it (its
share of compute, tensor-parallel, pipeline and data-parallel time, bubbles, depth, degrees, size)
and ``c`` is a kernel regression of ``log(measured / simulated)`` over the measured runs, shrunk
towards zero by ``prior_runs`` pseudo-runs that say "the simulator is right":

    c(x) = sum_i w_i(x) r_i / (sum_i w_i(x) + prior_runs),   w_i(x) = exp(-|x - x_i|^2 / (2 h^2))

Near measured runs it follows them; far from every run (all ``w_i`` ~ 0) it is the simulator. Its
uncertainty is the spread of the neighbours' residuals, widened where there are few (an effective
number of runs ``sum_i w_i``), and ``out_of_distribution`` when that number is below one.

Fitted from run records (``hetpart run --out``): each record's plan is re-simulated on the cluster
the prediction is for (the emulated one for emulated runs) with the simulator's run-time options.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

from hetpart.cluster import Cluster
from hetpart.graph.model_graph import ModelGraph
from hetpart.plan import Plan
from hetpart.workload import Workload

__all__ = ["Correction", "CorrectedPredictor", "correction_features", "fit_correction", "CORRECTION_FEATURES"]

CORRECTION_FEATURES = ("compute_share", "tp_share", "pp_share", "dp_share", "bubble_share", "log_step_s",
                       "log_pp", "log_dp", "log_tp", "log_micro_batch", "log_devices")


def correction_features(prediction: Any, plan: Plan) -> np.ndarray:
    """What the correction reads: the simulator's breakdown as shares of the step, and the plan's shape."""
    step = prediction.step_time_s
    rows = prediction.breakdown
    n = max(len(rows), 1)

    def share(key):
        return sum(r.get(key, 0.0) for r in rows) / n / step

    tp = max(s.tp for r in plan.replicas for s in r.stages)
    pp = max(len(r.stages) for r in plan.replicas)
    return np.array([share("compute_s"), share("tp_comm_s"), share("pp_comm_s"), share("dp_comm_s"),
                     share("bubble_s"), math.log10(step), math.log2(pp) / 3, math.log2(plan.dp) / 3,
                     math.log2(tp) / 3, math.log2(plan.micro_batch) / 3, math.log2(plan.num_devices) / 4])


@dataclass
class Correction:
    """A fitted correction (see the module docstring)."""

    x: np.ndarray
    """Features of the measured runs ``[n, F]``."""
    r: np.ndarray
    """``log(measured / simulated)`` of each run ``[n]``."""
    bandwidth: float = 0.35
    prior_runs: float = 1.0
    meta: dict[str, Any] = field(default_factory=dict)

    def apply(self, x: np.ndarray) -> tuple[float, float, bool]:
        """``(log correction, relative std, out_of_distribution)`` at features ``x``."""
        if len(self.r) == 0:
            return 0.0, 0.5, True
        d2 = ((self.x - x) ** 2).sum(1)
        w = np.exp(-d2 / (2 * self.bandwidth ** 2))
        support = float(w.sum())
        c = float((w * self.r).sum() / (support + self.prior_runs))
        spread = float(np.sqrt((w * (self.r - c) ** 2).sum() / support)) if support > 1e-12 else 0.0
        std = math.sqrt(spread ** 2 + (0.5 ** 2) / (1.0 + support))
        return c, std, support < 1.0


def fit_correction(x: Sequence[np.ndarray], log_ratio: Sequence[float], bandwidth: float = 0.35,
                   prior_runs: float = 1.0) -> Correction:
    """The correction of the measured runs with features ``x`` and residuals ``log(measured/simulated)``."""
    return Correction(np.asarray(x, float).reshape(len(log_ratio), -1), np.asarray(log_ratio, float), bandwidth,
                      prior_runs)


def records_training_set(records: Iterable[Any]) -> tuple[list[np.ndarray], list[float], list[bool]]:
    """``(features, log(measured/simulated), emulated)`` of run records (``hetpart.records.RunRecord``)."""
    from hetpart.costmodel.simulator import Simulator

    xs, rs, emulated = [], [], []
    for rec in records:
        model, cluster, plan = rec.model_graph(), rec.prediction_cluster(), rec.run_plan()
        overlap = bool((rec.predicted.options if rec.predicted else {}).get("overlap_grad_reduce", False))
        pred = Simulator(model, cluster, overlap_grad_reduce=overlap).simulate(plan, validate=False)
        xs.append(correction_features(pred, plan))
        rs.append(math.log(rec.measured.step_time_s / pred.step_time_s))
        emulated.append(bool(rec.emulated))
    return xs, rs, emulated


class CorrectedPredictor:
    """The simulator times a :class:`Correction` (Predictor protocol; no lower bound)."""

    name = "corrected"

    def __init__(self, model: ModelGraph, cluster: Cluster, workload: Workload | None = None, *,
                 correction: Correction, overlap_grad_reduce: bool = True) -> None:
        from hetpart.costmodel.simulator import Simulator

        self.sim = Simulator(model, cluster, overlap_grad_reduce=overlap_grad_reduce)
        self.correction = correction
        self.version = f"simulator x correction({len(correction.r)} runs)"

    def predict(self, plan: Plan, workload: Workload | None = None, *, validate: bool = True, trace: bool = False):
        """The simulator's report with the corrected step time (metrics that scale with it rescaled)."""
        from dataclasses import replace

        pred = self.sim.simulate(plan, workload, validate=validate, trace=trace)
        c, std, ood = self.correction.apply(correction_features(pred, plan))
        k = math.exp(c)
        m = dict(pred.metrics)
        m["step_time_s"] = pred.step_time_s * k
        for key in ("tokens_per_s", "samples_per_s", "hardware_tflops_per_device", "model_tflops_per_device", "mfu"):
            m[key] = pred.metrics[key] / k
        m["uncertainty"] = {"relative_std": std, "out_of_distribution": ood, "correction": k}
        return replace(pred, step_time_s=m["step_time_s"], tokens_per_s=m["tokens_per_s"],
                       samples_per_s=m["samples_per_s"], metrics=m)

    def estimate_batch(self, plans: Sequence[Plan]) -> list:
        from hetpart.costmodel.simulator import Estimate

        out = []
        for plan in plans:
            p = self.predict(plan, validate=False)
            est = self.sim.estimate(plan)
            out.append(Estimate(p.step_time_s, p.tokens_per_s, est.fits_in_memory, est.memory_headroom_gb))
        return out
