"""The per-rank entry point that torchrun starts: ``python -m hetpart.runtime.worker JOB.json``.

It reads the job file written by :func:`hetpart.runtime.launch.launch`, joins the process group,
builds the engine's :class:`~hetpart.runtime.engine.Executor` for its rank with emulation hooks
installed, runs the warm-up and measured steps (resuming from a checkpoint when asked), and writes
``rank{r}.result.json``. Any failure is written to ``rank{r}.error.json`` (one line, and whether it
is a lost connection to a peer) before the process exits non-zero.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from hetpart.runtime.faults import (LAUNCHER_PID_ENV, FaultSpec, Heartbeat, die_with_parent, error_path,
                                    process_alive, result_path)

__all__ = ["StepAccount", "WorkerHooks", "transport_costs", "main"]

_COMM_ERROR_MARKERS = ("connection closed", "connection reset", "broken pipe", "timed out", "timeout",
                       "gloo", "peer", "socket", "disconnected", "distbackenderror", "distnetworkerror")


@dataclass
class StepAccount:
    """Seconds one rank spent in one step, by kind (filled by :class:`WorkerHooks`)."""

    compute_s: float = 0.0
    """Measured compute (forward and backward of every micro-batch)."""
    slowdown_s: float = 0.0
    """Sleep added to emulate a slower device."""
    emulated_comm_s: float = 0.0
    """Sleep added to emulate the links of collectives."""
    arrival_wait_s: float = 0.0
    """Sleep until emulated point-to-point transfers arrived (inside the engine's compute time)."""
    transport_excess_s: float = 0.0
    """What this machine's own transport (:func:`transport_costs`) took beyond the emulated time of the
    collectives whose emulated link is faster than it: no sleep can shorten a collective, so the step pays it."""


class WorkerHooks:
    """The engine's hooks for one rank: emulation delays, accounting, heartbeat and fault injection.

    Emulated transfers delay the receiver, not the sender (:class:`~hetpart.runtime.emulation.ArrivalBoard`):
    a compute that started before its input's emulated arrival is followed by a sleep of the
    difference, which ends it exactly where it would have ended had it waited for the input.
    """

    def __init__(self, emulator, board, heartbeat: Heartbeat, fault: FaultSpec | None, rank: int,
                 transport: dict[tuple[tuple[int, ...], int], float] | None = None) -> None:
        self.emulator = emulator
        self.transport = dict(transport or {})
        """``(sorted ranks, bytes) -> seconds`` this machine's own transport takes for that collective
        (:func:`transport_costs`): the emulated delay is what it should take in all, the sleep the rest."""
        self.board = board
        self.heartbeat = heartbeat
        self.fault = fault if fault is not None and fault.rank == rank and fault.phase == "steps" else None
        self.step = 0
        self.account = StepAccount()
        self.rank = rank
        self.lane: tuple[int, ...] = ()
        self.num_stages = 0
        self.tp = 1
        self._cpu_mark = time.thread_time()
        self._synced_work_s = 0.0
        """Compute already slowed down at TP all-reduces of this chunk (:meth:`on_tp_sync`)."""

    def attach(self, lane: tuple[int, ...], tp: int = 1, num_stages: int | None = None) -> None:
        """The ranks of this rank's pipeline lane (one per device group), its TP degree and the number
        of (virtual) stages of its replica: stage ``k`` runs on ``lane[k % len(lane)]`` (interleaved
        schedules have ``len(lane) * interleave`` stages)."""
        self.lane = tuple(lane)
        self.tp = tp
        self.num_stages = len(self.lane) if num_stages is None else num_stages

    def begin_step(self, step: int) -> None:
        self.step = step
        self.account = StepAccount()
        self.heartbeat.progress(step)
        self._cpu_mark = time.thread_time()

    def on_tp_sync(self, work_s: float) -> None:
        """Before an uneven stage's TP all-reduce: slow down the ``work_s`` seconds computed since the
        last one here, so that the faster peers wait for this rank at the all-reduce (a delay at the
        end of the chunk would come after the peers' compute instead of beside it). Wall time, the
        waiting inside all-reduces excluded by the engine: on a loaded machine the CPU time of the
        thread would leave out the contention that slows every rank alike."""
        if self.emulator is None:
            return
        work = max(0.0, work_s)
        delay = self.emulator.compute_delay_s(work)
        self._synced_work_s += work
        self.account.slowdown_s += delay
        self._sleep(delay)
        self._cpu_mark = time.thread_time()

    def on_compute(self, stage_index: int, kind: str, seconds: float) -> None:
        if self.fault is not None and self.step == self.fault.step:
            self.fault.fire()
        seconds = self._work_s(seconds)
        self.account.compute_s += seconds + self._synced_work_s
        self._synced_work_s = 0.0
        if self.emulator is not None:
            wait = self._arrival_wait(stage_index, kind, seconds)
            delay = self.emulator.compute_delay_s(seconds) + self.emulator.pass_delay_s(kind)
            self.account.slowdown_s += delay
            self.account.arrival_wait_s += wait
            self._sleep(wait + delay)
        self.heartbeat.progress()
        self._cpu_mark = time.thread_time()

    def _work_s(self, seconds: float) -> float:
        """The compute to slow down. Under tensor parallelism the engine's compute time includes
        waiting inside the TP all-reduces for the slowest peer; slowing that down again would count
        the peer's slowdown twice. This thread's CPU time since the last hook excludes the waiting."""
        if self.tp == 1:
            return seconds
        return min(seconds, time.thread_time() - self._cpu_mark)

    def _arrival_wait(self, stage: int, kind: str, seconds: float) -> float:
        if self.board is None or not self.lane or kind == "loss":  # the loss receives nothing
            return 0.0
        src = stage - 1 if kind == "fwd" else stage + 1
        if not 0 <= src < self.num_stages or self.lane[src % len(self.lane)] == self.rank:
            return 0.0
        started = time.time() - seconds
        return max(0.0, self.board.next_arrival(self.lane[src % len(self.lane)]) - started)

    def on_send(self, num_bytes: int, peer_rank: int) -> None:
        if self.emulator is not None and self.board is not None:
            self.board.post(peer_rank, time.time() + self.emulator.send_delay_s(num_bytes, peer_rank))
        self.heartbeat.progress()

    def on_collective(self, kind: str, num_bytes: int, group_ranks) -> None:
        if self.emulator is not None:
            emulated = self.emulator.collective_delay_s(kind, num_bytes, list(group_ranks))
            ranks = tuple(sorted(group_ranks))
            key = (ranks, num_bytes) if kind in ("all_reduce", "tp_all_reduce") else (ranks, num_bytes, kind)
            real = self.transport.get(key, 0.0)
            delay = max(0.0, emulated - real)
            self.account.emulated_comm_s += delay
            self.account.transport_excess_s += max(0.0, real - emulated)
            self._sleep(delay)
        self.heartbeat.progress()

    def _sleep(self, seconds: float) -> None:
        if seconds > 0:
            self.heartbeat.busy(seconds)
            time.sleep(seconds)


def _emulation(job: dict[str, Any], plan, rank: int):
    """Calibrate in every rank at once (so the contention of the run is in the numbers), agree on
    the mean, and build this rank's :class:`~hetpart.runtime.emulation.Emulator`."""
    import torch.distributed as dist

    from hetpart.cluster import load_cluster
    from hetpart.runtime.emulation import Emulator, resolve_emulation, speed_ratios
    from hetpart.runtime.measure import calibrate
    from hetpart.runtime.models import RunnableSpec

    emu = job.get("emulation")
    if not emu:
        return None, None
    mine = calibrate(RunnableSpec.from_dict(job["runnable"]), emu["unit_flops"], plan.seq_len, plan.micro_batch)
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine.to_dict())
    mean = lambda key: sum(c[key] for c in everyone) / len(everyone)  # noqa: E731
    real = load_cluster(job["cluster"])
    params = resolve_emulation(plan, real, emu["precision"], mean("achieved_tflops"), mean("optimizer_gbyte_s"),
                               emu["width"], emu.get("time_factor"))
    compute_factor = params.time_factor
    if emu.get("link_balance") and not emu.get("time_factor"):
        params = dataclasses.replace(params, time_factor=params.time_factor * emu["link_balance"])
    devices = tuple(job["rank_devices"])
    effects = {}
    if emu.get("effects"):
        from hetpart.runtime.emulation import EmulationEffects

        effects = EmulationEffects.from_dict(emu["effects"]).rank_terms(
            plan, real, devices, rank, int(emu.get("planned_seq_len") or plan.seq_len),
            compute_factor * float(emu.get("flops_ratio") or 1.0))
    emulator = Emulator(cluster=params.cluster(real, plan), rank_devices=devices, rank=rank,
                        speed_ratio=speed_ratios(plan, real, params.precision)[devices[rank]],
                        shaped=emu.get("shaped", "none"), **effects)
    return emulator, {"params": params.to_dict(), "calibrations": everyone, "compute_time_factor": compute_factor,
                      "effects": effects}


TRANSPORT_REPEATS = 9
"""Timed runs of each collective :func:`transport_costs` measures (after an untimed first): an odd count, whose
median is one of them. A choice, not a fit."""


def transport_costs(executor, repeats: int = TRANSPORT_REPEATS) -> dict[tuple[tuple[int, ...], int], float]:
    """Seconds this machine's own transport (gloo over loopback) takes for each collective whose link
    the emulation delays: the tensor-parallel all-reduce of one micro-batch's activations and every
    fused gradient bucket this rank joins, at their real sizes. Each is the median of ``repeats`` runs after
    a first one, every run after a barrier of its members (they arrive together: transport, no waiting). The
    fastest run, kept before, was the transport of a quiet moment: the typical one took longer, and the
    difference stayed in every measured collective on top of the emulated link.

    The emulated link replaces the real one instead of adding to it: after a collective the rank
    sleeps the emulated time minus this. Every rank runs its TP group first (TP groups are disjoint),
    then its buckets in the engine's global order, so the calibration cannot deadlock.
    """
    import math

    import torch
    import torch.distributed as dist

    role, plan = executor.role, executor.plan
    jobs: list[tuple[tuple[int, ...], int]] = []
    if role.tp > 1 and executor.spec.config is not None:
        ranks = tuple(sorted(executor.layout.tp_groups[(executor.replica, role.stages[0] % executor.pp)]))
        jobs.append((ranks, plan.micro_batch * plan.seq_len * executor.spec.config.hidden_size))
    for bucket in executor.grad_buckets:
        if executor.rank in bucket.ranks:
            numel = 0
            for key in bucket.keys:
                n, shard = math.prod(executor._param_info[key].shape), executor._shard(key)
                numel += n if bucket.full or shard.tp_dim is None else n // role.tp
            jobs.append((bucket.ranks, numel))
    samples: dict[tuple, list[float]] = {}
    for ranks, numel in jobs:
        t = torch.zeros(numel, dtype=executor.dtype, device=executor.device)
        group = executor.groups.group(ranks)
        times = samples.setdefault((ranks, numel * t.element_size()), [])
        for i in range(repeats + 1):
            dist.barrier(group=group)
            start = time.perf_counter()
            dist.all_reduce(t, group=group)
            if i:
                times.append(time.perf_counter() - start)
    out = {key: statistics.median(times) for key, times in samples.items()}
    if executor.sharded_keys and executor.dist_optimizer is None:
        out.update(_fsdp_transport(executor, repeats))
    return out


def _fsdp_transport(executor, repeats: int) -> dict[tuple, float]:
    """:func:`transport_costs` of FSDP2's collectives (:func:`hetpart.runtime.sharded.transport_jobs`): a
    gather or reduce-scatter keyed ``(ranks, bytes, kind)``, hybrid sharding's all-reduce ``(ranks, bytes)``."""
    import torch
    import torch.distributed as dist
    from hetpart._torch_compat import fsdp_default_collectives

    from hetpart.runtime.sharded import transport_jobs

    samples: dict[tuple, list[float]] = {}
    all_gather, reduce_scatter = fsdp_default_collectives()
    gather, scatter = all_gather(), reduce_scatter()
    for kind, ranks, group, numel, dtype in transport_jobs(executor):
        n = group.size()
        whole = torch.zeros(numel, dtype=dtype, device=executor.device)
        piece = torch.zeros(numel // n if kind != "all_reduce" else numel, dtype=dtype, device=executor.device)
        nbytes = (numel if kind != "all_reduce" else piece.numel()) * whole.element_size()
        times = samples.setdefault((ranks, nbytes) if kind == "all_reduce" else (ranks, nbytes, kind), [])
        for i in range(repeats + 1):
            dist.barrier(group=group)
            start = time.perf_counter()
            if kind == "all_gather":
                gather(whole, piece, group)
            elif kind == "reduce_scatter":
                scatter(piece, whole, group, dist.ReduceOp.SUM)
            else:
                dist.all_reduce(piece, group=group)
            if i:
                times.append(time.perf_counter() - start)
    return {key: statistics.median(times) for key, times in samples.items()}


def _is_comm_error(exc: BaseException) -> bool:
    text = f"{exc.__class__.__name__} {exc}".lower()
    return any(m in text for m in _COMM_ERROR_MARKERS)


def run_worker(job: dict[str, Any], run_dir: Path, rank: int, world: int, heartbeat: Heartbeat) -> dict[str, Any]:
    """Build this rank's executor, run the steps, checkpoint; returns the rank's result."""
    import torch
    import torch.distributed as dist

    from hetpart.plan import Plan
    from hetpart.runtime.emulation import ArrivalBoard
    from hetpart.runtime.engine import Executor
    from hetpart.runtime.models import RunnableSpec

    torch.set_num_threads(1)
    device = torch.device("cpu")
    if job.get("device") == "cuda":  # one GPU per rank (launch.run_device); FSDP2 and CUDA events use the current one
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
        torch.cuda.set_device(device)
    fault = FaultSpec(**job["fault"]) if job.get("fault") else None
    if fault is not None:
        fault.fire_in("start", rank)
    heartbeat.enter("rendezvous")
    if not dist.is_initialized():
        timeout = timedelta(seconds=float(job.get("comm_timeout_s", 600)))
        if job.get("local_ranks") is not None:  # several machines: the plan's rank, whatever torchrun numbered
            dist.init_process_group("gloo", timeout=timeout, rank=rank, world_size=world)
        else:
            dist.init_process_group("gloo", timeout=timeout)
    # Building the model (imports of its library included) takes long without progress: it counts as
    # start-up; from calibration on, the hang limit applies.
    heartbeat.enter("build")
    if job.get("checkpoint_dir"):
        import torch.distributed.checkpoint  # noqa: F401 - a slow first import, not a hang in the checkpoint phase
    plan = Plan.from_dict(job["plan"])
    hooks = WorkerHooks(None, None, heartbeat, fault, rank)
    executor = Executor(plan, RunnableSpec.from_dict(job["runnable"]), rank=rank, world_size=world, hooks=hooks,
                        device=device, comm_timeout_s=float(job.get("comm_timeout_s", 600)))
    hooks.attach(executor.lane, executor.role.tp, executor.plan.replicas[executor.replica].pp)
    heartbeat.enter("calibrate")
    if fault is not None:
        fault.fire_in("calibrate", rank)
    emulator, emulation = _emulation(job, plan, rank)
    heartbeat.progress()
    hooks.emulator = emulator
    hooks.board = ArrivalBoard(run_dir / "p2p", rank) if emulator is not None and emulator.shaped != "all" else None
    if emulator is not None and emulator.shaped == "none":  # shaped links: the real transfer IS the emulation
        hooks.transport = transport_costs(executor)
        emulation["transport"] = [{"ranks": list(k[0]), "bytes": k[1], "seconds": s} | ({"kind": k[2]} if len(k) > 2 else {})
                                  for k, s in hooks.transport.items()]
    start = 0
    ckpt = job.get("checkpoint_dir")
    if ckpt:
        from hetpart.runtime.checkpoint import load_checkpoint

        start = load_checkpoint(ckpt, executor, job.get("checkpoint_identity"))
        heartbeat.resumed_from = start if start else None
    if job.get("check_gradients"):  # the gate's pass, on the weights the run starts from (hetpart run --check-gradients)
        from hetpart.runtime.gradcheck import save_gradients

        _unslowed(hooks, save_gradients, executor, run_dir, start)
    profiled = [_unit_profile(job, plan, heartbeat, executor)]
    # the step's own host work, for the prediction; on a GPU the packing runs as kernels queued behind the
    # backward, whose time the host's clock does not see (the GPU's profile prices the device)
    host_work_s = executor.host_work_s() if executor.device.type == "cpu" else 0.0
    end = job.get("end_step") or start + job["warmup"] + job["steps"]
    every = int(job.get("checkpoint_every") or 0)
    steps = []
    losses = []
    dist.barrier()
    heartbeat.enter("steps")
    for step in range(start, end):
        hooks.begin_step(step)
        wall, cpu = time.perf_counter(), time.process_time()
        out = executor.step(step)
        steps.append(_step_record(step, out, hooks.account)
                     | {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu})
        losses.append(float(out.loss))
        heartbeat.finished_step(step, float(out.loss), steps[-1]["wall_s"])
        if ckpt and (step + 1 == end or (every and (step + 1 - start) % every == 0)):
            _checkpoint(ckpt, executor, step + 1, heartbeat, fault, rank, job.get("checkpoint_identity"))
    # the peak of the measured steps: a warm-up step's growth includes states allocated for good during it
    # (the optimizer's moments at the first step), which the steps after it hold from their start
    measure_from = int(job.get("measure_from", int(job.get("first_step", 0)) + job["warmup"]))
    peak = max(s["peak_memory_bytes"] for s in ([s for s in steps if s["step"] >= measure_from] or steps))
    memory = {"peak_memory_bytes": int(peak), "memory_method": steps[-1]["memory_source"] if steps else ""}
    if steps and executor.device.type == "cpu":  # the resident set misses tensors in resident pages: count them
        memory = {"peak_memory_bytes": _memory_step(executor, hooks, end - 1), "memory_method": "live_tensors",
                  "rss_peak_delta_bytes": int(peak)}
    profiled.append(_unit_profile(job, plan, heartbeat, executor))  # after too: the median brackets a load that drifts
    heartbeat.enter("done")
    return {"rank": rank, "device": job["rank_devices"][rank], "first_step": start, "steps": steps,
            "losses": losses, **memory, "host_work_s": host_work_s,
            # the same collectives every step, at fixed measured and emulated times: the same sum every step
            "transport_excess_s": max((s["transport_excess_s"] for s in steps), default=0.0),
            "schedule_used": getattr(executor, "schedule_used", plan.schedule), "emulation": emulation,
            "profile_samples": [p for p in profiled if p is not None],
            **({"torchrun_rank": int(os.environ["RANK"]), "node_rank": int(job["nodes"]["node_rank"])}
               if job.get("local_ranks") is not None else {})}


def _memory_step(executor, hooks: WorkerHooks, step: int) -> int:
    """Live tensor bytes at their peak in one more step (the data of ``step`` again), after the measured steps and
    their checkpoint: the counting makes it several times slower than a step, so it is not timed, and neither
    slowed nor shaped."""
    return _unslowed(hooks, executor.memory_step, step)


def _unslowed(hooks: WorkerHooks, fn, *args):
    """``fn(*args)`` with the emulation's delays and the injected fault off (an untimed pass of every rank)."""
    saved = hooks.emulator, hooks.board, hooks.fault
    hooks.emulator = hooks.board = hooks.fault = None
    try:
        return fn(*args)
    finally:
        hooks.emulator, hooks.board, hooks.fault = saved


def _gather_results(result: dict[str, Any], run_dir: Path, rank: int, world: int) -> None:
    """Over several machines: every rank's result to global rank 0 (over the gloo group), which writes the
    other ranks' result files next to its own, where node rank 0's launcher collects the whole run."""
    import torch.distributed as dist

    everyone: list[Any] | None = [None] * world if rank == 0 else None
    dist.gather_object(result, everyone, dst=0)
    if rank == 0:
        for r, res in enumerate(everyone or []):
            if r != rank and res is not None:
                _write_result(run_dir, r, res)


def _write_result(run_dir: Path, rank: int, result: dict[str, Any]) -> None:
    tmp = result_path(run_dir, rank).with_suffix(f".{os.getpid()}.tmp")  # rank 0 writes others' too (shared dirs)
    tmp.write_text(json.dumps(result))
    os.replace(tmp, result_path(run_dir, rank))


def _unit_profile(job: dict[str, Any], plan, heartbeat: Heartbeat, executor) -> dict[str, Any] | None:
    """This rank's unit timings on its own device for the run's prediction, when the launcher asks for them (no
    ``--profile``), and its Adam step timed on the tensors its optimizer steps (their whole shapes: a sharding
    level halves each, not their number)."""
    if not job.get("profile_units"):
        return None
    import torch.distributed as dist

    from hetpart.runtime.calibrate import measure_here
    from hetpart.runtime.models import RunnableSpec
    from hetpart.runtime.profile import Meeting

    # several CPU ranks time the whole model together and meet after each repeat: their collectives wait for the
    # slowest of them. Every rank of the default group profiles here, at the same point of the run, on the same
    # kind of device (job["device"] is the run's): each enters the meeting's collectives as often as the others.
    several = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    meeting = Meeting() if several and executor.device.type == "cpu" else None
    return measure_here(RunnableSpec.from_dict(job["runnable"]), plan.micro_batch, plan.seq_len,
                        tick=heartbeat.progress, device=str(executor.device),
                        adam_shapes=[tuple(p.shape) for p in executor.params.values()], meeting=meeting)


def _checkpoint(directory: str, executor, next_step: int, heartbeat: Heartbeat, fault: FaultSpec | None,
                rank: int, identity: dict[str, Any] | None = None) -> None:
    from hetpart.runtime.checkpoint import save_checkpoint

    heartbeat.enter("checkpoint")
    if fault is not None:
        fault.fire_in("checkpoint", rank)
    save_checkpoint(directory, executor, next_step=next_step, meta=identity)
    heartbeat.enter("steps")


def _step_record(step: int, out: Any, acc: StepAccount) -> dict[str, Any]:
    """One step of one rank; the engine's timing already contains the hooks' sleeps."""
    t = out.timing
    # The engine counts hook time as compute; waiting for an emulated transfer is communication.
    return {"step": step, "time_s": t.step_s, "compute_s": t.compute_s - acc.arrival_wait_s,
            "measured_compute_s": acc.compute_s, "slowdown_s": acc.slowdown_s,
            "comm_s": t.comm_s + acc.arrival_wait_s, "emulated_comm_s": acc.emulated_comm_s + acc.arrival_wait_s,
            "optimizer_s": t.optimizer_s, "idle_s": t.idle_s, "transport_excess_s": acc.transport_excess_s,
            "loss": float(out.loss),
            "peak_memory_bytes": int(out.peak_memory_bytes), "memory_source": out.memory_source}


def main(argv: list[str] | None = None) -> int:
    die_with_parent()  # torchrun's death (kill -9 of the launcher takes it) takes this worker too
    launcher = int(os.environ[LAUNCHER_PID_ENV]) if os.environ.get(LAUNCHER_PID_ENV, "").isdigit() else None
    if launcher is not None and not process_alive(launcher):
        return 1  # the launcher died while this process started
    argv = sys.argv[1:] if argv is None else argv
    job_path = Path(argv[0])
    job = json.loads(job_path.read_text())
    run_dir = job_path.parent
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if job.get("local_ranks") is not None:  # several machines: this machine's ranks, in LOCAL_RANK order
        rank = int(job["local_ranks"][int(os.environ["LOCAL_RANK"])])
        if world != len(job["rank_devices"]):
            raise SystemExit(f"runtime: torchrun counts {world} ranks over the machines and the plan has "
                             f"{len(job['rank_devices'])}; every machine must run the same plan")
    heartbeat = Heartbeat(run_dir, rank, launcher).start()
    try:
        result = run_worker(job, run_dir, rank, world, heartbeat)
        if job.get("local_ranks") is not None:
            _gather_results(result, run_dir, rank, world)
        _write_result(run_dir, rank, result)
        return 0
    except BaseException as exc:  # every failure is reported to the launcher, then re-raised
        message = " ".join(f"{exc.__class__.__name__}: {exc}".split())[:500]
        error_path(run_dir, rank).write_text(json.dumps({"message": message, "comm": _is_comm_error(exc),
                                                         "traceback": traceback.format_exc()}))
        raise
    finally:
        heartbeat.stop()
        _shutdown()


def _shutdown() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - a dead peer may make teardown fail; the run is over anyway
            pass


if __name__ == "__main__":
    sys.exit(main())
