"""Measured per-unit profiles: forward and backward time and memory of each unit kind, on the device at hand.

The analytical simulator prices a unit from its FLOPs and a fitted efficiency curve. A profile replaces
that guess with a measurement: the unit modules the runtime executes (:mod:`hetpart.runtime.models`) are
built at full size, one of each kind (embedding, one transformer block, head), and timed forward and
backward at each micro-batch size: CUDA events on a GPU, ``perf_counter`` on the CPU; warm-up first,
then the median of repeats, with the spread (min, max) kept beside it so that a reader can judge noise.
A repeat may be a block of calls (``block_s``): its mean then counts for one.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch

from hetpart.runtime.models import RunnableSpec, build_units, synthetic_batch

__all__ = ["UnitTiming", "profile_units", "device_name", "time_chain", "Meeting"]

_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class UnitTiming:
    """One unit kind at one micro-batch size, measured."""

    unit: str
    """Unit name (``embedding``, ``block_0``, ``head``)."""
    micro_batch: int
    seq_len: int
    precision: str
    """``fp32`` (TF32 off), ``tf32`` (fp32 storage, TF32 matrix products), ``bf16`` or ``fp16`` (weights and
    activations in that type, the matrix work of mixed-precision training)."""
    fwd_s: float
    """Median forward seconds."""
    bwd_s: float
    """Median backward seconds (input and weight gradients)."""
    fwd_range_s: tuple[float, float]
    bwd_range_s: tuple[float, float]
    peak_memory_gb: float | None
    """Peak allocated memory during forward + backward (GPU only; None on the CPU)."""
    repeats: int
    extra: dict[str, Any] = field(default_factory=dict)
    activation_gb: float | None = None
    """Bytes the forward saves for the backward (autograd's saved tensors, each storage once), GB."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def device_name(device: torch.device) -> str:
    """A readable name of ``device`` (the GPU's marketing name, or the CPU model)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


class _Clock:
    """Times one call: CUDA events on a GPU (the work is asynchronous), ``perf_counter`` on the CPU."""

    def __init__(self, device: torch.device):
        self.device = device

    def __call__(self, fn: Callable[[], Any]) -> float:
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            stream = torch.cuda.current_stream(self.device)  # the unit's device, whichever is current
            start.record(stream)
            fn()
            end.record(stream)
            torch.cuda.synchronize(self.device)
            return start.elapsed_time(end) / 1e3
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0


def _unit_input(spec: RunnableSpec, index: int, micro_batch: int, seq_len: int, device: torch.device,
                dtype: torch.dtype) -> torch.Tensor:
    if index == 0:
        tokens, _ = synthetic_batch(spec, micro_batch, seq_len)
        return tokens.to(device)
    hidden = spec.config.hidden_size
    gen = torch.Generator().manual_seed(index)
    x = torch.randn(micro_batch, seq_len, hidden, generator=gen).to(device=device, dtype=dtype)
    return x.requires_grad_(True)


def profile_units(spec: RunnableSpec, micro_batches: list[int], seq_len: int, precision: str = "bf16",
                  device: str | torch.device = "cpu", warmup: int = 3, repeats: int = 10,
                  block_index: int = 1, *, min_repeats: int | None = None, budget_s: float | None = None,
                  block_s: float | None = None,
                  on_timing: Callable[[UnitTiming], None] | None = None,
                  tick: Callable[[], None] | None = None) -> list[UnitTiming]:
    """Time the embedding, one block and the head of ``spec`` at each micro-batch size.

    Args:
        spec: a transformer (``spec.config`` set), at the size to measure (not shrunk).
        micro_batches: sequences per micro-batch to measure.
        seq_len: tokens per sequence.
        precision: ``fp32``, ``tf32``, ``bf16`` or ``fp16``.
        device: where to run (``cuda``, ``cuda:1``, ``cpu``).
        warmup, repeats: untimed and timed iterations per measurement; the median is reported.
        block_index: which unit stands for every block (they have the same shape).
        min_repeats, budget_s: with a budget, stop after ``min_repeats`` timed iterations (at least)
            once one measurement has spent ``budget_s`` seconds (large units on a CPU).
        block_s: each timed repeat runs as many calls as take about this long (from the warm-up) and
            counts their mean: on a shared CPU a short call's median misses the time slices the process
            waits for, a block's mean includes them as a training step does.
        on_timing: called with each :class:`UnitTiming` as soon as it is measured (progress).
        tick: called after every repeat (a run's heartbeat: measuring is progress, not a hang).

    Returns:
        One :class:`UnitTiming` per unit kind and micro-batch size.
    """
    if spec.config is None:
        raise ValueError("profile_units: a transformer spec is needed (python: models have no unit kinds)")
    if precision not in _DTYPES:
        raise ValueError(f"profile_units: precision {precision!r}; use one of {', '.join(_DTYPES)}")
    device = torch.device(device)
    dtype = _DTYPES[precision]
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        torch.backends.cudnn.allow_tf32 = precision == "tf32"
    indices = [0, block_index, spec.num_units - 1]
    units = build_units(spec, indices, device=device, dtype=dtype)
    clock = _Clock(device)
    if device.type == "cuda":
        _warm_gpu(units[1], spec, indices[1], max(micro_batches), seq_len, device, dtype)
    out = []
    floor = repeats if min_repeats is None else max(1, min(min_repeats, repeats))
    for index, unit in zip(indices, units):
        for b in micro_batches:
            timing = _time_unit(unit, spec, index, b, seq_len, device, dtype, clock, warmup, repeats, floor, budget_s,
                                block_s, tick)
            out.append(timing)
            if on_timing is not None:
                on_timing(timing)
    return out


GPU_WARMUP_S = 0.2
"""Seconds of a block's forward and backward a GPU runs before anything is timed: an idle GPU sits at a low clock
(an H200 read 345 MHz idle, 1,980 MHz under load) and the first unit timed would pay its climb. A choice, not a
fit: a tenth of a second is the order of a boost clock's climb, and this doubles it."""


def _warm_gpu(unit: torch.nn.Module, spec: RunnableSpec, index: int, micro_batch: int, seq_len: int,
              device: torch.device, dtype: torch.dtype) -> None:
    x = _unit_input(spec, index, micro_batch, seq_len, device, dtype)
    started = time.perf_counter()
    while time.perf_counter() - started < GPU_WARMUP_S:
        unit.zero_grad(set_to_none=True)
        y = unit(x)
        (y[0] if isinstance(y, tuple) else y).float().sum().backward()
        x.grad = None
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    unit.zero_grad(set_to_none=True)


def _time_unit(unit: torch.nn.Module, spec: RunnableSpec, index: int, micro_batch: int, seq_len: int,
               device: torch.device, dtype: torch.dtype, clock: _Clock, warmup: int, repeats: int,
               min_repeats: int | None = None, budget_s: float | None = None,
               block_s: float | None = None, tick: Callable[[], None] | None = None) -> UnitTiming:
    x = _unit_input(spec, index, micro_batch, seq_len, device, dtype)
    with torch.no_grad():
        grad = torch.randn_like(unit(x).float()).to(dtype) * 1e-3
    loss = _head_loss(spec, micro_batch, seq_len, device) if index == spec.num_units - 1 else None
    saved_gb = _saved_activation_gb(unit, x)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    fwd, bwd = [], []
    floor = repeats if min_repeats is None else min_repeats
    calls = 1
    started = time.perf_counter()
    for i in range(warmup + repeats):
        if budget_s is not None and len(fwd) >= floor and time.perf_counter() - started > budget_s:
            break
        f = b = 0.0
        for _ in range(calls if i >= warmup else 1):
            df, db = _call(unit, x, grad, clock, loss)
            f, b = f + df, b + db
        if tick is not None:
            tick()
        if i >= warmup:
            fwd.append(f / calls)
            bwd.append(b / calls)
        elif block_s:  # enough calls per repeat that each spans the scheduler's time slices
            calls = max(1, min(_MAX_CALLS, math.ceil(block_s / max(f + b, 1e-9))))
    peak = torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else None
    return UnitTiming(unit=unit.unit_name, micro_batch=micro_batch, seq_len=seq_len,
                      precision=_precision_name(dtype, device), fwd_s=statistics.median(fwd),
                      bwd_s=statistics.median(bwd), fwd_range_s=(min(fwd), max(fwd)), bwd_range_s=(min(bwd), max(bwd)),
                      peak_memory_gb=peak, repeats=len(fwd), activation_gb=saved_gb)


class Meeting:
    """The ranks of a run meeting after every repeat of :func:`time_chain` (gloo, the default group unless
    ``group``): each repeat starts after a barrier, and ends by gathering every member's seconds, whose slowest a
    collective after that compute waits for. Every rank of the group must time the chain at the same time, with
    the same ``repeats``: each call below is one collective of the group."""

    def __init__(self, group: Any = None) -> None:
        self.group = group

    def start(self) -> None:
        import torch.distributed as dist

        dist.barrier(group=self.group)

    def seconds(self, mine: float) -> list[float]:
        """Every member's ``mine``, in group rank order."""
        import torch.distributed as dist

        out = [torch.zeros(1, dtype=torch.float64) for _ in range(dist.get_world_size(self.group))]
        dist.all_gather(out, torch.tensor([mine], dtype=torch.float64), group=self.group)
        return [float(t.item()) for t in out]


def time_chain(spec: RunnableSpec, micro_batch: int, seq_len: int, device: str | torch.device = "cpu",
               repeats: int = 10, block_s: float | None = None,
               tick: Callable[[], None] | None = None, meeting: Meeting | None = None,
               met: dict[str, float] | None = None) -> tuple[float, float]:
    """Forward (with the loss) and backward seconds of every unit of ``spec`` run back to back in one autograd
    graph, as a one-stage step runs them (fp32, median of ``repeats``; ``block_s`` as :func:`profile_units`).

    The units' own timings (:func:`profile_units`) run each unit alone, its inputs and weights warm in the
    caches; in a step each unit finds what the units before it left there. On this CPU (tiny gpt2-small, quiet)
    the 14 units alone summed 16.7 ms against 20.5 ms back to back. :func:`hetpart.runtime.calibrate.profile_from_samples`
    scales the units' times by the ratio.

    With a ``meeting`` every repeat starts with the run's other ranks and ends by gathering their times; ``met``
    then receives :func:`_met`'s ``own_s``, ``slowest_s``, ``typical_s`` and ``ranks``."""
    from hetpart.runtime.engine import loss_fn_for

    device = torch.device(device)
    units = build_units(spec, range(spec.num_units), device=device, dtype=torch.float32)
    tokens, targets = synthetic_batch(spec, micro_batch, seq_len)
    tokens, targets, loss_fn = tokens.to(device), targets.to(device), loss_fn_for(spec, 1.0)
    clock = _Clock(device)

    def once() -> tuple[float, float]:
        for u in units:
            u.zero_grad(set_to_none=True)
        holder: dict[str, torch.Tensor] = {}

        def forward() -> None:
            x = tokens
            for u in units:
                x = u(x)
            holder["loss"] = loss_fn(x, targets)
        return clock(forward), clock(lambda: holder["loss"].backward())

    f, b = once()  # warm-up; it also sizes the blocks
    calls = max(1, min(_MAX_CALLS, math.ceil(block_s / max(f + b, 1e-9)))) if block_s else 1
    if meeting is not None:  # every rank runs as many calls per repeat: the most any of them asked for
        calls = int(round(max(meeting.seconds(float(calls)))))
    fwd, bwd, everyone = [], [], []
    for _ in range(repeats):
        if meeting is not None:
            meeting.start()
        parts = [once() for _ in range(calls)]
        fwd.append(sum(p[0] for p in parts) / calls)
        bwd.append(sum(p[1] for p in parts) / calls)
        if meeting is not None:
            everyone.append(meeting.seconds(fwd[-1] + bwd[-1]))
        if tick is not None:
            tick()
    if meeting is not None and met is not None:
        met.update(_met(fwd, bwd, everyone))
    return statistics.median(fwd), statistics.median(bwd)


def _met(fwd: list[float], bwd: list[float], everyone: list[list[float]]) -> dict[str, float]:
    """What a meeting of :func:`time_chain` measured (``everyone``: per repeat, every member's seconds of one
    forward and backward): this rank's median, the median over repeats of the slowest member's and of the
    members' median (the same on every member), and the members' count."""
    return {"own_s": statistics.median(f + b for f, b in zip(fwd, bwd)),
            "slowest_s": statistics.median(max(row) for row in everyone),
            "typical_s": statistics.median(statistics.median(row) for row in everyone),
            "ranks": len(everyone[0]) if everyone else 0}


def _head_loss(spec: RunnableSpec, micro_batch: int, seq_len: int, device: torch.device):
    """The loss a training step computes on the head's output (:func:`hetpart.runtime.engine.loss_fn_for`: token
    cross-entropy in fp32 over the vocabulary), on the synthetic batch's targets: the head is timed with it, as a
    step runs it. Without it the head's profile left out the loss's softmax over the vocabulary, forward and
    backward: on this CPU's tiny gpt2-small the isolated head took 0.49/0.95 ms against 0.77/3.17 ms inside a
    step's chain, and the runtime's prediction of a one-A100 run was 27-32% fast on a quiet machine."""
    from hetpart.runtime.engine import loss_fn_for

    _, targets = synthetic_batch(spec, micro_batch, seq_len)
    targets, base = targets.to(device), loss_fn_for(spec, 1.0)
    return lambda out: base(out, targets)


def _call(unit: torch.nn.Module, x: torch.Tensor, grad: torch.Tensor, clock: _Clock,
          loss: Callable[[torch.Tensor], torch.Tensor] | None = None) -> tuple[float, float]:
    """One forward and one backward of ``unit``, timed (with ``loss``: the loss on its output, and its backward)."""
    unit.zero_grad(set_to_none=True)
    holder: dict[str, torch.Tensor] = {}
    if loss is None:
        f = clock(lambda: holder.__setitem__("y", unit(x)))
        b = clock(lambda: holder["y"].backward(grad))
    else:
        f = clock(lambda: holder.__setitem__("y", loss(unit(x))))
        b = clock(lambda: holder["y"].backward())
    if x.grad is not None:
        x.grad = None
    return f, b


_MAX_CALLS = 64


def _saved_activation_gb(unit: torch.nn.Module, x: torch.Tensor) -> float:
    """GB the forward of ``unit`` on ``x`` saves for its backward: every tensor autograd packs, each
    storage counted once (views of one buffer share it); parameters excluded.

    The pack hook keeps each saved storage alive until the forward ends (so that no address is reused and
    counted twice) through a detached alias. The tensor itself would close a cycle when an operator saves
    its own output (tanh, attention): node -> packed tensor -> its ``grad_fn`` -> node, held in C++ where
    Python's collector never sees it (torch's ``saved_tensors_hooks`` warns of it). That cycle kept what the
    forward computed up to its last such output, and the profiled unit's parameters, alive for the whole
    run (:mod:`hetpart.runtime.worker` profiles before its steps): on a 2-stage gpt2-small (h=256,
    micro-batch 4, seq 128) 10.5 MB on each rank, counted in every step's peak."""
    params = {p.untyped_storage().data_ptr() for p in unit.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in params:
            seen[ptr] = max(seen.get(ptr, 0), storage.nbytes())
        return t.detach()

    inp = x.detach().requires_grad_(x.is_floating_point())
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        unit(inp)
    unit.zero_grad(set_to_none=True)
    return sum(seen.values()) / 1e9


def _precision_name(dtype: torch.dtype, device: torch.device) -> str:
    if dtype == torch.float32:
        tf32 = device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32
        return "tf32" if tf32 else "fp32"
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
