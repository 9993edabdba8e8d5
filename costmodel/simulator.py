"""The analytical step-time simulator of a plan on a heterogeneous cluster.

One training step of a :class:`~hetpart.plan.Plan`:

1. every replica runs its pipeline (:mod:`hetpart.costmodel.schedule`): per virtual stage and
   micro-batch, compute (:mod:`~hetpart.costmodel.compute`, fitted efficiency) plus tensor-parallel
   all-reduces inside the stage; point-to-point transfers between stages over the actual link
   (``cluster.link_between``; with sequence parallelism each of the ``tp`` ranks sends its ``1/tp``
   shard, Megatron's scatter/gather, sharing the node's NICs);
2. data-parallel gradient all-reduces, per group of units held by the same stages of all replicas
   (replicas may cut the model differently and mix device types: the slowest member paces the ring).
   A group's all-reduce starts when every holder has finished its last backward, so it overlaps with
   the backward of earlier stages; all-reduces that share a device run one after another. Tied
   embedding copies on different stages are all-reduced the same way;
3. the optimizer step, memory-bandwidth bound: 28 bytes moved per parameter held (read 16-bit
   gradient, fp32 master and two moments; write them back and the 16-bit weight) over HBM bandwidth,
   after the slowest gradient all-reduce (global gradient-norm clipping needs them all).

Memory per device follows :mod:`~hetpart.costmodel.memory`.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from hetpart.cluster import Cluster
from hetpart.errors import PlanError, WorkloadError
from hetpart.graph.model_graph import ModelGraph
from hetpart.hardware import GPUSpec
from hetpart.plan import Plan
from hetpart.workload import DTYPE_BYTES, Workload

from hetpart.costmodel.collectives import allreduce_time_s, p2p_time_s
from hetpart.costmodel.compute import unit_compute_s, unit_tp_comm_s
from hetpart.costmodel.efficiency import EfficiencyCurve
from hetpart.costmodel.memory import MODEL_STATE_BYTES_PER_PARAM, in_flight_microbatches, memory_capacity_gb
from hetpart.costmodel.schedule import pipeline_timing

__all__ = ["Prediction", "Simulator", "simulate", "OPTIMIZER_BYTES_PER_PARAM"]

OPTIMIZER_BYTES_PER_PARAM = 28
"""HBM bytes an Adam step moves per parameter under mixed precision (see the module docstring)."""


@dataclass(frozen=True)
class Prediction:
    """What the simulator predicts for one plan."""

    step_time_s: float
    tokens_per_s: float
    samples_per_s: float
    fits_in_memory: bool
    metrics: dict[str, Any]
    """The CONTRACT metrics (step_time_s, tokens_per_s, ..., peak_memory_gb per device type, fits_in_memory)."""
    memory_gb: dict[str, float]
    """Predicted peak memory of each device of the plan, GB."""
    breakdown: list[dict[str, Any]]
    """Per replica and pipeline device group (seconds per step): compute_s and tp_comm_s (busy),
    bubble_s (idle inside the pipeline), sync_wait_s (after the pipeline, until every gradient
    all-reduce is done: exposed DP communication or a slower replica), optimizer_s; pp_comm_s and
    dp_comm_s are link time (overlapped or not); plus devices, gpu, tp, layers, memory_gb,
    capacity_gb. For every entry, busy + bubble_s + sync_wait_s + the slowest optimizer_s = step."""
    timeline: list[dict[str, Any]] = field(default_factory=list)
    """With ``trace=True``: events ``{replica, stage, microbatch, kind, start_s, end_s}``, kind in
    ``fwd``, ``bwd``, ``send``, ``dp_sync``, ``optim`` (stage = pipeline device group)."""

    def to_dict(self) -> dict[str, Any]:
        return {"step_time_s": self.step_time_s, "tokens_per_s": self.tokens_per_s,
                "samples_per_s": self.samples_per_s, "fits_in_memory": self.fits_in_memory,
                "metrics": dict(self.metrics), "memory_gb": dict(self.memory_gb),
                "breakdown": [dict(b) for b in self.breakdown], "timeline": [dict(e) for e in self.timeline]}


@dataclass(frozen=True)
class _StageCost:
    fwd_s: float
    bwd_s: float
    compute_s: float
    """Compute of one micro-batch (fwd + bwd + recompute), without TP communication."""
    tp_s: float
    gpu: GPUSpec


@dataclass
class _Replica:
    pp: int
    m: int
    costs: list[_StageCost]
    p2p: np.ndarray
    timing: Any
    last_bwd: np.ndarray


class Simulator:
    """Simulates plans of one model on one cluster; caches per-unit costs between plans.

    Example:
        >>> from hetpart import load_cluster, load_model
        >>> from hetpart.costmodel import Simulator, megatron_plan
        >>> model, cluster = load_model("gpt2-small", seq_len=256), load_cluster("a100-8")
        >>> plan = megatron_plan(model, cluster, Workload(16, 256), tp=2, pp=2, dp=2, micro_batch=2)
        >>> Simulator(model, cluster).simulate(plan).fits_in_memory
        True
    """

    def __init__(self, model: ModelGraph, cluster: Cluster,
                 curve_of: Callable[[GPUSpec], EfficiencyCurve] | None = None) -> None:
        """``curve_of`` overrides the efficiency curve per device type (calibration fits through it)."""
        self.model = model
        self.cluster = cluster
        self._curve_of = curve_of
        self._unit_cache: dict[tuple, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
        self._link_cache: dict[tuple[str, str], Any] = {}
        self._ar_cache: dict[tuple, float] = {}
        self._tables = _Tables(model)
        self._tp_link_cache: dict[tuple[str, ...], tuple[float, float]] = {}
        self._capacity_cache: dict[str, float] = {}
        self._gpu_cache: dict[str, GPUSpec] = {}

    # --------------------------------------------------------------------------------- costs
    def _unit_prefix(self, gpu: GPUSpec, tp: int, mb: int, precision: str, recompute: str, tp_link) -> tuple:
        key = (gpu.name, gpu.tflops_bf16, gpu.tflops_fp32, tp, mb, precision, recompute, tp_link)
        hit = self._unit_cache.get(key)
        if hit is None:
            curve = self._curve_of(gpu) if self._curve_of else None
            fwd, bwd = unit_compute_s(self.model, gpu, tp, mb, precision, recompute, curve)
            tpf, tpb = unit_tp_comm_s(self.model, tp, mb, recompute, *tp_link) if tp > 1 else (fwd * 0, bwd * 0)
            z = np.zeros(1)
            hit = tuple(np.concatenate([z, np.cumsum(a)]) for a in (fwd, bwd, tpf, tpb))
            self._unit_cache[key] = hit
        return hit

    def _link(self, a: str, b: str):
        key = (a, b)
        if key not in self._link_cache:
            self._link_cache[key] = self.cluster.link_between(a, b)
        return self._link_cache[key]

    def _tp_link(self, devices: tuple[str, ...]) -> tuple[float, float]:
        hit = self._tp_link_cache.get(devices)
        if hit is None:
            hit = self._tp_link_cache[devices] = self._tp_link_uncached(devices)
        return hit

    def _gpu(self, device_id: str) -> GPUSpec:
        gpu = self._gpu_cache.get(device_id)
        if gpu is None:
            gpu = self._gpu_cache[device_id] = self.cluster.device(device_id).gpu
        return gpu

    def _capacity_gb(self, device_id: str) -> float:
        gpu = self._gpu(device_id)
        if gpu.name not in self._capacity_cache:
            self._capacity_cache[gpu.name] = memory_capacity_gb(gpu)
        return self._capacity_cache[gpu.name]

    def _tp_link_uncached(self, devices: tuple[str, ...]) -> tuple[float, float]:
        bw, lat = float("inf"), 0.0
        for i in range(len(devices)):
            link = self._link(devices[i], devices[(i + 1) % len(devices)])
            if link is not None and link.kind != "self":
                bw, lat = min(bw, link.bandwidth_gbyte_s), max(lat, link.latency_us)
        return bw, lat

    def _slowest_gpu(self, devices: tuple[str, ...]) -> GPUSpec:
        return min((self._gpu(d) for d in devices), key=lambda g: g.tflops_bf16)

    def _stage_cost(self, stage, plan: Plan) -> _StageCost:
        gpu = self._slowest_gpu(stage.devices)
        tp_link = self._tp_link(stage.devices) if stage.tp > 1 else (1.0, 0.0)
        f, b, tf, tb = self._unit_prefix(gpu, stage.tp, plan.micro_batch, plan.precision, plan.recompute, tp_link)
        a, z = stage.layers
        cf, cb, tpf, tpb = f[z] - f[a], b[z] - b[a], tf[z] - tf[a], tb[z] - tb[a]
        return _StageCost(cf + tpf, cb + tpb, cf + cb, tpf + tpb, gpu)

    def _p2p_s(self, src, dst, plan: Plan) -> float:
        link = self._link(src.devices[0], dst.devices[0])
        if link is None:
            raise PlanError(f"pipeline: devices {src.devices[0]} and {dst.devices[0]} sit in zones without a link; "
                            "add one under 'links'")
        tp = max(src.tp, dst.tp)
        nbytes = self.model.units[src.layers[1] - 1].out_act_bytes * plan.micro_batch / tp
        if link.kind in ("nic", "inter_zone"):
            share = min(self.cluster.group_of(d).node_bandwidth_gbyte_s / tp for d in (src.devices[0], dst.devices[0]))
            if share < link.bandwidth_gbyte_s:
                link = type(link)(share, link.latency_us, link.kind)
        return p2p_time_s(nbytes, link)

    # --------------------------------------------------------------------------------- pipeline
    def _replica(self, plan: Plan, r: int) -> _Replica:
        rep = plan.replicas[r]
        v = plan.interleave if plan.schedule == "interleaved" else 1
        pp = rep.pp // v
        m = plan.num_microbatches(r)
        costs = [self._stage_cost(s, plan) for s in rep.stages]
        p2p = np.array([self._p2p_s(rep.stages[k], rep.stages[k + 1], plan) for k in range(rep.pp - 1)])
        fwd = np.repeat(np.array([[c.fwd_s for c in costs]]).T, m, axis=1)
        bwd = np.repeat(np.array([[c.bwd_s for c in costs]]).T, m, axis=1)
        timing = pipeline_timing(fwd, bwd, p2p, plan.schedule, v)
        return _Replica(pp, m, costs, p2p, timing, timing.last_backward_end_s(rep.pp))

    # --------------------------------------------------------------------------------- data parallel
    def _dp_segments(self, plan: Plan) -> list[tuple[tuple[tuple[int, int], ...], float]]:
        """Groups of consecutive units held by the same (replica, stage) set, with their gradient bytes
        per device (the smallest TP shard among the holders), plus tied-embedding copies."""
        grad_bytes = DTYPE_BYTES[plan.precision]
        cuts = sorted({s.layers[0] for rep in plan.replicas for s in rep.stages} | {self.model.num_units})
        starts = [[s.layers[0] for s in rep.stages] for rep in plan.replicas]
        segments: dict[tuple, float] = {}
        spans: list[tuple[int, int, tuple]] = []
        for a, z in zip(cuts[:-1], cuts[1:]):
            holders = tuple((r, bisect_right(starts[r], a) - 1) for r in range(plan.dp))
            spans.append((a, z, holders))
            if plan.dp > 1:
                tp_min = min(plan.replicas[r].stages[k].tp for r, k in holders)
                sharded, whole = self._tables.params(a, z)
                segments[holders] = segments.get(holders, 0.0) + (sharded / tp_min + whole) * grad_bytes
        for holders, nbytes in self._tied_segments(plan, spans, grad_bytes):
            segments[holders] = segments.get(holders, 0.0) + nbytes
        return [(h, b) for h, b in segments.items() if len(h) > 1 and b > 0]

    def _tied_segments(self, plan: Plan, spans, grad_bytes: int) -> list[tuple[tuple, float]]:
        owner = self._tables.owner
        if owner < 0:
            return []
        def holders_of(u):
            return next(h for a, z, h in spans if a <= u < z)
        out = []
        for u in self._tables.sharers:
            hu, ho = holders_of(u), holders_of(owner)
            if hu != ho:
                holders = tuple(sorted(set(hu) | set(ho)))
                tp_min = min(plan.replicas[r].stages[k].tp for r, k in holders)
                out.append((holders, self.model.units[u].shared_params * grad_bytes / tp_min))
        return out

    def _allreduce_s(self, nbytes: float, holders, plan: Plan) -> float:
        stages = [plan.replicas[r].stages[k] for r, k in holders]
        members = tuple(sorted({s.devices[0] for s in stages}))
        concurrent = max(s.tp for s in stages)
        key = (nbytes, members, concurrent)
        if key not in self._ar_cache:
            self._ar_cache[key] = allreduce_time_s(nbytes, members, self.cluster, concurrent)
        return self._ar_cache[key]

    def _dp_sync(self, plan: Plan, reps: list[_Replica]) -> tuple[float, dict[tuple[int, int], float], list]:
        """(end of the last gradient all-reduce, dp seconds per (replica, device group), events)."""
        def group(r, k):
            return (r, k % reps[r].pp)

        jobs = []
        for holders, nbytes in self._dp_segments(plan):
            ready = max(reps[r].last_bwd[k] for r, k in holders)
            jobs.append((ready, holders, self._allreduce_s(nbytes, holders, plan)))
        jobs.sort(key=lambda j: j[0])
        free: dict[tuple[int, int], float] = {}
        spent: dict[tuple[int, int], float] = {}
        events = []
        end_all = 0.0
        for ready, holders, t in jobs:
            groups = {group(r, k) for r, k in holders}
            start = max([ready] + [free.get(g, 0.0) for g in groups])
            for g in groups:
                free[g] = start + t
                spent[g] = spent.get(g, 0.0) + t
                events.append({"replica": g[0], "stage": g[1], "microbatch": -1, "kind": "dp_sync",
                               "start_s": start, "end_s": start + t})
            end_all = max(end_all, start + t)
        return end_all, spent, events

    # --------------------------------------------------------------------------------- memory
    def _memory(self, plan: Plan, reps: list[_Replica]) -> tuple[dict[str, float], dict[tuple[int, int], float]]:
        per_device: dict[str, float] = {}
        per_group: dict[tuple[int, int], float] = {}
        v = plan.interleave if plan.schedule == "interleaved" else 1
        for r, rep in enumerate(plan.replicas):
            pp, m = reps[r].pp, reps[r].m
            for d in range(pp):
                flight = in_flight_microbatches(plan.schedule, d, pp, m, v)
                gb = sum(self._tables.memory_gb(*rep.stages[k].layers, rep.stages[k].tp, plan.micro_batch, flight,
                                                plan.recompute) for k in range(d, rep.pp, pp))
                per_group[(r, d)] = gb
                for dev in rep.stages[d].devices:
                    per_device[dev] = gb
        return per_device, per_group

    def _optimizer_s(self, plan: Plan, r: int, d: int, pp: int) -> float:
        rep = plan.replicas[r]
        params = sum(self._tables.params_per_device(*rep.stages[k].layers, rep.stages[k].tp)
                     for k in range(d, rep.pp, pp))
        hbm = min(self._gpu(x).hbm_gbyte_s for x in rep.stages[d].devices)
        return params * OPTIMIZER_BYTES_PER_PARAM / (hbm * 1e9)

    # --------------------------------------------------------------------------------- main
    def simulate(self, plan: Plan, workload: Workload | None = None, *, validate: bool = True,
                 trace: bool = False) -> Prediction:
        """Predict one training step of ``plan`` (see :func:`simulate`)."""
        self._check(plan, workload, validate)
        reps = [self._replica(plan, r) for r in range(plan.dp)]
        dp_end, dp_spent, dp_events = self._dp_sync(plan, reps)
        optim = {(r, d): self._optimizer_s(plan, r, d, reps[r].pp) for r in range(plan.dp) for d in range(reps[r].pp)}
        pipe_end = max(rep.timing.makespan_s for rep in reps)
        sync_end = max(pipe_end, dp_end)
        step = sync_end + max(optim.values())
        per_device, per_group = self._memory(plan, reps)
        breakdown = self._breakdown(plan, reps, dp_spent, optim, per_group, sync_end)
        metrics = self._metrics(plan, reps, step, breakdown)
        for b in breakdown:
            del b["gpus"]
        timeline = self._timeline(plan, reps, dp_events, optim, sync_end) if trace else []
        return Prediction(step_time_s=float(step), tokens_per_s=metrics["tokens_per_s"],
                          samples_per_s=metrics["samples_per_s"], fits_in_memory=metrics["fits_in_memory"],
                          metrics=metrics, memory_gb=per_device, breakdown=breakdown, timeline=timeline)

    def _check(self, plan: Plan, workload: Workload | None, validate: bool) -> None:
        if validate:
            plan.check(self.model, self.cluster)
        if plan.seq_len != self.model.seq_len:
            raise PlanError(f"plan: seq_len: {plan.seq_len} but the model graph was built for {self.model.seq_len} "
                            f"tokens; load the model with seq_len={plan.seq_len}")
        if DTYPE_BYTES[plan.precision] != self.model.dtype_bytes:
            raise PlanError(f"plan: precision: {plan.precision!r} but the model graph was built with "
                            f"{self.model.dtype_bytes}-byte activations; load the model with precision={plan.precision!r}")
        if workload is not None and (workload.global_batch, workload.seq_len) != (plan.global_batch, plan.seq_len):
            raise WorkloadError(f"workload: global_batch {workload.global_batch} and seq_len {workload.seq_len} differ "
                                f"from the plan's {plan.global_batch} and {plan.seq_len}; plan for this workload")

    def _breakdown(self, plan, reps, dp_spent, optim, per_group, sync_end) -> list[dict[str, Any]]:
        out = []
        for r, rep in enumerate(plan.replicas):
            info = reps[r]
            busy = info.timing.busy_s()
            for d in range(info.pp):
                ks = range(d, rep.pp, info.pp)
                # activations sent down to k+1, gradients sent up to k-1
                sends = sum((info.p2p[k] if k < rep.pp - 1 else 0.0) + (info.p2p[k - 1] if k > 0 else 0.0)
                            for k in ks) * info.m
                out.append({
                    "replica": r, "stage": d, "layers": [list(rep.stages[k].layers) for k in ks],
                    "devices": list(rep.stages[d].devices), "gpu": info.costs[d].gpu.name, "tp": rep.stages[d].tp,
                    "compute_s": sum(info.costs[k].compute_s for k in ks) * info.m,
                    "tp_comm_s": sum(info.costs[k].tp_s for k in ks) * info.m,
                    "pp_comm_s": float(sends),
                    "dp_comm_s": dp_spent.get((r, d), 0.0),
                    "bubble_s": float(info.timing.makespan_s - busy[d]),
                    "sync_wait_s": float(sync_end - info.timing.makespan_s),
                    "optimizer_s": optim[(r, d)],
                    "memory_gb": per_group[(r, d)],
                    "capacity_gb": min(self._capacity_gb(x) for x in rep.stages[d].devices),
                    "gpus": [self._gpu(x) for x in rep.stages[d].devices],
                })
        return out

    def _metrics(self, plan, reps, step, breakdown) -> dict[str, Any]:
        model = self.model
        samples = plan.global_batch
        model_flops = model.train_flops * samples
        recompute = sum(u.recompute_flops[plan.recompute] for u in model.units) * samples
        peak = 0.0
        n = 0
        peak_mem: dict[str, float] = {}
        span = bubble = 0.0
        for b in breakdown:
            for gpu in b["gpus"]:
                peak_mem[gpu.name] = max(peak_mem.get(gpu.name, 0.0), b["memory_gb"])
                peak += gpu.tflops(plan.precision) * 1e12
            n += len(b["gpus"])
            span += reps[b["replica"]].timing.makespan_s
            bubble += b["bubble_s"]
        fits = all(b["memory_gb"] <= b["capacity_gb"] for b in breakdown)
        step = float(step)
        return {
            "step_time_s": step,
            "tokens_per_s": samples * plan.seq_len / step,
            "samples_per_s": samples / step,
            "hardware_tflops_per_device": float((model_flops + recompute) / step / n / 1e12),
            "model_tflops_per_device": float(model_flops / step / n / 1e12),
            "mfu": float(model_flops / step / peak),
            "bubble_fraction": float(bubble / span) if span > 0 else 0.0,
            "peak_memory_gb": {k: float(x) for k, x in peak_mem.items()},
            "fits_in_memory": bool(fits),
        }

    def _timeline(self, plan, reps, dp_events, optim, sync_end) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        for r, info in enumerate(reps):
            for op in info.timing.ops():
                events.append({"replica": r, "stage": op.device, "microbatch": op.microbatch, "kind": op.kind,
                               "start_s": op.start_s, "end_s": op.end_s})
                k = op.stage
                if op.kind == "fwd" and k < len(info.p2p):
                    events.append({"replica": r, "stage": op.device, "microbatch": op.microbatch, "kind": "send",
                                   "start_s": op.end_s, "end_s": op.end_s + float(info.p2p[k])})
                elif op.kind == "bwd" and k > 0:
                    events.append({"replica": r, "stage": op.device, "microbatch": op.microbatch, "kind": "send",
                                   "start_s": op.end_s, "end_s": op.end_s + float(info.p2p[k - 1])})
        events += dp_events
        for (r, d), t in optim.items():
            events.append({"replica": r, "stage": d, "microbatch": -1, "kind": "optim", "start_s": sync_end,
                           "end_s": sync_end + t})
        return events


class _Tables:
    """Prefix sums over the units of a model, so any stage ``[first, last)`` costs O(1).

    Same accounting as :func:`~hetpart.costmodel.memory.stage_memory_gb` (tests compare the two).
    """

    def __init__(self, model: ModelGraph) -> None:
        def prefix(values):
            return np.concatenate([[0.0], np.cumsum(np.asarray(values, dtype=float))]).tolist()

        units = model.units
        sh = [1.0 if u.tp_shardable else 0.0 for u in units]
        self._p_sh = prefix([u.params * f for u, f in zip(units, sh)])
        self._p_rep = prefix([u.params * (1 - f) for u, f in zip(units, sh)])
        self._s_sh = prefix([u.shared_params * f for u, f in zip(units, sh)])
        self._s_rep = prefix([u.shared_params * (1 - f) for u, f in zip(units, sh)])
        self._act = {mode: (prefix([u.act_bytes[mode] * f for u, f in zip(units, sh)]),
                            prefix([u.act_bytes[mode] * (1 - f) for u, f in zip(units, sh)]))
                     for mode in ("none", "selective", "full")}
        self._none = [(u.act_bytes["none"], u.tp_shardable) for u in units]
        names = [u.name for u in units]
        tied = (model.arch or {}).get("tied_owner")
        self.owner = names.index(tied) if tied in names else -1
        self.sharers = [i for i, u in enumerate(units) if u.shared_params]

    def params(self, a: int, z: int) -> tuple[float, float]:
        """(tensor-parallel-sharded, replicated) parameters owned by units ``[a, z)``."""
        return self._p_sh[z] - self._p_sh[a], self._p_rep[z] - self._p_rep[a]

    def params_per_device(self, a: int, z: int, tp: int) -> float:
        sharded, whole = self.params(a, z)
        if not a <= self.owner < z:
            sharded += self._s_sh[z] - self._s_sh[a]
            whole += self._s_rep[z] - self._s_rep[a]
        return sharded / tp + whole

    def memory_gb(self, a: int, z: int, tp: int, micro_batch: int, in_flight: float, recompute: str) -> float:
        sh, rep = self._act[recompute]
        acts = ((sh[z] - sh[a]) / tp + (rep[z] - rep[a])) * micro_batch * in_flight
        if recompute == "full" and z > a:
            acts += max(b / (tp if s else 1) for b, s in self._none[a:z]) * micro_batch
        return (self.params_per_device(a, z, tp) * MODEL_STATE_BYTES_PER_PARAM + acts) / 1e9


def simulate(model: ModelGraph, cluster: Cluster, plan: Plan, workload: Workload | None = None, *,
             validate: bool = True, trace: bool = False) -> Prediction:
    """Predict step time, throughput, memory and a breakdown for ``plan``.

    Args:
        model: the unit graph (built for the plan's ``seq_len`` and precision).
        cluster: the cluster the plan's device ids refer to.
        plan: the plan.
        workload: optional; when given its global batch and sequence length must match the plan's.
        validate: check the plan first (:meth:`Plan.check` raises :class:`PlanError`).
        trace: also return the per-operation timeline (for a Gantt chart).

    For many plans of one model on one cluster, reuse a :class:`Simulator` (it caches unit costs).
    """
    return Simulator(model, cluster).simulate(plan, workload, validate=validate, trace=trace)
