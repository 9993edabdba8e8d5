"""Sharded data parallelism (ZeRO stages 1-3, FSDP, HSDP): what each level divides and what it sends.

Model states per parameter (ZeRO paper accounting, Rajbhandari et al. 2020, with the gradients in the
dtype engines keep them), split as :func:`state_bytes` gives them: under mixed precision 16-bit weights
(2 bytes), gradients in fp32 under bf16 (4) and in fp16 under fp16 (2)
(:data:`~hetpart.costmodel.memory.GRAD_BYTES`), and the optimizer's fp32 master copy and two Adam moments
(12); under fp32 4 + 4 + 8. A replica holding fraction ``f`` of its shard group's states keeps

* level 1 (optimizer states, Megatron's distributed optimizer): ``w + g + opt f``;
* level 2 (+ gradients, ZeRO-2): ``w + (g + opt) f``, plus the full gradient of the unit whose
  reduce-scatter is in flight;
* level 3 (+ parameters, FSDP full shard): ``(w + g + opt) f``, plus the unsharded parameters alive
  while a unit runs and those of its neighbour, prefetched, and the running unit's full gradient in the
  backward (:func:`gathered_working_bytes`; the ``torch`` kernel set keeps the runtime's own accounting).

Level 3 keeps the 16-bit weight shard beside the fp32 master shard (18 bytes per parameter under bf16, not
16): the engine the ``fused`` kernel set models is Megatron-Core, whose level 3 is Megatron-FSDP
(``--use-megatron-fsdp``, ``zero_dp_strategy`` ``optim_grads_params``). Its parameter groups hold three sharded
buffers: ``model_weight_buffer`` in the compute dtype (bf16), ``main_weight_buffer`` in ``main_params_dtype``
(fp32 by default) and ``main_grad_buffer`` (fp32: Megatron-LM reduces bf16 gradients in fp32, its
``grad_reduce_in_fp32``), plus the optimizer's moments (NVIDIA/Megatron-LM
``megatron/core/distributed/fsdp/src/README.md``, ``mixed_precision_policy``: "main_params_dtype ... Defaults to
torch.float32"; ``param_and_grad_buffer.py``). Engines that keep 16 (checked, not modelled): PyTorch FSDP2 as
torchtitan runs it keeps the fp32 parameter shard as its own master (``MixedPrecisionPolicy(param_dtype=bf16)``
casts only the gathered copy) with an fp32 gradient shard, 4 + 4 + 8; DeepSpeed ZeRO-3 keeps 2 + 2 + 12 (bf16
gradients, its default communication dtype).

Communication over the replicas holding a unit (the links the all-reduce model of
:mod:`~hetpart.costmodel.collectives` crosses; a reduce-scatter or an all-gather moves half an
all-reduce's bytes on the same rings, NCCL's rings only: :func:`~hetpart.costmodel.collectives.reduce_scatter_time_s`):

* every level reduce-scatters the gradients instead of all-reducing them (after the last backward,
  overlapped with it as the unsharded all-reduce is), and the optimizer steps only the shard;
* levels 1 and 2 all-gather the updated parameters after the optimizer step; the gather overlaps the
  next step's first forward (Megatron's ``--overlap-param-gather``), so only what exceeds one
  micro-batch's forward of the device is exposed;
* levels 2 and 3 reduce-scatter every micro-batch's gradients during its backward (as DeepSpeed's
  ZeRO-2/3 do under gradient accumulation); level 3 also all-gathers each unit's parameters before
  its forward and again before its backward, every micro-batch. A unit's collective overlaps the
  compute of its neighbour (prefetch one ahead; a reduce-scatter behind the next unit's backward): per
  micro-batch the stage pays what a communication stream running the collectives in issue order adds
  to the compute stream (:func:`exposed_unit_comm_s`).

Levels 2 and 3 thus run collectives per micro-batch, and every member of a shard group must take part
in each: a replica with fewer micro-batches than another of its group (uneven batch shares) runs
zero-weighted padding micro-batches up to the group's largest count (:func:`microbatches_run`; hetpart's
runtime does the same), which costs it their compute.

Uneven fractions use padded collectives (every member sends the largest shard, as FSDP pads its
flat buffers): the bytes scale by ``n * max(f)``, the ring's latency terms do not (as many messages). Hybrid sharding (``shard_group``) shards inside
groups of consecutive replicas and all-reduces each shard across the groups.

A plan's ``offload`` keeps some of these states in host memory instead (:mod:`~hetpart.costmodel.offload`).

hetpart's runtime (the ``torch`` kernel set) shards no tied weight: a key that several units hold (GPT-2's
token embedding, owned by the embedding and copied by the head) stays out of FSDP2 and out of the uneven
distributed optimizer and keeps its all-reduce (``_tied_keys`` in :mod:`hetpart.runtime.sharded`), so a
device keeps its weight, gradient and optimizer states whole at every level (:func:`tied_params_held`).
Megatron's distributed optimizer shards the embedding's states like any other's (the ``fused`` accounting).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from hetpart.costmodel.memory import state_split
from hetpart.costmodel.offload import device_state_bytes

if TYPE_CHECKING:  # pragma: no cover
    from hetpart.graph.model_graph import ModelGraph
    from hetpart.plan import Plan

__all__ = ["memory_zero", "microbatches_run", "sharded_delta_gb", "state_bytes", "sharded_state_bytes", "working_set_bytes", "gathered_working_bytes", "collective_pad", "exposed_unit_comm_s",
           "tied_params_held"]


def memory_zero(plan: "Plan") -> int:
    """The level whose memory and host copies apply to ``plan``: its own, except that one replica (of one rank)
    has nothing to shard (0), unless its states are offloaded: ZeRO-Offload streams a lone replica's gradients
    to the host as at level 2 (Ren et al. 2021: a lone GPU keeps only its 16-bit weights)."""
    return plan.zero if plan.dp * plan.cp > 1 or plan.offload != "none" else 0


def microbatches_run(plan: "Plan", replica: int) -> int:
    """Micro-batches ``replica`` runs per step: its own, or at levels 2-3 its shard group's largest count
    (the rest zero-weighted padding, so that every per-micro-batch collective has all its members)."""
    m = plan.num_microbatches(replica)
    if plan.zero < 2 or plan.dp < 2:
        return m
    group = next(g for g in plan.shard_groups() if replica in g)
    return max(plan.num_microbatches(r) for r in group)


def state_bytes(precision: str, optimizer: str = "adam") -> tuple[float, float, float]:
    """``(weights, gradients, optimizer)`` bytes per parameter; they add up to the optimizer's total of
    :func:`hetpart.costmodel.memory.state_bytes_per_param` (Adam: 18 under bf16, 16 under fp16 and fp32)."""
    return state_split(precision, optimizer)


def sharded_state_bytes(params: float, precision: str, zero: int, fraction: float, optimizer: str = "adam",
                        offload: str = "none") -> float:
    """Bytes of model states a device holding ``params`` parameters keeps at rest (working sets aside), less
    what ``offload`` keeps in host memory (:mod:`~hetpart.costmodel.offload`)."""
    return params * device_state_bytes(*state_bytes(precision, optimizer), zero, fraction, offload)


def working_set_bytes(largest_unit_params: float, precision: str, zero: int,
                      chunk_units: "Sequence[Sequence[float]] | None" = None) -> float:
    """Unsharded states alive on top of the shards: level 2 the full gradient of the unit being reduced,
    level 3 also the gathered parameters of the running unit and of the prefetched one.

    ``chunk_units``: the parameters one device holds of each unit, per model chunk of the device, in execution
    order; given, level 3 takes the running unit's actual neighbour (:func:`gathered_working_bytes`). Without
    it, the prefetched unit is taken as large as the largest one (``2 w + g`` times ``largest_unit_params``: an
    upper bound; the embedding or head, the largest unit of most models, has one neighbour, a block)."""
    w, g, _ = state_bytes(precision)
    if zero == 2:
        return largest_unit_params * g
    if zero >= 3 and chunk_units is not None:
        return max((gathered_working_bytes(units, w, g) for units in chunk_units), default=0.0)
    if zero >= 3:
        return largest_unit_params * (2 * w + g)
    return 0.0


def gathered_working_bytes(units: "Sequence[float]", w: float, g: float) -> float:
    """Level 3's unsharded bytes at their peak over a chunk of units (``units``: the parameters of each, in
    forward order): the forward gathers unit ``i`` while ``i + 1`` is prefetched, ``w (p_i + p_{i+1})``; the
    backward runs unit ``i`` with ``i - 1`` prefetched and ``i``'s whole gradient alive until its
    reduce-scatter, ``w (p_i + p_{i-1}) + g p_i`` (prefetch one ahead: FSDP2's default, Megatron-FSDP's
    ``overlap_param_gather``). A chunk's end prefetches nothing from the next device's chunk."""
    best = 0.0
    for i, p in enumerate(units):
        after = units[i + 1] if i + 1 < len(units) else 0.0
        before = units[i - 1] if i > 0 else 0.0
        best = max(best, w * (p + after), w * (p + before) + g * p)
    return best


def sharded_delta_gb(params: float, largest_unit_params: float, precision: str, zero: int, fraction: float,
                     optimizer: str = "adam", offload: str = "none",
                     chunk_units: "Sequence[Sequence[float]] | None" = None) -> float:
    """GB to add to an unsharded account of ``params`` parameters (16 bytes each) for level ``zero`` and
    ``offload``: the shards the device keeps instead of the whole states, plus the working set (negative:
    sharding saves memory; ``chunk_units``: :func:`working_set_bytes`)."""
    if not zero and offload == "none":
        return 0.0
    kept = (sharded_state_bytes(params, precision, zero, fraction, optimizer, offload)
            + working_set_bytes(largest_unit_params, precision, 3 if offload == "full" else zero, chunk_units))
    return (kept - params * sum(state_bytes(precision, optimizer))) / 1e9


def tied_params_held(model: "ModelGraph", first: int, last: int) -> float:
    """Parameters of tied weights that units ``[first, last)`` hold (the owner's, or a copy where only a
    sharer is there; counted once): what hetpart's runtime leaves unsharded (module docstring)."""
    if model.tied_owner_index < 0:
        return 0.0
    sharers = [i for i, u in enumerate(model.units) if u.shared_params]
    if not any(first <= i < last for i in [model.tied_owner_index, *sharers]):
        return 0.0
    return float(max((model.units[i].shared_params for i in sharers), default=0))


def collective_pad(plan: "Plan", replicas) -> float:
    """How many more bytes a reduce-scatter or all-gather among ``replicas`` (one shard group) moves than
    with even shards: ``n * max(f)`` (padded to the largest shard), 1 for even shards. Callers price the
    padded bytes, so the ring's latency terms count once."""
    if plan.shard_fractions is None:
        return 1.0
    members = list(replicas)
    return len(members) * max(plan.shard_fractions[r] for r in members)


def exposed_unit_comm_s(compute_s: list[float], pre_s: list[float] | None = None,
                        post_s: list[float] | None = None) -> float:
    """Seconds a chain of units pays for its per-unit collectives, on two streams: the units compute
    back to back in execution order; one communication stream runs the collectives in the order they
    are issued. Unit ``i``'s ``pre_s[i]`` (a parameter all-gather) must finish before it computes and is
    issued when unit ``i - 1`` starts (prefetch one ahead, as FSDP2 does; the first at time 0);
    ``post_s[i]`` (a gradient reduce-scatter) is issued when unit ``i`` finishes. Returns when the later
    stream finishes, less the compute: a collective hides behind the *next* unit's compute, the first
    gather and the last reduce-scatter have nothing to hide behind."""
    n = len(compute_s)
    gathers = pre_s is not None  # without gathers no unit waits on the communication stream
    pre = pre_s or [0.0] * n
    post = post_s or [0.0] * n
    comm_end = comp_end = pre[0] if n else 0.0
    ready = comm_end  # when the next unit's gather is done
    for i, t in enumerate(compute_s):
        start = max(comp_end, ready)
        if gathers and i + 1 < n:
            comm_end = max(comm_end, start) + pre[i + 1]
            ready = comm_end
        comp_end = start + t
        comm_end = max(comm_end, comp_end) + post[i]
    return max(comm_end, comp_end) - sum(compute_s)
