"""The corrected model: the simulator's prediction times a correction learned from measured runs.

``step = simulator_step * exp(c(x))``, where ``x`` describes the plan as the simulator sees it (its
share of compute, tensor-parallel, pipeline and data-parallel time, bubbles, depth, degrees, size)
and ``c`` is a kernel regression of ``log(measured / simulated)`` over the measured runs, shrunk
towards zero by ``prior_runs`` pseudo-runs that say "the simulator is right":

    c(x) = sum_i w_i(x) r_i / (sum_i w_i(x) + prior_runs),   w_i(x) = exp(-|x - x_i|^2 / (2 h^2))

Near measured runs it follows them; far from every run (all ``w_i`` ~ 0) it is the simulator. Its
uncertainty is the spread of the neighbours' residuals, widened where there are few (an effective
number of runs ``sum_i w_i``), and ``out_of_distribution`` when that number is below one.

A kernel alone only repeats the residuals of nearby runs; a trend across them (the simulator growing
too fast as micro-batches shrink, say) it cannot carry to a plan between or beside them. So with three
runs or more a linear term comes first (semi-parametric regression): ridge regression of the residuals
on the features, its penalty chosen by leave-one-out over the runs from :data:`RIDGE_GRID` (or no
linear term, when none of them predicts the left-out runs better than the simulator does), faded
towards the simulator away from the runs by ``S / (S + prior_runs)``, ``S`` the runs' weight under a
kernel of bandwidth :data:`LINEAR_FADE`; the kernel then fits what the linear term leaves (with
``wide_bandwidth``, the shared term comes first and the linear term fits what it leaves).
On the closed loop's runs (12 stored loops of the acceptance cluster, 9-11 runs to train on each) the
error on the runs never trained on fell from 28.7% (kernel alone; simulator 34.5%) to 14.6%, below the
simulator's in every loop; on 4 loops of clusters and models not looked at while designing it, from
26.0% to 17.9% (simulator 38.1%; docs/BENCHMARKS.md, "The closed loop's correction on stored loops").

With ``wide_bandwidth`` set, a second, wider kernel first carries what the runs share (a whole
cluster or runtime slower than the simulator says: the same shrinkage, its own bandwidth) and the
narrow one fits what is left, so a plan near no run still gets the bias the runs on its cluster share.

Fitted from run records (``hetpart run --out``): each record's plan is re-simulated on the cluster
the prediction is for (the emulated one for emulated runs) with the simulator's run-time options.
Features come from that run-time simulation (``features="run"``: re-predicting records) or from the
plan as it was planned, the full model on the real cluster (``features="plan"``: what a planner
that prices plans of the real cluster needs; ``hetpart loop`` fits so).

Registered as the predictor ``corrected`` (:func:`corrected_predictor`): the correction given, else
``$HETPART_CORRECTION`` (a file ``hetpart costmodel correct --out`` wrote), else none: then it has
seen no run and answers as the simulator, flagged out of distribution.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Literal, Sequence

import numpy as np

from hetpart.cluster import Cluster
from hetpart.graph.model_graph import ModelGraph
from hetpart.plan import Plan
from hetpart.workload import Workload

__all__ = ["Correction", "CorrectedPredictor", "correction_features", "fit_correction", "records_training_set",
           "fit_records", "corrected_predictor", "load_correction", "leave_one_out", "run_prediction",
           "planned_features", "CORRECTION_FEATURES", "RIDGE_GRID", "LINEAR_FADE"]

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


RIDGE_GRID = (0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0)
"""Penalties of the linear term's slopes that leave-one-out chooses from (features are of order one)."""
LINEAR_FADE = 1.0
"""Bandwidth of the kernel whose weight of the runs fades the linear term towards the simulator."""


def _fit_linear(x: np.ndarray, r: np.ndarray, prior_runs: float) -> tuple[np.ndarray | None, float | None]:
    """``(intercept and slopes, penalty)`` of the ridge regression of ``r`` on ``x`` whose leave-one-out error
    (mean ``|predicted / measured - 1|``) is least, or ``(None, None)`` when predicting every left-out run
    by the simulator (no linear term) does as well, or when there are fewer than three runs. The
    intercept is penalized by ``prior_runs`` (the pseudo-runs that say the simulator is right)."""
    n = len(r)
    if n < 3:
        return None, None
    center = x.mean(0)  # slopes about the runs' mean, so the intercept is their shrunk mean residual
    z = np.hstack([np.ones((n, 1)), x - center])
    best = (float(np.mean(np.abs(np.expm1(-r)))), None, None)
    for lam in RIDGE_GRID:
        reg = lam * np.eye(z.shape[1])
        reg[0, 0] = prior_runs
        inv = np.linalg.inv(z.T @ z + reg)
        hat = z @ inv @ z.T
        keep = 1.0 - np.diag(hat)
        if np.any(keep < 1e-9):  # a run that fits itself exactly says nothing about the others
            continue
        loo = (r - hat @ r) / keep
        err = float(np.mean(np.abs(np.expm1(-loo))))
        if err < best[0]:
            coef = inv @ z.T @ r
            coef[0] -= center @ coef[1:]  # back to an intercept at the origin of the features
            best = (err, coef, lam)
    return best[1], best[2]


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

    wide_bandwidth: float | None = None
    """Bandwidth of the wider kernel that carries what the runs share (None: no such term)."""
    linear: np.ndarray | None = None
    """Intercept and slopes of the linear term (module docstring), None: no linear term."""
    ridge: float | None = None
    """The slopes' penalty leave-one-out chose for :attr:`linear`."""

    def apply(self, x: np.ndarray) -> tuple[float, float, bool]:
        """``(log correction, relative std, out_of_distribution)`` at features ``x``."""
        if len(self.r) == 0:
            return 0.0, 0.5, True
        x = np.asarray(x, float)
        shared = self._kernel(x, self.wide_bandwidth, self.r)[0] if self.wide_bandwidth else 0.0
        r = self._residuals()  # less the shared term and the linear one, at every run
        local, w = self._kernel(x, self.bandwidth, r)
        c = shared + self._linear_at(x) + local
        support = float(w.sum())
        resid = r - local
        spread = float(np.sqrt((w * resid ** 2).sum() / support)) if support > 1e-12 else 0.0
        std = math.sqrt(spread ** 2 + (0.5 ** 2) / (1.0 + support))
        return c, std, support < 1.0

    def _linear_at(self, x: np.ndarray) -> float:
        """The linear term at ``x``, faded towards zero away from the runs."""
        if self.linear is None:
            return 0.0
        value = float(self.linear[0] + x @ self.linear[1:])
        weight = float(np.exp(-((self.x - x) ** 2).sum(1) / (2 * LINEAR_FADE ** 2)).sum())
        return value * weight / (weight + self.prior_runs) if weight + self.prior_runs > 0 else value

    def _residuals(self) -> np.ndarray:
        """What the narrow kernel fits: the runs' residuals less the shared term and the linear term
        (computed once: runs do not change)."""
        cached = getattr(self, "_resid_cache", None)
        if cached is None or len(cached) != len(self.r):
            cached = self.r - self.shared_at_runs()
            if self.linear is not None:
                cached = cached - np.array([self._linear_at(xi) for xi in self.x])
            self._resid_cache = cached
        return cached

    def shared_at_runs(self) -> np.ndarray:
        """The wide kernel's value at every run, zeros without one (the linear term fits what it leaves)."""
        if not self.wide_bandwidth:
            return np.zeros(len(self.r))
        cached = getattr(self, "_shared_cache", None)
        if cached is None or len(cached) != len(self.r):
            cached = np.array([self._kernel(xi, self.wide_bandwidth, self.r)[0] for xi in self.x])
            self._shared_cache = cached
        return cached

    def _kernel(self, x: np.ndarray, bandwidth: float, r: np.ndarray) -> tuple[float, np.ndarray]:
        w = np.exp(-((self.x - x) ** 2).sum(1) / (2 * bandwidth ** 2))
        return float((w * r).sum() / (w.sum() + self.prior_runs)), w

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data (:func:`load_correction` reads it back)."""
        return {"features": list(CORRECTION_FEATURES), "x": self.x.tolist(), "r": self.r.tolist(),
                "bandwidth": self.bandwidth, "prior_runs": self.prior_runs, "wide_bandwidth": self.wide_bandwidth,
                "linear": None if self.linear is None else self.linear.tolist(), "ridge": self.ridge,
                "meta": self.meta}

    def save(self, path: str | Path) -> None:
        import json

        Path(path).parent.mkdir(parents=True, exist_ok=True)  # as the data set and checkpoint writers do
        Path(path).write_text(json.dumps(self.to_dict(), indent=1))

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "<correction>") -> "Correction":
        from hetpart.errors import SpecError

        if not isinstance(data, dict) or "x" not in data or "r" not in data:
            raise SpecError(f"{source}: not a correction (expected the keys x and r, as 'hetpart costmodel correct' "
                            "writes them)")
        if list(data.get("features", CORRECTION_FEATURES)) != list(CORRECTION_FEATURES):
            raise SpecError(f"{source}: features {data.get('features')} differ from this version's "
                            f"{list(CORRECTION_FEATURES)}; fit it again with 'hetpart costmodel correct'")
        r = np.asarray(data["r"], float)
        linear = data.get("linear")  # absent in corrections saved before the linear term: none
        if linear is not None and len(linear) != len(CORRECTION_FEATURES) + 1:
            raise SpecError(f"{source}: linear has {len(linear)} terms, expected {len(CORRECTION_FEATURES) + 1} "
                            "(an intercept and one slope per feature); fit it again with 'hetpart costmodel correct'")
        return cls(np.asarray(data["x"], float).reshape(len(r), len(CORRECTION_FEATURES)), r,
                   float(data.get("bandwidth", 0.35)), float(data.get("prior_runs", 1.0)),
                   dict(data.get("meta", {})), data.get("wide_bandwidth"),
                   None if linear is None else np.asarray(linear, float), data.get("ridge"))


def load_correction(path: str | Path) -> Correction:
    """A correction saved by :meth:`Correction.save` (``hetpart costmodel correct --out``)."""
    import json

    from hetpart.errors import SpecError

    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise SpecError(f"{path}: cannot read the correction ({exc.strerror}); give the file "
                        "'hetpart costmodel correct --out' wrote") from None
    except ValueError as exc:
        raise SpecError(f"{path}: not JSON ({exc}); give the file 'hetpart costmodel correct --out' wrote") from None
    return Correction.from_dict(data, str(path))


def fit_correction(x: Sequence[np.ndarray], log_ratio: Sequence[float], bandwidth: float = 0.35,
                   prior_runs: float = 1.0, wide_bandwidth: float | None = None, linear: bool = True) -> Correction:
    """The correction of the measured runs with features ``x`` and residuals ``log(measured/simulated)``;
    ``linear``: fit the linear term (module docstring) where leave-one-out says it helps."""
    xs = np.asarray(x, float).reshape(len(log_ratio), len(CORRECTION_FEATURES))
    rs = np.asarray(log_ratio, float)
    out = Correction(xs, rs, bandwidth, prior_runs, wide_bandwidth=wide_bandwidth)
    if linear:
        out.linear, out.ridge = _fit_linear(xs, rs - out.shared_at_runs(), prior_runs)
    return out


def records_training_set(records: Iterable[Any], features: Literal["run", "plan"] = "run"
                         ) -> tuple[list[np.ndarray], list[float], list[bool]]:
    """``(features, log(measured/simulated), emulated)`` of run records (``hetpart.records.RunRecord``).

    The residual is always against the simulator's prediction of exactly what ran (the run-time model
    on the prediction cluster); ``features`` says where the features come from (module docstring).
    """
    xs, rs, emulated = [], [], []
    for rec in records:
        simulated, pred_x = run_prediction(rec), None
        if features == "plan":
            pred_x = planned_features(rec)
        xs.append(pred_x if pred_x is not None else correction_features(simulated, rec.run_plan()))
        rs.append(math.log(rec.measured.step_time_s / simulated.step_time_s))
        emulated.append(bool(rec.emulated))
    return xs, rs, emulated


def run_prediction(rec: Any):
    """The simulator's prediction of exactly what a record ran (run-time model, prediction cluster), with the
    runtime's own engine options as the record kept them (:func:`hetpart.runtime.measure.predict`): its gradient
    all-reduce after the backward and its PyTorch kernels (``kernels="torch"``: the activations and operators of
    Hugging Face modules; the default ``fused`` set priced its runs as Megatron's, 48.9% off on the H100 runs
    against 6.8%)."""
    from hetpart.costmodel.simulator import Simulator

    options = rec.predicted.options if rec.predicted else {}
    overlap = bool(options.get("overlap_grad_reduce", False))
    kernels = str(options.get("kernels", "torch"))
    return Simulator(rec.model_graph(), rec.prediction_cluster(), overlap_grad_reduce=overlap,
                     kernels=kernels).simulate(rec.run_plan(), validate=False)


def planned_features(rec: Any) -> np.ndarray:
    """Correction features of a record's plan as planned: the full model on the real cluster."""
    from hetpart.cluster import parse_cluster
    from hetpart.costmodel.simulator import Simulator
    from hetpart.graph import load_model

    plan = Plan.from_dict(rec.original_plan, "<record>: original_plan")
    model = load_model(rec.model.spec, seq_len=plan.seq_len, precision=plan.precision)
    cluster = parse_cluster(rec.cluster, "<record>: cluster")
    return correction_features(Simulator(model, cluster).simulate(plan, validate=False), plan)


def fit_records(records: Sequence[Any], features: Literal["run", "plan"] = "run", **options: Any) -> Correction:
    """The correction fitted on ``records`` (``fit_correction``'s options: bandwidths, prior runs)."""
    xs, rs, emulated = records_training_set(records, features)
    corr = fit_correction(xs, rs, **options) if rs else Correction(np.zeros((0, len(CORRECTION_FEATURES))),
                                                                   np.zeros(0),
                                                                   **{k: v for k, v in options.items() if k != "linear"})
    corr.meta.update(features=features, runs=len(rs), emulated_runs=int(sum(emulated)))
    return corr


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
        # the correction's spread is its residuals against measured runs: the band is that spread around the step
        m["uncertainty"] = {"relative_std": std, "out_of_distribution": ood, "correction": k,
                            "step_time_s_low": m["step_time_s"] * math.exp(-std),
                            "step_time_s_high": m["step_time_s"] * math.exp(std), "source": self.name}
        if ood:
            m["uncertainty"]["out_of_distribution_reasons"] = [self._ood_reason()]
        return replace(pred, step_time_s=m["step_time_s"], tokens_per_s=m["tokens_per_s"],
                       samples_per_s=m["samples_per_s"], metrics=m)

    def _ood_reason(self) -> str:
        """Why a plan is out of the correction's distribution: it has seen no run, or none like this plan."""
        runs = len(self.correction.r)
        if not runs:
            return ("no correction loaded, so the simulator's step stands (set HETPART_CORRECTION to a file "
                    "'hetpart costmodel correct --out' wrote)")
        return (f"less than one run's weight near this plan among the correction's {runs} run"
                f"{'s' if runs != 1 else ''} (measure plans like it: 'hetpart run --out', then 'hetpart costmodel "
                "correct')")

    def estimate_batch(self, plans: Sequence[Plan]) -> list:
        from hetpart.costmodel.simulator import Estimate

        out = []
        for plan in plans:
            p = self.predict(plan, validate=False)
            est = self.sim.estimate(plan)
            out.append(Estimate(p.step_time_s, p.tokens_per_s, est.fits_in_memory, est.memory_headroom_gb))
        return out


def leave_one_out(xs: Sequence[np.ndarray], rs: Sequence[float], **options: Any) -> tuple[list[float], list[float]]:
    """Per run, ``(simulator error, corrected error)`` in % of the measured step time, each run predicted
    by a correction fitted on all the others (it never trains on the run it predicts)."""
    sim, corr = [], []
    for i in range(len(rs)):
        rest = [j for j in range(len(rs)) if j != i]
        c, _, _ = fit_correction([xs[j] for j in rest], [rs[j] for j in rest], **options).apply(xs[i])
        sim.append(100 * abs(math.exp(-rs[i]) - 1))
        corr.append(100 * abs(math.exp(c - rs[i]) - 1))
    return sim, corr


def corrected_predictor(model: ModelGraph, cluster: Cluster, workload: Workload | None = None, *,
                        correction: Correction | str | Path | None = None, records: str | Path | None = None,
                        features: Literal["run", "plan"] = "plan", overlap_grad_reduce: bool = True
                        ) -> CorrectedPredictor:
    """Registry factory for ``corrected`` (``hetpart.costmodel.predictor``).

    Args:
        correction: a fitted :class:`Correction` or the path of one (``hetpart costmodel correct --out``).
        records: run records (``.jsonl``) to fit one from, when no ``correction`` is given.
        features: for ``records``: where the features come from (module docstring).

    With neither, ``$HETPART_CORRECTION`` if set, else a correction that has seen no run: the
    simulator's numbers, flagged out of distribution.
    """
    import os

    if correction is None and records is None and os.environ.get("HETPART_CORRECTION"):
        from hetpart.errors import SpecError

        try:
            correction = load_correction(os.environ["HETPART_CORRECTION"])
        except SpecError as exc:  # name the variable: the file was never given on the command line
            what = str(exc).split("; give the file")[0]  # this fix, not the file option's
            raise SpecError(f"HETPART_CORRECTION={what}; set it to a file 'hetpart costmodel correct --out' wrote, "
                            "or unset it") from None
    if isinstance(correction, (str, Path)):
        correction = load_correction(correction)
    if correction is None:
        from hetpart.records import load_records

        correction = fit_records(load_records(records), features) if records else fit_records([], features)
    return CorrectedPredictor(model, cluster, workload, correction=correction, overlap_grad_reduce=overlap_grad_reduce)
