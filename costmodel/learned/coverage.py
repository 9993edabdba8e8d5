"""Which device types of a plan a learned cost model cannot speak for.

Both learned predictors (``learned`` and ``learned-graph``) were trained on simulator labels of
clusters drawn from the GPU catalog (:mod:`hetpart.costmodel.learned.sampling`). A plan is out of
their distribution, whatever its features look like, when one of its device types

* is not a catalog type the data set drew (an inline GPU; a catalog type restated inline with the
  same figures counts as the catalog's): the model never saw its compute;
* has ``assumed`` compute (:func:`hetpart.costmodel.provenance.compute_kind`: another generation's
  curve scaled by peak, single units' times -65% to +77% against measured ones): the labels the model learned
  from are themselves a guess there, so a small spread around them would claim a precision nobody has.

:func:`unseen_device_types` is the one test both predictors apply (their feature-range tests come on
top), so that they agree on it. So is :func:`scale_reasons`: their features are shares and ratios (of the step,
the pipeline, the cluster), in which a model or cluster far larger than any they trained on can look ordinary,
so the scenario's size itself (the model's parameters, the cluster's devices) is held against the range of the
training scenarios (:func:`training_scale`, recorded in the checkpoint as ``train_scale``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:  # pragma: no cover
    from hetpart.cluster import Cluster

__all__ = ["unseen_device_types", "DeviceCoverage", "training_scale", "scale_reasons", "checkpoint_scale",
           "SHIPPED_TRAIN_SCALE"]

SHIPPED_TRAIN_SCALE = {"params": [5.0e7, 4.1e11], "devices": [2, 512],
                       "source": "the bounds the shipped checkpoints' data set drew from (hetpart costmodel dataset "
                                 "--scenarios 160 --max-devices 512 --seed 0; the data set itself was not kept)"}
"""The scale of the shipped checkpoints' training data, which they do not record: the data set's draw bounds
(:func:`~hetpart.costmodel.learned.sampling.random_cluster`: 2 devices to ``--max-devices`` 512, as the closed
head's meta records for its data set).
ASSUMED for the parameters: ~50M to 410B, the random transformers' ~50M floor (sampling.py) and the largest of
160 scenarios replayed with seed 0 today (406B; the generator and catalog changed since, so the draws are not
exactly the ones trained on)."""


def unseen_device_types(cluster: "Cluster", devices: Iterable[str],
                        known: Iterable[str] | None = None) -> dict[str, str]:
    """Per device type among ``devices`` that the learned models do not cover: why (one phrase).

    Args:
        cluster: the cluster the device ids belong to.
        devices: device ids of a plan (``"group/node/local"``).
        known: GPU names of the training data set, when the checkpoint records them; otherwise the
            catalog the data set draws from.

    Returns:
        ``{gpu name: reason}``, empty when every device type is covered.
    """
    return DeviceCoverage(cluster, known).of(devices)


class DeviceCoverage:
    """:func:`unseen_device_types` with the per-type answer cached (a predictor keeps one per cluster)."""

    def __init__(self, cluster: "Cluster", known: Iterable[str] | None = None) -> None:
        self.cluster = cluster
        self.known = None if known is None else frozenset(known)
        self._by_group: dict[int, str | None] = {}

    def of(self, devices: Iterable[str]) -> dict[str, str]:
        out: dict[str, str] = {}
        for d in devices:
            dev = self.cluster.device(d)
            if dev.group not in self._by_group:
                self._by_group[dev.group] = self._reason(dev.gpu)
            why = self._by_group[dev.group]
            if why is not None:
                out.setdefault(dev.gpu.name, why)
        return out

    def _reason(self, gpu) -> str | None:
        from hetpart.catalog.hardware import GPU_CATALOG
        from hetpart.costmodel.provenance import ERROR_BANDS, compute_kind

        listed = GPU_CATALOG.get(gpu.name)
        if listed is None or replace(gpu, source=listed.source) != listed:  # a catalog type restated inline is one
            return "inline device type (not in the catalog the training data was drawn from)"
        if self.known is not None and gpu.name not in self.known:
            return "device type absent from the training data"
        kind, _ = compute_kind(gpu)
        if kind == "assumed":
            lo, hi = ERROR_BANDS["assumed"]["signed_pct"]
            return f"compute assumed (the simulator's labels there: single units' times {lo:+.0f}% to {hi:+.0f}%)"
        return None


_SCALE_WORDS = {"params": ("model of {:.3g}B parameters", 1e-9), "devices": ("cluster of {:.0f} devices", 1.0)}
"""How each quantity of :func:`training_scale` is named in a reason, and the factor it is printed with."""


def training_scale(records: Iterable[dict]) -> dict[str, list[float]]:
    """``{quantity: [least, most]}`` over the ``train`` split of data-set records (as
    :func:`hetpart.costmodel.learned.dataset.build_dataset` writes them) of the model's parameters and the
    cluster's devices, the range :func:`scale_reasons` holds a scenario to. Empty when no record is in the
    train split."""
    from hetpart.costmodel.learned.sampling import Scenario

    seen: dict[str, list[float]] = {}
    for r in records:
        if r.get("split") != "train":
            continue
        model, cluster = Scenario.rebuild(r["model_spec"], r["cluster_spec"])
        for key, value in (("params", model.num_params), ("devices", cluster.num_devices)):
            lo, hi = seen.get(key, (value, value))
            seen[key] = [min(lo, value), max(hi, value)]
    return seen


def checkpoint_scale(meta: dict, path, shipped) -> dict | None:
    """The training scale a checkpoint's ``meta`` records (``train_scale``); for the shipped file ``shipped``,
    which records none, :data:`SHIPPED_TRAIN_SCALE`; None otherwise (no scale test)."""
    from pathlib import Path

    if isinstance(meta.get("train_scale"), dict):
        return meta["train_scale"]
    try:
        same = Path(path).resolve() == Path(shipped).resolve()
    except OSError:  # pragma: no cover - an unreadable path is never the shipped file
        same = False
    return SHIPPED_TRAIN_SCALE if same else None


def scale_reasons(scale: dict | None, model, cluster) -> tuple[str, ...]:
    """Why the scenario lies outside the training scale ``scale`` (:func:`training_scale`), one phrase per
    quantity outside its ``[least, most]``; empty when ``scale`` is None or everything is inside.

    >>> scale = {"devices": [2, 512]}
    >>> class C: num_devices = 1024
    >>> class M: num_params = 1e9
    >>> scale_reasons(scale, M, C)
    ("cluster of 1024 devices, outside the training data's 2 to 512",)
    """
    if not scale:
        return ()
    values = {"params": model.num_params, "devices": cluster.num_devices}
    out = []
    for key, (words, factor) in _SCALE_WORDS.items():
        bounds = scale.get(key)
        if not bounds or bounds[0] <= values[key] <= bounds[1]:
            continue
        lo, hi = (f"{b * factor:.3g}" for b in bounds)
        out.append(f"{words.format(values[key] * factor)}, outside the training data's {lo} to {hi}")
    return tuple(out)
