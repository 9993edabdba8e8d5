"""The homogeneous Megatron-LM plan: a uniform (tp, pp, dp) grid over the cluster in device order.

Devices are taken in cluster order (group, node, gpu) and ranks are placed in an engine's order, named
innermost first: ``tp-dp-pp`` (the default) is Megatron-LM's (``initialize_model_parallel``; DeepSpeed
and torchtitan place them the same way): consecutive ``tp`` devices form a tensor-parallel group
(inside one node), consecutive groups are the data-parallel replicas of one stage, and the pipeline
stages are outermost (stage ``k`` of every replica sits on the ``k``-th block of ``tp * dp`` devices).
``tp-pp-dp`` puts consecutive groups in one pipeline and the replicas outermost. Context parallelism
(``cp > 1``) sits just outside tensor parallelism, as in Megatron-Core (``tp-cp-ep-dp-pp``): a stage's
``cp`` tensor-parallel groups are consecutive, so the orders read ``tp-cp-dp-pp`` and ``tp-cp-pp-dp``. Transformer blocks are split evenly over the ``pp * interleave`` virtual
stages; where they do not divide, the embedding and the head count as one layer each, as in
Megatron-Core and Llama 3 405B (:func:`even_layer_split`). As in Megatron-LM the embedding rides with
the first stage and the head with the last. The batch is split evenly over replicas.
"""

from __future__ import annotations

from hetpart.cluster import Cluster
from hetpart.errors import PlanError, WorkloadError
from hetpart.graph.model_graph import ModelGraph
from hetpart.plan import Plan, Replica, Stage
from hetpart.vocabulary import chunks_per_device
from hetpart.workload import Workload

__all__ = ["megatron_plan", "even_layer_split", "RANK_ORDERS", "DEFAULT_ORDER"]

RANK_ORDERS = ("tp-dp-pp", "tp-pp-dp")
"""Rank orders of the grid, innermost dimension first (tensor parallelism is innermost in every engine)."""
DEFAULT_ORDER = "tp-dp-pp"
"""Megatron-LM's order (``parallel_state.initialize_model_parallel``: TP, then DP, then PP outermost)."""


def even_layer_split(num_units: int, num_stages: int, has_ends: bool = True) -> list[tuple[int, int]]:
    """``[first, last)`` unit ranges for ``num_stages`` stages.

    With ``has_ends`` (a transformer: embedding, blocks, head) the embedding joins the first stage and the
    head the last. Where the blocks divide evenly over the stages they are split evenly (Megatron-LM's
    only layout). Where they do not, the embedding and the head each count as one layer of the split, as
    Megatron-Core's ``--account-for-embedding-in-pipeline-split`` and ``--account-for-loss-in-pipeline-split``
    do and as Llama 3 405B was trained (126 blocks over 16 x 4 virtual stages: "we reduce one Transformer
    layer each from the first and the last stages", Llama 3 paper, section 3.3.2): the first stage, which
    holds the most micro-batches in flight, carries one block fewer. A remainder that still does not divide
    goes to the stages just before the last, one block each (they hold few micro-batches in flight under
    1F1B). Without ``has_ends`` all units are split evenly, the remainder to the first stages.
    """
    lo, hi = (1, num_units - 1) if has_ends else (0, num_units)
    blocks = hi - lo
    if num_stages < 1 or blocks < num_stages:
        raise PlanError(f"--pp: {num_stages} pipeline stages (pp x interleave) for {blocks} layers; "
                        f"use at most {blocks} stages")
    if not has_ends or blocks % num_stages == 0 or num_stages < 2:
        base, extra = divmod(blocks, num_stages)
        sizes = [base + (1 if k < extra else 0) for k in range(num_stages)]
    else:
        base, extra = divmod(blocks + 2, num_stages)
        sizes = [base] * num_stages
        for k in range(num_stages - 1 - extra, num_stages - 1):
            sizes[k] += 1
        sizes[0] -= 1
        sizes[-1] -= 1
        if min(sizes) < 1:  # too few blocks for the ends to count: plain even split
            base, extra = divmod(blocks, num_stages)
            sizes = [base + (1 if k < extra else 0) for k in range(num_stages)]
    bounds = [lo]
    for size in sizes:
        bounds.append(bounds[-1] + size)
    bounds[0], bounds[-1] = 0, num_units
    return list(zip(bounds[:-1], bounds[1:]))


def _check_grid(model: ModelGraph, cluster: Cluster, workload: Workload, tp: int, pp: int, dp: int,
                micro_batch: int, cp: int = 1) -> None:
    for name, value in (("tp", tp), ("pp", pp), ("dp", dp), ("micro_batch", micro_batch), ("cp", cp)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PlanError(f"--{name.replace('_', '-')}: must be a whole number >= 1, got {value!r}")
    need = tp * cp * pp * dp
    if need > cluster.num_devices:
        # only the dimensions above 1 can go down (--tp 2 on one GPU: tp, not pp or dp)
        down = [f"--{n}" for n, value in (("pp", pp), ("dp", dp), ("cp", cp), ("tp", tp)) if value > 1]
        lower = "lower " + (" or ".join(down) if len(down) < 3 else ", ".join(down[:-1]) + " or " + down[-1])
        if cp == 1:
            raise PlanError(f"--tp/--pp/--dp: {tp} x {pp} x {dp} = {need} devices but cluster {cluster.name!r} has "
                            f"{cluster.num_devices}; {lower}")
        raise PlanError(f"--tp/--cp/--pp/--dp: {tp} x {cp} x {pp} x {dp} = {need} devices but cluster "
                        f"{cluster.name!r} has {cluster.num_devices}; {lower}")
    if workload.global_batch % (dp * micro_batch):
        raise WorkloadError(f"--global-batch: {workload.global_batch} is not divisible by dp x micro_batch = "
                            f"{dp} x {micro_batch}; use a multiple of {dp * micro_batch}")
    heads = model.num_heads
    if heads and heads % tp:
        raise PlanError(f"--tp: {tp} does not divide the {heads} attention heads of {model.name}")


def megatron_plan(model: ModelGraph, cluster: Cluster, workload: Workload, tp: int, pp: int, dp: int,
                  micro_batch: int, schedule: str = "1f1b", interleave: int = 1,
                  recompute: str = "selective", zero: int | None = None, order: str = DEFAULT_ORDER,
                  cp: int = 1) -> Plan:
    """The Megatron-LM plan of the given grid (see the module docstring); ``order`` places the ranks
    (``tp-cp-dp-pp`` and ``tp-cp-pp-dp`` are accepted for ``tp-dp-pp`` and ``tp-pp-dp``); ``cp``:
    context parallelism, each stage on ``tp x cp`` consecutive devices.

    Raises:
        PlanError: the grid needs more devices than the cluster has, a TP group would cross a node,
            or there are fewer layers than stages.
        WorkloadError: the global batch does not split into ``dp`` replicas of whole micro-batches.
    """
    _check_grid(model, cluster, workload, tp, pp, dp, micro_batch, cp)
    order = order.replace("tp-cp-", "tp-") if isinstance(order, str) else order
    if order not in RANK_ORDERS:
        raise PlanError(f"--order: unknown rank order {order!r}; use {' or '.join(RANK_ORDERS)} "
                        "(innermost first; Megatron-LM's is tp-dp-pp)")
    if isinstance(interleave, bool) or not isinstance(interleave, int) or interleave < 1:
        raise PlanError(f"--interleave: must be a whole number >= 1, got {interleave!r}")
    v = chunks_per_device(schedule, interleave)
    if schedule != "interleaved" and interleave != 1:
        raise PlanError(f"--interleave: {interleave} needs --schedule interleaved")
    devices = cluster.devices
    groups = []
    for g in range(pp * dp * cp):  # tensor-parallel groups; a stage holds cp consecutive ones
        members = devices[g * tp:(g + 1) * tp]
        if len({d.node_key for d in members}) > 1:
            raise PlanError(f"--tp: {tp} devices from {members[0].id} cross a node boundary; use a tp that divides "
                            f"the GPUs per node ({cluster.groups[members[0].group].gpus_per_node})")
        groups.append(tuple(d.id for d in members))
    if cp > 1:
        groups = [sum(groups[g * cp:(g + 1) * cp], ()) for g in range(pp * dp)]
    has_ends = (not model.traced or model.tied_owner is not None) and model.num_units >= 3
    ranges = even_layer_split(model.num_units, pp * v, has_ends)
    replicas = []
    for r in range(dp):
        pipe = groups[r * pp:(r + 1) * pp] if order == "tp-pp-dp" else groups[r::dp]
        stages = tuple(Stage(ranges[k], pipe[k % pp], tp) for k in range(pp * v))
        replicas.append(Replica(1.0 / dp, stages))
    recompute = "selective" if recompute == "auto" else recompute
    meta = {"planner": "megatron", "grid": [tp, pp, dp], "order": order, "model": model.name,
            "cluster": cluster.name}
    if cp > 1:
        meta.update(order=order.replace("tp-", "tp-cp-", 1), cp=cp)
    return Plan(global_batch=workload.global_batch, micro_batch=micro_batch, seq_len=workload.seq_len,
                replicas=tuple(replicas), schedule=schedule, recompute=recompute, interleave=v,
                zero=workload.zero or 0 if zero is None else zero, offload=workload.offload,
                precision=workload.precision, optimizer=workload.optimizer, attention=workload.attention, cp=cp,
                meta=meta)
