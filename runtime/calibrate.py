"""``hetpart calibrate``: measure a profile (:mod:`hetpart.costmodel.profile`) on the devices at hand.

* Compute: the runtime's own unit modules (:mod:`hetpart.runtime.models`) of the model, one of each
  kind (embedding, a block, the head), forward and backward at each micro-batch size, with
  :func:`hetpart.runtime.profile.profile_units`: CUDA events on each distinct CUDA device type when
  there are any, else ``perf_counter`` on this machine's CPU with one thread (what one rank of
  ``hetpart run`` gets); warm-up first, then the median of the repeats, with the spread. The saved
  activations are measured too (autograd's saved tensors), and one Adam step per parameter.
* Links: two local processes (gloo on the CPU, NCCL between two GPUs) time point-to-point ping-pongs
  and all-reduces over a sweep of message sizes (median of the repeats, spread kept); latency and
  bandwidth are fitted to each sweep.

Which measured device prices which cluster device type is written into the profile: a CUDA device
whose name contains the type's model (``A100`` in ``NVIDIA A100-SXM4-80GB``) is that type; any other
type gets the first measured device as a STAND-IN (this CPU for an A100), which the predictions say.
"""

from __future__ import annotations

import os
import platform
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from hetpart.costmodel.profile import (ComputeEntry, DeviceBinding, DeviceClass, LinkEntry, Profile, TensorParallelEntry,
                                       fit_latency_bandwidth)
from hetpart.errors import ModelError, PlanError

__all__ = ["CalibrateOptions", "calibrate_profile", "cpu_description", "bind_device_types"]

CPU_SEQ_LEN = 64
"""Default sequence length on a CPU: a full-size head at micro-batch 8 and 1,024 tokens takes a CPU
core tens of seconds per call; a profile is interpolated in FLOPs per call, so shorter sequences at
larger micro-batches still cover the work of longer ones."""
IN_RUN = "measured by the ranks before and after their steps"
"""The source of a profile a run measured itself (no ``--profile``)."""
BLOCK_S = 0.02
"""On a CPU each timed repeat is a block of calls lasting about this long, and counts its mean: the
median of single short calls misses the time slices a process waits for on a shared machine."""
_SWEEP_BYTES = tuple(4 ** k for k in range(5, 13))
"""Message sizes of the link sweeps: 1 KiB to 16 MiB."""


@dataclass(frozen=True)
class CalibrateOptions:
    """What ``hetpart calibrate`` measures."""

    micro_batches: tuple[int, ...] = (1, 2, 4, 8)
    seq_len: int | None = None
    """Tokens per sequence; None: the model's own (at most 2048) on a GPU, at most :data:`CPU_SEQ_LEN` on a CPU."""
    precision: str | None = None
    """None: bf16 on GPUs that have it (else fp16), fp32 on a CPU (what ``hetpart run`` computes in there)."""
    scale: str | int | None = None
    """Measure the shrunken model ``hetpart run --scale`` runs (``tiny``, ``small`` or a hidden size)."""
    repeats: int | None = None
    """Most timed repeats per measurement (None: 10 on a GPU, 7 on a CPU)."""
    min_repeats: int = 3
    budget_s: float = 3.0
    """After ``min_repeats``, stop repeating a measurement once it has taken this long (CPU only)."""
    links: bool = True
    """Also measure links between two local processes."""
    tensor_parallel: bool = True
    """Also time each unit kind tensor-parallel over local processes as ``hetpart run`` runs it (DTensor for
    an even split, and the blocks by hand as an uneven split runs; gloo on the CPU, NCCL across CUDA
    devices), with the same all-reduces timed alone."""
    tp_degrees: tuple[int, ...] | None = None
    """The tensor-parallel degrees to time; None: each of :data:`TP_DEGREES` there are devices (or cores) for."""
    device: str = "auto"
    """``auto`` (CUDA when present, else the CPU), ``cpu`` or ``cuda``."""

    def __post_init__(self) -> None:
        if not self.micro_batches or any(isinstance(b, bool) or not isinstance(b, int) or b < 1
                                         for b in self.micro_batches):
            shown = ",".join(str(b) for b in self.micro_batches) if isinstance(self.micro_batches, (tuple, list)) \
                else repr(self.micro_batches)
            raise PlanError(f"--micro-batches: {shown or 'none'}; give whole numbers >= 1 such as 1,2,4,8")
        if self.seq_len is not None and self.seq_len < 1:
            raise PlanError(f"--seq-len: must be >= 1, got {self.seq_len}")
        if self.precision is not None and self.precision not in ("fp32", "tf32", "bf16", "fp16"):
            raise PlanError(f"--precision: {self.precision!r}; calibrate measures fp32, tf32, bf16 or fp16")
        if self.device not in ("auto", "cpu", "cuda"):
            raise PlanError(f"--device: {self.device!r}; use auto, cpu or cuda")
        if self.repeats is not None and self.repeats < 1:
            raise PlanError(f"--repeats: must be >= 1, got {self.repeats}")
        if self.tp_degrees is not None and (not self.tp_degrees or any(
                isinstance(d, bool) or not isinstance(d, int) or d < 2 for d in self.tp_degrees)):
            shown = ",".join(str(d) for d in self.tp_degrees) if isinstance(self.tp_degrees, (tuple, list)) \
                else repr(self.tp_degrees)
            raise PlanError(f"--tp-degrees: {shown or 'none'}; give whole numbers >= 2 such as 2,4,8")


def cpu_description() -> str:
    """This machine's CPU model and what one rank gets of it."""
    from hetpart.runtime.profile import device_name

    import torch

    return f"cpu: {device_name(torch.device('cpu'))}, 1 thread per process ({os.cpu_count()} cores)"


def _cuda_names() -> list[str]:
    import torch

    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def _norm(text: str) -> str:
    return "".join(ch for ch in text.upper() if ch.isalnum())


def bind_device_types(types: list[str], classes: dict[str, DeviceClass]) -> dict[str, DeviceBinding]:
    """Which measured class prices each cluster device type: a CUDA class whose name contains the
    type's model (the part before the first ``-``: ``A100`` of ``A100-80GB``), else the first class as
    a stand-in."""
    first = next(iter(classes))
    out = {}
    for t in types:
        model = _norm(t.split("-")[0])
        own = [c for c in classes.values() if c.kind == "cuda" and model and model in _norm(c.name)]
        if t in classes:
            out[t] = DeviceBinding(device=t, stand_in=False)
        elif own:
            out[t] = DeviceBinding(device=own[0].name, stand_in=False)
        else:
            out[t] = DeviceBinding(device=first, stand_in=True)
    return out


def calibrate_profile(cluster_spec: str, model_spec: str, options: CalibrateOptions = CalibrateOptions(),
                      say: Callable[[str], None] = lambda _: None) -> Profile:
    """Measure a profile for ``model_spec`` and the device types of ``cluster_spec`` (module docstring).

    Raises:
        SpecError, ModelError, PlanError: bad cluster, model or options (nothing measured).
    """
    import torch

    from hetpart.cluster import load_cluster
    from hetpart.graph.scales import check_seq_len
    from hetpart.graph.transformer import transformer_graph
    from hetpart.runtime.models import runnable_spec

    started = time.perf_counter()
    load_before = _load()
    cluster = load_cluster(cluster_spec)
    if model_spec.startswith("python:"):
        raise ModelError(f"--model: {model_spec}: calibrate measures transformer units (embedding, block, head); "
                         "python: models are not supported yet; give a catalog name or a config.json")
    spec = runnable_spec(model_spec, options.scale)
    cuda = options.device == "cuda" or (options.device == "auto" and torch.cuda.is_available())
    if cuda and not torch.cuda.is_available():
        raise PlanError("--device: cuda asked for but torch sees no CUDA device; use --device cpu")
    precision = options.precision or (("bf16" if torch.cuda.is_bf16_supported() else "fp16") if cuda else "fp32")
    seq = options.seq_len or min(spec.config.max_positions, 2048 if cuda else CPU_SEQ_LEN)
    check_seq_len(seq, spec.name, spec.config.max_positions, options.scale)  # the CLI checked the full model's
    graph = transformer_graph(spec.config, spec.name, seq, 2 if precision in ("bf16", "fp16") else 4)
    classes, compute = {}, []
    if cuda:
        names = _cuda_names()
        for name in dict.fromkeys(names):
            index = names.index(name)
            say(f"measuring units on cuda:{index} ({name}), {precision}, seq {seq}, micro-batches "
                f"{','.join(map(str, options.micro_batches))}")
            fixed, per_param = _adam(spec, f"cuda:{index}")
            classes[name] = DeviceClass(name=name, kind="cuda", description=f"cuda: {name} (torch {torch.__version__}, "
                                        f"CUDA {torch.version.cuda})", adam_s_per_param=per_param, adam_fixed_s=fixed)
            compute += _measure_units(spec, graph, name, f"cuda:{index}", precision, seq, options, say)
    else:
        say(f"no CUDA device: measuring this machine's CPU (1 thread), {precision}, seq {seq}, micro-batches "
            f"{','.join(map(str, options.micro_batches))}")
        with _one_thread():
            fixed, per_param = _adam(spec, "cpu")
            classes["cpu"] = DeviceClass(name="cpu", kind="cpu", description=cpu_description(),
                                         adam_s_per_param=per_param, adam_fixed_s=fixed)
            compute += _measure_units(spec, graph, "cpu", "cpu", precision, seq, options, say)
    bindings = bind_device_types(list(cluster.gpu_types), classes)
    for t, b in bindings.items():
        if b.stand_in:
            say(f"{t}: not at hand; measured {classes[b.device].description} stands in for it (predictions with "
                f"this profile then price running {spec.name}{f' at --scale {options.scale}' if options.scale else ''} "
                "on this machine; for another model or scale it prices nothing)")
    links = _measure_links(cuda, list(classes)[0], say, options.repeats) if options.links else []
    tensor_parallel = (_measure_tensor_parallel(model_spec, graph, list(classes)[0], cuda, precision, seq, options, say)
                       if options.tensor_parallel else [])
    meta = {"command": " ".join(["hetpart", *sys.argv[1:]]) if sys.argv and "hetpart" in sys.argv[0] else "",
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host": platform.node(),
            "python": platform.python_version(), "torch": torch.__version__, "hetpart": _version(),
            "load_average_before": load_before, "load_average_after": _load(),
            "wall_time_s": round(time.perf_counter() - started, 2), "cores": os.cpu_count(),
            "method": ("runtime unit modules; CUDA events" if cuda else "runtime unit modules; perf_counter, 1 thread")
                      + f"; 1 warm-up, median of up to {_max_repeats(options, cuda)} repeats "
                        f"(at least {options.min_repeats})"}
    model = {"name": spec.name, "scale": str(options.scale or ""), "seq_len": seq, "precision": precision,
             "num_units": graph.num_units, "hidden_size": spec.config.hidden_size, "num_params": graph.num_params}
    return Profile(devices=classes, device_types=bindings, compute=tuple(compute), links=tuple(links),
                   tensor_parallel=tuple(tensor_parallel), model=model, meta=meta)


def _version() -> str:
    from hetpart import __version__

    return __version__


def _load() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


class _one_thread:
    """One torch thread while measuring the CPU (a rank of ``hetpart run`` gets one)."""

    def __enter__(self):
        import torch

        self.threads = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc):
        import torch

        torch.set_num_threads(self.threads)


def _max_repeats(options: CalibrateOptions, cuda: bool) -> int:
    return options.repeats or (10 if cuda else 7)


def _measure_units(spec, graph, device_class: str, device: str, precision: str, seq: int,
                   options: CalibrateOptions, say) -> list[ComputeEntry]:
    from hetpart.runtime.profile import profile_units

    cuda = device.startswith("cuda")
    units = {"embedding": graph.units[0], "block": graph.units[1], "head": graph.units[-1]}

    def progress(t) -> None:
        say(f"  {t.unit} micro-batch {t.micro_batch}: forward {t.fwd_s * 1e3:.2f} ms, backward {t.bwd_s * 1e3:.2f} ms "
            f"(median of {t.repeats}; spread {_spread(t.fwd_range_s, t.fwd_s)} / {_spread(t.bwd_range_s, t.bwd_s)})")

    rows = profile_units(spec, list(options.micro_batches), seq, precision, device, warmup=1,
                         repeats=_max_repeats(options, cuda), min_repeats=options.min_repeats,
                         budget_s=None if cuda else options.budget_s, block_s=None if cuda else BLOCK_S,
                         on_timing=progress)
    factors = {} if cuda else _chain_factors_cpu(spec, graph, rows, seq, options, say)
    out = []
    for r in rows:
        u = units[r.unit.split("_")[0]]
        sf, sb = factors.get(r.micro_batch, (1.0, 1.0))
        out.append(ComputeEntry(device=device_class, precision=r.precision, unit=u.kind, params=int(u.params),
                                seq_len=seq, micro_batch=r.micro_batch, fwd_flops=u.fwd_flops * r.micro_batch,
                                fwd_s=sf * r.fwd_s, bwd_s=sb * r.bwd_s,
                                fwd_range_s=(sf * r.fwd_range_s[0], sf * r.fwd_range_s[1]),
                                bwd_range_s=(sb * r.bwd_range_s[0], sb * r.bwd_range_s[1]), repeats=r.repeats,
                                activation_gb=r.activation_gb, peak_memory_gb=r.peak_memory_gb, width=int(u.width)))
    return out


CHAIN_MEMORY_SHARE = 0.25
"""The whole model is timed back to back (:func:`_chain_factors_cpu`) only where its weights, gradients and a
copy of each take at most this share of the memory available: a full-size large model on a CPU is not built."""


def _chain_factors_cpu(spec, graph, rows, seq: int, options: CalibrateOptions, say) -> dict[int, tuple[float, float]]:
    """Per micro-batch, what the whole model back to back took over its units alone, forward and backward
    (:func:`hetpart.runtime.profile.time_chain`, as the in-run profile does: :func:`chain_factors`), on this CPU;
    the units' times are scaled by it. Empty where the model is too large to build whole here."""
    from hetpart.runtime.profile import time_chain

    free = _free_bytes("cpu")
    if free is None or graph.num_params * 4 * 3 > CHAIN_MEMORY_SHARE * free:
        say("  the whole model is too large to time back to back here: units priced as timed alone")
        return {}
    out = {}
    for mb in options.micro_batches:
        alone = {r.unit.split("_")[0]: r for r in rows if r.micro_batch == mb}
        if set(alone) != {"embedding", "block", "head"}:
            continue
        cf, cb = time_chain(spec, mb, seq, "cpu", repeats=_max_repeats(options, False), block_s=BLOCK_S)
        n = spec.num_units
        fwd = alone["embedding"].fwd_s + (n - 2) * alone["block"].fwd_s + alone["head"].fwd_s
        bwd = alone["embedding"].bwd_s + (n - 2) * alone["block"].bwd_s + alone["head"].bwd_s
        out[mb] = (cf / fwd if fwd > 0 else 1.0, cb / bwd if bwd > 0 else 1.0)
        say(f"  the whole model back to back, micro-batch {mb}: x{out[mb][0]:.2f} forward, x{out[mb][1]:.2f} backward "
            "over its units alone (the units' times are scaled by it)")
    return out


def _spread(rng, median: float) -> str:
    lo, hi = rng
    return f"-{(1 - lo / median) * 100:.0f}%/+{(hi / median - 1) * 100:.0f}%" if median > 0 else "n/a"


def _adam(spec, device: str, tick: Callable[[], None] | None = None) -> tuple[float, float]:
    """``(fixed_s, s_per_param)`` of one Adam step (fp32 master weights, torch's default implementation as
    the runtime uses it): the medians over one block's parameters and over every unit kind's, a line
    through the two."""
    from hetpart.runtime.models import build_units

    indices = _adam_units(spec, device)
    units = build_units(spec, indices, device=device)
    small = [p for p in units[indices.index(1)].parameters()]
    large = [p for u in units for p in u.parameters()]
    points = [(sum(p.numel() for p in ps), _adam_step_s(ps, device, tick=tick)) for ps in (small, large)]
    (n1, t1), (n2, t2) = points
    per_param = max((t2 - t1) / (n2 - n1), 0.0) if n2 > n1 else 0.0
    if per_param == 0.0:  # noise swamped the difference: all of it per parameter
        return 0.0, t2 / n2
    return max(t1 - per_param * n1, 0.0), per_param


def _adam_layout(shapes: Sequence[Sequence[int]], device: str,
                 tick: Callable[[], None] | None = None) -> tuple[float, float] | None:
    """``(fixed_s, s_per_param)`` of one Adam step over the tensors a rank of a run steps (``shapes``), from two
    timings of that many tensors: at their sizes and at half of each. None where their states would not fit
    the memory at hand (then :func:`_adam` times one unit of each kind).

    torch's Adam on CPU loops over its tensors in Python, a dozen operations each (a few microseconds per
    operation), so a step costs per tensor as well as per parameter. A line through one block and the three unit
    kinds (:func:`_adam`: 12 and 16 tensors) put that cost in the slope, and priced the 150 tensors of
    gpt2-small at ``--scale tiny`` at 2-4 ms where its ranks' optimizer steps took 6.5-14 ms on this machine.
    At the rank's own tensor count the intercept holds their per-tensor cost, which a sharding level keeps (it
    halves each tensor, not their number), and the slope the per-parameter cost."""
    import math

    import torch

    sizes = [max(1, math.prod(s)) for s in shapes]
    total = sum(sizes)
    free = _free_bytes(device)
    if not sizes or (free is not None and 1.5 * total * ADAM_BYTES_PER_PARAM > 0.8 * free):
        return None
    points = []
    for numels in (sizes, [max(1, n // 2) for n in sizes]):
        params = [torch.nn.Parameter(torch.zeros(n, device=device)) for n in numels]
        points.append((sum(numels), _adam_step_s(params, device, tick=tick)))
        del params
    (n1, t1), (n2, t2) = points
    per_param = max((t1 - t2) / (n1 - n2), 0.0) if n1 > n2 else 0.0
    if per_param == 0.0:  # noise swamped the difference: all of it per parameter
        return 0.0, t1 / n1
    return max(t1 - per_param * n1, 0.0), per_param


ADAM_BYTES_PER_PARAM = 24
"""What timing an Adam step holds per parameter: the fp32 weight, its gradient, two moments, and torch's
multi-tensor step's temporaries (about two more)."""


def _adam_units(spec, device: str) -> list[int]:
    """The units whose Adam step :func:`_adam` times: the three unit kinds (embedding, a block, the head), or,
    where their states would not fit the memory at hand (a large vocabulary on a small machine: llama3-8b's
    1.27 B parameters need 30 GB), the first two blocks, so that calibrating never runs out of memory."""
    from hetpart.runtime.models import _meta_units

    kinds = [0, 1, spec.num_units - 1]
    need = sum(p.numel() for u in _meta_units(spec, kinds) for p in u.parameters()) * ADAM_BYTES_PER_PARAM
    free = _free_bytes(device)
    if free is None or need <= 0.8 * free or spec.num_units < 4:
        return kinds
    return [1, 2]


def _free_bytes(device: str) -> float | None:
    """Memory free on ``device`` (CUDA: the driver's free bytes; CPU: Linux's MemAvailable), None if unknown."""
    import torch

    if device.startswith("cuda"):
        return float(torch.cuda.mem_get_info(torch.device(device))[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _adam_step_s(params, device: str, repeats: int = 9, tick: Callable[[], None] | None = None) -> float:
    import torch

    for p in params:
        p.grad = torch.ones_like(p)
    opt = torch.optim.Adam(params, lr=1e-9)
    times = []
    for attempt in range(repeats + 1):
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        opt.step()
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)
        if attempt:
            times.append(time.perf_counter() - t)
        if tick is not None:
            tick()
    return statistics.median(times)


# ------------------------------------------------------------------------------------------ links
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _measure_links(cuda: bool, device_class: str, say, repeats: int | None = None) -> list[LinkEntry]:
    """p2p and all-reduce sweeps between two local processes; [] when they cannot be had (one GPU). ``repeats``
    (``--repeats``): timed repeats per message size; None: 20 up to 1 MiB, 8 above."""
    import json

    import torch
    import torch.multiprocessing as mp

    if cuda and torch.cuda.device_count() < 2:
        say("links: one CUDA device only, nothing to measure between two (the cluster's links stay analytic)")
        return []
    backend = "nccl" if cuda else "gloo"
    say(f"measuring links: two local processes, {backend}, p2p and all-reduce of "
        f"{_SWEEP_BYTES[0] // 1024} KiB to {_SWEEP_BYTES[-1] // 2**20} MiB")
    with tempfile.TemporaryDirectory(prefix="hetpart-calibrate-") as tmp:
        out = Path(tmp) / "links.json"
        mp.start_processes(_link_worker, args=(2, _free_port(), backend, str(out), repeats), nprocs=2, join=True,
                           start_method="spawn")
        sweeps = json.loads(out.read_text())
    scope = "intra_node" if cuda else "any"
    entries = []
    for kind in ("p2p", "allreduce"):
        points = [(p["bytes"], p["seconds"]) for p in sweeps[kind]]
        lat_s, per_byte = fit_latency_bandwidth(points)
        if kind == "allreduce":  # ring of 2: 2 hops of latency, bytes / bw (see collectives.ring_allreduce_time_s)
            n = 2
            lat_s, per_byte = lat_s / (2 * (n - 1)), per_byte / (2 * (n - 1) / n)
        entries.append(LinkEntry(kind=kind, devices=(device_class, device_class), scope=scope,
                                 latency_us=lat_s * 1e6, bandwidth_gbyte_s=1.0 / per_byte / 1e9, members=2,
                                 backend=backend, sweep=tuple(sweeps[kind])))
        say(f"  {kind}: latency {lat_s * 1e6:.1f} us, bandwidth {1.0 / per_byte / 1e9:.2f} GB/s"
            + (" (per ring hop)" if kind == "allreduce" else ""))
    return entries


def _link_worker(rank: int, world: int, port: int, backend: str, out: str, given: int | None = None) -> None:
    """One of the two processes of the link sweeps (spawned; rank 0 writes the results)."""
    import json

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    device = torch.device(f"cuda:{rank}") if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        results = {"p2p": [], "allreduce": []}
        for nbytes in _SWEEP_BYTES:
            buf = torch.ones(max(1, nbytes // 4), device=device)
            repeats = given or (20 if nbytes <= 2**20 else 8)
            results["p2p"].append(_ping_pong(dist, buf, rank, repeats, device))
            results["allreduce"].append(_allreduce(dist, buf, repeats, device))
        if rank == 0:
            Path(out).write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _point(nbytes: int, times: list[float]) -> dict[str, float]:
    return {"bytes": float(nbytes), "seconds": statistics.median(times), "min_s": min(times), "max_s": max(times),
            "repeats": len(times)}


def _ping_pong(dist, buf, rank: int, repeats: int, device) -> dict[str, float]:
    """Half the round trip of ``buf`` from rank 0 to rank 1 and back (one warm-up)."""
    times = []
    for i in range(repeats + 1):
        dist.barrier()
        t = time.perf_counter()
        if rank == 0:
            dist.send(buf, 1)
            dist.recv(buf, 1)
        else:
            dist.recv(buf, 0)
            dist.send(buf, 0)
        _sync(device)
        if i:
            times.append((time.perf_counter() - t) / 2)
    return _point(buf.numel() * buf.element_size(), times)


def _allreduce(dist, buf, repeats: int, device) -> dict[str, float]:
    times = []
    for i in range(repeats + 1):
        dist.barrier()
        _sync(device)
        t = time.perf_counter()
        dist.all_reduce(buf)
        _sync(device)
        if i:
            times.append(time.perf_counter() - t)
        buf.fill_(1.0)
    return _point(buf.numel() * buf.element_size(), times)


# ------------------------------------------------------------------------------------------ tensor parallelism
TP_DEGREES = (2, 4, 8)
"""The degrees :func:`_measure_tensor_parallel` times by default, each where the devices at hand (CUDA
devices, or cores: a process each, never sharing one) suffice and the runtime can split the model so."""


TP_BLOCK_S = 0.1
"""On a CPU each timed repeat of a tensor-parallel unit is a block of calls lasting about this long: a rank
that waits at an all-reduce sleeps, and waking it costs up to a scheduler tick (4 ms at 250 Hz) now and
then, so a block must span many all-reduces for its mean to be what a training step sees."""


def _measure_tensor_parallel(model_spec: str, graph, device_class: str, cuda: bool, precision: str, seq: int,
                             options: CalibrateOptions, say) -> list[TensorParallelEntry]:
    """Each unit kind at each micro-batch, run tensor-parallel over ``tp`` local processes as ``hetpart
    run`` runs an even split (and the blocks as it runs an uneven one, timed at an even split), and its
    all-reduces alone, for each degree of ``options.tp_degrees`` (default :data:`TP_DEGREES`); a degree is
    skipped, with one line why, where its processes would share a core or a device, where the runtime
    would refuse the split, or where the measurement fails (the rest of the profile kept)."""
    import torch

    from hetpart.runtime.models import runnable_spec

    from hetpart.runtime.launch import host_cores

    available = torch.cuda.device_count() if cuda else host_cores()
    what = "CUDA device(s)" if cuda else "core(s)"
    cfg = runnable_spec(model_spec, options.scale).config
    sizes = {"attention heads": cfg.num_heads, "key/value heads": cfg.kv_heads, "MLP width": cfg.ffn}
    entries = []
    for tp in options.tp_degrees or TP_DEGREES:
        if tp > available:
            if options.tp_degrees or tp == min(TP_DEGREES):  # the defaults above the machine go unsaid
                say(f"tensor parallelism {tp}: {available} {what}, {tp} needed; not measured "
                    f"({'the nearest measured degree prices it' if entries else 'the analytic all-reduces price it'})")
            continue
        odd = [f"the {n} {what_}" for what_, n in sizes.items() if n % tp]
        if odd:  # the runtime refuses such a split: nothing it runs to measure
            say(f"tensor parallelism {tp}: not measured: {tp} does not divide {' and '.join(odd)} of the model "
                "that runs")
            continue
        entries += _tensor_parallel_degree(tp, model_spec, graph, device_class, cuda, precision, seq, options, say)
    return entries


def _tensor_parallel_degree(tp: int, model_spec: str, graph, device_class: str, cuda: bool, precision: str, seq: int,
                            options: CalibrateOptions, say) -> list[TensorParallelEntry]:
    """:func:`_measure_tensor_parallel` at one degree ([] when the measurement fails, said)."""
    import json

    import torch.multiprocessing as mp

    backend = "nccl" if cuda else "gloo"
    say(f"measuring tensor parallelism: each unit split {tp} ways over {tp} local processes ({backend}) as the "
        "runtime runs an even split (DTensor) and an uneven one (Megatron-style, the blocks), and its all-reduces alone")
    with tempfile.TemporaryDirectory(prefix="hetpart-calibrate-") as tmp:
        out = Path(tmp) / "tp.json"
        job = {"model": model_spec, "scale": options.scale, "precision": precision, "seq": seq,
               "micro_batches": list(options.micro_batches), "repeats": _max_repeats(options, cuda),
               "min_repeats": options.min_repeats, "budget_s": None if cuda else options.budget_s,
               "block_s": None if cuda else TP_BLOCK_S}
        try:
            mp.start_processes(_tp_worker, args=(tp, _free_port(), backend, json.dumps(job), str(out)), nprocs=tp,
                               join=True, start_method="spawn")
        except Exception as exc:  # noqa: BLE001 - an optional part: the rest of the profile is kept
            if not out.exists():  # rank 0 writes every row at once after the last measurement: without them, none
                last = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
                say(f"tensor parallelism {tp}: not measured: {last[-1][:300] if last else type(exc).__name__} (the "
                    "profile keeps the rest; its tensor-parallel units are priced by the analytic all-reduces)")
                return []
        rows = json.loads(out.read_text())
    units = {"embedding": graph.units[0], "block": graph.units[1], "head": graph.units[-1]}
    entries = []
    for r in rows:
        u = units[r["unit"].split("_")[0]]
        entries.append(TensorParallelEntry(
            device=device_class, precision=precision, unit=u.kind, params=int(u.params), seq_len=seq,
            micro_batch=r["micro_batch"], fwd_flops=u.fwd_flops * r["micro_batch"], tp=tp, fwd_s=r["fwd_s"],
            bwd_s=r["bwd_s"], collective_fwd_s=r["collective_fwd_s"], collective_bwd_s=r["collective_bwd_s"],
            collectives_fwd=r["collectives_fwd"], collectives_bwd=r["collectives_bwd"],
            collective_bytes=r["collective_bytes"], fwd_range_s=tuple(r["fwd_range_s"]),
            bwd_range_s=tuple(r["bwd_range_s"]), repeats=r["repeats"], backend=backend, engine=r["engine"]))
        say(f"  {r['unit']} micro-batch {r['micro_batch']} tp {tp} ({r['engine']}): forward {r['fwd_s'] * 1e3:.2f} ms "
            f"({r['collectives_fwd']} all-reduces {r['collective_fwd_s'] * 1e3:.2f} ms alone), backward "
            f"{r['bwd_s'] * 1e3:.2f} ms ({r['collectives_bwd']}: {r['collective_bwd_s'] * 1e3:.2f} ms)")
    return entries


class _CountCollectives:
    """Hooks that note the bytes of each tensor-parallel all-reduce (:class:`hetpart.runtime.engine.Hooks`)."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def on_compute(self, *_args) -> None:
        return None

    def on_send(self, *_args) -> None:
        return None

    def on_collective(self, kind: str, num_bytes: int, group_ranks) -> None:
        self.sizes.append(int(num_bytes))


def _tp_worker(rank: int, world: int, port: int, backend: str, job_json: str, out: str) -> None:
    """One rank of :func:`_measure_tensor_parallel` (spawned; rank 0 writes the rows)."""
    import json

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from hetpart.runtime.engine import TP_ENGINES, parallelize_for_timing
    from hetpart.runtime.models import build_units, runnable_spec
    from hetpart.runtime.profile import _DTYPES, _Clock, _unit_input

    job = json.loads(job_json)
    torch.set_num_threads(1)
    device = torch.device(f"cuda:{rank}") if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = job["precision"] == "tf32"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    done = False
    try:
        spec = runnable_spec(job["model"], job["scale"])
        dtype, clock = _DTYPES[job["precision"]], _Clock(device)
        mesh = init_device_mesh(device.type, (world,))
        rows = []
        for engine in TP_ENGINES:
            for index in (0, 1, spec.num_units - 1):
                unit = build_units(spec, [index], device=device, dtype=dtype)[0]
                if engine == "megatron" and not unit.tp_plan:
                    continue  # by hand only the blocks are cut (an embedding or head runs whole, or vocabulary-split)
                hooks = _CountCollectives()
                parallelize_for_timing(unit, mesh, hooks, engine, spec.config, rank)
                for mb in job["micro_batches"]:
                    x = _unit_input(spec, index, mb, job["seq"], device, dtype)
                    rows.append(dict(_tp_timing(unit, x, mb, dtype, hooks, clock, dist, device, job), engine=engine))
        everyone: list[Any] = [None] * world
        dist.all_gather_object(everyone, rows)
        if rank == 0:  # the slowest rank's median: its peers wait for it at every all-reduce
            merged = []
            for parts in zip(*everyone):
                slow = max(parts, key=lambda r: r["fwd_s"] + r["bwd_s"])
                merged.append(dict(slow, fwd_s=max(r["fwd_s"] for r in parts), bwd_s=max(r["bwd_s"] for r in parts),
                                   collective_fwd_s=max(r["collective_fwd_s"] for r in parts),
                                   collective_bwd_s=max(r["collective_bwd_s"] for r in parts)))
            Path(f"{out}.tmp").write_text(json.dumps(merged))
            os.replace(f"{out}.tmp", out)  # whole or absent: the parent reads it even if a rank dies at exit
        dist.barrier()
        done = True
    finally:
        dist.destroy_process_group()
    if done:  # skip the interpreter's teardown: a communication thread destroyed there now and then aborts the
        sys.stdout.flush()  # process (std::terminate) after its work is done, which would discard it
        sys.stderr.flush()
        os._exit(0)


def _agreed(dist, value: float, device) -> float:
    """The largest of every rank's ``value`` (ranks must agree on how many calls they make)."""
    import torch

    t = torch.tensor([float(value)], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _tp_timing(unit, x, micro_batch: int, dtype, hooks: _CountCollectives, clock, dist, device, job
               ) -> dict[str, Any]:
    """Forward and backward of one tensor-parallel unit (blocks of calls on a CPU), then its all-reduces alone."""
    import math

    import torch

    from hetpart.runtime.profile import _call

    with torch.no_grad():
        grad = torch.randn_like(unit(x)) * 1e-3
    hooks.sizes.clear()
    f, b = _call(unit, x, grad, clock)  # warm-up; its all-reduces say what one call exchanges
    sizes = list(hooks.sizes)
    split = _forward_collectives(unit, x, hooks)
    calls = 1
    if job["block_s"]:
        calls = int(_agreed(dist, max(1, min(64, math.ceil(job["block_s"] / max(f + b, 1e-9)))), device))
    fwd, bwd, started = [], [], time.perf_counter()
    for _ in range(job["repeats"]):
        done = len(fwd) >= job["min_repeats"] and job["budget_s"] and time.perf_counter() - started > job["budget_s"]
        if _agreed(dist, 1.0 if done else 0.0, device):
            break
        dist.barrier()
        f = b = 0.0
        for _ in range(calls):
            df, db = _call(unit, x, grad, clock)
            f, b = f + df, b + db
        fwd.append(f / calls)
        bwd.append(b / calls)
    alone_f = _collectives_alone(sizes[:split], dtype, calls, len(fwd), clock, dist, device)
    alone_b = _collectives_alone(sizes[split:], dtype, calls, len(fwd), clock, dist, device)
    return {"unit": unit.unit_name, "micro_batch": micro_batch, "fwd_s": statistics.median(fwd),
            "bwd_s": statistics.median(bwd), "fwd_range_s": [min(fwd), max(fwd)], "bwd_range_s": [min(bwd), max(bwd)],
            "repeats": len(fwd), "collective_fwd_s": alone_f, "collective_bwd_s": alone_b,
            "collectives_fwd": split, "collectives_bwd": len(sizes) - split,
            "collective_bytes": statistics.fmean(sizes) if sizes else 0.0}


def _forward_collectives(unit, x, hooks: _CountCollectives) -> int:
    """How many of one call's all-reduces its forward makes (the rest are the backward's)."""
    import torch

    hooks.sizes.clear()
    with torch.no_grad():
        unit(x)
    count = len(hooks.sizes)
    hooks.sizes.clear()
    return count


def _collectives_alone(sizes: list[int], dtype, calls: int, repeats: int, clock, dist, device) -> float:
    """Median seconds of the all-reduces ``sizes`` (bytes each) run back to back, as blocks of ``calls``."""
    import torch

    if not sizes:
        return 0.0
    element = torch.tensor([], dtype=dtype).element_size()
    bufs = [torch.ones(max(1, n // element), dtype=dtype, device=device) for n in sizes]

    def run() -> None:
        for buf in bufs:
            dist.all_reduce(buf)

    run()  # warm-up
    times = []
    for _ in range(max(1, repeats)):
        dist.barrier()
        times.append(sum(clock(run) for _ in range(calls)) / calls)
    return statistics.median(times)


# ------------------------------------------------------------------------------------------ inside a run
def measure_here(spec, micro_batch: int, seq_len: int, repeats: int = 10,
                 tick: Callable[[], None] | None = None, device: str = "cpu",
                 adam_shapes: Sequence[Sequence[int]] | None = None, meeting=None) -> dict[str, Any]:
    """This process's unit timings (one of each kind, ``micro_batch`` sequences, fp32 as the runtime runs, on
    ``device``, the rank's own: median of ``repeats``) and its Adam step: what a rank of ``hetpart run`` measures
    before and after its steps, under the run's own contention (JSON-ready). ``device`` names the class that
    measured (a CUDA device's name, or this CPU), so that a GPU run is priced by its GPU's times. ``adam_shapes``:
    the shapes of the tensors this rank's optimizer steps; Adam is then timed on that layout
    (:func:`_adam_layout`) instead of on one unit of each kind. With a ``meeting``
    (:class:`hetpart.runtime.profile.Meeting`: every rank of a run of several measures at once) each repeat of
    the whole model starts with the other ranks and the slowest rank's time is kept beside this rank's
    (``chain["met"]``, :func:`meeting_factor`)."""
    import torch

    from hetpart.runtime.profile import device_name, profile_units

    where = torch.device(device)
    rows = profile_units(spec, [micro_batch], seq_len, "fp32", where, warmup=1, repeats=repeats,
                         block_s=None if where.type == "cuda" else BLOCK_S, tick=tick)
    fixed, per_param = (_adam_layout(adam_shapes, str(where), tick) if adam_shapes else None) or \
        _adam(spec, str(where), tick)
    chain = None
    if where.type == "cpu":  # the whole model back to back (a GPU rank may not hold it: its stage's share)
        from hetpart.runtime.profile import time_chain

        met: dict[str, float] = {}
        cf, cb = time_chain(spec, micro_batch, seq_len, where, repeats=repeats, block_s=BLOCK_S, tick=tick,
                            meeting=meeting, met=met)
        chain = {"fwd_s": cf, "bwd_s": cb, "units": spec.num_units, **({"met": met} if met else {})}
    if where.type == "cuda":
        name = device_name(where)
        measured_on = {"name": name, "kind": "cuda", "description": f"cuda: {name} (torch {torch.__version__}, "
                                                                     f"CUDA {torch.version.cuda}); measured inside the run"}
    else:
        measured_on = {"name": "cpu", "kind": "cpu", "description": cpu_description() + "; measured inside the run"}
    return {"units": [r.to_dict() for r in rows], "adam_fixed_s": fixed, "adam_s_per_param": per_param,
            "device": measured_on, "chain": chain}


def chain_factors(samples: list[dict[str, Any]]) -> tuple[float, float] | None:
    """Forward and backward: the whole model back to back over its units alone (embedding, ``n - 2`` blocks,
    head), per sample at the run's micro-batch, the median over samples; None where no sample timed the chain."""
    fwd, bwd = [], []
    for sample in samples:
        chain = sample.get("chain")
        if not chain:
            continue
        alone = {r["unit"].split("_")[0]: r for r in sample["units"]}
        if set(alone) != {"embedding", "block", "head"}:
            continue
        n = chain["units"]
        for key, out in (("fwd_s", fwd), ("bwd_s", bwd)):
            summed = alone["embedding"][key] + (n - 2) * alone["block"][key] + alone["head"][key]
            if summed > 0:
                out.append(chain[key] / summed)
    if not fwd or not bwd:
        return None
    return statistics.median(fwd), statistics.median(bwd)


def meeting_factor(samples: list[dict[str, Any]]) -> float | None:
    """The slowest rank's time for the whole model over the ranks' typical one (their median), when the ranks
    of a run computed it together and met after each repeat (:class:`hetpart.runtime.profile.Meeting`; per
    repeat, then the median over repeats, the same on every rank of a meeting), the median over samples.
    A collective after a compute waits for its slowest member; on a shared CPU the members' times scatter (time
    slices lost to each other and to other processes), so the step runs at the pace of the slowest, which the
    units' medians (every rank's, then their median) leave out. None where no sample met (one rank, GPU ranks)."""
    ratios = [met["slowest_s"] / met["typical_s"] for s in samples
              for met in [(s.get("chain") or {}).get("met") or {}] if met.get("typical_s", 0) > 0]
    return statistics.median(ratios) if ratios else None


def profile_from_samples(spec, graph, samples: list[dict[str, Any]], device_types: list[str]) -> Profile:
    """A profile from the ranks' :func:`measure_here` samples: per device class that measured and unit kind,
    the median of their medians, the spread over every repeat, the repeats summed, each scaled by what the
    whole model back to back took over its units alone (:func:`chain_factors`, where the ranks timed it on a
    CPU: a step's units find caches the units before them filled). A device type is priced by
    the CUDA class of its own model where one measured (a run on its GPU), else by the first class, this CPU
    when the ranks ran here (a stand-in)."""
    units = {"embedding": graph.units[0], "block": graph.units[1], "head": graph.units[-1]}
    cpu_class = {"name": "cpu", "kind": "cpu", "description": cpu_description() + "; measured inside the run"}
    by_class: dict[str, list[dict[str, Any]]] = {}
    described: dict[str, dict[str, str]] = {}
    for sample in samples:
        where = sample.get("device") or cpu_class
        by_class.setdefault(where["name"], []).append(sample)
        described.setdefault(where["name"], where)
    compute, classes = [], {}
    for name, group in by_class.items():
        # a step runs the units back to back: their times alone scaled by what the chain measured (time_chain)
        sf, sb = chain_factors(group) or (1.0, 1.0)
        meet = meeting_factor(group) or 1.0  # the ranks meet at collectives: the slowest one's pace
        sf, sb = sf * meet, sb * meet
        rows: dict[tuple[str, int], list[dict]] = {}
        for sample in group:
            for r in sample["units"]:
                rows.setdefault((r["unit"].split("_")[0], r["micro_batch"]), []).append(r)
        for (kind, mb), rs in rows.items():
            u = units[kind]
            compute.append(ComputeEntry(
                device=name, precision="fp32", unit=u.kind, params=int(u.params), seq_len=graph.seq_len,
                micro_batch=mb, fwd_flops=u.fwd_flops * mb, fwd_s=sf * statistics.median(r["fwd_s"] for r in rs),
                bwd_s=sb * statistics.median(r["bwd_s"] for r in rs),
                fwd_range_s=(sf * min(r["fwd_range_s"][0] for r in rs), sf * max(r["fwd_range_s"][1] for r in rs)),
                bwd_range_s=(sb * min(r["bwd_range_s"][0] for r in rs), sb * max(r["bwd_range_s"][1] for r in rs)),
                repeats=sum(r["repeats"] for r in rs), activation_gb=rs[0].get("activation_gb"),
                width=int(u.width)))
        where = described[name]
        classes[name] = DeviceClass(name=name, kind=where["kind"], description=where["description"],
                                    adam_s_per_param=statistics.median(s["adam_s_per_param"] for s in group),
                                    adam_fixed_s=statistics.median(s["adam_fixed_s"] for s in group))
    return Profile(devices=classes, device_types=bind_device_types(device_types, classes), compute=tuple(compute),
                   model={"name": spec.name, "seq_len": graph.seq_len, "precision": "fp32"},
                   meta={"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                         "method": f"every rank before and after its steps ({len(samples)} samples), median of "
                                   "the medians", "chain_factors": {name: chain_factors(group)
                                                                   for name, group in by_class.items()},
                         "meeting_factors": {name: meeting_factor(group) for name, group in by_class.items()}},
                   source=IN_RUN)
