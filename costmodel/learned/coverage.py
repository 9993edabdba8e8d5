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
top), so that they agree on it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:  # pragma: no cover
    from hetpart.cluster import Cluster

__all__ = ["unseen_device_types", "DeviceCoverage"]


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
