"""The per-rank execution engine: one training step of a plan with torch.distributed.

Each process builds an :class:`Executor` for its rank. The executor builds the units of its
stage(s) (:mod:`hetpart.runtime.models`), splits attention and MLP across the stage's TP group with
``torch.distributed.tensor.parallel`` on a ``DeviceMesh`` of those ranks, wraps each stage in a
``torch.distributed.pipelining.PipelineStage`` on its pipeline lane, and runs the plan's schedule
(``ScheduleGPipe``, ``Schedule1F1B`` or ``ScheduleInterleaved1F1B``).

Exact data parallelism with uneven shares: replica ``r`` processes ``n_r`` of the ``G`` sequences in
micro-batches of ``b``; each micro-batch's mean loss is scaled by ``b / G`` (and the schedule does not
rescale), so a replica's gradient is ``n_r / G`` times its mean and the sum over replicas, done among
the ranks holding each unit (:mod:`hetpart.runtime.groups`; the units a set of ranks shares go in
one flat all-reduce of up to 25 MiB, as DDP's buckets), is the gradient of the global mean loss.
Then Adam steps.

Example (in every process of a torchrun job whose world size is ``plan.num_devices``)::

    ex = Executor(plan, runnable_spec("gpt2-small", "tiny"), rank, world_size)
    for step in range(3):
        result = ex.step(step)          # StepResult(loss=..., timing=StepTiming(...), ...)
"""

from __future__ import annotations

import math
import os
import resource
import statistics
import time
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from hetpart.errors import PlanError, RuntimeFault
from hetpart.plan import Plan
from hetpart.runtime.dist_optimizer import uses_sharded_adam
from hetpart.runtime.groups import (DEFAULT_BUCKET_CAP, CommLayout, FanOut, ProcessGroups, RankRole, comm_layout,
                                    fuse_buckets)
from hetpart.runtime.local_adam import LocalShardAdam
from hetpart.runtime.models import ParamInfo, RunnableSpec, UnitModel, build_units, synthetic_batch, unit_infos

__all__ = ["Hooks", "NoHooks", "StepTiming", "StepResult", "LocalGrad", "Executor", "check_runnable", "require_runnable",
           "loss_fn_for", "parallelize_for_timing", "TP_ENGINES"]


class Hooks(Protocol):
    """Callbacks for emulation and measurement (the emulator sleeps in them to slow a rank down)."""

    def on_compute(self, stage_index: int, kind: Literal["fwd", "bwd", "loss"], seconds: float) -> None:
        """After a stage computed one micro-batch's forward or backward (``seconds`` measured, hook time of
        tensor-parallel all-reduces excluded), or the last stage the loss of one micro-batch (``"loss"``)."""

    def on_send(self, num_bytes: int, peer_rank: int) -> None:
        """Before a pipeline send of ``num_bytes`` to global rank ``peer_rank``."""

    def on_collective(self, kind: str, num_bytes: int, group_ranks: tuple[int, ...]) -> None:
        """A collective among the global ranks ``group_ranks``, called right after it: ``"all_reduce"`` of a
        gradient bucket, or ``"tp_all_reduce"`` of tensor parallelism (from
        inside the compute: the output of each row-parallel linear in the forward, the input gradient
        of each column-parallel linear in the backward), or a sharding level's ``"reduce_scatter"`` /
        ``"all_gather"`` of a unit's whole buffer (FSDP2's, :mod:`hetpart.runtime.sharded`, some from inside
        the compute, booked as communication; the distributed optimizer's, padded) and, under hybrid
        sharding, the ``"all_reduce"`` of a shard across the shard groups. The step-loss all-reduce is not
        reported."""

    def on_tp_sync(self, work_s: float) -> None:
        """Optional: right before a tensor-parallel all-reduce of an uneven stage, inside the compute,
        with the wall seconds this rank computed since the last one (waiting excluded): an emulated slow
        rank sleeps here, so that its peers wait for it at the all-reduce, as for a slow device."""


class NoHooks:
    """Hooks that do nothing (a run at this machine's own speed)."""

    def on_compute(self, stage_index: int, kind: str, seconds: float) -> None:
        return None

    def on_send(self, num_bytes: int, peer_rank: int) -> None:
        return None

    def on_collective(self, kind: str, num_bytes: int, group_ranks: tuple[int, ...]) -> None:
        return None


@dataclass(frozen=True)
class StepTiming:
    """Where one rank's step time went, in seconds (hook time included where the hook is called)."""

    step_s: float
    """Wall time of the step on this rank."""
    compute_s: float
    """Forward, backward and loss compute of every micro-batch (+ on_compute hook time)."""
    comm_s: float
    """Gradient all-reduces, pipeline send issue and all on_send/on_collective hook time (tensor-parallel
    all-reduces themselves run inside the compute and count there; their hook time counts here)."""
    optimizer_s: float
    """Adam step."""
    idle_s: float
    """The rest: waiting for activations/gradients from neighbours (pipeline bubbles, p2p transfer)."""
    fwd_s: float
    """Forward part of compute_s (loss included)."""
    bwd_s: float
    """Backward part of compute_s."""


@dataclass(frozen=True)
class StepResult:
    """The outcome of one step on one rank."""

    step: int
    loss: float
    """Global mean loss of the step (same on every rank; NaN when not synchronised)."""
    timing: StepTiming
    peak_memory_bytes: int
    """Peak memory during the step (see ``memory_source``)."""
    memory_source: str
    """``cuda_max_allocated`` (torch's allocator peak on this rank's GPU) or ``rss_peak_delta`` (on CPU:
    the process's peak resident set during the step, reset before it via /proc/self/clear_refs, minus the
    resident set at its start) or ``rss_peak_since_start`` (where the peak cannot be reset)."""
    tokens: int
    """Tokens of the whole step (global batch x sequence length)."""


@dataclass(frozen=True)
class LocalGrad:
    """A gradient as this rank holds it (a shard under tensor parallelism)."""

    grad: torch.Tensor
    tp: int
    tp_index: int
    tp_dim: int | None
    """Dimension split across the TP group, None when the rank holds the whole tensor."""
    offset: int | None = None
    """Where this rank's slice starts along ``tp_dim`` under an uneven split (None: ``torch.chunk``'s)."""

    def of(self, full: torch.Tensor) -> torch.Tensor:
        """This rank's part of the whole tensor ``full`` (the reference's gradient, say)."""
        if self.tp_dim is None:
            return full
        if self.offset is None:
            return full.chunk(self.tp, self.tp_dim)[self.tp_index]
        return full.narrow(self.tp_dim, self.offset, self.grad.shape[self.tp_dim])


@dataclass
class _Clock:
    fwd: float = 0.0
    bwd: float = 0.0
    comm: float = 0.0
    tp_hooks: float = 0.0
    """Communication inside compute chunks, taken out of their compute: on_collective hooks of
    tensor-parallel all-reduces, and level-2 gradient reduce-scatters that run (with their hooks) from
    inside the backward (:meth:`communicated`)."""
    in_chunk: bool = False
    segment_start: float = 0.0
    """When this rank's compute since its last uneven-TP all-reduce (or since the chunk began) started."""
    """True while a stage computes a micro-batch (the one-off shape inference of the first step is not
    reported to the hooks)."""

    def reset(self) -> None:
        self.fwd = self.bwd = self.comm = self.tp_hooks = 0.0

    def communicated(self, seconds: float) -> None:
        """Book ``seconds`` of communication. Inside a compute chunk (a collective run from a backward hook)
        they are not compute: :meth:`chunk` moves them to ``comm``, and the hooks' ``on_compute`` (an
        emulated slow device's sleep, proportional to its compute) never sees them."""
        if self.in_chunk:
            self.tp_hooks += seconds
        else:
            self.comm += seconds

    def chunk(self, kind: str, stage_index: int, start: float, tp_before: float, hooks: "Hooks") -> None:
        """Book a compute chunk: TP hook time is communication, the rest is compute (+ its hook)."""
        tp = self.tp_hooks - tp_before
        compute = time.perf_counter() - start - tp
        hook_start = time.perf_counter()
        hooks.on_compute(stage_index, kind, compute)
        compute += time.perf_counter() - hook_start
        self.comm += tp
        if kind in ("fwd", "loss"):
            self.fwd += compute
        else:
            self.bwd += compute


def loss_fn_for(spec: RunnableSpec, scale: float):
    """The per-micro-batch loss: token cross-entropy (``python:`` models: mean square), times ``scale``."""
    if spec.config is not None:
        def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(logits.float().flatten(0, -2), targets.flatten()) * scale
    else:
        def loss(out: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            return F.mse_loss(out.float(), targets.float()) * scale
    return loss


def check_runnable(plan: Plan, spec: RunnableSpec) -> list[str]:
    """The runtime's rules (:mod:`hetpart.rules`) for the model that RUNS (empty when the plan can run).

    :meth:`Plan.validate` checks them against the full-size model; the shrunken model that runs has
    its own sizes (heads raised to a multiple of the plan's TP degrees) and positions."""
    from hetpart.rules import RULES, schedule_problems

    out = []
    if plan.seq_len > (spec.config.max_positions if spec.config and spec.config.learned_positions else 10**9):
        out.append(f"seq_len: {plan.seq_len} exceeds the {spec.config.max_positions} positions of the model that "
                   "runs; shrink the sequence (scaled_seq_len) or the plan")
    sizes = None
    if spec.config is not None:
        cfg = spec.config
        sizes = {"attention heads": cfg.num_heads, "MLP width": cfg.ffn}
        if cfg.kv_heads != cfg.num_heads:
            sizes["key/value heads"] = cfg.kv_heads
    out += schedule_problems(plan)
    from hetpart.runtime.sharded import sharding_problems

    out += sharding_problems(plan)
    for i, r in enumerate(plan.replicas):
        for tp in sorted({s.tp for s in r.stages}):
            if tp > RULES.max_tp_without_transformer and sizes is None:
                out.append(f"replicas[{i}]: tp {tp} needs a transformer; python: models run with tp 1")
            split = [s.tp_split for s in r.stages if s.tp == tp and s.tp_split is not None]
            for what, n in (sizes or {}).items():
                given = split and ((what != "MLP width" and split[0].heads) or (what == "MLP width" and split[0].ffn))
                if tp > 1 and n % tp and not given:
                    out.append(f"replicas[{i}]: tp {tp} does not divide the {n} {what} of the model that runs")
        for j, s in enumerate(r.stages):
            if s.tp_split is not None and spec.config is not None:
                out += _split_problems(s, spec.config, f"replicas[{i}].stages[{j}]")
    return out


def _split_problems(stage, cfg, where: str) -> list[str]:
    """An uneven split must add up to the sizes of the model that runs, in whole key/value groups."""
    out = []
    group = cfg.num_heads // cfg.kv_heads
    for dim, total in (("heads", cfg.num_heads), ("ffn", cfg.ffn), ("vocab", cfg.vocab_size)):
        parts = getattr(stage.tp_split, dim)
        if parts and (len(parts) != stage.tp or sum(parts) != total or min(parts) <= 0
                      or (dim == "heads" and any(p % group for p in parts))):
            out.append(f"{where}.tp_split.{dim}: {list(parts)} does not split the {total} {dim} of the model that "
                       f"runs into {stage.tp} positive shares" + (f" of whole groups of {group}" if dim == "heads" else ""))
    return out


def require_runnable(plan: Plan, spec: RunnableSpec, source: str = "plan") -> None:
    """Raise :class:`PlanError` with the first rule of :func:`check_runnable` that ``plan`` breaks."""
    problems = check_runnable(plan, spec)
    if problems:
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        raise PlanError(f"{source}: {problems[0]}{more}")


class _TimedStage:
    """Factory for a PipelineStage subclass that times compute and reports sends to the hooks.

    With a :class:`~hetpart.runtime.groups.FanOut` (the replica's stages differ in TP degree), the
    stage sends its activation to every rank of the next stage that receives from it, and its input
    gradient to every rank of the previous stage that does (instead of torch's one peer per stage):
    the sends of each step (retargeted here) and the one-off ones of the shape inference and the
    warm-up vote (:class:`hetpart._torch_compat.PipelineFanOut`). Receives stay torch's, from
    ``stage_index_to_group_rank`` (this rank's path).
    """

    @staticmethod
    def make(module: nn.Module, stage_index: int, num_stages: int, device: torch.device, group: Any,
             clock: _Clock, hooks: Hooks, fanout: FanOut | None = None, own_group: Any = None):
        from torch.distributed.pipelining import PipelineStage

        from hetpart._torch_compat import PipelineFanOut, adopt_pipeline_group

        class TimedStage(PipelineFanOut, PipelineStage):
            def _timed(self, kind: str, run, *args, **kwargs):
                start, tp = time.perf_counter(), clock.tp_hooks
                clock.in_chunk, clock.segment_start = True, start
                try:
                    out = run(*args, **kwargs)
                finally:
                    clock.in_chunk = False
                clock.chunk(kind, self.stage_index, start, tp, hooks)
                return out

            def forward_one_chunk(self, *args, **kwargs):
                return self._timed("fwd", super().forward_one_chunk, *args, **kwargs)

            def backward_one_chunk(self, *args, **kwargs):
                return self._timed("bwd", super().backward_one_chunk, *args, **kwargs)

            def get_fwd_send_ops(self, chunk: int):
                ops = super().get_fwd_send_ops(chunk)
                return _report_sends(_retarget(ops, fanout.forward) if fanout else ops, clock, hooks)

            def get_bwd_send_ops(self, chunk: int):
                ops = super().get_bwd_send_ops(chunk)
                return _report_sends(_retarget(ops, fanout.backward) if fanout else ops, clock, hooks)

        if fanout is None:
            return TimedStage(module, stage_index, num_stages, device, group=group)
        # A replica whose stages differ in TP has more ranks than stages, and an explicit map (set by
        # the executor): build the stage on this rank alone, then hand it the replica's group.
        stage = TimedStage(module, stage_index, num_stages, device, group=own_group)
        adopt_pipeline_group(stage, group)
        stage.fan_forward, stage.fan_backward = fanout.forward, fanout.backward
        return stage


def _retarget(ops: list, peers: tuple[int, ...]) -> list:
    """Torch's send ops (to its one peer) as the same sends to each of ``peers`` (global ranks)."""
    return [dist.P2POp(op.op, op.tensor, peer, op.group, op.tag) for op in ops for peer in peers]


def _report_sends(ops: list, clock: _Clock, hooks: Hooks) -> list:
    start = time.perf_counter()
    for op in ops:
        hooks.on_send(op.tensor.numel() * op.tensor.element_size(), op.peer)
    clock.comm += time.perf_counter() - start
    return ops


class _StageModule(nn.Module):
    """The units of one stage, run in order."""

    def __init__(self, units: list[UnitModel]):
        super().__init__()
        self.units = nn.ModuleList(units)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for unit in self.units:
            x = unit(x)
        return x


def _local(t: torch.Tensor) -> torch.Tensor:
    from hetpart._torch_compat import local_tensor

    return local_tensor(t)


class Executor:
    """Runs this rank's part of ``plan`` (see the module docstring).

    Args:
        plan: the plan; ``plan.seq_len`` is the sequence length that runs (shrink it for small models).
        model_spec: what to build (:func:`hetpart.runtime.models.runnable_spec`).
        rank: this process's rank; rank ``r`` runs ``plan.devices[r]``.
        world_size: must equal ``plan.num_devices``.
        device: torch device of this rank (default: ``cuda:LOCAL_RANK`` when CUDA is present, else CPU).
        hooks: emulation/measurement callbacks (:class:`Hooks`).
        lr: Adam learning rate.
        dtype: parameter and activation dtype (fp32 by default: CPU bf16 matmuls are slow and inexact).
        comm_timeout_s: timeout of the plan's process groups (pipeline, TP, gradient buckets).
        bucket_cap: the most gradient elements per data-parallel all-reduce (fused buckets).

    The default process group must be initialised (torchrun + ``dist.init_process_group``).
    """

    def __init__(self, plan: Plan, model_spec: RunnableSpec, rank: int, world_size: int, *,
                 device: torch.device | str | None = None, hooks: Hooks | None = None, lr: float = 1e-3,
                 dtype: torch.dtype = torch.float32, comm_timeout_s: float = 600.0,
                 bucket_cap: int = DEFAULT_BUCKET_CAP):
        if not dist.is_initialized():
            raise RuntimeFault("runtime: torch.distributed is not initialised; start the ranks with torchrun "
                               "(hetpart run) and call init_process_group first")
        if world_size != plan.num_devices or dist.get_world_size() != world_size:
            raise RuntimeFault(f"runtime: the plan has {plan.num_devices} devices but the job has "
                               f"{dist.get_world_size()} processes; start one process per device")
        require_runnable(plan, model_spec)
        self.plan, self.spec, self.rank, self.world_size = plan, model_spec, rank, world_size
        self.device = torch.device(device) if device is not None else _default_device()
        self.hooks: Hooks = hooks or NoHooks()
        self.dtype = dtype
        self.clock = _Clock()
        self.infos = unit_infos(model_spec)
        self._param_info = {p.key: p for u in self.infos for p in u.params}
        if len(self.infos) != _plan_units(plan):
            raise PlanError(f"plan: covers {_plan_units(plan)} units but {model_spec.name} has {len(self.infos)}; "
                            "plan and model must match")
        self.layout: CommLayout = comm_layout(plan, self.infos)
        self.role: RankRole = self.layout.roles[rank]
        self.groups = ProcessGroups(self.layout, _all_cuda_ids(self.device), comm_timeout_s)
        self.dp_tp_mesh = None
        self.stage_modules = self._build_stage_modules()
        self.sharded_keys: set[str] = set()
        # levels 1-2 with uneven shard fractions: the sharded keys' Adam (hetpart.runtime.dist_optimizer)
        self.dist_optimizer = None
        self.sharded_reports = None
        """Level 1 on FSDP2: the step's deferred reduce-scatter reports (:class:`hetpart.runtime.sharded.Level1Reports`)."""
        if self.device.type != "cpu":
            # on a CPU device host memory is the device's: an offloaded plan runs as it is (FSDP2's offload policy
            # included); on an accelerator only what FSDP2's CPUOffloadPolicy does is real (hetpart.rules says
            # which; hetpart run refuses the same before any process starts)
            from hetpart.rules import accelerator_problems

            problems = accelerator_problems(plan)
            if problems:
                raise PlanError(problems[0])
        if plan.zero and not uses_sharded_adam(plan):
            from hetpart.runtime.sharded import apply_sharding

            self.sharded_keys = apply_sharding(self)  # FSDP2 reduce-scatters these; the buckets keep the rest
        self.params = self._canonical_params()
        if uses_sharded_adam(plan):
            from hetpart.runtime.dist_optimizer import ShardedAdam
            from hetpart.runtime.sharded import shardable_keys

            self.sharded_keys = shardable_keys(self)
            self.dist_optimizer = ShardedAdam(self, self.sharded_keys, lr=lr)
        self.grad_buckets = fuse_buckets(self._unsharded_buckets(), self._sync_numel, bucket_cap)
        self._flat_buffers: dict[int, torch.Tensor] = {}
        self.schedule, self.schedule_used = self._build_schedule()
        rest = [p for k, p in self.params.items() if self.dist_optimizer is None or k not in self.sharded_keys]
        # DTensor parameters (FSDP2's shards, TP's splits) step on their local shards: the same update without
        # DTensor's dispatch per operation (hetpart.runtime.local_adam)
        self.optimizer = LocalShardAdam(rest or [torch.zeros(0, requires_grad=True)], lr=lr)

    # ------------------------------------------------------------------------------- building
    @property
    def replica(self) -> int:
        return self.role.replica

    @property
    def pp(self) -> int:
        r = self.plan.replicas[self.replica]
        return r.pp // self.plan.chunks_per_device

    @property
    def lane(self) -> tuple[int, ...]:
        """Global ranks of this rank's pipeline lane, one per device group (stage ``k`` runs on
        ``lane[k % pp]``; with the interleaved schedule a replica has ``pp * interleave`` stages).
        Where stages differ in TP degree: the rank it receives from at each stage (its path)."""
        return self.layout.paths[self.rank]

    def stage_rank(self, stage_index: int) -> int:
        """The global rank that runs stage ``stage_index`` of this rank's lane (a neighbour's rank)."""
        return self.lane[stage_index % len(self.lane)]

    def _build_stage_modules(self) -> list[_StageModule]:
        stages = self.plan.replicas[self.replica].stages
        built = {}
        for j in self.role.stages:
            units = build_units(self.spec, range(*stages[j].layers), self.device, self.dtype)
            for unit in units:
                unit.set_recompute(self.plan.recompute)
            built[j] = _StageModule(units)
        self._tie_local(built)
        self._slices: dict[str, tuple[int, int, int]] = {}
        """Canonical key -> (dim, offset, length) of this rank's slice under an uneven split."""
        self._vocab_loss: tuple[int, Any] | None = None
        """(offset of this rank's vocabulary rows, TP group) where its last stage's head is vocabulary-split."""
        if self.role.tp > 1:
            uneven = {j for j in built if stages[j].tp_split is not None}
            ranks = self.layout.tp_groups[(self.replica, self.role.stages[0] % self.pp)]
            reporter = _TPReporter(ranks, self.hooks, self.clock)
            if len(uneven) < len(built):
                mesh, _ = self._tp_mesh()
                if self.plan.zero and not uses_sharded_adam(self.plan):  # FSDP2 composes with TP on one 2-D (dp, tp) mesh, as torchtitan builds it
                    from hetpart.runtime.sharded import dp_tp_mesh

                    self.dp_tp_mesh = dp_tp_mesh(self)
                    if self.dp_tp_mesh is not None:
                        mesh = self.dp_tp_mesh["tp"]
                for j, module in built.items():
                    if j not in uneven:
                        _parallelize(module, mesh, reporter)
            if uneven:
                from hetpart.runtime.uneven_tp import parallelize_uneven, parallelize_vocab, runtime_split

                group = self.groups.group(ranks)
                for j in sorted(uneven):
                    split = runtime_split(stages[j].tp_split, self.spec.config, self.role.tp)
                    self._slices.update(parallelize_uneven(built[j].units, split, self.role.tp_index,
                                                           self.spec.config, group, reporter))
                    self._slices.update(parallelize_vocab(built[j].units, split, self.role.tp_index, group, reporter))
                    if split.vocab and j == len(stages) - 1:
                        self._vocab_loss = (split.offset("vocab", self.role.tp_index), group)
                self._tie_local(built)  # a tied head shares its embedding's new slice
        return [built[j] for j in self.role.stages]

    def _tie_local(self, built: dict[int, _StageModule]) -> None:
        """A rank holding a tied weight's owner and its copy uses one tensor (as the reference does)."""
        owners = {}
        for module in built.values():
            for unit in module.units:
                for local, key in unit.canonical_names().items():
                    if local.removeprefix("body.") not in unit.tied:
                        owners[key] = unit.get_parameter(local)
        for module in built.values():
            for unit in module.units:
                for short, key in unit.tied.items():
                    if key in owners:
                        parent, _, leaf = f"body.{short}".rpartition(".")
                        setattr(unit.get_submodule(parent), leaf, owners[key])

    def _tp_mesh(self):
        from torch.distributed.device_mesh import DeviceMesh

        ranks = self.layout.tp_groups[(self.replica, self.role.stages[0] % self.pp)]
        return DeviceMesh.from_group(self.groups.group(ranks), self.device.type), ranks

    def _canonical_params(self) -> dict[str, nn.Parameter]:
        out: dict[str, nn.Parameter] = {}
        for module in self.stage_modules:
            for unit in module.units:
                for local, key in unit.canonical_names().items():
                    out.setdefault(key, unit.get_parameter(local))
        return out

    def _unsharded_buckets(self) -> list:
        """The gradient buckets without the keys FSDP reduces (the same on every rank: a key is sharded
        exactly where its bucket has two or more members and is no tied weight)."""
        if not self.plan.zero:
            return list(self.layout.buckets)
        from hetpart.runtime.sharded import _tied_keys

        tied = _tied_keys(self)
        out = []
        for b in self.layout.buckets:
            keys = tuple(k for k in b.keys if k in tied)
            if keys:
                out.append(replace(b, keys=keys))
        return out

    @property
    def microbatches_run(self) -> int:
        """Micro-batches this rank's replica runs per step (:func:`hetpart.costmodel.sharding.microbatches_run`:
        at sharding levels 2-3, zero-weighted padding up to the shard group's largest count)."""
        from hetpart.costmodel.sharding import microbatches_run

        return microbatches_run(self.plan, self.replica)

    def _build_schedule(self):
        from torch.distributed.pipelining import ScheduleGPipe, Schedule1F1B, ScheduleInterleaved1F1B

        lane = self.lane
        order = list(self.layout.p2p_groups[self.rank])
        group = self.groups.group(order)
        num_stages = self.plan.replicas[self.replica].pp
        fanout = self.layout.fanouts.get(self.rank)
        stages = []
        for j, module in zip(self.role.stages, self.stage_modules):
            stage = _TimedStage.make(module, j, num_stages, self.device, group, self.clock, self.hooks, fanout,
                                     self.groups.group((self.rank,)) if fanout is not None else None)
            stages.append(stage)
        m = self.microbatches_run
        scale = self.plan.micro_batch / self.plan.global_batch
        if self._vocab_loss is not None:
            from hetpart.runtime.uneven_tp import vocab_parallel_loss

            base = vocab_parallel_loss(scale, *self._vocab_loss)
        else:
            base = loss_fn_for(self.spec, scale)
        loss = self._timed_loss(self._padded(base))
        kind = self.plan.schedule
        if kind == "1f1b" and m < num_stages:
            kind = "gpipe"  # torch's 1F1B needs >= pp micro-batches; GPipe computes the same step
        if kind == "interleaved" and num_stages > 1:
            if fanout is not None:
                raise RuntimeFault("runtime: the interleaved schedule needs one TP degree for every stage of a "
                                   "replica (hetpart.rules); use gpipe or 1f1b")
            if order != list(lane):
                raise RuntimeFault("runtime: interleaved lanes must run on increasing ranks; order plan devices by "
                                   "stage")
            schedule = ScheduleInterleaved1F1B(stages, m, loss_fn=loss, scale_grads=False)
        else:
            kind = "gpipe" if kind == "interleaved" else kind
            cls = ScheduleGPipe if kind == "gpipe" else Schedule1F1B
            schedule = cls(stages[0], m, loss_fn=loss, scale_grads=False)
            # Map stage index -> rank within the (sorted) lane group explicitly.
            stages[0].stage_index_to_group_rank = {j: order.index(lane[j]) for j in range(num_stages)}
        self._stages = stages
        return schedule, kind

    def _padded(self, loss):
        """Padding micro-batches (past the replica's own count) weigh nothing: their loss times 0."""
        real = self.plan.num_microbatches(self.replica)
        if self.microbatches_run == real:
            return loss
        self._loss_calls = 0

        def weighted(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            value = loss(out, target)
            if not self._schedule_ready():
                return value  # the first step's one-off shape inference, not a micro-batch
            self._loss_calls += 1
            return value if self._loss_calls <= real else value * 0.0
        return weighted

    def _timed_loss(self, loss):
        def timed(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            start = time.perf_counter()
            value = loss(out, target)
            if self._schedule_ready():  # not the one-off shape inference of the first step
                self.clock.chunk("loss", self.role.stages[-1], start, self.clock.tp_hooks, self.hooks)
            return value
        return timed

    def _schedule_ready(self) -> bool:
        schedule = getattr(self, "schedule", None)
        flags = [getattr(schedule, n, True) for n in ("_stage_backward_initialized", "_stages_backward_initialized")]
        return schedule is not None and all(flags)

    # ------------------------------------------------------------------------------- one step
    def replica_rows(self) -> tuple[int, int]:
        """Rows ``[first, last)`` of the global batch that this rank's replica processes."""
        samples = self.plan.replica_samples()
        first = sum(samples[: self.replica])
        return first, first + samples[self.replica]

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This replica's ``(inputs, targets)`` of the deterministic global batch of ``step``."""
        inputs, targets = synthetic_batch(self.spec, self.plan.global_batch, self.plan.seq_len, step)
        first, last = self.replica_rows()
        rows = torch.arange(first, last)
        padded = self.microbatches_run * self.plan.micro_batch
        if padded > len(rows):  # padding micro-batches repeat real rows; their loss weighs 0 (_padded)
            rows = rows[torch.arange(padded) % len(rows)]
        return inputs[rows].to(self.device), targets[rows].to(self.device)

    def forward_backward(self, step: int) -> float:
        """Run every micro-batch of this rank's replica; return this rank's share of the global loss
        (its scaled micro-batch losses summed where it runs the last stage on TP lane 0, else 0)."""
        for p in self.params.values():
            p.grad = None
        self._loss_calls = 0
        inputs, targets = self.batch(step)
        holds_first = 0 in self.role.stages
        holds_last = self.plan.replicas[self.replica].pp - 1 in self.role.stages
        losses: list[torch.Tensor] = []
        args = (inputs,) if holds_first else ()
        fsdp2 = self.plan.zero == 2 and self.dist_optimizer is None
        if fsdp2:
            from hetpart.runtime.sharded import keep_gathered

            keep_gathered(self, True)
        if self.dist_optimizer is not None:
            self.dist_optimizer.start_step()
        self.schedule.step(*args, target=targets if holds_last else None, losses=losses if holds_last else None,
                           return_outputs=False)
        if fsdp2:
            keep_gathered(self, False)
        if holds_last and self.role.tp_index == 0:
            return float(sum(loss.detach().float().item() for loss in losses))
        return 0.0

    def _sync_numel(self, key: str) -> int:
        """Elements of ``key``'s whole gradient (what sizes the buckets: the same on every rank)."""
        return math.prod(self._param_info[key].shape)

    def sync_gradients(self) -> None:
        """All-reduce (sum) every fused gradient bucket this rank belongs to, in the global order (then the
        uneven shards' reduce-scatters, :meth:`ShardedAdam.finish_backward`). At level 1 on FSDP2, the
        reduce-scatters its last backward ran are reported first, one per run of units held alike."""
        if self.sharded_reports is not None:
            self.sharded_reports.flush()
        self._all_reduce_buckets()
        if self.dist_optimizer is not None:
            self.dist_optimizer.finish_backward()

    def _all_reduce_buckets(self, *, reduce: bool = True) -> None:
        """``reduce=False``: the same host work without the all-reduces (:meth:`host_work_s`)."""
        for index, bucket in enumerate(self.grad_buckets):
            if self.rank not in bucket.ranks:
                continue
            tensors = [self._grad_for_sync(k, bucket.full) for k in bucket.keys]
            flat = self._bucket_buffer(index, sum(t.numel() for t in tensors), tensors[0])
            torch.cat([t.reshape(-1) for t in tensors], out=flat)
            if reduce:
                start = time.perf_counter()
                dist.all_reduce(flat, group=self.groups.group(bucket.ranks))
                # After it: every member is there, so an emulated link delay starts from the last arrival.
                self.hooks.on_collective("all_reduce", flat.numel() * flat.element_size(), bucket.ranks)
                self.clock.comm += time.perf_counter() - start
            offset = 0
            for key, t in zip(bucket.keys, tensors):
                self._store_synced(key, flat[offset: offset + t.numel()].view_as(t), bucket.full)
                offset += t.numel()

    def host_work_s(self, repeats: int = 9) -> float:
        """Median seconds of the host work a step of this rank does besides computing, communicating and stepping
        the optimizer: taking its rows of the batch, and packing its gradient buckets and handing the synced
        slices back (:meth:`_all_reduce_buckets` without the all-reduces). Timed before the steps on gradients
        of zeros, made untimed before each repeat as a backward leaves them (a repeat's own allocation of them
        would add a pass over the model's bytes a step does not make), and dropped after. The prediction adds the
        slowest rank's to the step (:func:`hetpart.runtime.measure.predict`). The pipeline schedule's own
        bookkeeping is not in it. ``repeats``: timed runs after an untimed first, an odd count (a choice)."""
        synced = [k for b in self.grad_buckets if self.rank in b.ranks for k in b.keys]
        times = []
        for i in range(repeats + 1):
            for key in synced:
                self.params[key].grad = torch.zeros_like(self.params[key])
            start = time.perf_counter()
            self.batch(0)
            self._all_reduce_buckets(reduce=False)
            if i:
                times.append(time.perf_counter() - start)
        for p in self.params.values():
            p.grad = None
        return statistics.median(times)

    def _bucket_buffer(self, index: int, numel: int, like: torch.Tensor) -> torch.Tensor:
        """The flat tensor bucket ``index`` is all-reduced in, kept from step to step: a fresh one per step (what
        ``torch.cat`` allocated) was a large allocation whose pages the kernel mapped and zeroed again every step,
        and the gradients were then copied back out of it. A plain gradient now stays a view of it
        (:meth:`_store_synced`) until the next step's ``p.grad = None``."""
        buf = self._flat_buffers.get(index)
        if buf is None or buf.numel() != numel or buf.dtype != like.dtype or buf.device != like.device:
            buf = self._flat_buffers[index] = torch.empty(numel, dtype=like.dtype, device=like.device)
        return buf

    def _grad_for_sync(self, key: str, full: bool) -> torch.Tensor:
        p = self.params[key]
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        g = _local(p.grad)
        if not full:
            return g
        info = self._shard(key)
        whole = torch.zeros(info.shape, dtype=g.dtype, device=g.device)
        if info.tp_dim is None:
            whole.copy_(g / self.role.tp)
        else:
            whole.narrow(info.tp_dim, self._offset(key, g, info.tp_dim), g.shape[info.tp_dim]).copy_(g)
        return whole

    def _offset(self, key: str, local: torch.Tensor, dim: int) -> int:
        """Where this rank's slice of ``key`` starts along ``dim``: the prefix sum of the ranks before
        it under an uneven split, else ``torch.chunk``'s ``tp_index * size``."""
        if key in self._slices:
            return self._slices[key][1]
        return self.role.tp_index * local.shape[dim]

    def _store_synced(self, key: str, value: torch.Tensor, full: bool) -> None:
        p = self.params[key]
        if not full and type(p.grad) is torch.Tensor:  # a plain gradient: the synced slice of the bucket itself
            p.grad = value
            return
        g = _local(p.grad)
        if full:
            info = self._shard(key)
            if info.tp_dim is not None:
                value = value.narrow(info.tp_dim, self._offset(key, g, info.tp_dim), g.shape[info.tp_dim])
        g.copy_(value)

    def _shard(self, key: str) -> ParamInfo:
        info = self._param_info[key]
        if key in self._slices:  # an uneven slice (the vocabulary's too, which no tp_plan names)
            return replace(info, tp_dim=self._slices[key][0])
        return info if self.role.tp > 1 else replace(info, tp_dim=None)

    def global_loss(self, local: float) -> float:
        """Sum the ranks' loss shares into the global mean loss (an all-reduce over every rank)."""
        t = torch.tensor([local], dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return float(t.item())

    def _settle(self) -> None:
        """Wait for this rank's GPU to finish what it was given (kernels and NCCL collectives run asynchronously:
        without it a step's clock stops when the host has issued the optimizer, not when it ran)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def step(self, step: int, *, sync_loss: bool = True) -> StepResult:
        """One training step: forward/backward of every micro-batch, gradient sync, Adam."""
        self.clock.reset()
        mem = _MemoryProbe(self.device)
        self._settle()
        start = time.perf_counter()
        local = self.forward_backward(step)
        self.sync_gradients()
        self._settle()
        opt_start = time.perf_counter()
        self.optimizer.step()
        if self.dist_optimizer is not None:
            self.dist_optimizer.step()
        self._settle()
        end = time.perf_counter()
        peak, source = mem.peak()
        loss = self.global_loss(local) if sync_loss else float("nan")
        c = self.clock
        step_s, opt_s = end - start, end - opt_start
        timing = StepTiming(step_s=step_s, compute_s=c.fwd + c.bwd, comm_s=c.comm, optimizer_s=opt_s,
                            idle_s=max(0.0, step_s - c.fwd - c.bwd - c.comm - opt_s), fwd_s=c.fwd, bwd_s=c.bwd)
        return StepResult(step=step, loss=loss, timing=timing, peak_memory_bytes=peak, memory_source=source,
                          tokens=self.plan.global_batch * self.plan.seq_len)

    def memory_step(self, step: int) -> int:
        """One more training step, every rank at once, counting live tensor bytes on this rank's CPU: their
        peak during the step, the state held at its start (weights, last step's gradients, optimizer moments,
        buffers) included, as ``torch.cuda.max_memory_allocated`` counts on a GPU
        (:class:`hetpart.runtime.live_memory.LiveTensorBytes`). The counting slows the step several times: it
        is not a timed step. It updates the weights like any step."""
        from hetpart.runtime.live_memory import LiveTensorBytes, live_tensors

        params = [p for m in self.stage_modules for p in m.parameters()] + list(self.params.values())
        grads = [p.grad for p in params if p.grad is not None]
        mem = LiveTensorBytes(self.device.type).hold(live_tensors(params, grads))
        del grads  # held here, the last step's gradients would outlive the step's own `p.grad = None`, as on no GPU
        with mem:
            self.step(step)
        return mem.peak_bytes

    # ------------------------------------------------------------------------------- inspection
    def local_gradients(self) -> dict[str, LocalGrad]:
        """Every parameter's gradient as this rank holds it, by canonical key."""
        from hetpart.runtime.sharded import full_gradient

        out = {}
        whole = self.dist_optimizer.full_gradients() if self.dist_optimizer is not None else {}
        for key, p in self.params.items():
            if key in whole:  # reduced into uneven shards: all-gathered whole
                offset = self._slices[key][1] if key in self._slices else None
                out[key] = LocalGrad(whole[key].detach().clone(), self.role.tp, self.role.tp_index,
                                     self._shard(key).tp_dim, offset)
                continue
            if key in self.sharded_keys:  # FSDP's shard: gathered whole (a collective, in key order)
                out[key] = LocalGrad(full_gradient(p).detach().clone(), 1, 0, None)
                continue
            info = self._shard(key)
            offset = self._slices[key][1] if key in self._slices else None
            out[key] = LocalGrad(_local(p.grad).detach().clone(), self.role.tp, self.role.tp_index, info.tp_dim, offset)
        return out

    def state_dict(self) -> dict[str, Any]:
        """Parameters by canonical key (DTensor shards under TP, local slices under an uneven split, whose
        ``(dim, offset, length)`` in the whole tensor ``tp_slices`` gives) and the optimizer state."""
        return {"model": dict(self.params), "optimizer": self.optimizer.state_dict(), "tp_slices": dict(self._slices)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("tp_slices", {}) != self._slices:
            raise RuntimeFault("runtime: the checkpoint was written under another tensor-parallel split "
                               f"({len(state.get('tp_slices', {}))} sliced parameters, this run has "
                               f"{len(self._slices)}); resume with the plan that wrote it")
        with torch.no_grad():
            for key, value in state["model"].items():
                _local(self.params[key]).copy_(_local(value))
        self.optimizer.load_state_dict(state["optimizer"])


# ----------------------------------------------------------------------------------- helpers
def _plan_units(plan: Plan) -> int:
    return plan.replicas[0].stages[-1].layers[1]


def _default_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    return torch.device("cpu")


def _all_cuda_ids(device: torch.device) -> list[str | None]:
    import socket

    vendor = "amd" if torch.version.hip else "nvidia"
    mine = f"{vendor}|{socket.gethostname()}:{device.index or 0}" if device.type == "cuda" else None
    ids: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(ids, mine)
    return ids


TP_ENGINES = ("dtensor", "megatron")
"""How a stage runs tensor parallelism: ``dtensor`` (torch's column- and row-parallel linears: a stage
without ``tp_split``) or ``megatron`` (local slices and Megatron's two autograd wrappers by hand:
:mod:`hetpart.runtime.uneven_tp`, a stage with one)."""


def parallelize_for_timing(unit: UnitModel, mesh, hooks: Hooks, engine: str = "dtensor", cfg=None,
                           rank: int = 0) -> None:
    """Shard ``unit`` over ``mesh`` as a stage runs it under ``engine`` (:data:`TP_ENGINES`; ``megatron``
    with an even split of ``cfg``'s heads and columns, ``rank`` this process's place), reporting each of its
    all-reduces to ``hooks.on_collective``: what ``hetpart calibrate`` times (:mod:`hetpart.runtime.calibrate`)."""
    clock = _Clock()
    clock.in_chunk = True
    ranks = tuple(range(mesh.size()))
    reporter = _TPReporter(ranks, hooks, clock)
    if engine == "dtensor":
        _parallelize(_StageModule([unit]), mesh, reporter)
        return
    if engine != "megatron":
        raise ValueError(f"engine: {engine!r}; use one of {', '.join(TP_ENGINES)}")
    from hetpart.runtime.uneven_tp import parallelize_uneven, runtime_split

    parallelize_uneven([unit], runtime_split(None, cfg, mesh.size()), rank, cfg, mesh.get_group(), reporter)


def _parallelize(module: _StageModule, mesh, reporter: "_TPReporter") -> None:
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   parallelize_module)

    for unit in module.units:
        plan: dict[str, Any] = {}
        for path, style in unit.tp_plan.items():
            if style.startswith("input"):
                # One replicated DTensor feeds the column-parallel linears below: their input gradients
                # add up as partial sums and are all-reduced once, where the DTensor was made.
                kwarg = style.partition(":")[2]
                plan[f"body.{path}"] = (PrepareModuleInput(input_kwarg_layouts={kwarg: Replicate()},
                                                           desired_input_kwarg_layouts={kwarg: Replicate()})
                                        if kwarg else
                                        PrepareModuleInput(input_layouts=(Replicate(),),
                                                           desired_input_layouts=(Replicate(),)))
                continue
            s = ColwiseParallel() if style == "colwise" else RowwiseParallel()
            s.src_data_rank = None  # every rank holds the same initial weights: slice locally, no scatter
            plan[f"body.{path}"] = s
        if plan:
            parallelize_module(unit, mesh, plan)
            unit.tensor_parallel_applied(mesh.size())
            fed = [p for p, st in unit.tp_plan.items() if st.startswith("input")]
            for path, style in unit.tp_plan.items():
                if style == "colwise" and any(path.startswith(f + ".") for f in fed):
                    continue  # its input gradient is all-reduced (and reported) at the feeding module
                reporter.attach(unit.get_submodule(f"body.{path}"), style)


class _ReportGrad(torch.autograd.Function):
    """Identity whose backward reports the input-gradient all-reduce of a column-parallel linear."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, reporter: "_TPReporter") -> torch.Tensor:
        ctx.reporter = reporter
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        ctx.reporter.report(grad)
        return grad, None


class _TPReporter:
    """Reports tensor-parallel all-reduces to the hooks: the output of every row-parallel linear in the
    forward, the input gradient of every column-parallel linear (or of the ``input`` module that feeds
    several) in the backward (Megatron's g and f)."""

    def __init__(self, ranks: tuple[int, ...], hooks: Hooks, clock: _Clock):
        self.ranks, self.hooks, self.clock = tuple(sorted(ranks)), hooks, clock

    def before_sync(self) -> None:
        """Before an uneven stage's all-reduce (:meth:`Hooks.on_tp_sync`; its sleep is emulated compute)."""
        sync = getattr(self.hooks, "on_tp_sync", None)
        if self.clock.in_chunk and sync is not None:
            sync(time.perf_counter() - self.clock.segment_start)

    def after_sync(self) -> None:
        """After an uneven stage's all-reduce (and its report): the next compute segment starts."""
        self.clock.segment_start = time.perf_counter()

    def report(self, t: torch.Tensor) -> None:
        if not self.clock.in_chunk:
            return
        start = time.perf_counter()
        self.hooks.on_collective("tp_all_reduce", t.numel() * t.element_size(), self.ranks)
        self.clock.tp_hooks += time.perf_counter() - start

    def attach(self, module: nn.Module, style: str) -> None:
        if style == "rowwise":
            module.register_forward_hook(lambda _m, _inp, out: self.report(out))
            return
        kwarg = style.partition(":")[2]

        def pre(_m, args, kwargs):
            x = kwargs[kwarg] if kwarg else args[0]
            if not (isinstance(x, torch.Tensor) and x.requires_grad):
                return None
            x = _ReportGrad.apply(x, self)
            return (args, {**kwargs, kwarg: x}) if kwarg else ((x, *args[1:]), kwargs)

        # Prepended: runs before torch's input preparation, so the backward reports after its all-reduce.
        module.register_forward_pre_hook(pre, prepend=True, with_kwargs=True)


class _MemoryProbe:
    """Peak memory of one step: CUDA allocator peak, or on CPU the peak resident set (VmHWM)."""

    def __init__(self, device: torch.device):
        self.device = device
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            return
        self.start_rss = _proc_status("VmRSS")
        try:
            with open("/proc/self/clear_refs", "w") as fh:
                fh.write("5")  # resets VmHWM to the current RSS
            self.resettable = True
        except OSError:
            self.resettable = False

    def peak(self) -> tuple[int, str]:
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device)), "cuda_max_allocated"
        hwm = _proc_status("VmHWM")
        if self.resettable and hwm and self.start_rss:
            return max(0, hwm - self.start_rss), "rss_peak_delta"
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "rss_peak_since_start"


def _proc_status(field_name: str) -> int:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
