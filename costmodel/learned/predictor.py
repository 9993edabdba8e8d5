"""The graph surrogate behind the Predictor protocol (``--predictor learned-graph``; ``learned`` is the
closed-form surrogate of :mod:`~hetpart.costmodel.learned.closed`, which reuses this class's reports).

It prices plans without running the simulator: the shipped checkpoint
(``costmodel/learned/checkpoints/surrogate.pt``, or ``checkpoint=`` / ``HETPART_SURROGATE``) maps a
batch of plans to log step times in one forward pass. Memory is analytic (the simulator's
accounting), never learned.

Every answer carries its uncertainty (``metrics["uncertainty"]``): the variance head's relative
standard deviation, and ``out_of_distribution`` when some input lies outside what the model was
trained on or a device type is one the learned models do not cover (inline, or with assumed compute:
:mod:`~hetpart.costmodel.learned.coverage`, shared with ``learned``); then the relative standard
deviation is at least ``OOD_RELATIVE_STD`` and ``out_of_distribution_reasons`` says why. It never refuses
an input the simulator accepts, except context-parallel plans (``cp > 1``) and plans that offload states to
the host (``offload``): none were in its training set and its features have no place for them, so it names
the simulator instead.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from hetpart.cluster import Cluster
from hetpart.errors import HetpartError, PlanError, SpecError, WorkloadError
from hetpart.graph.model_graph import ModelGraph
from hetpart.plan import Plan
from hetpart.workload import DTYPE_BYTES, Workload

from hetpart.costmodel.learned.encode import ScenarioContext, encode_plans
from hetpart.costmodel.activations import DEFAULT_KERNELS, effective_attention

__all__ = ["LearnedPredictor", "LearnedEstimate", "learned_predictor", "default_checkpoint", "OOD_RELATIVE_STD"]

OOD_RELATIVE_STD = 0.5
"""Relative standard deviation reported, at least, for an input outside the training ranges."""
_OOD_MARGIN = 0.25
"""How far (in normalised feature units) outside the training range an input may go unflagged."""


def default_checkpoint() -> Path:
    """``$HETPART_SURROGATE`` or the checkpoint shipped with the package."""
    env = os.environ.get("HETPART_SURROGATE")
    return Path(env) if env else Path(__file__).parent / "checkpoints" / "surrogate.pt"


@dataclass(frozen=True)
class LearnedEstimate:
    """:class:`~hetpart.costmodel.simulator.Estimate`'s fields plus the uncertainty."""

    step_time_s: float
    tokens_per_s: float
    fits_in_memory: bool
    memory_headroom_gb: float
    relative_std: float
    """Standard deviation of the step time over the step time (the variance head, OOD-inflated); 0 for a plan
    ``learned`` left to the simulator (its metrics carry the simulator's error band instead)."""
    out_of_distribution: bool
    """Some input lies outside the training data's range, or a device type is one the learned models do not
    cover (:func:`~hetpart.costmodel.learned.coverage.unseen_device_types`)."""
    ood_reasons: tuple[str, ...] = ()
    """Why it is out of distribution (one phrase each; empty when it is not)."""


_MODELS: dict[str, tuple] = {}


def _load(path: Path):
    key = str(path.resolve())
    if key not in _MODELS:
        where = "HETPART_SURROGATE" if os.environ.get("HETPART_SURROGATE") else "--predictor learned-graph"
        if not path.is_file():
            raise PlanError(f"{where}: no surrogate checkpoint at {path}; train one with "
                            "'hetpart costmodel train' or set HETPART_SURROGATE")
        from hetpart.costmodel.learned.dataset import is_torch_archive
        from hetpart.costmodel.learned.train import load_checkpoint

        if not is_torch_archive(path):  # before torch's unpickler fails on it in its own words
            raise SpecError(f"{where}: {path}: not a checkpoint written by 'hetpart costmodel train'; give one "
                            "(a head written by 'hetpart costmodel train-closed' goes to HETPART_CLOSED_HEAD)")
        _MODELS[key] = load_checkpoint(path)
    return _MODELS[key]


class LearnedPredictor:
    """Predictor protocol (``name``, ``version``, ``estimate_batch``, ``predict``); no lower bound."""

    name = "learned-graph"

    def __init__(self, model: ModelGraph, cluster: Cluster, workload: Workload | None = None, *,
                 checkpoint: str | Path | None = None, precision: str | None = None) -> None:
        import torch

        self.model, self.cluster, self.workload = model, cluster, workload
        path = Path(checkpoint) if checkpoint else default_checkpoint()
        self.net, meta = _load(path)
        self.version = f"surrogate:{path.name}:epochs{meta.get('epochs_done', meta.get('epoch', '?'))}:step{meta.get('step', '?')}"
        self._ranges = {k: (np.asarray(lo), np.asarray(hi)) for k, (lo, hi) in meta.get("input_ranges", {}).items()}
        self._torch = torch
        self._ctx: dict[str, ScenarioContext] = {}
        self._cfg_ood: dict = {}
        self._precision = precision
        self._train_gpus = meta.get("train_gpus")
        from hetpart.costmodel.learned.coverage import checkpoint_scale

        self._train_scale = checkpoint_scale(meta, path, Path(__file__).parent / "checkpoints" / "surrogate.pt")
        self._bands: dict[tuple[str, ...], tuple] = {}  # (:meth:`_step_band`)

    def _context(self, precision: str) -> ScenarioContext:
        if precision not in self._ctx:
            self._ctx[precision] = ScenarioContext(self.model, self.cluster, precision)
        return self._ctx[precision]

    def _check(self, plan: Plan) -> None:
        if plan.precision not in DTYPE_BYTES:
            raise PlanError(f"plan: precision: {plan.precision!r} is not one the learned predictor knows "
                            f"({', '.join(DTYPE_BYTES)}); use --predictor simulator")
        if plan.seq_len != self.model.seq_len:
            raise PlanError(f"plan: seq_len: {plan.seq_len} but the model graph was built for {self.model.seq_len} "
                            f"tokens; load the model with seq_len={plan.seq_len}")
        if DTYPE_BYTES[plan.precision] != self.model.dtype_bytes:
            raise PlanError(f"plan: precision: {plan.precision!r} but the model graph was built with "
                            f"{self.model.dtype_bytes}-byte activations")

    def _ood(self, batch) -> np.ndarray:
        """Per encoded plan: whether an input lies outside the training ranges."""
        flags = np.zeros(batch.num_plans, bool)
        if not self._ranges:
            return flags

        def outside(key, x):
            lo, hi = self._ranges[key]
            return ((x < lo - _OOD_MARGIN) | (x > hi + _OOD_MARGIN)).any(-1)

        if batch.unit_x.size:
            configs = getattr(batch, "configs", None)
            if configs is not None:  # a configuration's rows are the same in every batch: checked once
                cache = self._cfg_ood
                new = [j for j, c in enumerate(configs) if c not in cache]
                if new:
                    for j, bad in zip(new, outside("unit_x", batch.unit_x[new]).any(-1).tolist()):
                        cache[configs[j]] = bad
                bad_cfg = np.array([cache[c] for c in configs], bool)
            else:
                bad_cfg = outside("unit_x", batch.unit_x).any(-1)
            if bad_cfg.any():
                stage_bad = bad_cfg[batch.stage_cfg]
                rep_bad = (stage_bad[batch.rep_stages.clip(min=0)] & (batch.rep_stages >= 0)).any(1)
                np.logical_or.at(flags, batch.rep_plan, rep_bad)
        flags |= outside("plan_x", batch.plan_x)
        if batch.seg_x.size:
            np.logical_or.at(flags, batch.seg_plan, outside("seg_x", batch.seg_x))
        uid = getattr(batch, "p2p_uid", None)
        if uid is not None and len(batch.p2p_first):  # each distinct transfer once (padding is in range)
            bad = outside("p2p_x", batch.p2p_x.reshape(-1, batch.p2p_x.shape[-1])[batch.p2p_first])
            p2p = (bad[uid.clip(min=0)] & (uid >= 0)).any(-1)
        else:
            p2p = outside("p2p_x", batch.p2p_x).any(-1)
        np.logical_or.at(flags, batch.rep_plan, p2p)
        return flags

    def _run(self, plans: Sequence[Plan]) -> tuple[list, Any]:
        """Per plan ``(log step, log var, ood)`` or an error string; plans grouped by precision."""
        from hetpart.costmodel.learned.surrogate import to_tensors

        out: list = [None] * len(plans)
        by_precision: dict[str, list[int]] = {}
        for i, plan in enumerate(plans):
            try:
                self._check(plan)
            except PlanError as exc:
                out[i] = str(exc)
                continue
            if plan.cp != 1:  # its features describe stages of tp devices holding whole sequences
                out[i] = (f"plan: cp: {plan.cp}: the learned predictor was trained on plans without context "
                          "parallelism and cannot price one; use --predictor simulator")
                continue
            if plan.offload != "none":  # host copies and a CPU optimizer step: nothing of the kind in its training
                out[i] = (f"plan: offload: {plan.offload!r}: the learned predictor was trained on plans that keep "
                          "their states on the devices and cannot price host offload; use --predictor simulator")
                continue
            by_precision.setdefault(plan.precision, []).append(i)
        batches = {}
        for precision, idx in by_precision.items():
            try:
                ctx = self._context(precision)
            except (KeyError, ValueError, ZeroDivisionError) as exc:  # a precision the featurizer cannot price
                for i in idx:
                    out[i] = f"plan: precision: {precision!r}: the learned predictor cannot price it ({exc}); use " \
                             "--predictor simulator"
                continue
            batch = encode_plans(ctx, [plans[i] for i in idx])
            for j, msg in batch.errors.items():
                out[idx[j]] = msg
            if batch.num_plans:
                with self._torch.no_grad():
                    res = self.net.details(to_tensors(batch))
                batch.bubble = res["bubble_fraction"].tolist()
                mu, log_var = res["log_step_s"].tolist(), res["log_variance"].tolist()
                ood = self._ood(batch)
                for row, j in enumerate(batch.rows):
                    out[idx[j]] = (mu[row], log_var[row], bool(ood[row]), batch, row)
            batches[precision] = batch
        return out, batches

    def estimate_batch(self, plans: Sequence[Plan]) -> list[LearnedEstimate]:
        """Step time, memory fit and uncertainty of each plan, in one forward pass per precision.

        Raises:
            PlanError: for the first plan that cannot be priced (use :meth:`estimate_many` to get
                one answer or error per plan).
        """
        out = []
        for res in self.estimate_many(plans):
            if isinstance(res, str):
                raise PlanError(res)
            out.append(res)
        return out

    def estimate_many(self, plans: Sequence[Plan]) -> list[LearnedEstimate | str]:
        """Like :meth:`estimate_batch`, with an error message in place of each plan it cannot price."""
        results, _ = self._run(plans)
        out: list[LearnedEstimate | str] = []
        for plan, res in zip(plans, results):
            if isinstance(res, str):
                out.append(res)
                continue
            out.append(self._estimate(plan, *res))
        return out

    def ood_reasons(self, plan: Plan, features_outside: bool = False) -> tuple[str, ...]:
        """Why ``plan`` is out of this predictor's distribution: a model or cluster outside the training
        scenarios' size and its device types the learned models do not cover (the tests both learned predictors
        share), and ``features_outside`` (the feature-range test)."""
        from hetpart.costmodel.learned.coverage import DeviceCoverage, scale_reasons

        cov = getattr(self, "_coverage", None)
        if cov is None:
            cov = self._coverage = DeviceCoverage(self.cluster, getattr(self, "_train_gpus", None))
            self._scale_reasons = scale_reasons(getattr(self, "_train_scale", None), self.model, self.cluster)
        reasons = self._scale_reasons + tuple(f"{gpu}: {why}" for gpu, why in cov.of(plan.devices).items())
        return reasons + (("plan features outside the training range",) if features_outside else ())

    def _estimate(self, plan: Plan, mu: float, log_var: float, ood: bool, batch, row: int) -> LearnedEstimate:
        step = math.exp(mu)
        std = math.sqrt(math.exp(log_var))
        reasons = self.ood_reasons(plan, ood)
        if reasons:
            std = max(std, OOD_RELATIVE_STD)
        headroom = float(batch.headroom_gb[row]) if getattr(batch, "headroom_gb", None) is not None \
            else self._headroom(plan, batch.memory_gb[row])
        return LearnedEstimate(step, plan.global_batch * plan.seq_len / step, bool(batch.fits[row]), headroom, std,
                               bool(reasons), reasons)

    def _headroom(self, plan: Plan, memory: dict[str, float]) -> float:
        from hetpart.costmodel.memory import memory_capacity_gb

        caps = {}
        for d in plan.devices:
            gpu = self.cluster.device(d).gpu
            caps[gpu.name] = min(caps.get(gpu.name, math.inf), memory_capacity_gb(gpu))
        return min((caps[k] - v for k, v in memory.items() if k in caps), default=0.0)

    def _validate(self, plan: Plan, workload: Workload | None) -> None:
        plan.check(self.model, self.cluster)
        if workload is not None and (workload.global_batch, workload.seq_len) != (plan.global_batch, plan.seq_len):
            raise WorkloadError(f"workload: global_batch {workload.global_batch} and seq_len {workload.seq_len} differ "
                                f"from the plan's {plan.global_batch} and {plan.seq_len}; plan for this workload")

    def predict(self, plan: Plan, workload: Workload | None = None, *, validate: bool = True,
                trace: bool = False):
        """The CONTRACT metrics of one plan (the step time learned, memory analytic), with
        ``metrics["uncertainty"]``. ``trace`` is not supported by a learned model (no timeline)."""
        if validate:
            self._validate(plan, workload)
        answer = self.predict_many([plan], workload)[0]
        if isinstance(answer, str):
            raise PlanError(answer)
        return answer

    def predict_many(self, plans: Sequence[Plan], workload: Workload | None = None, *,
                     validate: bool = False) -> list:
        """:meth:`predict`'s report for many plans in one forward pass; an error message in place of
        each plan it cannot price (or, with ``validate``, that breaks a rule)."""
        from hetpart.costmodel.simulator import Prediction

        if validate:
            checked: list = []
            for plan in plans:
                try:
                    self._validate(plan, workload)
                    checked.append(plan)
                except HetpartError as exc:
                    checked.append(str(exc))
            good = [p for p in checked if not isinstance(p, str)]
            priced = iter(self.predict_many(good, workload))
            return [p if isinstance(p, str) else next(priced) for p in checked]
        results, _ = self._run(plans)
        out: list = []
        for plan, res in zip(plans, results):
            if isinstance(res, str):
                out.append(res)
                continue
            mu, log_var, ood, batch, row = res
            est = self._estimate(plan, mu, log_var, ood, batch, row)
            metrics = self.metrics(plan, est, batch.memory_gb[row])
            metrics["bubble_fraction"] = float(batch.bubble[row])
            out.append(Prediction(step_time_s=est.step_time_s, tokens_per_s=est.tokens_per_s,
                                  samples_per_s=plan.global_batch / est.step_time_s,
                                  fits_in_memory=est.fits_in_memory, metrics=metrics, memory_gb={}, breakdown=[],
                                  timeline=[]))
        return out

    def metrics(self, plan: Plan, est: LearnedEstimate, memory: dict[str, float]) -> dict[str, Any]:
        """The CONTRACT ``metrics`` of a plan from its estimate and analytic memory."""
        step = est.step_time_s
        samples = plan.global_batch
        model_flops = self.model.train_flops * samples
        # what the recompute mode runs again, counted as the simulator counts it (under fused attention selective
        # recomputation runs nothing beyond what the flash backward always does)
        attention = effective_attention(plan.attention, self.model.dtype_bytes, DEFAULT_KERNELS)  # 32-bit: eager
        mode = plan.recompute if attention == "eager" or plan.recompute == "full" else "none"
        recompute = sum(u.recompute_flops[mode] for u in self.model.units) * samples
        n = plan.num_devices
        peak = sum(self.cluster.device(d).peak_flops(plan.precision) for d in plan.devices)
        return {
            "step_time_s": step, "tokens_per_s": est.tokens_per_s, "samples_per_s": samples / step,
            "hardware_tflops_per_device": float((model_flops + recompute) / step / n / 1e12),
            "model_tflops_per_device": float(model_flops / step / n / 1e12),
            "mfu": float(model_flops / step / peak),
            "bubble_fraction": None,
            "peak_memory_gb": {k: float(v) for k, v in memory.items()},
            "fits_in_memory": est.fits_in_memory,
            "uncertainty": self._uncertainty(plan, est),
        }

    def _uncertainty(self, plan: Plan, est: LearnedEstimate) -> dict[str, Any]:
        """``metrics["uncertainty"]``: the surrogate's spread around the simulator it was trained to imitate
        (``relative_std``), and a low/high step that composes that spread with the simulator's own step-level
        error band against measured runs over the plan's device types
        (:func:`~hetpart.costmodel.provenance.step_band`): a plan cannot be known better than the simulator
        behind its labels. Both null where a device type has no step-level band; ``band`` says which."""
        step, spread = est.step_time_s, est.relative_std
        lo, hi, band = self._step_band(plan)
        return {"relative_std": spread, "out_of_distribution": est.out_of_distribution,
                # signed_pct is predicted / measured - 1: a band [lo, hi] puts the measured step at step / (1 + x)
                "step_time_s_low": None if hi is None else step / (1 + hi / 100) * math.exp(-spread),
                "step_time_s_high": None if lo is None else step / (1 + lo / 100) * math.exp(spread),
                "out_of_distribution_reasons": list(est.ood_reasons), "source": self.name,
                "band": f"relative std {spread * 100:.2f}% around the simulator, within {band}"}

    def _step_band(self, plan: Plan) -> tuple[float | None, float | None, str]:
        """``(low %, high %, what it is)``: the simulator's step-level error band over the plan's device types
        (:func:`~hetpart.costmodel.provenance.step_band`; low and high None where a type has none), memoised per
        set of types."""
        from hetpart.costmodel.provenance import prediction_provenance, step_band

        types = tuple(sorted({self.cluster.device(d).gpu.name for d in plan.devices}))
        bands = self._bands
        known = bands.get(types)
        if known is None:
            provenance = prediction_provenance(self.cluster, plan, None)
            lo, hi, unknown = step_band(provenance)
            if unknown:
                kinds = ", ".join(f"{t} (compute {provenance['device_types'][t]['compute']})" for t in unknown)
                text = (f"no step-level error band for {kinds}: no whole step of such a device was checked against "
                        "a measurement")
                unit = [provenance["device_types"][t]["error_band"] for t in unknown]
                unit = [b for b in unit if b.get("scope") == "unit" and b.get("rows")]
                if unit:
                    a, b = unit[0]["signed_pct"]
                    text += f" (single units' times: {a:+.0f}% to {b:+.0f}%)"
            else:
                text = f"the simulator's compute error band {lo:+.1f}% to {hi:+.1f}% (predicted / measured - 1) over " \
                       "the plan's device types"
            known = bands[types] = (lo, hi, text)
        return known


def learned_predictor(model: ModelGraph, cluster: Cluster, workload: Workload | None = None, *,
                      checkpoint: str | Path | None = None) -> LearnedPredictor:
    """Registry factory for ``learned`` (``hetpart.costmodel.predictor``)."""
    return LearnedPredictor(model, cluster, workload, checkpoint=checkpoint)
