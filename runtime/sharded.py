"""Sharded data parallelism in the runtime: torch FSDP2 (``fully_shard``) per unit, under the pipeline.

Each unit of a stage is sharded over the ranks that hold the same piece of it in the other replicas of
its shard group (the members of its gradient bucket, :mod:`hetpart.runtime.groups`), as torchtitan
applies ``fully_shard`` per transformer block before handing the stage to
``torch.distributed.pipelining``. Gradients are summed (divide factor 1: each micro-batch's loss is
already scaled by ``b / G``, :mod:`hetpart.runtime.engine`). Tied weights whose copies sit on other
ranks (GPT-2's embedding and LM head) stay out of FSDP and keep their all-reduce.

What each level runs (the collectives of :mod:`hetpart.costmodel.sharding`):

* 1: the stage module is an FSDP root too, so the pipeline schedule defers every reduce-scatter to
  the end of the step (gradients accumulate whole, as Megatron's distributed optimizer does);
  parameters are gathered at the step's first forward and kept through the backward. Where every holder
  holds the same stage, the stage is one FSDP group (one all-gather and one reduce-scatter per step,
  :func:`_shard_stage_whole`); replicas cut at other places shard unit by unit under the root;
* 2: parameters are gathered at the first forward and kept until the step ends; each micro-batch's
  gradients are reduce-scattered after its backward;
* 3: each unit's parameters are gathered before its forward and again before its backward, every
  micro-batch, and freed after; gradients are reduce-scattered every micro-batch.

At levels 2 and 3 every member of a shard group must join every per-micro-batch collective, so a
replica with fewer micro-batches runs zero-weighted padding micro-batches up to its group's largest
count (:func:`hetpart.costmodel.sharding.microbatches_run`).

With tensor parallelism, the units are split over a 2-D ``(dp, tp)`` mesh: TP on its ``tp`` rows, FSDP on
its ``dp`` columns (torchtitan's composition; replicas of a sharded plan with TP are cut alike, one TP
degree, :func:`hetpart.rules.sharding_problems`).

Uneven ``shard_fractions`` at levels 1-2, and levels 1-2 of plans with an uneven tensor-parallel split
(``tp_split``), do not come here: they run on hetpart's distributed optimizer with uneven ranges
(:mod:`hetpart.runtime.dist_optimizer`). Not run (and refused by
:func:`sharding_problems`, :func:`hetpart.rules.uneven_shard_problems`): uneven fractions at level 3 --
FSDP2 splits every parameter with ``torch.chunk`` into equal pieces along one dimension
(``FSDPParam._init_sharded_param`` in torch 2.13's ``torch/distributed/fsdp/_fully_shard/_fsdp_param.py``,
line 298: ``chunks = _chunk_with_empty(param_data, shard_world_size, dim=shard_dim)``, which is
``torch.chunk``, ``_fsdp_common.py`` line 137; ``shard_placement_fn`` only picks the dimension, and a
nonzero dimension must even divide), so a rank cannot hold a chosen fraction of the parameters it gathers
per unit; uneven fractions with hybrid sharding; and hybrid sharding together with TP (a 3-D mesh).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:  # pragma: no cover
    from hetpart.plan import Plan
    from hetpart.runtime.engine import Executor

__all__ = ["sharding_problems", "apply_sharding", "full_gradient"]


def sharding_problems(plan: "Plan") -> list[str]:
    """The sharded plans this runtime cannot execute (empty when it can)."""
    if not plan.zero:
        return []
    from hetpart.rules import split_sharding_problems, uneven_shard_problems

    out = uneven_shard_problems(plan)
    if any(s.tp_split is not None for r in plan.replicas for s in r.stages):
        out += split_sharding_problems(plan)
    if plan.shard_group and any(s.tp > 1 for r in plan.replicas for s in r.stages):
        out.append("shard_group: hybrid sharding with tensor parallelism (a 3-D mesh) does not run; use "
                   "shard_group 0 or tp 1")
    return out


def shardable_keys(ex: "Executor") -> set[str]:
    """The canonical keys a sharding level shards on this rank: held by two or more ranks, not tied
    (what :func:`apply_sharding` gives FSDP2, and the uneven distributed optimizer its ranges)."""
    tied = _tied_keys(ex)
    return {k for b in ex.layout.buckets if ex.rank in b.ranks and len(b.ranks) >= 2 for k in b.keys if k not in tied}


def dp_tp_mesh(ex: "Executor"):
    """The 2-D ``(dp, tp)`` mesh of this rank's stage: row ``i`` the TP group of replica ``i``'s stage
    (replicas cut alike, :func:`hetpart.rules.sharding_problems`), column ``t`` the data-parallel peers
    of TP rank ``t``. None with one replica."""
    from torch.distributed.device_mesh import DeviceMesh

    plan = ex.plan
    if plan.dp < 2:
        return None
    j = ex.role.stages[0] % ex.pp
    grid = [list(ex.layout.tp_groups[(r, j)]) for r in range(plan.dp)]
    column = [row[ex.role.tp_index] for row in grid]
    return DeviceMesh.from_group([ex.groups.group(column), ex.groups.group(grid[ex.replica])], ex.device.type,
                                 mesh=torch.tensor(grid), mesh_dim_names=("dp", "tp"))


def apply_sharding(ex: "Executor") -> set[str]:
    """Shard ``ex``'s units with FSDP2; returns the canonical keys FSDP now owns (their gradients no
    longer go through the all-reduce buckets)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

    zero = ex.plan.zero
    # offload "full": FSDP2 keeps each sharded parameter, its gradient and the optimizer's states in host memory
    # and copies the shard to the device before each all-gather (on a CPU device host memory is the device's)
    policy = CPUOffloadPolicy(pin_memory=ex.device.type == "cuda") if ex.plan.offload == "full" else OffloadPolicy()
    owned: set[str] = set()
    if zero == 1:
        ex.sharded_reports = Level1Reports(ex)
    tied = _tied_keys(ex)
    ranks_of = {k: b.ranks for b in ex.layout.buckets for k in b.keys if ex.rank in b.ranks}
    for j, module in zip(ex.role.stages, ex.stage_modules):
        if zero == 1 and _shard_stage_whole(ex, j, module, tied, ranks_of, policy, owned):
            continue
        ignored_all: set[torch.nn.Parameter] = set()
        sharded_any = None
        for unit in module.units:
            names = unit.canonical_names()
            keys = [k for k in names.values() if k not in tied]
            ignored = {unit.get_parameter(local) for local, k in names.items() if k in tied}
            ignored_all |= ignored
            ranks = ranks_of.get(keys[0], (ex.rank,)) if keys else (ex.rank,)
            if len(ranks) < 2:
                continue
            mesh = ex.dp_tp_mesh["dp"] if ex.dp_tp_mesh is not None else _mesh(ex, ranks)
            fully_shard(unit, mesh=mesh, reshard_after_forward=zero >= 3, ignored_params=ignored or None,
                        offload_policy=policy)
            _sum_gradients(unit)
            _report_collectives(ex, unit, mesh)
            owned.update(keys)
            sharded_any = mesh
        if zero == 1 and sharded_any is not None:
            # A root over the stage: the pipeline defers its units' reduce-scatters to the step's end.
            fully_shard(module, mesh=sharded_any, reshard_after_forward=False, ignored_params=ignored_all or None,
                        offload_policy=policy)
            _sum_gradients(module)
            _report_collectives(ex, module, sharded_any)
    return owned


def _shard_stage_whole(ex: "Executor", stage: int, module, tied: set[str], ranks_of: dict, policy,
                       owned: set[str]) -> bool:
    """Level 1 where every unit of stage ``stage`` has the same holders and each of them holds exactly these units
    in one of its stages: one FSDP2 group over the whole stage (True), else nothing (False: the units are sharded
    one by one under a root, as on every holder, whose collectives must match).

    At level 1 the parameters are gathered at the step's first forward and kept through the backward, and the
    gradients reduce-scattered once after it, so gathering unit by unit overlaps nothing on gloo (each gather is
    waited for at once) and only multiplies the collectives: on this CPU a 14-unit stage paid 28 of them per
    step, each a point where both ranks must meet (0.056 s of communication per step on a quiet machine for
    2 ranks of gpt2-small at ``--scale tiny``). One group runs one all-gather and one reduce-scatter of the
    stage, what the simulator prices at level 1 (one reduce-scatter per run of units held alike,
    ``Simulator._sharded_sync_s``)."""
    from torch.distributed.fsdp import fully_shard

    held = {}
    ignored: set[torch.nn.Parameter] = set()
    for unit in module.units:
        names = unit.canonical_names()
        ignored |= {unit.get_parameter(local) for local, k in names.items() if k in tied}
        keys = [k for k in names.values() if k not in tied]
        if keys:
            held[tuple(keys)] = ranks_of.get(keys[0], (ex.rank,))
    holders = set(held.values())
    if len(holders) != 1 or len(next(iter(holders))) < 2:
        return False
    ranks = next(iter(holders))
    layers = tuple(ex.plan.replicas[ex.replica].stages[stage].layers)
    for r in ranks:  # replicas cut at other places: a holder's stage holds other units too
        role = ex.layout.roles[r]
        if not any(tuple(ex.plan.replicas[role.replica].stages[k].layers) == layers for k in role.stages):
            return False
    mesh = ex.dp_tp_mesh["dp"] if ex.dp_tp_mesh is not None else _mesh(ex, ranks)
    fully_shard(module, mesh=mesh, reshard_after_forward=False, ignored_params=ignored or None, offload_policy=policy)
    _sum_gradients(module)
    _report_collectives(ex, module, mesh)
    owned.update(k for keys in held for k in keys)
    return True


def _report_collectives(ex: "Executor", module, mesh) -> None:
    """FSDP2's all-gathers and reduce-scatters of ``module`` run through :class:`ReportedAllGather` and
    :class:`ReportedReduceScatter`: each is reported to the executor's hooks (an emulated run pays the
    emulated link for it, as it does for a gradient all-reduce) and booked as communication, not compute.
    Under hybrid sharding (a ``(replicate, shard)`` mesh) the all-reduce of each reduce-scattered shard
    across the shard groups, which FSDP2 runs right after the reduce-scatter, is reported as an
    ``all_reduce`` of the shard's bytes among the replicate group (timed from the reduce-scatter's end to
    FSDP2's all-reduce hook, which runs right after it)."""
    if getattr(module, "_get_fsdp_state", None) is None or not module._get_fsdp_state()._fsdp_param_groups:
        return  # a root over units that hold every parameter: nothing of its own to gather
    scatter = ReportedReduceScatter(ex)
    module.set_custom_all_gather(ReportedAllGather(ex))
    module.set_custom_reduce_scatter(scatter)
    names = getattr(mesh, "mesh_dim_names", None) or ()
    if "replicate" in names:
        group = mesh.get_group("replicate")

        def after_all_reduce(shard: torch.Tensor) -> None:
            _reported(ex, "all_reduce", shard.numel() * shard.element_size(), group, scatter.ended, deferred=True)

        module.set_all_reduce_hook(after_all_reduce)


def transport_jobs(ex: "Executor") -> list[tuple[str, tuple[int, ...], Any, int, torch.dtype]]:
    """FSDP2's collectives of one step on this rank, once each, in unit order (every rank lists its units in
    the global order, so timing them in this order cannot deadlock): ``(kind, sorted ranks, group, numel,
    dtype)``, ``kind`` an ``all_gather`` (``numel`` the gathered buffer), a ``reduce_scatter`` (the whole
    gradient buffer) or, under hybrid sharding, the ``all_reduce`` of the shard across the shard groups, at
    the sizes :class:`ReportedAllGather`, :class:`ReportedReduceScatter` and the all-reduce hook report.
    What :func:`hetpart.runtime.worker.transport_costs` times, so that the emulated link replaces gloo's own
    transport instead of adding to it. At level 1 the gathers only: the gradients' collectives are reported
    fused per run of units (:class:`Level1Reports`), whose own transport (a few milliseconds per unit on
    loopback) stays in the measured step."""
    from torch.distributed.fsdp import FSDPModule

    jobs = []
    for module in ex.stage_modules:
        for unit in list(module.units) + [module]:
            if not isinstance(unit, FSDPModule):
                continue
            for pg in unit._get_fsdp_state()._fsdp_param_groups:
                if not pg.fsdp_params:
                    continue
                info = pg.mesh_info
                group = info.shard_process_group
                n = group.size()
                shard = sum(fp.padded_sharded_param_size.numel() for fp in pg.fsdp_params)
                dtype = pg.fsdp_params[0].sharded_param.dtype
                ranks = tuple(sorted(_group_ranks(group)))
                jobs.append(("all_gather", ranks, group, n * shard, dtype))
                if ex.sharded_reports is not None:
                    continue  # level 1: gradients are reported per run of units (Level1Reports), not timed alone
                jobs.append(("reduce_scatter", ranks, group, n * shard, dtype))
                replicate = getattr(info, "replicate_process_group", None)
                if replicate is not None and replicate.size() > 1:
                    jobs.append(("all_reduce", tuple(sorted(_group_ranks(replicate))), replicate, shard, dtype))
    return jobs


def _group_ranks(group) -> tuple[int, ...]:
    import torch.distributed as dist

    return tuple(dist.get_process_group_ranks(group))


class Level1Reports:
    """Level 1: the reduce-scatters FSDP2 runs in the step's last backward (one per unit), reported as one
    collective per run of consecutive units with the same holders, at the end of the backward
    (:meth:`flush`, from :meth:`hetpart.runtime.engine.Executor.sync_gradients`), and under hybrid sharding
    the all-reduces of their shards likewise: what the simulator prices at level 1 (one reduce-scatter of
    each run's gradients after the backward, ``Simulator._sharded_sync_s``; the distributed optimizer fuses
    them too). Per unit, the emulated link's latency was paid once per unit: ZeRO-1 over three ranks on
    Ethernet, 6 units, charged 0.67 s of reduce-scatter per step where the simulator prices about 0.2 s."""

    def __init__(self, ex: "Executor") -> None:
        self.ex = ex
        self.runs: dict[str, tuple[tuple[int, ...], int]] = {}
        """kind -> (ranks, bytes so far) of the open run."""

    def add(self, kind: str, ranks: tuple[int, ...], num_bytes: int) -> None:
        if kind in self.runs and self.runs[kind][0] != ranks:
            self.flush()
        held, so_far = self.runs.get(kind, (ranks, 0))
        self.runs[kind] = (held, so_far + num_bytes)

    def flush(self) -> None:
        import time

        begin = time.perf_counter()
        for kind in ("reduce_scatter", "all_reduce"):  # FSDP2's order: the shard is all-reduced after its scatter
            if kind in self.runs:
                ranks, num_bytes = self.runs.pop(kind)
                self.ex.hooks.on_collective(kind, num_bytes, ranks)
        self.runs.clear()
        self.ex.clock.communicated(time.perf_counter() - begin)


def _reported(ex: "Executor", kind: str, num_bytes: int, group, begin: float, deferred: bool = False) -> None:
    """After one of FSDP2's collectives (every member has arrived): the emulated link's delay (the hooks'),
    and the whole time, the waiting for slower members included, booked as communication. Inside a compute
    chunk (a unit's gather before its forward or backward, its reduce-scatter after its backward, level 3)
    it must not count as compute: an emulated slow device stretches its compute by its slowdown, and
    stretching the time it waited for its peers made them wait in turn, longer at every unit (a ZeRO-3 plan
    over an A100, an RTX 3090 and a T4 took 55-95 s per step; with its collectives booked here, 9.1 s against
    8.5 s predicted)."""
    import time

    if deferred and ex.sharded_reports is not None:  # level 1: a gradient's; reported with its run at the end
        ex.clock.communicated(time.perf_counter() - begin)
        ex.sharded_reports.add(kind, tuple(sorted(_group_ranks(group))), int(num_bytes))  # books a flush itself
        return
    ex.hooks.on_collective(kind, int(num_bytes), _group_ranks(group))
    ex.clock.communicated(time.perf_counter() - begin)


def _comm_classes():
    from hetpart._torch_compat import fsdp_default_collectives

    return fsdp_default_collectives()


class ReportedAllGather(_comm_classes()[0]):  # type: ignore[misc]
    """FSDP2's default all-gather, run to completion (CPU: FSDP2 waits on it at once anyway) and reported
    as an ``all_gather`` of the gathered buffer's bytes (what :func:`hetpart.costmodel.sharding` prices)."""

    def __init__(self, ex: "Executor") -> None:
        self.ex = ex

    def __call__(self, output_tensor, input_tensor, group, async_op: bool = False):
        import time

        begin = time.perf_counter()
        work = super().__call__(output_tensor, input_tensor, group, async_op=async_op)
        if work is not None:
            work.wait()
        _reported(self.ex, "all_gather", output_tensor.numel() * output_tensor.element_size(), group, begin)
        return None


class ReportedReduceScatter(_comm_classes()[1]):  # type: ignore[misc]
    """FSDP2's default reduce-scatter, reported as a ``reduce_scatter`` of the whole (unsharded) gradient
    buffer's bytes."""

    def __init__(self, ex: "Executor") -> None:
        self.ex = ex
        self.ended = 0.0
        """When the last reduce-scatter and its report ended (where hybrid sharding's all-reduce begins)."""

    def __call__(self, output_tensor, input_tensor, group, op, async_op: bool = False):
        import time

        begin = time.perf_counter()
        work = super().__call__(output_tensor, input_tensor, group, op, async_op=async_op)
        if work is not None:
            work.wait()
        _reported(self.ex, "reduce_scatter", input_tensor.numel() * input_tensor.element_size(), group, begin,
                  deferred=True)
        self.ended = time.perf_counter()
        return None


def _mesh(ex: "Executor", ranks: tuple[int, ...]):
    """A 1-D mesh of the unit's holders, or under hybrid sharding the 2-D ``(replicate, shard)`` mesh
    FSDP2 runs HSDP on."""
    from torch.distributed.device_mesh import DeviceMesh

    from hetpart.runtime.groups import hybrid_mesh

    grid = hybrid_mesh(ex.plan, ex.layout.roles, ranks)
    if grid is None:
        return DeviceMesh.from_group(ex.groups.group(ranks), ex.device.type)
    row = next(r for r in grid if ex.rank in r)
    col = next(c for c in zip(*grid) if ex.rank in c)
    return DeviceMesh.from_group([ex.groups.group(col), ex.groups.group(row)], ex.device.type,
                                 mesh=torch.tensor(grid), mesh_dim_names=("replicate", "shard"))


def _sum_gradients(module) -> None:
    """Reduce by a plain sum (divide factor 1): gloo has no PREMUL_SUM, which a custom factor asks of
    the collective otherwise."""
    module.set_force_sum_reduction_for_comms(True)
    module.set_gradient_divide_factor(1.0)


def keep_gathered(ex: "Executor", keep: bool) -> None:
    """Level 2: keep each unit's gathered parameters through its backward (``keep``) during the step's
    micro-batches, then free them before the optimizer steps the shards."""
    from torch.distributed.fsdp import FSDPModule

    for module in ex.stage_modules:
        for unit in module.units:
            if isinstance(unit, FSDPModule):
                if keep:
                    unit.set_reshard_after_backward(False)
                else:
                    unit.set_reshard_after_backward(True)
                    unit.reshard()


def full_gradient(param: Any) -> torch.Tensor:
    """The whole gradient of an FSDP-sharded parameter (an all-gather among its shard group)."""
    grad = param.grad
    if grad is None:
        return torch.zeros(param.shape, dtype=param.dtype)
    return grad.full_tensor()


def _tied_keys(ex: "Executor") -> set[str]:
    """Canonical keys of tied weights (a key that several units hold: the owner's and its copies'):
    they keep their all-reduce bucket."""
    from collections import Counter

    counts = Counter(p.key for info in ex.infos for p in info.params)
    return {k for k, n in counts.items() if n > 1}
