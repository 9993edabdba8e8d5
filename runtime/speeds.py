"""Measured speed factors per device (a cluster file's ``slow:``) from the runtime's own timings.

``hetpart run --out runs.jsonl`` records, for every rank, the compute it did in each measured step: its
own work (the thread's compute time, the waiting inside tensor-parallel all-reduces excluded) plus,
under emulation, the sleep that makes it run at its emulated device's speed. Each rank's rate is its
forward, backward and recompute FLOPs of one step (its units, its share of an uneven split, its
replica's samples: what :func:`hetpart.runtime.measure.warmup_tflops` counts) over that time.

A device's factor is its rate over the fastest rate measured, in the same run, among the devices of its
GPU type that ran the same work: the same units at the same tensor-parallel degree and slice
(data-parallel replicas, an even tensor-parallel group; the batch share may differ). Ranks whose work
differs in kind reach different efficiencies on the same device (a pipeline stage of blocks only ran at
0.52-0.57 of the stage holding the head on two healthy RTX 4090s, probe B, item 11; a narrow uneven
TP slice the same), so such a pair says nothing about either device: a device with no peer of its
type that ran its work gets no factor from that record, and none at all when no record gives it one
(:attr:`DeviceSpeed.unrated`). Several records: the median factor per device over the records that
rate it. Factors above ``1 - tolerance`` are taken as 1 (a shared machine's noise), so healthy devices
get no entry.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from hetpart.plan import Plan
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
    """Records that rated it: a factor resting on one run is one measurement (a noisy neighbour) and can
    mark a healthy GPU slow."""
    unrated: Literal["", "only_of_type", "unlike_work"] = ""
    """Why it has no factor (``compared_with`` 0): the only device of its type in every record, or its type's
    other devices ran other work (another pipeline stage's units, another TP slice) in every record."""


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


def _work(plan: Plan) -> dict[str, tuple]:
    """Device -> what it computes per micro-batch: each of its stages' units, TP degree and own TP slice.
    Two devices with the same work run the same kernels, so their rates compare the devices alone."""
    out: dict[str, list] = {}
    for replica in plan.replicas:
        for stage in replica.stages:
            split = stage.tp_split
            for i, d in enumerate(stage.devices):
                k = i % stage.tp
                part = tuple(dims[k] if dims else None for dims in
                             ((split.heads, split.ffn, split.vocab) if split is not None else ((), (), ())))
                out.setdefault(d, []).append((stage.layers, stage.tp, part))
    return {d: tuple(sorted(w)) for d, w in out.items()}


def _rank_rates(record: RunRecord, plan: Plan, source: str) -> dict[str, float]:
    """Device -> measured TFLOPS of the rank that ran it in ``record``."""
    from hetpart.runtime.measure import _rank_flops

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
    typed: set[str] = set()  # devices that had another of their type in some record
    first: tuple[str, str] | None = None
    for source, record in records:
        cluster = parse_cluster(record.cluster, f"{source}: cluster")
        if first is None:
            first = (source, cluster.name)
        elif cluster.name != first[1]:
            raise RecordError(f"{source}: a run of cluster {cluster.name!r}, and {first[0]} is one of "
                              f"{first[1]!r}; give the records of one cluster")
        plan = record.run_plan(source)
        measured = _rank_rates(record, plan, source)
        work = _work(plan)
        types: dict[str, list[str]] = {}
        alike: dict[tuple, list[str]] = {}
        for d in measured:
            gpu_of[d] = cluster.device(d).gpu.name
            types.setdefault(gpu_of[d], []).append(d)
            alike.setdefault((gpu_of[d], work.get(d)), []).append(d)
            rates.setdefault(d, []).append(measured[d])
            peers.setdefault(d, 0)
        typed.update(d for devices in types.values() if len(devices) > 1 for d in devices)
        for devices in alike.values():
            if len(devices) < 2:
                continue
            best = max(measured[d] for d in devices)
            for d in devices:
                factors.setdefault(d, []).append(measured[d] / best if best > 0 else 1.0)
                peers[d] = max(peers[d], len(devices) - 1)
    out = tuple(DeviceSpeed(d, gpu_of[d], statistics.median(rates[d]), statistics.median(factors.get(d, [1.0])),
                            peers[d], len(factors.get(d, rates[d])),
                            "" if d in factors else "unlike_work" if d in typed else "only_of_type")
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
