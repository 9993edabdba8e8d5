"""Where a prediction's numbers come from, per device type, and how far to trust them.

Every prediction says, for each device type of the plan, whether its compute came from

* ``measured``: a profile's entries (``hetpart calibrate``; :mod:`hetpart.costmodel.profile`), on that
  device or on a stand-in (``stand_in: true``: this machine's CPU measured for a cluster that names
  GPUs; the numbers then price running the plan on this machine);
* ``fitted``: an efficiency curve fitted (or anchored) to published measurements of that generation;
* ``published``: a curve whose large-product efficiency is a published GEMM measurement of that
  generation (:mod:`hetpart.costmodel.published_gemm`), the rest of it another generation's;
* ``assumed``: another generation's curve scaled by the device's peak (or a fitted/published curve
  carried over to a device type it does not speak for);

and carries the error band of that kind: the residuals of the predictions of that kind against
measurements, with where they come from. The bands below are copied from ``docs/BENCHMARKS.md``
(the commands that produce them are named beside each) and recomputed from their rows by tests
(``hetpart.experiments.bench_validation.ampere_band``, ``hopper_band``, ``volta_band``,
``bench_profile_truth.measured_band``, ``bench_gpu_profile.assumed_band``); ``signed_pct`` is the range of
``predicted / measured - 1`` over the rows, negative meaning too fast. ``scope`` says what the rows are:
``step`` (whole steps or throughputs: a band a step time can carry) or ``unit`` (one unit's forward or
backward time: far wider than a step's error, since a step sums many units whose errors partly cancel, and
not a band for a step time).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # pragma: no cover
    from hetpart.cluster import Cluster
    from hetpart.costmodel.profile import BoundProfile
    from hetpart.plan import Plan

__all__ = ["ERROR_BANDS", "prediction_provenance", "attention_entry", "profile_use", "compute_kind", "step_band"]

ERROR_BANDS: dict[str, dict[str, Any]] = {
    "measured": {
        "scope": "step", "mean_abs_pct": 8.5, "signed_pct": [-21.9, 35.6], "rows": 43, "held_out": True,
        "from": "40 real CPU runs of 1-2 ranks (no emulation; pipeline, data and tensor parallel, even and uneven "
                "splits, four calibrations minutes to hours apart) predicted with a profile of the same machine (-22% "
                "to +36%, mean 8.2%) and 3 emulated runs on a quiet machine from in-run profiles (-17% to -6%); more "
                "ranks than cores, processor sharing: -5% to -27%, mean 13.8% over 12 four-rank runs on two cores, all "
                "too fast (docs/BENCHMARKS.md 'Measured profiles', 'More ranks than cores'; make bench "
                "BENCH=profile-truth)",
    },
    "fitted:ampere": {
        "scope": "step", "mean_abs_pct": 2.3, "signed_pct": [-4.0, 4.9], "rows": 18, "held_out": False,
        "from": "in-sample residuals of the fit (2026-11-27 refit, host dispatch overlapped; as step times on "
                "2026-12-01: Table 5 2.6%, Table 1 2.0%): Korthikanti et al. 2022 Table 5 and Narayanan et al. 2021 Table 1, large models on DGX "
                "A100 (make bench BENCH=simulator-calibration). Small work rests on the host cost per operator, "
                "measured on one H100's host: 11 real runs of a 12-block model on an H100, held out, 6.8% mean "
                "error (-13% to +16%; docs/BENCHMARKS.md 'Validation against published and measured runs'); a "
                "slower or faster host CPU moves it",
    },
    "fitted:hopper": {
        "scope": "step", "mean_abs_pct": 7.0, "signed_pct": [-13.2, 15.6], "rows": 15, "held_out": True,
        "from": "held-out rows only (the curve was fitted on a GEMM sweep of one H100, never on a training run): "
                "Llama 3 405B on 8,192 and 16,384 H100 (Table 4; -5.5%, -2.6%, and -11.1% with context "
                "parallelism 16), all too fast, 11 real runs of a 12-block model on one H100 (fp32, micro-batch "
                "1-4, -13.2% to +15.6%) and one on an H200 (+11.5%), whose small work rests on the host cost per "
                "operator (docs/BENCHMARKS.md "
                "'Validation against published and measured runs'; make bench BENCH=simulator-validation)",
    },
    "fitted": {
        "scope": "step", "mean_abs_pct": None, "signed_pct": [None, None], "rows": 0, "held_out": False,
        "from": "a curve fitted to measurements whose residuals this table does not hold yet (see its status and "
                "docs/BENCHMARKS.md)",
    },
    "fitted:volta": {
        "scope": "step", "mean_abs_pct": 9.4, "signed_pct": [-9.4, -9.4], "rows": 1, "held_out": True,
        "from": "anchored to one published point (Shoeybi et al. 2019, 1.2B on one V100); checked on the same "
                "paper's 8.3B run on 512 V100s (make bench BENCH=simulator-calibration)",
    },
    "published": {
        "scope": "step", "mean_abs_pct": None, "signed_pct": [None, None], "rows": 0, "held_out": False,
        "from": "large-product efficiency from published GEMM figures (AMD's MAF table for MI300X, a MAMF sweep for "
                "MI250X, cuBLAS on an L20 for Ada, community torch.mm tables for the T4, TITAN RTX, RTX 2080 Ti and "
                "L4; costmodel/published_gemm.py); no training run on these GPUs was used or checked. The rest of the "
                "curve (small products, memory-bound kernels, per-operator cost) is Ampere's or Volta's scaled by "
                "peak. The same kind of best-shape GEMM figure sits 5-6% (A100) and 2-3% (H100) above those "
                "generations' fitted e_max; on CDNA3 the curve is +8% (bf16), +4% (fp16), -1% (fp8) against AMD's "
                "typical-shape GEMM throughput (TAF, MI325X) scaled to the MI300X. Expect compute a few % optimistic "
                "on large work, and the small-work errors of the fitted curves (2-50x too fast at micro-batch 1 on an "
                "H100)",
    },
    "assumed": {
        "scope": "unit", "mean_abs_pct": 27.3, "signed_pct": [-65.1, 77.3], "rows": 240, "held_out": True,
        "from": "the Ampere curve scaled by peak against 240 per-unit times measured on an H100 (120 units forward "
                "and backward; bf16, TF32 and fp32; gpt2-small to llama2-7b; the runtime's kernels; "
                "hetpart.experiments.bench_gpu_profile.assumed_band(), tests/test_provenance_s50_band.py); end to end on "
                "Llama 3 405B -11% and -14%",
    },
}
"""Error bands per kind of compute source (see the module docstring)."""


def compute_kind(gpu, curve_of: Callable | None = None) -> tuple[str, str]:
    """``(kind, curve description)`` of the analytic compute of ``gpu``: fitted, published or assumed."""
    from hetpart.costmodel.efficiency import curve_for

    if curve_of is not None:
        curve = curve_of(gpu)
        return "fitted", f"{curve.name} (calibrated in this process: {curve.status})"
    curve = curve_for(gpu)
    status = curve.status.split(":", 1)[0].strip().lower()
    kind = {"fitted": "fitted", "anchored": "fitted", "published": "published"}.get(status, "assumed")
    family = gpu.name.split("-")[0]
    if kind != "assumed" and family not in _GENERATION_REFERENCE.get(curve.name, (family,)):
        kind = "assumed"  # a generation's curve carried over to a type it was not fitted on
    return kind, f"{curve.name} ({curve.status})"


_GENERATION_REFERENCE = {"ampere": ("A100", "A10", "A30", "A40", "A6000", "RTX3090", "RTX3080"),
                         "ada": ("L20", "RTX4090", "L4"), "cdna3": ("MI300X",), "cdna2": ("MI250X", "MI250"),
                         "turing": ("T4", "TitanRTX", "RTX2080Ti")}
"""Device types a fitted or published curve speaks for (Ampere: the fit used A100s, other Ampere parts share
the architecture; Ada: the L20 measured and the RTX 4090, the same AD102 tensor rate, and the L4 with its own
figure; Turing: the types with their own figures). Other types priced with such a curve (an L40S, an inline
``arch: ada`` type) are ``assumed``."""


def step_band(provenance: dict[str, Any]) -> tuple[float | None, float | None, list[str]]:
    """``(low, high, unknown)``: the widest step-level band (``signed_pct``) over the device types of a
    :func:`prediction_provenance`, and the device types that have none (no rows, or rows of single units
    only). ``low`` and ``high`` are None when any type has none: a step is as uncertain as its least known
    device, and a band over the others alone would claim more than the rows show. The band always holds 0 (the
    point itself): a type checked on rows of one sign only (V100: one row, -9.4%) says the step may be that far
    off, not that it cannot be right."""
    lo = hi = None
    unknown: list[str] = []
    for name, p in provenance["device_types"].items():
        band = p["error_band"]
        a, b = band.get("signed_pct", [None, None])
        if not band.get("rows") or a is None or b is None or band.get("scope", "step") != "step":
            unknown.append(name)
            continue
        lo, hi = (a, b) if lo is None else (min(lo, a), max(hi, b))
    return (None, None, unknown) if unknown else (min(lo, 0.0), max(hi, 0.0), unknown)


_FP8_MEASURED = ("cdna3", "hopper")
"""Curves with an fp8 efficiency of their own (MI300X: AMD's hipBLASLt fp8 figure; Hopper: a published fp8 GEMM
sweep, :data:`~hetpart.costmodel.efficiency._HOPPER_FP8`). The others run fp8 at their bf16 fraction of the fp8
peak, an assumption no measurement here checked: their fp8 compute is ``assumed``. A fitted curve's fp8 is
``published``: its fit (and step band) is of bf16 runs, no fp8 run checked it."""

_BAND_FAMILIES = {"ampere": ("A100",), "hopper": ("H100", "H200"), "volta": ("V100",)}
"""The device families a generation's step band was measured on (the rows of ``fitted:<curve>``). Another type
priced with that curve (an RTX 3090 or A10 with Ampere's, a GH200 with Hopper's and a Grace host) shares its
architecture but not those rows: no step-level band (its curve is still ``fitted``)."""


def _band(kind: str, curve_name: str, family: str | None = None) -> dict[str, Any]:
    specific = ERROR_BANDS.get(f"{kind}:{curve_name}")
    if specific is not None and family is not None and family not in _BAND_FAMILIES.get(curve_name, (family,)):
        measured = ", ".join(_BAND_FAMILIES[curve_name])
        return {"scope": "step", "mean_abs_pct": None, "signed_pct": [None, None], "rows": 0, "held_out": False,
                "from": f"the {curve_name} curve, whose step band ({specific['signed_pct'][0]}% to "
                        f"{specific['signed_pct'][1]}%) was measured on {measured} only; no run on a {family} was "
                        "checked (its tensor rate, memory and host differ)"}
    return dict(specific or ERROR_BANDS.get(kind) or ERROR_BANDS["assumed"])


def prediction_provenance(cluster: "Cluster", plan: "Plan", profiled: "BoundProfile | None",
                          curve_of: Callable | None = None, kernels: str | None = None) -> dict[str, Any]:
    """Per device type of ``plan``: the source of its compute and its error band; plus the links' source and
    the attention kernel priced under the kernel set ``kernels`` (default the simulator's,
    :func:`attention_entry`)."""
    out: dict[str, Any] = {}
    gpus = {}
    for d in plan.devices:
        gpu = cluster.device(d).gpu
        gpus.setdefault(gpu.name, gpu)
    for name, gpu in gpus.items():
        kind, curve = compute_kind(gpu, curve_of)
        if plan.precision == "fp8" and curve_of is None and curve.split(" ", 1)[0] not in _FP8_MEASURED:
            kind, curve = "assumed", f"{curve}; fp8 at the curve's bf16 fraction of peak: no fp8 figure, no fp8 run"
        elif plan.precision == "fp8" and curve_of is None and kind == "fitted":
            kind, curve = "published", f"{curve}; fp8 plateau from a published fp8 GEMM sweep, no fp8 run"
        entry: dict[str, Any] = {"compute": kind, "curve": curve}
        if profiled is not None:
            entry.update(_measured(profiled, gpu, plan.precision))
        entry["error_band"] = _band(entry["compute"], curve.split(" ", 1)[0], gpu.name.split("-")[0])
        out[name] = entry
    links = "datasheet line rates (catalog or cluster file)"
    used: dict[str, Any] = {}
    if profiled is not None and profiled.profile.links:
        entries = profiled.profile.links
        links = (f"measured where {profiled.profile.source or 'the profile'} has an entry for the device class and "
                 "scope; datasheet elsewhere")
        if any(e.scope == "any" for e in entries):
            backends = ", ".join(sorted({e.backend for e in entries if e.backend})) or "local"
            links += (f" (scope 'any': {backends} between local processes of the measuring machine stands in for "
                      "every link: the prediction is for running the plan there)")
    if profiled is not None:
        used = profile_use(profiled, gpus, plan)
        if not used["links"]:
            links = "datasheet line rates (catalog or cluster file): no link entry of the profile applies"
    return {"device_types": out, "links": links, "attention": attention_entry(plan, kernels),
            "profile": None if profiled is None else {"file": profiled.profile.source,
                                                      "fingerprint": profiled.profile.fingerprint,
                                                      "measured": profiled.profile.meta.get("date", ""), **used}}


def attention_entry(plan: "Plan", kernels: str | None = None) -> dict[str, str]:
    """Which attention kernel a prediction of ``plan`` priced, and why: ``requested`` (the plan's), ``priced``
    (``fused``: no score matrix; ``eager``: scores stored and streamed), ``kernel`` and ``why``
    (:func:`~hetpart.costmodel.activations.attention_kernel`: a 32-bit run under the engine's fused kernels falls
    back to the unfused core)."""
    from hetpart.costmodel.activations import DEFAULT_KERNELS, attention_kernel
    from hetpart.vocabulary import DTYPE_BYTES

    kernels = kernels or DEFAULT_KERNELS
    priced, kernel, why = attention_kernel(plan.attention, DTYPE_BYTES[plan.precision], kernels)
    return {"requested": plan.attention, "priced": priced, "kernel": kernel, "kernels": kernels, "why": why}


def profile_use(profiled: "BoundProfile", gpus: dict[str, Any], plan: "Plan") -> dict[str, Any]:
    """Which of the profile's entries priced the plan's device types, per kind, and why the others did not.

    Returns ``units`` (device type -> ``"k of n"`` units measured), ``links`` and ``optimizer`` (the device
    types whose measured links and Adam step were used), ``not_applied`` (device type -> why none of the
    profile's entries price it) and ``summary``, one line for people."""
    units: dict[str, str] = {}
    links: list[str] = []
    optimizer: list[str] = []
    not_applied: dict[str, str] = {}
    notes: list[str] = []
    total = profiled.model.num_units
    for name, gpu in gpus.items():
        reason = profiled.not_applied_reason(gpu)
        if reason is not None:
            not_applied[name] = reason
            continue
        device = profiled.applying_class(gpu)
        units[name] = f"{profiled.units_measured(name, plan.precision) or 0} of {total}"
        if any(e.devices == (device, device) for e in profiled.profile.links):
            links.append(name)
        if profiled.profile.devices[device].adam_s_per_param is None:
            notes.append(f"{name}: no optimizer step measured")
        elif plan.optimizer != "adam" or plan.offload != "none":
            notes.append(f"{name}: its measured Adam step does not price "
                         + (f"{plan.optimizer}" if plan.optimizer != "adam" else "a step offloaded to the CPU"))
        else:
            optimizer.append(name)
    measured_units = [f"{t} ({u})" for t, u in units.items() if not u.startswith("0 ")]
    unused = [f"{t}: {why}" for t, why in not_applied.items()] + notes
    unused += [f"{t}: no unit of this model measured at {plan.precision}" for t, u in units.items() if u.startswith("0 ")]
    if not (measured_units or links or optimizer):
        summary = "not used, every term analytic: " + "; ".join(unused)
    else:
        said = [f"{kind} for {', '.join(types)}" for kind, types in (
            ("measured units", measured_units), ("measured links", links), ("measured optimizer step", optimizer))
            if types]
        summary = "; ".join(said) + ("; analytic elsewhere (" + "; ".join(unused) + ")" if unused else "")
    return {"units": units, "links": links, "optimizer": optimizer, "not_applied": not_applied, "summary": summary}


def _measured(profiled: "BoundProfile", gpu, precision: str) -> dict[str, Any]:
    reason = profiled.not_applied_reason(gpu)
    if reason is not None:
        return {"profile": f"{reason}; analytic"}
    device = profiled.applying_class(gpu)
    stand_in = profiled.stand_in(gpu)
    hits = profiled.units_measured(gpu.name, precision)
    total = profiled.model.num_units
    measured_precision = profiled.precision_for(device, precision, stand_in)
    if not hits:
        why = "no unit of this model at this precision" if measured_precision else f"nothing measured at {precision}"
        return {"profile": f"{device}: {why}; analytic"}
    cls = profiled.profile.devices[device]
    out: dict[str, Any] = {"compute": "measured", "measured_on": cls.description or cls.name,
                           "stand_in": stand_in, "units_measured": f"{hits} of {total}"}
    if measured_precision != precision:
        out["precision_measured"] = measured_precision
    timed = sorted({(e.engine, e.tp) for e in profiled.profile.tensor_parallel
                    if e.device == device and e.precision == measured_precision})
    out["tensor_parallel"] = (", ".join(f"{engine} at tp {tp}" for engine, tp in timed) + " measured (what the engine "
                              "pays beyond a unit's share and its all-reduces)" if timed else
                              "not measured: tensor-parallel units are their 1/tp share plus the all-reduces")
    if out["stand_in"]:
        out["note"] = (f"{gpu.name} priced as {cls.description or cls.name}: the prediction is for running the "
                       f"plan on that device (hetpart run --no-emulation), not on real {gpu.name}s")
    return out
