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
  parameters are gathered at the step's first forward and kept through the backward;
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
    tied = _tied_keys(ex)
    ranks_of = {k: b.ranks for b in ex.layout.buckets for k in b.keys if ex.rank in b.ranks}
    for module in ex.stage_modules:
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
            owned.update(keys)
            sharded_any = mesh
        if zero == 1 and sharded_any is not None:
            # A root over the stage: the pipeline defers its units' reduce-scatters to the step's end.
            fully_shard(module, mesh=sharded_any, reshard_after_forward=False, ignored_params=ignored_all or None,
                        offload_policy=policy)
            _sum_gradients(module)
    return owned


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
