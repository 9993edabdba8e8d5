"""Measured speed factors per device (a cluster file's ``slow:``) from the runtime's own timings.

``hetpart run --out runs.jsonl`` records, for every rank, the compute it did in each measured step: its
own work (the thread's compute time, the waiting inside tensor-parallel all-reduces excluded) plus,
under emulation, the sleep that makes it run at its emulated device's speed. Each rank's rate is its
forward, backward and recompute FLOPs of one step (its units, its share of an uneven split, its
replica's samples: what :func:`hetpart.runtime.measure.warmup_tflops` counts) over that time.

A device's factor is its rate over the fastest rate measured for its GPU type in the same run, so a
throttled GPU stands out against its healthy peers; a type measured on one device only gets no factor
(nothing to compare it with). Several records: the median factor per device. Factors above
``1 - tolerance`` are taken as 1 (a shared machine's noise), so healthy devices get no entry.

Caveats: ranks whose work differs in kind (a pipeline stage holding the head next to one of blocks
only, or a narrow uneven slice) reach different efficiencies on the same device; compare devices that
run alike work (data-parallel replicas, an even tensor-parallel group) for the cleanest factors.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetpart.records import RecordError, RunRecord

__all__ = ["DeviceSpeed", "SpeedEstimate", "speed_factors", "with_measured_slow"]


@dataclass(frozen=True)
class DeviceSpeed:
    """One device's measured rate and factor."""

    device: str
    gpu: str
    """Its GPU type in the record's cluster."""
    tflops: float
    """Median measured rate over the records, TFLOPS (of the model that ran, on this machine)."""
    factor: float
    """Median rate over the fastest device of its type in the same record (1.0 for the fastest)."""
    compared_with: int
    """Other devices of its type it was compared with (0: none, no factor is written)."""
    runs: int = 1
    """Records that measured it: a factor resting on one run is one measurement (a pipeline stage's share
    of the work, a noisy neighbour) and can mark a healthy GPU slow."""


@dataclass(frozen=True)
class SpeedEstimate:
    """Measured factors of every device the records ran."""

    devices: tuple[DeviceSpeed, ...]
    records: int
    tolerance: float
    slow: dict[str, float] = field(default_factory=dict)
    """What goes into ``slow:``: devices whose factor is below ``1 - tolerance`` (rounded to 0.01)."""
    cluster: str = ""
    """Name of the cluster the records ran (every record's must be the same)."""


def _rank_rates(record: RunRecord, source: str) -> dict[str, float]:
    """Device -> measured TFLOPS of the rank that ran it in ``record``."""
    from hetpart.runtime.measure import _rank_flops

    plan = record.run_plan(source)
    flops = _rank_flops(record.model_graph(), plan)
    out = {}
    for r in record.measured.ranks:
        busy = r.measured_compute_s + r.emulated_slowdown_s
        if r.measured_compute_s <= 0:
            raise RecordError(f"{source}: measured.ranks[{r.rank}].measured_compute_s: missing; the record was "
                              "written before runs kept each rank's own compute; run again with 'hetpart run --out'")
        out[r.device] = flops.get(r.device, 0.0) / busy / 1e12
    return out


def speed_factors(records: list[tuple[str, RunRecord]], tolerance: float = 0.1,
                  source: str | None = None) -> SpeedEstimate:
    """Measured speed factors of every device of ``records`` (``(source, record)`` pairs); ``source``: the file
    they were read from (named when it holds none)."""
    from hetpart.cluster import parse_cluster

    if not 0 <= tolerance < 1:
        raise ValueError(f"tolerance must be in [0, 1), got {tolerance!r}")
    if not records:
        where = f"--speeds-from: {source}: " if source else ""
        raise RecordError(f"{where}the run records hold no record; give a file written by 'hetpart run --out' "
                          "(it appends one record per run)")
    rates: dict[str, list[float]] = {}
    factors: dict[str, list[float]] = {}
    peers: dict[str, int] = {}
    gpu_of: dict[str, str] = {}
    first: tuple[str, str] | None = None
    for source, record in records:
        cluster = parse_cluster(record.cluster, f"{source}: cluster")
        if first is None:
            first = (source, cluster.name)
        elif cluster.name != first[1]:
            raise RecordError(f"{source}: a run of cluster {cluster.name!r}, and {first[0]} is one of "
                              f"{first[1]!r}; give the records of one cluster")
        measured = _rank_rates(record, source)
        types: dict[str, list[str]] = {}
        for d in measured:
            gpu_of[d] = cluster.device(d).gpu.name
            types.setdefault(gpu_of[d], []).append(d)
        for devices in types.values():
            best = max(measured[d] for d in devices)
            for d in devices:
                rates.setdefault(d, []).append(measured[d])
                factors.setdefault(d, []).append(measured[d] / best if best > 0 else 1.0)
                peers[d] = max(peers.get(d, 0), len(devices) - 1)
    out = tuple(DeviceSpeed(d, gpu_of[d], statistics.median(rates[d]), statistics.median(factors[d]), peers[d],
                            len(factors[d]))
                for d in sorted(rates, key=lambda d: tuple(int(x) for x in d.split("/"))))
    slow = {s.device: round(s.factor, 2) for s in out if s.compared_with and s.factor < 1 - tolerance}
    return SpeedEstimate(devices=out, records=len(records), tolerance=tolerance, slow=slow,
                         cluster=first[1] if first else "")


def with_measured_slow(cluster_spec: str, slow: dict[str, float], devices: list[str],
                       measured: SpeedEstimate | None = None, source: str = "the run records") -> dict[str, Any]:
    """The cluster file ``cluster_spec`` (a path or a catalog name) as a YAML mapping, its ``slow:`` entries
    of ``devices`` replaced by the measured ``slow`` (others kept); checked by parsing it back.

    With ``measured`` (the estimate of the records in ``source``), the cluster must be the one the records
    ran: the same name and the same GPU type on every measured device (factors of another cluster's
    devices would mark the wrong GPUs slow)."""
    from hetpart.cluster import cluster_catalog, parse_cluster
    from hetpart.errors import SpecError
    from hetpart._yaml import load_yaml_file

    catalog = cluster_catalog()
    path = catalog[cluster_spec] if cluster_spec in catalog and not Path(cluster_spec).exists() else Path(cluster_spec)
    data = load_yaml_file(SpecError, path, "the cluster YAML")
    if not isinstance(data, dict):
        raise SpecError(f"{path}: the cluster YAML is not a mapping; give a cluster file")
    cluster = parse_cluster(data, source=str(path))
    if measured is not None:
        _check_same_cluster(cluster, str(cluster_spec), measured, source)
    missing = [d for d in devices if not cluster.has_device(d)]
    if missing:
        raise SpecError(f"--cluster: {path} has no device {missing[0]} that the run records measured; give the cluster "
                        "the runs ran on")
    kept = {k: v for k, v in (data.get("slow") or {}).items() if k not in devices}
    merged = {**kept, **slow}
    out = {k: v for k, v in data.items() if k != "slow"}
    if merged:
        out["slow"] = dict(sorted(merged.items(), key=lambda kv: cluster.device(kv[0]).index))
    parse_cluster(out, source=f"{path} with the measured slow:")
    return out


def _check_same_cluster(cluster, spec: str, measured: SpeedEstimate, source: str) -> None:
    from hetpart.errors import SpecError

    other = [d for d in measured.devices if cluster.has_device(d.device) and cluster.device(d.device).gpu.name != d.gpu]
    if measured.cluster and (cluster.name != measured.cluster or other):
        why = (f" (its {other[0].device} is {cluster.device(other[0].device).gpu.name}, where the runs had "
               f"{other[0].gpu})" if other else "")
        raise SpecError(f"--speeds-from: {source} holds runs of cluster {measured.cluster!r}, and --cluster {spec} is "
                        f"cluster {cluster.name!r}{why}; give the cluster the runs ran on (or records of this one)")
