"""The launcher: checks a plan, writes a job file and runs one process per device with torchrun.

``hetpart run`` comes here. Everything that can be refused is refused before any process starts:
the plan against the full-size model and the cluster, the shrunken model against the plan's
tensor-parallel degrees, and the number of processes against what this machine can host. Then
``python -m torch.distributed.run`` starts one worker (:mod:`hetpart.runtime.worker`) per device;
the same worker command runs on many machines with ``--nnodes``/``--rdzv-endpoint``
(:func:`torchrun_command`). While it runs, a :class:`~hetpart.runtime.faults.Watchdog` turns a dead or
hung rank into one :class:`~hetpart.errors.RuntimeFault` and kills every worker.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from hetpart.cluster import Cluster, load_cluster
from hetpart.errors import Interrupted, PlanError, RuntimeFault, WorkerFault
from hetpart.graph import ModelGraph, load_model
from hetpart.plan import Plan
from hetpart.runtime.faults import (HISTORY_STEPS, LAUNCHER_PID_ENV, PHASES, FaultSpec, Watchdog, die_with_parent,
                                    kill_pid_tree, process_alive, read_rank_state, result_path)

__all__ = ["RunOptions", "Nodes", "node_ranks", "check_nodes", "LocalRunResult", "Capacity", "PreparedRun", "RunResult", "RunProgress", "host_capacity", "check_capacity",
           "prepare_run", "torchrun_command", "launch", "run_plan", "plan_sources", "link_balance", "PROCESSES_PER_CORE"]

PROCESSES_PER_CORE = 4
"""Most worker processes per CPU core: emulated devices mostly sleep, but each still computes."""
_PROCESS_BASE_GB = 0.5
"""Resident memory of one worker before its model: ``import torch`` + torch.distributed + pipelining
measured 0.29 GB RSS on this machine's Python 3.11/torch 2.13; gloo buffers and the engine add more."""
_BYTES_PER_PARAM = 4 + 4 + 8 + 4
"""fp32 weights, gradients, two Adam moments, and one more copy for the pipeline's buffers."""


@dataclass(frozen=True)
class RunOptions:
    """How to run a plan (``hetpart run`` flags)."""

    steps: int = 5
    """Measured training steps (after the warm-up)."""
    warmup: int = 2
    """Steps run first and excluded from the measurements; the ones after the first calibrate the prediction."""
    scale: str | int = "tiny"
    """``tiny``, ``small`` or an explicit hidden size: the shrunken model that actually runs."""
    seed: int = 0
    """Seed of the weights and of the synthetic data."""
    time_factor: float | None = None
    """How much slower than the real cluster the emulated links run; None: fastest peak / CPU rate
    (the compute's own slowdown), times the link balance below when ``balance_links``."""
    balance_links: bool = False
    """Dilate links less than compute, so that the shrunken run keeps the full plan's ratio of gradient
    synchronisation to compute (:func:`link_balance`); ignored with an explicit ``time_factor``."""
    emulate: bool = True
    """Emulate the plan's device speeds and links (False: every process runs at this machine's speed)."""
    checkpoint_dir: str | None = None
    """Save with torch.distributed.checkpoint after the last step; resume from it when it holds one."""
    checkpoint_every: int = 0
    """Also save every this many steps (0: only after the last one)."""
    max_restarts: int = 0
    """Restart a failed or hung run this many times, from the last checkpoint (from the start without one)."""
    hang_timeout_s: float = 120.0
    """Seconds without progress on any rank after which the run counts as hung."""
    startup_timeout_s: float = 300.0
    """Seconds a rank may take to start (import torch, join the rendezvous)."""
    fault: FaultSpec | None = None
    """A fault to inject (tests and drills)."""
    impl: str = "auto"
    """Which implementation runs a transformer (``auto``, ``transformers``, ``hetpart``)."""
    netem: bool = False
    """Shape real traffic between per-rank network namespaces with ``tc`` instead of sleeping
    (:mod:`hetpart.runtime.netem`; needs root and iproute2)."""
    effects: dict[str, Any] | None = None
    """:class:`hetpart.runtime.emulation.EmulationEffects` as a dict: real-hardware effects the emulation
    adds and the simulator does not model (``hetpart loop``'s emulated ground); None: none."""
    profile: str | None = None
    """A measured profile of the model that runs (``hetpart calibrate --scale ...``) for the prediction;
    None: every rank times its units before and after its steps (:func:`hetpart.runtime.calibrate.measure_here`)."""
    device: str = "auto"
    """Where the ranks run (:func:`run_device`): ``cpu``; ``cuda``, one GPU per rank, without emulation; ``auto``:
    ``cuda`` where that holds, else ``cpu``."""
    check_gradients: bool = False
    """Compare the loss and every gradient of the run's first step with the single-process reference
    (:mod:`hetpart.runtime.gradcheck`; one more untimed forward and backward in every rank)."""

    def __post_init__(self) -> None:
        for name in ("steps", "warmup", "checkpoint_every", "max_restarts"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (1 if name == "steps" else 0):
                flag = "--" + name.replace("_", "-")
                raise PlanError(f"{flag}: must be a whole number >= {1 if name == 'steps' else 0}, got {value!r}")
        if self.checkpoint_every and not self.checkpoint_dir and not self.max_restarts:
            raise PlanError("--checkpoint-every: needs --checkpoint DIR (or --max-restarts, which keeps them in the run "
                            "directory)")
        if self.time_factor is not None and not self.time_factor > 0:
            raise PlanError(f"--time-factor: must be > 0, got {self.time_factor!r}")
        if not self.emulate:
            given = [flag for flag, on in (("--time-factor", self.time_factor is not None), ("--netem", self.netem)) if on]
            if given:
                raise PlanError(f"{', '.join(given)}: only shape the emulation, and --no-emulation turns it off; drop "
                                f"{'them' if len(given) > 1 else 'it'} or run without --no-emulation")
        if self.device not in RUN_DEVICES:
            raise PlanError(f"--device: {self.device!r}; use {', '.join(RUN_DEVICES)}")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["fault"] = self.fault.to_dict() if self.fault else None
        return out


@dataclass(frozen=True)
class Nodes:
    """Where this launcher stands in a run over several machines (``hetpart run --nnodes``; torchrun's static
    rendezvous). Every machine runs the same command with its own ``node_rank``: machine ``K`` hosts the
    plan's devices on the ``K``-th cluster node the plan uses, nodes ordered by the plan's rank order
    (:func:`node_ranks`)."""

    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    """Address of node rank 0's machine, where torchrun's store listens (every machine must reach it)."""
    master_port: int = 29500

    @property
    def multi(self) -> bool:
        return self.nnodes > 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def node_ranks(devices: list[str] | tuple[str, ...], cluster: Cluster) -> list[list[int]]:
    """The plan's ranks grouped by cluster node: entry ``K`` lists (ascending) the ranks of the ``K``-th node
    in the order the ranks first reach it (rank ``r`` runs ``devices[r]``)."""
    nodes: dict[Any, list[int]] = {}
    for rank, device in enumerate(devices):
        nodes.setdefault(cluster.device(device).node_key, []).append(rank)
    return list(nodes.values())


def check_nodes(nodes: Nodes, devices: list[str] | tuple[str, ...], cluster: Cluster, options: RunOptions) -> list[int]:
    """The ranks this machine runs; refuses what cannot run over ``nodes.nnodes`` machines (before any process).

    Raises:
        PlanError: ``--nnodes`` is not the number of cluster nodes the plan uses, ``--node-rank`` is out of
            range, or an option that needs one machine (emulation, checkpoints, restarts) is on.
    """
    groups = node_ranks(devices, cluster)
    if nodes.nnodes < 1:
        raise PlanError(f"--nnodes: must be a whole number >= 1, got {nodes.nnodes}")
    if not nodes.multi:
        if nodes.node_rank != 0:
            raise PlanError(f"--node-rank: {nodes.node_rank} needs --nnodes > 1 (one machine is node rank 0)")
        return list(range(len(devices)))
    if nodes.nnodes != len(groups):
        names = ", ".join("/".join(str(k) for k in cluster.device(devices[g[0]]).node_key) for g in groups)
        raise PlanError(f"--nnodes: {nodes.nnodes}, but the plan uses {len(groups)} cluster node"
                        f"{'s' if len(groups) != 1 else ''} ({names}); give --nnodes {len(groups)}, one machine each")
    if not 0 <= nodes.node_rank < nodes.nnodes:
        raise PlanError(f"--node-rank: {nodes.node_rank} is out of range; with --nnodes {nodes.nnodes} give 0 to "
                        f"{nodes.nnodes - 1} (0 on the --master-addr machine)")
    if not 0 < nodes.master_port < 65536:
        raise PlanError(f"--master-port: {nodes.master_port} is not a TCP port (1-65535)")
    if options.emulate:
        raise PlanError("--nnodes: emulation calibrates and slows one machine's CPU; runs over several machines "
                        "run the real devices (add --no-emulation)")
    given = [flag for flag, on in (("--checkpoint", options.checkpoint_dir is not None),
                                   ("--max-restarts", options.max_restarts > 0)) if on]
    if given:
        raise PlanError(f"{', '.join(given)}: not supported with --nnodes > 1 yet (each machine would restart or "
                        "resume on its own); run without")
    return groups[nodes.node_rank]


RUN_DEVICES = ("auto", "cpu", "cuda")
"""``hetpart run --device`` values."""


def run_device(options: RunOptions, ranks: int) -> str:
    """Where the ``ranks`` processes of a run compute: ``cuda`` (rank ``i`` on GPU ``i``) or ``cpu``.

    One GPU per rank or none: gloo's point-to-point cannot send CUDA tensors, so two ranks sharing a GPU cannot
    pass a pipeline's activations, and NCCL refuses two members on one GPU. Emulation runs on the CPU: it
    calibrates this machine's CPU and slows it (and its links) to the plan's devices, which means nothing for
    kernels running on a GPU at their own speed.

    Raises:
        PlanError: ``--device cuda`` where torch sees no GPU, fewer GPUs than ranks, or with emulation.
    """
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if options.device == "cpu":
        return "cpu"
    if options.device == "cuda":
        if not gpus:
            raise PlanError("--device cuda: torch sees no CUDA device; use --device cpu (or auto)")
        if ranks > gpus:
            raise PlanError(f"--device cuda: the plan has {ranks} devices and this machine {gpus} GPU(s); a run puts "
                            "one rank on each GPU (ranks sharing a GPU cannot send each other CUDA tensors over gloo); "
                            f"use --device cpu, or a plan of at most {gpus} devices")
        if options.emulate:
            raise PlanError("--device cuda: emulation calibrates and slows this machine's CPU, not a GPU; add "
                            "--no-emulation to run on the GPUs at their own speed, or use --device cpu")
        return "cuda"
    return "cuda" if gpus and ranks <= gpus and not options.emulate else "cpu"


@dataclass(frozen=True)
class Capacity:
    """How many worker processes this machine can host."""

    cores: int
    memory_available_gb: float
    per_process_gb: float
    max_processes: int

    def explain(self) -> str:
        by_cores = self.cores * PROCESSES_PER_CORE
        by_memory = int(self.memory_available_gb // self.per_process_gb)
        return (f"{self.cores} cores x {PROCESSES_PER_CORE} = {by_cores} by CPU, {self.memory_available_gb:.1f} GB "
                f"available / {self.per_process_gb:.2f} GB per process = {by_memory} by memory")


def host_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def host_capacity(per_process_gb: float) -> Capacity:
    """This machine's limit on worker processes for workers of ``per_process_gb`` each."""
    cores = host_cores()
    available = _memory_available_gb()
    limit = min(cores * PROCESSES_PER_CORE, int(available // per_process_gb))
    return Capacity(cores=cores, memory_available_gb=available, per_process_gb=per_process_gb, max_processes=limit)


def _memory_available_gb() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024 / 1e9
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES") / 1e9


def check_capacity(num_processes: int, per_process_gb: float) -> Capacity:
    """Raise :class:`RuntimeFault` when this machine cannot host ``num_processes`` workers."""
    cap = host_capacity(per_process_gb)
    if num_processes > cap.max_processes:
        raise RuntimeFault(f"runtime: the plan needs {num_processes} processes (one per device) but this machine "
                           f"hosts at most {cap.max_processes} ({cap.explain()}); run a plan with at most "
                           f"{cap.max_processes} devices (e.g. plan for a smaller cluster) or use several machines")
    return cap


def check_gpu_memory(num_processes: int, states_gb: float) -> None:
    """Raise :class:`RuntimeFault` when the whole model's states and activations (what a rank holds at most,
    as the host check counts them) exceed the smallest of the GPUs the ranks use."""
    import torch

    smallest = min(torch.cuda.get_device_properties(i).total_memory for i in range(num_processes)) / 1e9
    if states_gb > smallest:
        raise RuntimeFault(f"runtime: a rank may hold {states_gb:.1f} GB (fp32 weights, gradients, Adam moments, "
                           f"pipeline buffers and activations of the model that runs) and the smallest GPU has "
                           f"{smallest:.1f} GB; run a smaller --hidden-size or --scale")


@dataclass(frozen=True)
class PreparedRun:
    """Everything checked and resolved before any process starts."""

    plan: Plan
    """The plan as given (full-size model)."""
    cluster: Cluster
    model_spec: str
    cluster_spec: str
    full_graph: ModelGraph
    """The model the plan was made for."""
    runnable: Any
    """:class:`hetpart.runtime.models.RunnableSpec` of the shrunken model that runs."""
    run_graph: ModelGraph
    """Unit graph of the shrunken model at the run's sequence length and fp32."""
    run_plan: Plan
    """The plan with the run's sequence length and fp32 (the same stages, devices and batches)."""
    rank_devices: tuple[str, ...]
    """Device id of each rank."""
    per_process_gb: float
    meta: dict[str, Any] = field(default_factory=dict)
    checkpoint_identity: dict[str, Any] = field(default_factory=dict)
    """What identifies the model that runs in a checkpoint (:func:`hetpart.runtime.checkpoint.model_identity`)."""
    nodes: Nodes = field(default_factory=lambda: Nodes())
    """This machine's place in a run over several machines (one machine by default)."""

    @property
    def local_ranks(self) -> list[int]:
        """The ranks this machine runs."""
        if not self.nodes.multi:
            return list(range(len(self.rank_devices)))
        return node_ranks(self.rank_devices, self.cluster)[self.nodes.node_rank]


@dataclass(frozen=True)
class RunProgress:
    """Where a run is, for progress output (``hetpart run`` prints it on stderr and logs it to a tracker)."""

    phase: str
    """The phase of the slowest rank (:data:`hetpart.runtime.faults.PHASES`), or ``restart``."""
    done: int
    """Steps every rank finished, warm-up included, out of ``total`` (a resumed run counts from its start)."""
    total: int
    step: int | None = None
    """Index of the last step every rank finished (None before the first)."""
    warmup: bool = False
    """Whether that step was a warm-up step (excluded from the measurement)."""
    loss: float | None = None
    """Its loss (the global mean, as every rank reports it)."""
    step_time_s: float | None = None
    """Its wall time on the slowest rank."""
    tokens_per_s: float | None = None
    """Tokens of the model that runs (the shrunken one) per second at that step time."""
    eta_s: float | None = None
    """Seconds left at the mean step time so far."""
    resumed_from: int | None = None
    """The step this attempt resumed from (a checkpoint), if any."""
    attempt: int = 0
    """0 for the first attempt, then one more per restart."""
    message: str = ""
    """Why a restart happened."""


def prepare_run(plan: Plan, model_spec: str, cluster_spec: str, options: RunOptions, *,
                source: str = "plan", nodes: Nodes | None = None) -> PreparedRun:
    """Check the plan, shrink the model and check this machine's capacity; starts nothing. ``source``
    names the plan in the errors (its file, as ``predict`` and ``export`` do); ``nodes``: this machine's
    place in a run over several machines (its capacity is checked for its own ranks)."""
    if plan.cp != 1:
        raise PlanError(f"{source}: cp: {plan.cp}: context parallelism is prediction-only for now (hetpart predict prices "
                        "it); hetpart run executes plans with cp 1")
    from hetpart.graph.transformer import transformer_graph
    from hetpart.runtime.engine import require_runnable
    from hetpart.runtime.models import runnable_spec, scaled_seq_len

    cluster = load_cluster(cluster_spec)
    nodes = nodes or Nodes()
    local = len(check_nodes(nodes, plan.devices, cluster, options)) if all(cluster.has_device(d) for d in plan.devices) \
        else plan.num_devices  # unknown devices: plan.check below names them
    full = load_model(model_spec, seq_len=plan.seq_len, precision=plan.precision)
    plan.check(full, cluster, source=source)
    # Heads a multiple of every TP degree of the plan (stages and replicas may differ: 2 and 3 -> 6).
    from hetpart.runtime.uneven_tp import scale_plan_splits, split_heads_multiple

    # Uneven head splits keep their ratio where the head count allows ([5, 5, 3, 3] -> 16 heads).
    tp_multiple = math.lcm(*(s.tp for r in plan.replicas for s in r.stages), split_heads_multiple(plan))
    transformer = not model_spec.startswith("python:")
    runnable = runnable_spec(model_spec, options.scale if transformer else None, max_tp=tp_multiple,
                             impl=options.impl, seed=options.seed)  # type: ignore[arg-type]
    if transformer:
        seq = scaled_seq_len(plan.seq_len, options.scale)
        graph = transformer_graph(runnable.config, f"{runnable.name}@{options.scale}", seq, 4, source=full.source)
    else:  # python: models run as given; tracing decides what a "sequence" is
        graph = load_model(model_spec, seq_len=plan.seq_len, precision="fp32")
        seq = graph.seq_len
    replicas, notes = plan.replicas, []
    if transformer:  # splits in the shrunken model's sizes (the vocabulary stays whole)
        scaled, notes = scale_plan_splits(plan, runnable.config)
        replicas = scaled.replicas
    small = Plan(global_batch=plan.global_batch, micro_batch=plan.micro_batch, seq_len=seq, replicas=replicas,
                 schedule=plan.schedule, recompute=plan.recompute, interleave=plan.interleave, precision="fp32",
                 allow_cross_node_tp=plan.allow_cross_node_tp, zero=plan.zero, offload=plan.offload,
                 shard_group=plan.shard_group, shard_fractions=plan.shard_fractions, meta=dict(plan.meta))
    small.check(graph, cluster, source=f"{source} (shrunken model)")
    require_runnable(small, runnable, source=f"plan (the {runnable.name} that runs)")
    states = graph.num_params * _BYTES_PER_PARAM / 1e9 + _activation_gb(graph, small)
    if run_device(options, local) == "cuda":  # the states live on each rank's GPU, not in host memory
        from hetpart.rules import accelerator_problems

        problems = accelerator_problems(plan)
        if problems:
            raise PlanError(f"{source}: {problems[0]}")
        check_gpu_memory(local, states)
        per_process = _PROCESS_BASE_GB
    else:
        per_process = _PROCESS_BASE_GB + states
    check_capacity(local, per_process)
    from hetpart.runtime.checkpoint import model_identity

    identity = model_identity(runnable, graph, model_spec, options.scale)
    if options.checkpoint_dir:
        _check_checkpoint_dir(Path(options.checkpoint_dir), identity)
    return PreparedRun(plan=plan, cluster=cluster, model_spec=model_spec, cluster_spec=cluster_spec, full_graph=full,
                       runnable=runnable, run_graph=graph, run_plan=small, rank_devices=tuple(small.devices),
                       per_process_gb=per_process, meta={"tp_split_notes": notes} if notes else {},
                       checkpoint_identity=identity, nodes=nodes)


def _check_checkpoint_dir(path: Path, identity: dict[str, Any]) -> None:
    """Refuse a ``--checkpoint`` that cannot work before any process starts (it was found after training):
    a file, an unwritable place, or a checkpoint of another model or scale (``identity``: the model that runs,
    :func:`hetpart.runtime.checkpoint.model_identity`)."""
    from hetpart.runtime.checkpoint import checkpoint_info, identity_mismatch

    if v_exists(path) and not path.is_dir():
        raise PlanError(f"--checkpoint: {path} is a file; give a directory (created if missing)")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PlanError(f"--checkpoint: cannot create {path} ({exc.strerror or exc}); give a writable directory") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise PlanError(f"--checkpoint: {path} is not writable; give a writable directory")
    try:
        info = checkpoint_info(path)
    except RuntimeFault as exc:  # unreadable metadata: bad input, nothing started
        raise PlanError(f"--checkpoint: {exc}") from None
    if info is None:
        return
    if not isinstance(info, dict) or not isinstance(info.get("next_step"), int):
        raise PlanError(f"--checkpoint: {path / 'hetpart_checkpoint.json'} is not a hetpart checkpoint's metadata "
                        "(no whole next_step); remove the directory or give another --checkpoint")
    why = identity_mismatch(path, info, identity)
    if why is not None:
        raise PlanError(why)


def v_exists(path: Path) -> bool:
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def _activation_gb(graph: ModelGraph, plan: Plan) -> float:
    """Saved activations of the busiest process (an upper bound): its stages' units without recompute, whole
    (no tensor-parallel share), for the micro-batches its schedule holds at once (GPipe: all of its
    replica's; 1F1B: ``pp - stage``, as :func:`~hetpart.costmodel.memory.in_flight_microbatches` counts them).

    (Every micro-batch of the largest replica through the whole model, the bound before, refused a
    one-replica plan of gpt3-2.7b at ``--scale small`` on a 24 GB machine: 6.5 GB per process.)"""
    from hetpart.costmodel.memory import in_flight_microbatches

    v = plan.chunks_per_device
    worst = 0.0
    for r, replica in enumerate(plan.replicas):
        pp, m = replica.pp // v, plan.num_microbatches(r)
        for d in range(pp):
            per_seq = sum(u.act_bytes["none"] for s in replica.stages[d::pp] for u in graph.units[slice(*s.layers)])
            worst = max(worst, per_seq * plan.micro_batch * in_flight_microbatches(plan.schedule, d, pp, m, v))
    return worst / 1e9


# ------------------------------------------------------------------------------------- launching
def torchrun_command(job_path: str | Path, nproc_per_node: int, log_dir: str | Path, *, nnodes: int = 1,
                     rdzv_endpoint: str | None = None, wrapper: str | Path | None = None,
                     nodes: Nodes | None = None) -> list[str]:
    """The torchrun command line that starts the workers of ``job_path`` (one machine by default).

    On several machines (``nodes``, ``hetpart run --nnodes``): torchrun's static rendezvous, the same
    command on each machine with its own ``--node-rank`` and node rank 0's ``--master-addr``/``--master-port``;
    torchrun numbers the global ranks node after node (a node's ranks follow those of lower node ranks, even
    with different ``nproc_per_node``). ``nnodes`` with ``rdzv_endpoint`` (``host:port``) is the c10d
    rendezvous (``--netem``). ``wrapper``: a script that starts the worker itself (``--netem`` enters the
    rank's network namespace first).
    """
    cmd = [sys.executable, "-m", "torch.distributed.run"]
    if nodes is not None and nodes.multi:
        cmd += ["--nnodes", str(nodes.nnodes), "--rdzv-backend", "static", "--node-rank", str(nodes.node_rank),
                "--master-addr", str(nodes.master_addr), "--master-port", str(nodes.master_port)]
    elif nnodes == 1 and rdzv_endpoint is None:
        cmd += ["--standalone", "--nnodes", "1"]
    else:
        cmd += ["--nnodes", str(nnodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", str(rdzv_endpoint)]
        if wrapper is not None:  # the endpoint is the bridge address of this machine: host the store here
            cmd += ["--rdzv-conf", "is_host=1"]
    cmd += ["--nproc-per-node", str(nproc_per_node), "--max-restarts", "0", "--monitor-interval", "0.1",
            "--log-dir", str(log_dir), "--redirects", "3"]
    if wrapper is not None:
        return cmd + ["--no-python", str(wrapper), str(job_path)]
    return cmd + ["--no-python", sys.executable, "-c", _WORKER_BOOTSTRAP, str(job_path)]


_WORKER_BOOTSTRAP = f"""\
import ctypes, os, signal, sys
try:  # die with torchrun before the long imports: a launcher killed meanwhile must not leave this process behind
    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
except (OSError, AttributeError):
    pass
launcher = os.environ.get("{LAUNCHER_PID_ENV}", "")
if launcher.isdigit():
    try:
        state = open(f"/proc/{{launcher}}/stat").read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        state = "X"
    if state in ("Z", "X"):
        sys.exit(1)
import runpy
sys.argv = ["hetpart.runtime.worker"] + sys.argv[1:]
runpy.run_module("hetpart.runtime.worker", run_name="__main__", alter_sys=True)
"""
"""What torchrun starts per rank: the parent-death signal first, then ``python -m hetpart.runtime.worker JOB``."""


def _worker_env() -> dict[str, str]:
    env = dict(os.environ)
    # Workers share the machine's cores: one intra-op thread each keeps them from fighting.
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1", TORCH_SHOW_CPP_STACKTRACES="0")
    env[LAUNCHER_PID_ENV] = str(os.getpid())  # a worker whose launcher is gone kills itself
    return env


def launch(job: dict[str, Any], run_dir: str | Path, options: RunOptions,
           on_progress: Callable[[RunProgress], None] | None = None, attempt: int = 0) -> list[dict[str, Any]]:
    """Run the workers of ``job`` and return every rank's result.

    Args:
        job: the job (written to ``run_dir/job.json``); ``job["rank_devices"]`` sets the world size.
        run_dir: directory for the job file, heartbeats, results and logs.
        options: timeouts and the fault to inject.
        on_progress: called with a :class:`RunProgress` whenever a phase starts or every rank finished a step.
        attempt: 0, or the number of the restart (for the progress reports).

    Raises:
        WorkerFault: a rank died, raised or hung (every worker is killed first).
        Interrupted: SIGINT or SIGTERM (every worker is killed first).
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    world = len(job["rank_devices"])
    nodes = Nodes(**job["nodes"]) if job.get("nodes") else Nodes()
    local = list(job["local_ranks"]) if job.get("local_ranks") is not None else list(range(world))
    job_path = run_dir / "job.json"
    (run_dir / "logs").mkdir(exist_ok=True)
    describe = _describer(job)
    watchdog = Watchdog(run_dir, describe, world, options.hang_timeout_s, options.startup_timeout_s,
                        launcher_log=run_dir / "torchrun.log", ranks=local)
    tracker = _ProgressTracker(job, attempt, on_progress)
    network = _netem_network(job, run_dir)
    with _signals_interrupt(), network or contextlib.nullcontext(), open(run_dir / "torchrun.log", "wb") as log:
        if network is not None:
            job["emulation"]["shaped"] = network.shaped
        job_path.write_text(json.dumps(job, indent=1))
        cmd = torchrun_command(job_path, len(local), run_dir / "logs", nodes=nodes)
        if network is not None:
            cmd = torchrun_command(job_path, world, run_dir / "logs", rdzv_endpoint=f"{network.host_ip}:{network.free_port()}",
                                   wrapper=network.wrapper())
        # torchrun dies with the launcher (kill -9 included), and its workers with it (they set the same).
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_worker_env(),
                                start_new_session=True, preexec_fn=die_with_parent)
        try:
            _supervise(proc, watchdog, tracker)
        except Interrupted as exc:
            with _signals_ignored(), contextlib.suppress(Exception):  # report what the ranks finished by now
                tracker.update(watchdog.states())
            raise Interrupted(f"runtime: {exc} {tracker.where()}; {watchdog.scope} were stopped",
                              exc.exit_code) from None
        except WorkerFault as exc:
            if nodes.multi:  # a peer on another machine that failed shows here as a lost connection or a hang
                raise WorkerFault(f"{exc} (node rank {nodes.node_rank} of {nodes.nnodes}; a failure on another "
                                  "machine shows here as a lost connection or a hang: see that machine's output)") from None
            raise
        finally:
            with _signals_ignored():  # a second Ctrl-C must not leave workers behind
                _kill_all(proc, run_dir, local)
    # node rank 0's global rank 0 gathered every rank's result into this run directory (worker.py)
    collected = list(range(world)) if nodes.multi and nodes.node_rank == 0 else local
    return _collect(run_dir, collected, proc.returncode, describe)


class _ProgressTracker:
    """Turns the ranks' heartbeats into :class:`RunProgress` reports (one per phase and per finished step)."""

    def __init__(self, job: dict[str, Any], attempt: int, callback) -> None:
        plan = job["plan"]
        self.callback = callback
        self.attempt = attempt
        self.first = int(job.get("first_step", 0))
        self.end = int(job.get("end_step") or self.first + job["warmup"] + job["steps"])
        self.measure_from = int(job.get("measure_from", self.first + job["warmup"]))
        self.tokens = plan["global_batch"] * plan["seq_len"]
        self.times: list[float] = []
        self.last: tuple[str, int] | None = None
        self._last_step = -1
        self.report = RunProgress(phase="start", done=0, total=self.end - self.first, attempt=attempt)

    def update(self, states) -> None:
        phase = PHASES[min(PHASES.index(s.phase) if s.phase in PHASES else 0 for s in states)]
        step = min(s.done_step for s in states)
        if (phase, step) == self.last:
            return
        self.last = (phase, step)
        resumed = next((s.resumed_from for s in states if s.resumed_from), None)
        if step < 0 or step < self.first:
            self._emit(RunProgress(phase=phase, done=0, total=self.end - self.first, resumed_from=resumed,
                                   attempt=self.attempt))
            return
        start = max(self._last_step + 1, resumed or self.first, step - HISTORY_STEPS + 1)
        for k in range(start, step + 1):  # every step, also those finished between two polls
            self._emit(self._step_report(k, states, resumed))
        self._last_step = max(self._last_step, step)
        if phase == "checkpoint":
            self._emit(RunProgress(phase=phase, done=step + 1 - self.first, total=self.end - self.first, step=step,
                                   resumed_from=resumed, attempt=self.attempt))

    def _step_report(self, step: int, states, resumed: int | None) -> RunProgress:
        seen = [dict((int(h[0]), (h[1], h[2])) for h in s.history).get(step) for s in states]
        loss = seen[0][0] if seen[0] else None
        step_s = max((x[1] for x in seen if x), default=0.0) or None
        if step_s:
            self.times.append(step_s)
        left = self.end - step - 1
        eta = left * sum(self.times) / len(self.times) if self.times else None
        return RunProgress(phase="steps", done=step + 1 - self.first, total=self.end - self.first, step=step,
                           warmup=step < self.measure_from, loss=loss, step_time_s=step_s,
                           tokens_per_s=self.tokens / step_s if step_s else None, eta_s=eta,
                           resumed_from=resumed, attempt=self.attempt)

    def _emit(self, report: RunProgress) -> None:
        self.report = report
        if self.callback is not None:
            self.callback(report)

    def where(self) -> str:
        r = self.report
        return f"at step {r.done} of {r.total}" if r.done else f"in phase {r.phase} (before the first step)"


@contextlib.contextmanager
def _signals_interrupt():
    """While workers run, SIGINT (Ctrl-C) and SIGTERM unwind the launcher as :class:`Interrupted`, so that
    it kills every worker and removes namespaces and folders on the way out."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _interrupt(signum, frame):
        raise Interrupted("stopped by Ctrl-C (SIGINT)" if signum == signal.SIGINT else "stopped by SIGTERM", 128 + signum)

    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def _signals_ignored():
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


_POLL_S = 0.2
"""How often the launcher looks at the ranks (a few small file reads: it shares the cores with them)."""


def _netem_network(job: dict[str, Any], run_dir: Path):
    """The shaped network of a ``--netem`` job (None otherwise)."""
    emu = job.get("emulation") or {}
    if not emu.get("netem"):
        return None
    from hetpart.runtime.emulation import EmulationParams
    from hetpart.runtime.netem import NetemNetwork

    params = EmulationParams(**emu["link_params"])
    cluster = params.cluster(load_cluster(job["cluster"]), Plan.from_dict(job["plan"]))
    return NetemNetwork(cluster, job["rank_devices"], run_dir)


def _supervise(proc: subprocess.Popen, watchdog: Watchdog, tracker: _ProgressTracker) -> None:
    while True:
        rc = proc.poll()
        states = watchdog.states()
        tracker.update(states)  # first: the steps every rank finished before a fault or the end are reported too
        fault = watchdog.check(states)
        if fault is not None:
            raise fault
        if rc is not None:
            return
        time.sleep(_POLL_S)


def _kill_all(proc: subprocess.Popen, run_dir: Path, ranks: list[int]) -> None:
    """Kill every worker we started (by pid, from their heartbeats and from torchrun's descendants: a rank
    still importing has no heartbeat yet) and torchrun itself, and wait until they are gone."""
    pids = set(_descendants(proc.pid))
    for rank in ranks:
        state = read_rank_state(run_dir, rank)
        if state.pid is not None and state.alive:
            pids.add(state.pid)
    for pid in pids:
        kill_pid_tree(pid)
    if proc.poll() is None:
        kill_pid_tree(proc.pid)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not fail
        pass
    deadline = time.time() + 10
    while any(process_alive(pid) for pid in pids) and time.time() < deadline:
        time.sleep(0.02)


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux ``/proc``; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return []
    for entry in entries:
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def _collect(run_dir: Path, ranks: list[int], returncode: int | None, describe) -> list[dict[str, Any]]:
    results = []
    for rank in ranks:
        path = result_path(run_dir, rank)
        if not path.exists():
            tail = _log_tail(run_dir / "torchrun.log")
            raise WorkerFault(f"runtime: rank {rank} ({describe(rank)}) ended without a result (torchrun exit code "
                              f"{returncode}); {tail or 'see ' + str(run_dir / 'logs')}")
        results.append(json.loads(path.read_text()))
    return results


def _log_tail(path: Path) -> str:
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    errors = [line for line in lines if "Error" in line or "error" in line]
    return (errors or lines or [""])[-1][:300]


def _describer(job: dict[str, Any]) -> Callable[[int], str]:
    devices = job["rank_devices"]
    where: dict[str, str] = {}
    for i, r in enumerate(job["plan"]["replicas"]):
        for j, s in enumerate(r["stages"]):
            for d in s["devices"]:
                where.setdefault(d, f"replica {i} stage {j}")
    return lambda rank: f"device {devices[rank]}, {where.get(devices[rank], '?')}" if 0 <= rank < len(devices) else "?"


def new_run_dir(parent: str | Path | None = None) -> Path:
    """A fresh directory for one run's files."""
    return Path(tempfile.mkdtemp(prefix="hetpart-run-", dir=parent))


# ------------------------------------------------------------------------------------- a whole run
@dataclass(frozen=True)
class RunResult:
    """A finished run: what was measured, what the simulator predicted for it, and its record."""

    measured: Any
    """:class:`hetpart.runtime.measure.Measurement`."""
    predicted: dict[str, Any] | None
    """The simulator on the emulated cluster (None when emulation was off)."""
    record: Any
    """:class:`hetpart.records.RunRecord`: the JSON line (``--out``)."""
    run_dir: str | None
    """The ranks' files (None: a temporary directory, removed after the run)."""
    model: dict[str, Any] = field(default_factory=dict)
    """What ran, for people: name, scale, sizes (the ``model`` of ``hetpart run --json``)."""
    emulation: dict[str, Any] = field(default_factory=dict)
    """How the cluster was emulated, for people (the ``emulation`` of ``hetpart run --json``)."""
    resumed_from: int | None = None
    """The step the measured attempt started from (a checkpoint), None when it started at 0."""
    record_error: str | None = None
    """Why the record could not be appended to ``out`` after the run, and where it was kept instead (None: it
    was appended, or no ``out`` was given)."""
    nodes: dict[str, Any] | None = None
    """Over several machines: ``nnodes``, ``master_addr``/``master_port`` and each node's ranks (None: one)."""
    gradient_check: Any = None
    """:class:`hetpart.runtime.gradcheck.GradientCheck` with ``check_gradients`` (None without)."""

    def summary(self) -> dict[str, Any]:
        """The ``hetpart run --json`` object (shared/CONTRACT.md)."""
        measured = self.measured.to_dict()
        predicted = None
        if self.predicted is not None:
            predicted = {k: v for k, v in self.predicted.items() if k != "breakdown"}
        return {"measured": measured, "predicted": predicted, "model": self.model,
                "steps": self.measured.steps, "warmup": self.measured.warmup,
                "emulation": self.emulation, "cluster": self.record.cluster["name"],
                "run_dir": self.run_dir, "resumed_from": self.resumed_from,
                **({"record_error": self.record_error} if self.record_error else {}),
                **({"nodes": self.nodes} if self.nodes else {}),
                **({"gradient_check": self.gradient_check.to_dict()} if self.gradient_check is not None else {})}


def plan_sources(plan: Plan, model: str | None, cluster: str | None, source: str = "plan") -> tuple[str, str]:
    """The model and cluster a plan runs with: the given ones, else ``plan.meta["model"/"cluster"]`` (``source``:
    the plan file, for errors)."""
    from hetpart import _validate

    out = []
    for key, given in (("model", model), ("cluster", cluster)):
        value = given or plan.meta.get(key)
        if not isinstance(value, str) or not value:
            raise PlanError(f"{source}: meta.{key}: missing (the plan does not say which {key} it was made for); "
                            f"give --{key}")
        why = _validate.missing_recorded_source(source, key, value) if not given else None
        if why:
            raise PlanError(why)
        out.append(value)
    return out[0], out[1]


def run_plan(plan: Plan, model: str | None = None, cluster: str | None = None, options: RunOptions = RunOptions(), *,
             out: str | Path | None = None, run_dir: str | Path | None = None,
             on_progress: Callable[[RunProgress], None] | None = None, source: str = "plan",
             nodes: Nodes | None = None) -> "RunResult | LocalRunResult":
    """Run ``plan`` on this machine (emulating its cluster), measure it and predict it.

    With ``nodes`` over several machines (``hetpart run --nnodes``) this machine runs its node's ranks;
    node rank 0 gets every rank's result (gathered by global rank 0) and returns the whole run's
    :class:`RunResult` (and appends its record to ``out``); the other machines return a
    :class:`LocalRunResult` of their own ranks and write no record.

    Args:
        plan: the plan (made for the full-size model).
        model, cluster: ``--model``/``--cluster``; default to the plan's ``meta``.
        options: steps, scale, emulation, checkpoint, restarts, timeouts.
        out: append the JSON line to this ``.jsonl`` file.
        run_dir: where the ranks' files go; by default a fresh temporary directory, removed after a
            successful or interrupted run and kept after a failed one (its logs are named in the error).
        on_progress: called with a :class:`RunProgress` per phase and per finished step (and restart).
        source: names the plan in the errors (its file).
        nodes: this machine's place in a run over several machines (default: one machine).

    Raises:
        PlanError: the plan does not fit the model or the cluster, or ``--checkpoint`` cannot work
            (nothing was started).
        RecordError: ``out`` is not a place run records can be appended to (nothing was started).
        RuntimeFault: the machine cannot host the plan.
        WorkerFault: a rank died, raised or hung (after ``options.max_restarts`` restarts).
        Interrupted: SIGINT or SIGTERM.
    """
    from hetpart.runtime import measure

    model_spec, cluster_spec = plan_sources(plan, model, cluster, source)
    if options.check_gradients and nodes is not None and nodes.multi:
        raise PlanError("--check-gradients: compares every rank's gradients on one machine and this run spans "
                        f"{nodes.nnodes}; run the plan on one machine to check it")
    if out is not None:  # a directory or a foreign file was found only after every step had run
        from hetpart.records import check_records_target

        check_records_target(out)
    prep = prepare_run(plan, model_spec, _absolute(cluster_spec), options, source=source, nodes=nodes)
    profile = run_profile(prep, options)
    rates = measure.measure_host_rates(params_width(prep.run_graph))
    temporary = run_dir is None
    run_dir = Path(run_dir) if run_dir is not None else new_run_dir()
    try:
        job, results, warmup = _run_attempts(prep, options, run_dir, on_progress)
    except Interrupted:
        if temporary:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    small = prep.run_plan
    if prep.nodes.multi and prep.nodes.node_rank != 0:
        if temporary:
            shutil.rmtree(run_dir, ignore_errors=True)
        return LocalRunResult(nodes=prep.nodes, ranks=[_local_rank_summary(r, warmup) for r in results],
                              run_dir=None if temporary else str(run_dir))
    measured = measure.summarize(results, small, prep.cluster, small.seq_len, warmup)
    gradient_check = None
    if options.check_gradients:
        from hetpart.runtime.gradcheck import check_gradients

        gradient_check = check_gradients(prep.runnable, small, run_dir, len(prep.rank_devices))
    if profile is None and job.get("profile_units"):
        from hetpart.runtime.calibrate import profile_from_samples

        samples = [s for r in results for s in r.get("profile_samples", [])]
        if samples:
            profile = profile_from_samples(prep.runnable, prep.run_graph, samples, list(prep.cluster.gpu_types))
    emulation = {"enabled": options.emulate, "host": rates.to_dict()}
    # what the simulator does not price, measured by the ranks: the slowest rank's (runtime.measure.predict)
    host = max((float(r.get("host_work_s", 0.0)) for r in results), default=0.0)
    excess = max((float(r.get("transport_excess_s", 0.0)) for r in results), default=0.0)
    predicted, emu = None, None
    if profile is not None:
        emulation["profile"] = profile_summary(profile, options.profile)
    if options.emulate:
        emulation, emu = _emulation_used(prep, warmup, job, results, emulation, profile is not None)
        used = emulated_profile(profile, prep.cluster, small, prep.plan.precision) if profile is not None else None
        predicted = measure.by_real_gpu(measure.predict(prep.run_graph, emu, small, profile=used, host_work_s=host,
                                                    transport_excess_s=excess),
                                        emu, prep.cluster)
    elif profile is not None:  # this machine's own speed: the profile prices it directly
        if options.profile is not None:  # timed one process at a time: the ranks share this host's cores
            profile = profile.sharing_cores(len(prep.local_ranks), host_cores())
        predicted = measure.predict(prep.run_graph, prep.cluster, small, profile=profile, host_work_s=host)
    from hetpart.records import append_record
    from hetpart.runtime.record import model_summary, run_record

    record = run_record(prep, options, emulation, emu, measured, predicted)
    record_error = None
    if out is not None:
        try:
            append_record(out, record)
        except OSError as err:  # checked before the start, yet the disk filled or the place went: keep the record
            kept = run_dir / "record.jsonl"
            kept.write_text(record.to_json() + "\n")
            temporary = False
            record_error = (f"--out: could not append the record to {out} ({err.strerror or err}); it is in {kept} "
                            f"(append it with: cat {kept} >> FILE)")
    if temporary:
        shutil.rmtree(run_dir, ignore_errors=True)
    return RunResult(measured=measured, predicted=predicted, record=record, run_dir=None if temporary else str(run_dir),
                     model=model_summary(prep, options), emulation=emulation,
                     resumed_from=min(r["first_step"] for r in results) or None, record_error=record_error,
                     nodes=_nodes_summary(prep) if prep.nodes.multi else None, gradient_check=gradient_check)


def _nodes_summary(prep: PreparedRun) -> dict[str, Any]:
    """Which machine ran which ranks (the ``nodes`` of ``hetpart run --json`` over several machines)."""
    groups = node_ranks(prep.rank_devices, prep.cluster)
    return {**prep.nodes.to_dict(), "ranks": [{"node_rank": k, "ranks": g, "devices": [prep.rank_devices[r] for r in g]}
                                             for k, g in enumerate(groups)]}


def _local_rank_summary(result: dict[str, Any], warmup: int) -> dict[str, Any]:
    measured = result["steps"][warmup:]
    return {"rank": result["rank"], "device": result["device"], "step_times_s": [s["time_s"] for s in measured],
            "losses": [s["loss"] for s in measured]}


@dataclass(frozen=True)
class LocalRunResult:
    """What a machine other than node rank 0 ran (``hetpart run --nnodes N --node-rank K``, ``K > 0``): its
    ranks' measured step times and losses; node rank 0 prints the whole run."""

    nodes: Nodes
    ranks: list[dict[str, Any]]
    """Per local rank: rank, device, step_times_s and losses of the measured steps."""
    run_dir: str | None = None

    def summary(self) -> dict[str, Any]:
        return {"nodes": self.nodes.to_dict(), "ranks": self.ranks, "run_dir": self.run_dir,
                "note": f"node rank {self.nodes.node_rank} of {self.nodes.nnodes}: this machine's ranks only; node "
                        "rank 0 prints the whole run's measurements and appends its record"}


def _run_attempts(prep: PreparedRun, options: RunOptions, run_dir: Path,
                  on_progress) -> tuple[dict[str, Any], list[dict[str, Any]], int]:
    """Launch, and relaunch from the last checkpoint after a failure up to ``options.max_restarts`` times.

    Returns the last attempt's job, its ranks' results and how many of its steps were warm-up.
    """
    ckpt = options.checkpoint_dir
    if ckpt is None and options.max_restarts and options.checkpoint_every:
        ckpt = str(run_dir / "checkpoint")
    first = _next_step(ckpt)
    end, measure_from = first + options.warmup + options.steps, first + options.warmup
    job = _job(prep, options, ckpt, first, end, measure_from)
    attempt, directory = 0, run_dir
    while True:
        try:
            results = launch(job, directory, options, on_progress, attempt)
            return job, results, max(0, measure_from - min(r["first_step"] for r in results))
        except WorkerFault as exc:
            resume = _next_step(ckpt) if ckpt else first
            if attempt >= options.max_restarts or resume >= end:
                if attempt:
                    raise WorkerFault(f"{exc} (after {attempt} restart{'s' if attempt > 1 else ''})") from None
                raise
            attempt += 1
            if on_progress is not None:
                on_progress(RunProgress(phase="restart", done=resume - first, total=end - first,
                                        resumed_from=resume if ckpt else None, attempt=attempt, message=str(exc)))
            job = dict(job, fault=None)  # an injected fault happens once
            directory = run_dir / f"restart{attempt}"


def link_balance(prep: PreparedRun) -> float:
    """How much less than compute the links of a shrunken run are dilated to keep the plan's balance.

    A step computes ``~6 x params x tokens`` FLOPs and all-reduces ``params x bytes`` of gradients. The
    shrunken run has the plan's batch but ``seq_small / seq_full`` of its tokens, in fp32 instead of
    16-bit: at the compute's time factor ``T`` its gradient all-reduce weighs ``(seq_full / seq_small) x
    (4 / 2)`` times more against its compute than the plan's does on the real cluster (64x for a GPT-2
    plan at 1024 tokens run at 32). Dilating links by ``T`` times this factor restores the ratio.
    ``python:`` models run as given (factor 1).
    """
    if prep.model_spec.startswith("python:"):
        return 1.0
    return min(1.0, (prep.run_plan.seq_len / prep.plan.seq_len)
               * (prep.full_graph.dtype_bytes / prep.run_graph.dtype_bytes))


def _next_step(checkpoint_dir: str | None) -> int:
    """The step a run with this ``--checkpoint`` starts from (0 without one)."""
    from hetpart.runtime.checkpoint import checkpoint_info

    info = checkpoint_info(checkpoint_dir) if checkpoint_dir else None
    return int(info["next_step"]) if info else 0


def _job(prep: PreparedRun, options: RunOptions, checkpoint_dir: str | None, first: int, end: int,
         measure_from: int) -> dict[str, Any]:
    """The job file's content: what every worker needs to build and run its rank."""
    graph, small = prep.run_graph, prep.run_plan
    width = params_width(graph)
    # The workers calibrate the emulation themselves, all at once, under the run's own contention.
    emulation = {"precision": prep.plan.precision, "time_factor": options.time_factor, "width": width,
                 "unit_flops": [u.fwd_flops + u.bwd_flops for u in graph.units],
                 "link_balance": link_balance(prep) if options.balance_links else None,
                 "effects": options.effects, "planned_seq_len": prep.plan.seq_len,
                 "flops_ratio": _flops_ratio(prep)}
    if options.netem:
        emulation.update(_netem_setup(prep, options, width))
    return {"plan": small.to_dict(), "runnable": prep.runnable.to_dict(), "cluster": prep.cluster_spec,
            "device": run_device(options, len(prep.local_ranks)),
            "rank_devices": list(prep.rank_devices),
            # several machines: where this one stands and the (global) ranks it runs, in LOCAL_RANK order
            **({"nodes": prep.nodes.to_dict(), "local_ranks": prep.local_ranks} if prep.nodes.multi else {}), "steps": options.steps, "warmup": options.warmup,
            "first_step": first, "end_step": end, "measure_from": measure_from,
            "emulation": emulation if options.emulate else None,
            "fault": options.fault.to_dict() if options.fault else None,
            "checkpoint_dir": str(Path(checkpoint_dir).resolve()) if checkpoint_dir else None,
            "checkpoint_every": options.checkpoint_every, "check_gradients": options.check_gradients,
            # written into hetpart_checkpoint.json, checked by the next run before any rank starts
            "checkpoint_identity": prep.checkpoint_identity or None,
            # the ranks time their units before and after the steps: the prediction's profile
            "profile_units": options.profile is None and prep.runnable.config is not None,
            # hetpart's watchdog must see a hang before gloo's own timeout turns it into a peer's error
            "comm_timeout_s": max(options.hang_timeout_s, options.startup_timeout_s) + 60.0}


def _flops_ratio(prep: PreparedRun) -> float:
    """FLOPs of a sample of the model that runs over those of the planned model (the shrinkage of compute)."""
    full = sum(u.fwd_flops + u.bwd_flops for u in prep.full_graph.units)
    run = sum(u.fwd_flops + u.bwd_flops for u in prep.run_graph.units)
    return run / full if full > 0 else 1.0


def _emulation_used(prep: PreparedRun, warmup: int, job: dict[str, Any], results: list[dict[str, Any]],
                    summary: dict[str, Any], profiled: bool = False) -> tuple[dict[str, Any], Cluster]:
    """The emulated cluster the prediction uses, and its description for the record.

    The ranks agreed on ``T`` and a unit-timing calibration before the first step. With a profile
    (``profiled``) the prediction's compute comes from it and the peaks stay; without one, the rate
    the ranks reached in the warm-up recalibrates the device peaks (one or two steps: noisy). ``T``,
    fixed before the run, keeps the links.
    """
    from hetpart.runtime.emulation import EmulationParams, calibrated_peak_tflops
    from hetpart.runtime.measure import warmup_tflops

    graph, small = prep.run_graph, prep.run_plan
    params = EmulationParams(**results[0]["emulation"]["params"])
    summary = dict(summary, **params.to_dict(), calibrations=results[0]["emulation"]["calibrations"],
                   compute_time_factor=results[0]["emulation"].get("compute_time_factor", params.time_factor),
                   link_balance=job["emulation"].get("link_balance"),
                   calibrated_on="units", links=job["emulation"].get("shaped", "none"),
                   real_transport_s={str(r["rank"]): r["emulation"].get("transport", []) for r in results})
    if profiled:
        summary.update(calibrated_on="profile")
        return summary, params.cluster(prep.cluster, small)
    warm = warmup_tflops(results, graph, small, warmup)
    if warm is not None:
        peak = calibrated_peak_tflops(warm, params_width(graph), small.micro_batch * small.seq_len)
        params = dataclasses.replace(params, peak_tflops=peak, achieved_tflops=warm)
        summary.update(peak_tflops=peak, achieved_tflops=warm, calibrated_on="warm-up")
    return summary, params.cluster(prep.cluster, small)


def _netem_setup(prep: PreparedRun, options: RunOptions, width: int) -> dict[str, Any]:
    """``--netem`` shapes the links before the workers start, so ``T`` is fixed here: from
    ``--time-factor`` or from this process's own calibration."""
    from hetpart.runtime import measure
    from hetpart.runtime.emulation import resolve_emulation
    from hetpart.runtime.netem import netem_unavailable

    why = netem_unavailable()
    if why is not None:
        raise RuntimeFault(f"runtime: --netem: {why}; run without --netem (links are then emulated by sleeps)")
    graph, small = prep.run_graph, prep.run_plan
    cal = measure.calibrate(prep.runnable, [u.fwd_flops + u.bwd_flops for u in graph.units], small.seq_len,
                            small.micro_batch)
    params = resolve_emulation(small, prep.cluster, prep.plan.precision, cal.achieved_tflops, cal.optimizer_gbyte_s,
                               width, options.time_factor)
    return {"netem": True, "time_factor": params.time_factor, "link_params": params.to_dict()}


def run_profile(prep: PreparedRun, options: RunOptions):
    """The profile given as ``options.profile``, checked against the model that runs; None without one
    (the ranks then measure their units before and after their steps, :func:`_job`).

    Raises:
        SpecError: a bad ``--profile`` file, or one without an entry for the model that runs.
    """
    from hetpart.costmodel.profile import load_profile
    from hetpart.errors import SpecError

    small = prep.run_plan
    if options.profile is not None:
        profile = load_profile(options.profile)
        kinds = {(e.unit, e.params) for e in profile.compute}
        missing = [u.name for u in prep.run_graph.units if (u.kind, u.params) not in kinds]
        if missing:
            raise SpecError(f"--profile: {options.profile} has no entry for unit {missing[0]} of the model that runs "
                            f"({prep.run_graph.name}, hidden {prep.runnable.config.hidden_size if prep.runnable.config else '?'}); "
                            f"measure one with 'hetpart calibrate --model {prep.model_spec} --scale {options.scale} "
                            f"--seq-len {small.seq_len} --precision fp32'")
        measured = sorted({e.precision for e in profile.compute})
        if "fp32" not in measured:  # the runtime computes in fp32 (TF32 off): another precision's times price nothing
            raise SpecError(f"--profile: {options.profile} was measured in {', '.join(measured)}, and the run computes "
                            f"in fp32; measure one with 'hetpart calibrate --model {prep.model_spec} --scale "
                            f"{options.scale} --seq-len {small.seq_len} --precision fp32'")
        return profile
    return None


def profile_summary(profile, path: str | None) -> dict[str, Any]:
    """What the run's profile measured, for the record and ``hetpart run --json``: per unit kind and
    micro-batch, the median and the spread (fastest, slowest) of forward and backward."""
    units = [{"unit": e.unit, "micro_batch": e.micro_batch, "repeats": e.repeats,
              "fwd_ms": e.fwd_s * 1e3, "bwd_ms": e.bwd_s * 1e3,
              "fwd_spread_pct": [(e.fwd_range_s[0] / e.fwd_s - 1) * 100, (e.fwd_range_s[1] / e.fwd_s - 1) * 100],
              "bwd_spread_pct": [(e.bwd_range_s[0] / e.bwd_s - 1) * 100, (e.bwd_range_s[1] / e.bwd_s - 1) * 100]}
             for e in profile.compute]
    tensor_parallel = [{"unit": e.unit, "micro_batch": e.micro_batch, "tp": e.tp, "engine": e.engine,
                        "fwd_ms": e.fwd_s * 1e3, "bwd_ms": e.bwd_s * 1e3,
                        "all_reduces_alone_ms": (e.collective_fwd_s + e.collective_bwd_s) * 1e3}
                       for e in profile.tensor_parallel]
    return {"file": path, "measured": "given" if path else "by every rank before and after its steps",
            "date": profile.meta.get("date"), "fingerprint": profile.fingerprint, "units": units,
            **({"tensor_parallel": tensor_parallel} if tensor_parallel else {})}


def emulated_profile(profile, real: Cluster, plan: Plan, precision: str):
    """The profile of the emulated devices: every device type of the plan is this machine (the
    profile's device class that prices it) slowed by its type's ratio to the plan's fastest device, as
    :func:`~hetpart.runtime.emulation.emulated_cluster` slows the type's peak; the optimizer runs unslowed.

    A device's own speed factor (``slow:``) is NOT in the type's ratio: the emulated cluster keeps it and
    the simulator applies it per device, so the ranks' sleep (:meth:`~hetpart.runtime.emulation.Emulator.
    compute_delay_s`, type ratio over speed factor) is priced once. (Keying the per-device ratios by type
    priced a slowed device's factor twice and every other device of its type as slow: the +72-86% of the
    uneven-tp benchmark's per-run predictions.)"""
    import dataclasses

    from hetpart.costmodel.profile import DeviceBinding, DeviceClass, Profile
    from hetpart.runtime.emulation import _effective_tflops

    fastest = max(_effective_tflops(real, d, precision) for d in plan.devices)
    ratios = {real.device(d).gpu.name: fastest / real.device(d).gpu.tflops(precision) for d in plan.devices}
    source = next(iter(profile.devices.values()))
    devices, bindings, compute, tensor_parallel = {}, {}, [], []
    for gpu, ratio in ratios.items():
        name = f"{source.name} x{ratio:.4g}"
        devices[name] = DeviceClass(name=name, kind=source.kind, description=f"{source.description} slowed "
                                    f"{ratio:.3g}x (emulated {gpu})", adam_s_per_param=source.adam_s_per_param,
                                    adam_fixed_s=source.adam_fixed_s)
        bindings[f"emu-{gpu}"] = DeviceBinding(device=name, stand_in=True)
        compute += [dataclasses.replace(e, device=name, fwd_s=e.fwd_s * ratio, bwd_s=e.bwd_s * ratio,
                                        fwd_range_s=(e.fwd_range_s[0] * ratio, e.fwd_range_s[1] * ratio),
                                        bwd_range_s=(e.bwd_range_s[0] * ratio, e.bwd_range_s[1] * ratio))
                    for e in profile.compute if e.device == source.name]
        # what a tensor-parallel unit paid beyond its share and its all-reduces is this CPU's time too,
        # which the emulator slows like the rest of the compute it measures
        tensor_parallel += [dataclasses.replace(e, device=name, fwd_s=e.fwd_s * ratio, bwd_s=e.bwd_s * ratio,
                                                collective_fwd_s=e.collective_fwd_s * ratio,
                                                collective_bwd_s=e.collective_bwd_s * ratio)
                            for e in profile.tensor_parallel if e.device == source.name]
    return Profile(devices=devices, device_types=bindings, compute=tuple(compute),
                   tensor_parallel=tuple(tensor_parallel), model=dict(profile.model), meta=dict(profile.meta),
                   source=profile.source)


def params_width(graph: ModelGraph) -> int:
    """The matrix width that sizes a model's products (hidden size, else the widest unit)."""
    return int((graph.config.hidden_size if graph.config else 0) or max(u.width for u in graph.units) or 64)


def _absolute(cluster_spec: str) -> str:
    """Workers may start elsewhere: a cluster file path becomes absolute (catalog names stay)."""
    path = Path(cluster_spec)
    return str(path.resolve()) if path.suffix in (".yaml", ".yml") and path.exists() else cluster_spec
