"""Measurements of a run: host rates, the per-step summary, and the prediction for what ran.

The prediction is the simulator's for exactly what ran: the shrunken model on the emulated cluster
(:func:`hetpart.runtime.emulation.emulated_cluster`), whose device rates come from this machine's
measured rates. Both go into the run record (:mod:`hetpart.runtime.record`, ``--out``).

Step time is the mean over measured steps (warm-up excluded) of the slowest rank's step.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

__all__ = ["HostRates", "measure_host_rates", "matmul_tflops", "memory_gbyte_s", "Measurement", "summarize",
           "predict", "by_real_gpu", "Calibration", "calibrate", "warmup_tflops"]


@dataclass(frozen=True)
class HostRates:
    """What this machine computes per process (one thread, fp32), measured."""

    matmul_tflops: float
    """Best fp32 matmul rate of one thread on ``matmul_size``-square products, TFLOPS."""
    matmul_size: int
    memory_gbyte_s: float
    """One thread's streaming rate (read + write) over a 64 MiB buffer, GB/s."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def matmul_tflops(size: int = 256, repeats: int = 20) -> float:
    """Best-of fp32 matmul rate of one thread on ``size``-square products, TFLOPS."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(0)
        a, b = torch.randn(size, size, generator=gen), torch.randn(size, size, generator=gen)
        torch.mm(a, b)
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            torch.mm(a, b)
            best = min(best, time.perf_counter() - t)
    finally:
        torch.set_num_threads(threads)
    return 2 * size**3 / best / 1e12


def memory_gbyte_s(num_bytes: int = 64 * 2**20, repeats: int = 5) -> float:
    """Best-of streaming rate of one thread copying ``num_bytes``, GB/s (bytes read + written)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        src = torch.ones(num_bytes // 4)
        dst = torch.empty_like(src)
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            dst.copy_(src)
            best = min(best, time.perf_counter() - t)
    finally:
        torch.set_num_threads(threads)
    return 2 * num_bytes / best / 1e9


def measure_host_rates(width: int = 256) -> HostRates:
    """This machine's per-process rates; ``width`` sizes the matmul like the model that will run."""
    size = max(64, min(1024, width))
    return HostRates(matmul_tflops=matmul_tflops(size), matmul_size=size, memory_gbyte_s=memory_gbyte_s())


@dataclass(frozen=True)
class Measurement:
    """What a run measured (warm-up steps excluded)."""

    step_time_s: float
    """Mean over measured steps of the slowest rank's step time."""
    tokens_per_s: float
    samples_per_s: float
    step_times_s: tuple[float, ...]
    """Per measured step, the slowest rank's time."""
    step_time_std_s: float
    losses: tuple[float, ...]
    """Global mean loss of every step, warm-up included."""
    stages: tuple[dict[str, Any], ...]
    """Per replica and pipeline position: devices, ranks, compute_s, comm_s, idle_s per step (mean over its
    ranks); an interleaved rank's chunks are one row (``stages``, ``chunks``), not one row each."""
    ranks: tuple[dict[str, Any], ...]
    """Per rank: device, step time, compute/comm/idle per step, peak memory."""
    peak_memory_gb: dict[str, float]
    """Per device type (the plan's, as the prediction's ``peak_memory_gb`` is keyed), the largest peak over its
    ranks."""
    memory_method: str
    """How the peaks were read: ``live_tensors`` (on CPU: the bytes of live tensors at their peak in one extra,
    untimed step, :mod:`hetpart.runtime.live_memory`), ``cuda_max_allocated`` (the CUDA allocator's peak over
    the measured steps), or from older runs ``rss_peak_delta``/``rss_peak_since_start`` (resident-set growth)."""
    steps: int
    warmup: int
    rss_peak_delta_gb: dict[str, float] = field(default_factory=dict)
    """On CPU, per device type: the largest growth of a rank's resident set during a measured step (what
    ``peak_memory_gb`` held before ``live_tensors``; it misses tensors placed in pages already resident)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(results: Sequence[dict[str, Any]], plan, cluster, seq_len: int, warmup: int) -> Measurement:
    """Combine the ranks' results (``worker`` output) into one :class:`Measurement`."""
    steps = [r["steps"][warmup:] for r in results]
    n = min(len(s) for s in steps)
    if n == 0:
        raise ValueError(f"no measured steps: every rank ran {min(len(r['steps']) for r in results)} steps, "
                         f"warm-up {warmup}")
    slowest = [max(s[i]["time_s"] for s in steps) for i in range(n)]
    step_time = statistics.fmean(slowest)
    ranks = tuple(_rank_summary(r, s[:n]) for r, s in zip(results, steps))
    gpu = {d.id: d.gpu.name for d in cluster.devices}
    peak: dict[str, float] = {}
    rss: dict[str, float] = {}
    for r in ranks:
        peak[gpu[r["device"]]] = max(peak.get(gpu[r["device"]], 0.0), r["peak_memory_gb"])
        if "rss_peak_delta_gb" in r:
            rss[gpu[r["device"]]] = max(rss.get(gpu[r["device"]], 0.0), r["rss_peak_delta_gb"])
    losses = tuple(results[0]["losses"])
    return Measurement(step_time_s=step_time, tokens_per_s=plan.global_batch * seq_len / step_time,
                       samples_per_s=plan.global_batch / step_time, step_times_s=tuple(slowest),
                       step_time_std_s=statistics.pstdev(slowest), losses=losses,
                       stages=_stage_summary(ranks, plan), ranks=ranks, peak_memory_gb=peak,
                       memory_method=str(results[0].get("memory_method", "")), steps=n, warmup=warmup,
                       rss_peak_delta_gb=rss)


def _rank_summary(result: dict[str, Any], steps: list[dict[str, Any]]) -> dict[str, Any]:
    mean = lambda key: statistics.fmean(s.get(key, 0.0) for s in steps)  # noqa: E731
    return {"rank": result["rank"], "device": result["device"], "step_time_s": mean("time_s"),
            "wall_step_time_s": mean("wall_s"), "cpu_step_time_s": mean("cpu_s"),
            "compute_s": mean("compute_s"), "comm_s": mean("comm_s"), "optimizer_s": mean("optimizer_s"),
            "idle_s": mean("idle_s"),
            "emulated_slowdown_s": mean("slowdown_s"), "emulated_comm_s": mean("emulated_comm_s"),
            "measured_compute_s": mean("measured_compute_s"),
            "peak_memory_gb": float(result.get("peak_memory_bytes", 0)) / 1e9,
            **({"rss_peak_delta_gb": float(result["rss_peak_delta_bytes"]) / 1e9}
               if "rss_peak_delta_bytes" in result else {})}


def _stage_summary(ranks: Sequence[dict[str, Any]], plan) -> tuple[dict[str, Any], ...]:
    """Per replica, one row per pipeline position: the ranks holding it, seconds per step (mean over them).

    A rank's compute, comm, optimizer and idle are whole-rank figures. Under ``interleaved`` a rank holds
    ``v`` chunks (stages ``j, j + pp/v, ...``), so one row per stage showed the same rank's figures ``v``
    times and the rows added up to ``v`` times the step; such a row stands for all of its chunks instead:
    ``stage`` and ``layers`` are its first chunk's, ``stages`` and ``chunks`` list them all (one entry each
    without interleaving)."""
    by_device = {r["device"]: r for r in ranks}
    v = max(1, int(getattr(plan, "chunks_per_device", 1) or 1))
    out = []
    for i, replica in enumerate(plan.replicas):
        positions = len(replica.stages) // v if len(replica.stages) % v == 0 else len(replica.stages)
        for j in range(positions):
            held = list(range(j, len(replica.stages), positions))
            stage = replica.stages[j]
            members = [by_device[d] for d in stage.devices if d in by_device]
            if not members:
                continue
            row = {"replica": i, "stage": j, "layers": list(stage.layers), "devices": list(stage.devices),
                   "ranks": [m["rank"] for m in members], "stages": held,
                   "chunks": [list(replica.stages[k].layers) for k in held]}
            for key in ("compute_s", "comm_s", "optimizer_s", "idle_s"):
                row[key] = statistics.fmean(m[key] for m in members)
            out.append(row)
    return tuple(out)


def predict(graph, cluster, plan, profile=None, host_work_s: float = 0.0,
            transport_excess_s: float = 0.0) -> dict[str, Any]:
    """The simulator's prediction for ``plan`` of ``graph`` on ``cluster`` (the emulated one), as a dict.

    The keys that ``measured`` has (``step_time_s``, ``tokens_per_s``, ``samples_per_s``) come first,
    then the simulator's other metrics, ``predictor`` (name, version and options, for the run record)
    and its per-stage breakdown. The runtime all-reduces gradients
    after the backward (Megatron's default), so the simulator does too (``overlap_grad_reduce=False``), and
    it counts the activations the runtime's own modules save (``kernels="torch"``).
    ``profile``: a measured profile whose entries replace the simulator's analytic terms.
    ``host_work_s``: the runtime's own host work per step, measured by the ranks (the slowest rank's,
    :meth:`hetpart.runtime.engine.Executor.host_work_s`), which the simulator does not price: added to the step.
    ``transport_excess_s``: per step, what this machine's own transport took beyond the emulated links' time (the
    slowest rank's), also added (:data:`hetpart.costmodel.replay.RUNTIME_TERMS`).
    """
    from hetpart.costmodel.predictor import get_predictor
    from hetpart.costmodel.replay import with_runtime_terms
    from hetpart.workload import Workload

    workload = Workload(global_batch=plan.global_batch, seq_len=plan.seq_len, precision=plan.precision,
                        recompute=plan.recompute)
    # the runtime runs PyTorch's kernels (transformers modules): its saved activations are measured ones
    options = {"overlap_grad_reduce": False, "kernels": "torch"}
    chosen = get_predictor("simulator", graph, cluster, workload, **options,
                           **({"profile": profile} if profile is not None else {}))
    pred = chosen.predict(plan, workload)
    if profile is not None:  # the record keeps the profile itself: the prediction can be replayed exactly
        options = dict(options, profile=profile.to_dict() | {"source": profile.source})
    terms = {"host_work_s": float(host_work_s), "transport_excess_s": float(transport_excess_s)}
    # and the runtime's own terms added to the step, kept where nonzero (hetpart.costmodel.replay adds them again)
    options = dict(options, **{k: v for k, v in terms.items() if v})
    head = {"step_time_s": pred.step_time_s, "tokens_per_s": pred.tokens_per_s, "samples_per_s": pred.samples_per_s}
    out = with_runtime_terms(head, terms) | terms
    out.update({k: v for k, v in pred.metrics.items() if k not in out})
    out["predictor"] = {"name": chosen.name, "version": chosen.version, "options": options}
    out["provenance"] = pred.provenance
    out["breakdown"] = pred.breakdown
    return out


def by_real_gpu(predicted: dict[str, Any], emulated, real) -> dict[str, Any]:
    """``predicted`` with its per-device-type metrics keyed by the real cluster's GPU names, as the measured
    ones are: the emulated cluster names its types ``emu-<name>`` (:func:`hetpart.runtime.emulation.emulated_cluster`),
    so ``peak_memory_gb`` read ``emu-A100-80GB`` where the measurement read ``A100-80GB``."""
    names = {e.name: r.name for eg, rg in zip(emulated.groups, real.groups)
             for (e, _), (r, _) in zip(eg.gpu_counts, rg.gpu_counts)}
    out = dict(predicted)
    for key, value in predicted.items():
        if isinstance(value, dict) and value and set(value) <= set(names):
            out[key] = {names[k]: v for k, v in value.items()}
    return out


@dataclass(frozen=True)
class Calibration:
    """What one process of this machine achieves on the model that runs (fp32, one thread)."""

    achieved_tflops: float
    """Forward + backward FLOPs of the model / measured time, TFLOPS (framework overheads included)."""
    optimizer_gbyte_s: float
    """Adam's rate in the simulator's accounting: 28 bytes per parameter / measured step time, GB/s."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_ADAM_BYTES_PER_PARAM = 28  # the simulator's accounting (costmodel/simulator.py, optimizer step)


def calibrate(runnable, unit_flops: Sequence[float], seq_len: int, micro_batch: int, repeats: int = 7) -> Calibration:
    """Measure this process's rates on the model that will run.

    Times forward + backward of the embedding, the first block and the head (median of ``repeats``)
    on one micro-batch, counts every other unit like the first block, and times an Adam step over
    those units' parameters. Run in every worker at once, so that the numbers include the
    contention of the run itself; the raw matmul rate overstates small models several times.

    Args:
        runnable: :class:`hetpart.runtime.models.RunnableSpec`.
        unit_flops: forward + backward FLOPs of each unit for ONE sequence (the run's graph).
        seq_len: tokens per sequence of the run.
        micro_batch: sequences per micro-batch.
    """
    import torch

    from hetpart.runtime.models import build_units, synthetic_batch

    n = len(unit_flops)
    picked = sorted({0, min(1, n - 1), n - 1})
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        units = build_units(runnable, picked)
        x, _ = synthetic_batch(runnable, micro_batch, seq_len, step=0)
        times = {}
        for index, unit in zip(picked, units):
            x, times[index] = _time_unit(unit, x, repeats)
        params = [p for u in units for p in u.parameters()]
        optimizer_s = _time_adam(params, repeats)
    finally:
        torch.set_num_threads(threads)
    block = picked[min(1, len(picked) - 1)]
    total_s = sum(times.values()) + (n - len(picked)) * times[block]
    achieved = micro_batch * sum(unit_flops) / total_s / 1e12
    num_params = sum(p.numel() for p in params)
    return Calibration(achieved_tflops=achieved, optimizer_gbyte_s=_ADAM_BYTES_PER_PARAM * num_params / optimizer_s / 1e9)


def _time_adam(params, repeats: int) -> float:
    import torch

    for p in params:
        p.grad = torch.ones_like(p)
    opt = torch.optim.Adam(params, lr=1e-9)
    times = []
    for attempt in range(repeats + 1):
        t = time.perf_counter()
        opt.step()
        if attempt:
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def _time_unit(unit, x, repeats: int):
    """``(output, median forward+backward seconds)``; the first run only warms caches and allocators.

    The median, not the best: the calibration must include the contention that the run will see.
    """
    times = []
    for attempt in range(repeats + 1):
        inp = x.detach().requires_grad_(x.is_floating_point())
        t = time.perf_counter()
        out = unit(inp)
        out.float().square().mean().backward()
        if attempt:
            times.append(time.perf_counter() - t)
        unit.zero_grad(set_to_none=True)
    return out.detach(), statistics.median(times)


def warmup_tflops(results: Sequence[dict[str, Any]], graph, plan, warmup: int) -> float | None:
    """Mean rate the ranks reached in the warm-up, TFLOPS: their units' FLOPs / their measured compute.

    Uses the warm-up steps after the first (the first pays one-time costs) or the only one; the
    measured compute is before any emulated slowdown. None without a warm-up step.
    """
    if warmup < 1:
        return None
    steps = range(1, warmup) if warmup > 1 else range(0, 1)
    holders = _rank_flops(graph, plan)
    rates = []
    for r in results:
        seconds = sum(r["steps"][i]["measured_compute_s"] for i in steps)
        if seconds > 0:
            rates.append(holders[r["device"]] * len(steps) / seconds / 1e12)
    return statistics.fmean(rates) if rates else None


def _rank_flops(graph, plan) -> dict[str, float]:
    """Forward + backward (+ recompute) FLOPs of one step per device of ``plan``."""
    from hetpart.costmodel.tp_split import unit_shares

    out: dict[str, float] = {}
    for i, replica in enumerate(plan.replicas):
        samples = plan.replica_samples()[i]
        for stage in replica.stages:
            a, z = stage.layers
            flops = [u.fwd_flops + u.bwd_flops + u.recompute_flops[plan.recompute] for u in graph.units[a:z]]
            if stage.tp_split is None:
                shares = [[1.0 / stage.tp] * (z - a)] * stage.tp
            else:  # an uneven split: each device's share of each unit
                shares = unit_shares(graph, stage.tp, stage.tp_split)[:, a:z].tolist()
            for d, share in zip(stage.devices, shares):
                out[d] = out.get(d, 0.0) + sum(f * x for f, x in zip(flops, share)) * samples
    return out
