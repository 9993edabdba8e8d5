"""Which plans the runtime executes: its rules as plain data, and one check that reads them.

The runtime (:mod:`hetpart.runtime`) is not the only reader. :meth:`hetpart.plan.Plan.validate`
appends :func:`check` to its structural checks, so every planner that filters candidates through
``validate`` (the costmodel's ``Evaluator``) cannot emit a plan the runtime refuses; the search's
tensor-parallel options come from :func:`allowed_tp_degrees`; a planning environment builds its
action masks from :func:`tp_mask` (:func:`allowed_tp_degrees` per node group) and
:meth:`RuntimeRules.stages_may_differ_in_tp`.

Example:
    >>> from hetpart import load_cluster, load_model
    >>> model, cluster = load_model("gpt2-small", seq_len=128), load_cluster("a100-v100-16")
    >>> allowed_tp_degrees(model, cluster.groups[0].gpus_per_node)
    (1, 2, 4)
    >>> RULES.stages_may_differ_in_tp("1f1b"), RULES.stages_may_differ_in_tp("interleaved")
    (True, False)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # pragma: no cover
    from hetpart.cluster import Cluster
    from hetpart.graph.model_graph import ModelGraph
    from hetpart.plan import Plan, Replica

__all__ = ["TPDivisor", "RuntimeRules", "RULES", "tp_divisors", "allowed_tp_degrees", "tp_mask", "tp_problems",
           "split_sizes", "split_granularity", "ffn_split_unit", "tp_split_problems", "split_sharding_problems",
           "schedule_problems",
           "sharding_problems", "uneven_shard_problems", "accelerator_problems", "check"]

TPDivisor = Literal["num_heads", "kv_heads", "ffn"]
_DIVISOR_NAMES: dict[str, str] = {"num_heads": "attention heads", "kv_heads": "key/value heads", "ffn": "MLP width"}


@dataclass(frozen=True)
class RuntimeRules:
    """What the runtime can execute, beyond a plan's structural validity (covered units, devices that
    exist, whole micro-batches, connected zones)."""

    schedules: tuple[str, ...] = ("gpipe", "1f1b", "interleaved")
    """Pipeline schedules the runtime runs (torch.distributed.pipelining's GPipe, 1F1B, interleaved 1F1B)."""
    mixed_tp_schedules: tuple[str, ...] = ("gpipe", "1f1b")
    """Schedules under which the stages of one replica may have different TP degrees (the activation is
    resharded at the boundary: every receiving TP rank gets the full, replicated activation)."""
    replicas_may_differ_in_tp: bool = True
    """Replicas may use different TP degrees (their gradients are exchanged at full size)."""
    tp_divides: tuple[TPDivisor, ...] = ("num_heads", "kv_heads", "ffn")
    """Transformer sizes that every TP degree must divide (Megatron's column/row-parallel split)."""
    tp_within_node: bool = True
    """A TP group stays inside one node unless the plan sets ``allow_cross_node_tp``."""
    max_tp_without_transformer: int = 1
    """Models without a transformer config (``python:`` modules) run without tensor parallelism."""
    sharded_microbatch_collectives_need_alike_cuts: bool = True
    """Sharding levels 2-3 gather or reduce each unit every micro-batch; the members of a unit's shard
    group must issue those collectives in one order, which the runtime guarantees only when the
    replicas of a shard group cut the model alike (same stages, TP degrees). Level 1 has no such rule."""
    uneven_shard_levels: tuple[int, ...] = (1, 2)
    """Sharding levels that run with uneven ``shard_fractions`` (hetpart's distributed optimizer; level 3
    is torch FSDP2's, whose shards are equal ``torch.chunk`` pieces)."""
    interleaved_whole_rounds: bool = True
    """Interleaved 1F1B: a replica's micro-batches are a whole number of rounds of ``pp`` (torch's
    ``ScheduleInterleaved1F1B`` runs ``max(1, m // pp)`` rounds and needs ``m`` divisible by them)."""
    accelerator_offloads: tuple[str, ...] = ("none", "full")
    """Host offloads the runtime executes on an accelerator: ``full`` is FSDP2's ``CPUOffloadPolicy``;
    ``optimizer`` is not, since the runtime steps its optimizer on the device. (On a CPU device host memory
    is the device's, and every offload runs as it stands.)"""
    accelerator_full_offload_min_replicas: int = 2
    """Replicas that ``offload: full`` needs on an accelerator: ``CPUOffloadPolicy`` offloads what FSDP2
    shards, and the runtime shards a unit only among two or more replicas."""

    def stages_may_differ_in_tp(self, schedule: str) -> bool:
        """Whether the stages of one replica may use different TP degrees under ``schedule``."""
        return schedule in self.mixed_tp_schedules


RULES = RuntimeRules()
"""The rules of this version of the runtime."""


def tp_divisors(model: "ModelGraph", rules: RuntimeRules = RULES) -> dict[str, int] | None:
    """``{"attention heads": 12, ...}``: the sizes a TP degree must divide; None when the model has no
    transformer config (then only ``rules.max_tp_without_transformer`` is allowed)."""
    cfg = model.config
    if cfg is None:
        return None
    heads = cfg.num_heads
    kv = cfg.num_kv_heads or heads
    sizes = {"num_heads": heads, "kv_heads": kv if kv != heads else 0,  # no GQA: the heads rule says it
             "ffn": cfg.ffn_hidden_size or 4 * cfg.hidden_size}
    return {_DIVISOR_NAMES[k]: int(sizes[k]) for k in rules.tp_divides if sizes.get(k)}


def tp_problems(model: "ModelGraph", tp: int, rules: RuntimeRules = RULES) -> list[str]:
    """Why a stage of ``model`` cannot run with TP degree ``tp`` (empty when it can)."""
    sizes = tp_divisors(model, rules)
    if sizes is None:
        if tp > rules.max_tp_without_transformer:
            return [f"{tp} needs a transformer config; {model.name} (no transformer config) runs with tp "
                    f"{rules.max_tp_without_transformer}"]
        return []
    return [f"{tp} does not divide the {n} {what}" for what, n in sizes.items() if n % tp]


FFN_SPLIT_MULTIPLE = 64
"""Feed-forward columns of an uneven split come in multiples of this (GEMM tile granularity) where the
width allows (:func:`split_granularity`)."""


MIN_TILED_FFN = 1024
"""Feed-forward widths from this size split in :data:`FFN_SPLIT_MULTIPLE` units; smaller (shrunken) ones
in single columns."""


def split_sizes(model: "ModelGraph") -> dict[str, int] | None:
    """``{"heads": H, "ffn": F, "vocab": V}``: the totals an uneven split adds up to (None without a
    transformer config)."""
    cfg = model.config
    if cfg is None:
        return None
    return {"heads": cfg.num_heads, "ffn": cfg.ffn_hidden_size or 4 * cfg.hidden_size, "vocab": cfg.vocab_size}


def split_granularity(model: "ModelGraph", dim: str) -> int:
    """The unit each device's entry of ``dim`` must be a multiple of: whole key/value groups of heads
    (``heads / kv_heads``), 64 feed-forward columns (or the largest power of two dividing the width
    when 64 does not; one column below :data:`MIN_TILED_FFN`), one vocabulary row."""
    cfg = model.config
    if cfg is None:
        return 1
    if dim == "heads":
        return cfg.num_heads // (cfg.num_kv_heads or cfg.num_heads)
    if dim == "ffn":
        return ffn_split_unit(cfg.ffn_hidden_size or 4 * cfg.hidden_size)
    return 1


def ffn_split_unit(ffn: int) -> int:
    """The unit of a split of ``ffn`` feed-forward columns: :data:`FFN_SPLIT_MULTIPLE` (or the largest
    power of two dividing ``ffn`` when it does not) from :data:`MIN_TILED_FFN` columns, else one column
    (shrunken models of emulated runs are far below GEMM tiles)."""
    return math.gcd(ffn, FFN_SPLIT_MULTIPLE) if ffn >= MIN_TILED_FFN else 1


def tp_split_problems(model: "ModelGraph", stage, where: str = "stage") -> list[str]:
    """Why ``stage``'s ``tp_split`` does not fit ``model`` (empty when it does, or when there is none)."""
    split = stage.tp_split
    if split is None:
        return []
    sizes = split_sizes(model)
    if sizes is None:
        return [f"{where}.tp_split: {model.name} has no transformer config; an uneven split needs heads and "
                "feed-forward sizes (drop tp_split)"]
    out = []
    for dim, total in sizes.items():
        parts = getattr(split, dim)
        if not parts:
            continue
        unit = split_granularity(model, dim)
        what = {"heads": "attention heads", "ffn": "feed-forward columns", "vocab": "vocabulary rows"}[dim]
        if len(parts) != stage.tp:
            out.append(f"{where}.tp_split.{dim}: {len(parts)} entries for {stage.tp} devices; give one per device")
        elif sum(parts) != total:
            out.append(f"{where}.tp_split.{dim}: {list(parts)} adds up to {sum(parts)}, not the model's {total} "
                       f"{what}")
        elif any(p <= 0 or p % unit for p in parts):
            whole = {"heads": f"whole key/value groups of {unit} heads", "ffn": f"multiples of {unit} columns",
                     "vocab": "at least one row"}[dim]
            out.append(f"{where}.tp_split.{dim}: {list(parts)}: every device needs a positive share in {whole}")
    return out


def allowed_tp_degrees(model: "ModelGraph", gpus_per_node: int, *, allow_cross_node_tp: bool = False,
                       max_devices: int | None = None, rules: RuntimeRules = RULES) -> tuple[int, ...]:
    """TP degrees a stage of ``model`` may use on nodes of ``gpus_per_node`` devices (an action mask).

    Inside one node (``rules.tp_within_node``) the degree must divide ``gpus_per_node`` (groups of
    consecutive GPUs); with ``allow_cross_node_tp`` any degree up to ``max_devices`` is allowed.
    """
    if rules.tp_within_node and not allow_cross_node_tp:
        degrees = [t for t in range(1, gpus_per_node + 1) if gpus_per_node % t == 0]
    else:
        degrees = list(range(1, (max_devices or gpus_per_node) + 1))
    return tuple(t for t in degrees if not tp_problems(model, t, rules))


def tp_mask(model: "ModelGraph", cluster: "Cluster", *, allow_cross_node_tp: bool = False,
            rules: RuntimeRules = RULES) -> dict[int, tuple[int, ...]]:
    """Node group index -> the TP degrees a stage on that group's devices may use (an action mask).

    Example:
        >>> from hetpart import load_cluster, load_model
        >>> tp_mask(load_model("llama2-7b", seq_len=128), load_cluster("a100-v100-16"))
        {0: (1, 2, 4, 8), 1: (1, 2, 4, 8)}
    """
    return {i: allowed_tp_degrees(model, g.gpus_per_node, allow_cross_node_tp=allow_cross_node_tp,
                                  max_devices=cluster.num_devices, rules=rules)
            for i, g in enumerate(cluster.groups)}


def check(plan: "Plan", model: "ModelGraph", cluster: "Cluster", rules: RuntimeRules = RULES) -> list[str]:
    """Every runtime rule ``plan`` breaks for ``model`` on ``cluster`` (empty when the runtime can run it).

    Structural rules (covered units, existing devices, batch shares) are :meth:`Plan.validate`'s; this
    checks what the runtime adds. Devices missing from ``cluster`` are skipped (validate names them).
    """
    out = schedule_problems(plan, rules) + sharding_problems(plan, rules)
    seen: set[int] = set()
    for i, r in enumerate(plan.replicas):
        for j, s in enumerate(r.stages):
            if s.tp_split is not None:
                out += tp_split_problems(model, s, f"replicas[{i}].stages[{j}]")
                out += [f"replicas[{i}].stages[{j}].{why}" for why in split_sharding_problems(plan, rules)]
                problems = [why for why in tp_problems(model, s.tp, rules) if not _split_covers(s.tp_split, why)]
                out += [f"replicas[{i}].stages[{j}].tp: {why}" for why in problems]
            elif s.tp not in seen:
                seen.add(s.tp)
                for why in tp_problems(model, s.tp, rules):
                    out.append(f"replicas[{i}].stages[{j}].tp: {why}")
            cp = getattr(plan, "cp", 1)
            if len(s.devices) < 2 or (cp > 1 and s.tp < 2):
                continue  # one device sits on one node
            # with context parallelism the stage lists cp tensor-parallel groups, which may sit on other nodes
            for group in [s.devices] if cp == 1 else [s.devices[c * s.tp:(c + 1) * s.tp] for c in range(cp)]:
                nodes = _nodes(cluster, group)
                if rules.tp_within_node and len(nodes) > 1 and not plan.allow_cross_node_tp:
                    out.append(f"replicas[{i}].stages[{j}].devices: tensor-parallel group spans {len(nodes)} nodes; "
                               "keep it inside one node or set allow_cross_node_tp")
                    break
    if not rules.replicas_may_differ_in_tp and len({s.tp for r in plan.replicas for s in r.stages}) > 1:
        out.append("replicas: tensor-parallel degrees differ between replicas; use one tp everywhere")
    return out


def _nodes(cluster: "Cluster", devices) -> set[str]:
    """The nodes ``devices`` sit on (devices missing from ``cluster`` skipped), one per :attr:`Device.node_key`: a
    device's id is ``"group/node/gpu"`` (:attr:`Cluster.devices` names them so), so its node is the id before its
    last ``/``, read without looking the device up (a 1,024-GPU plan has 1,024 of them, validated 20 times a plan)."""
    return {d.rpartition("/")[0] for d in filter(cluster.has_device, devices)}


def _split_covers(split, why: str) -> bool:
    """Whether an uneven split gives the dimension that ``tp`` does not divide (``why``) explicitly."""
    if "heads" in why:
        return bool(split.heads)
    return "MLP" in why and bool(split.ffn)


def sharding_problems(plan: "Plan", rules: RuntimeRules = RULES) -> list[str]:
    """Sharded plans the runtime cannot order or mesh: replicas of one shard group that cut the model
    differently (or with other TP degrees) at levels 2-3, or at any level with tensor parallelism."""
    with_tp = any(s.tp > 1 for r in plan.replicas for s in r.stages)
    if not (plan.zero >= 2 or (plan.zero and with_tp)) or not rules.sharded_microbatch_collectives_need_alike_cuts:
        return []
    out = []
    for group in plan.shard_groups():
        shapes = {r: tuple((s.layers, s.tp) for s in plan.replicas[r].stages) for r in group}
        first = group[0]
        for r in group[1:]:
            if shapes[r] != shapes[first]:
                why = (f"zero {plan.zero} gathers or reduces every micro-batch" if plan.zero >= 2 else
                       "sharding with tensor parallelism runs on one (dp, tp) mesh per stage")
                out.append(f"replicas[{r}].stages: cut unlike replicas[{first}] of its shard group, but {why}, "
                           f"which runs only between replicas cut alike; cut them alike, or use "
                           f"{'zero 1' if plan.zero >= 2 and not with_tp else 'zero 0'}")
                break
    return out


def split_sharding_problems(plan: "Plan", rules: RuntimeRules = RULES) -> list[str]:
    """Why sharded data parallelism does not run beside an uneven ``tp_split`` in ``plan`` (empty when it
    does). Levels 1-2 run on hetpart's distributed optimizer, whose ranges are cut from each rank's local
    slice (:mod:`hetpart.runtime.dist_optimizer`); level 3 is torch FSDP2's, whose DTensor shards follow
    ``torch.chunk`` and cannot hold an uneven slice; hybrid sharding is not built for them."""
    zero = getattr(plan, "zero", 0)
    if not zero:
        return []
    if zero not in rules.uneven_shard_levels:
        return [f"tp_split: an uneven split does not run at zero {zero} (torch FSDP2 shards DTensors, which "
                f"cannot hold an uneven slice); use zero {' or '.join(map(str, rules.uneven_shard_levels))}, "
                "or drop tp_split"]
    if plan.shard_group:
        return ["tp_split: an uneven split does not run with hybrid sharding (shard_group); use shard_group 0, "
                "or drop tp_split"]
    return []


def uneven_shard_problems(plan: "Plan", rules: RuntimeRules = RULES) -> list[str]:
    """Uneven ``shard_fractions`` the runtime cannot execute: levels 1-2 run on hetpart's distributed
    optimizer with uneven ranges (:mod:`hetpart.runtime.dist_optimizer`); level 3 runs on torch FSDP2,
    which cuts every parameter into equal ``torch.chunk`` pieces; hybrid sharding is not built for them.

    Not part of :func:`check` (so not of :meth:`Plan.validate`): the simulator prices such plans, as a
    what-if. The runtime refuses them (:func:`hetpart.runtime.sharded.sharding_problems`) and the planners
    that choose fractions ask this first (:func:`hetpart.policies.shard_fractions.choose_shard_fractions`)."""
    if plan.shard_fractions is None or len(set(plan.shard_fractions)) < 2 or not plan.zero:
        return []
    if plan.zero not in rules.uneven_shard_levels:
        return [f"shard_fractions: uneven shards do not run at zero {plan.zero}: torch FSDP2 splits each parameter "
                "into equal torch.chunk pieces (shard_placement_fn only picks the dimension); use zero "
                f"{' or '.join(map(str, rules.uneven_shard_levels))} or even shards (drop shard_fractions)"]
    if plan.shard_group:
        return ["shard_fractions: uneven shards with hybrid sharding (shard_group) do not run; use shard_group 0 "
                "or even shards (drop shard_fractions)"]
    return []


def accelerator_problems(plan: "Plan", rules: RuntimeRules = RULES) -> list[str]:
    """Why the runtime refuses ``plan`` on an accelerator (``--device cuda``) though it runs it on CPU ranks
    (empty when it runs it on both); the engine and ``hetpart run`` raise the first, with this text.

    Not part of :func:`check` (so not of :meth:`Plan.validate`): a plan names no device kind, and these
    plans are sound elsewhere. DeepSpeed's ``offload_param`` (ZeRO-Infinity) runs ``full`` on one GPU,
    ZeRO-Offload and Megatron-Core's ``--optimizer-cpu-offload`` run ``optimizer``, the simulator prices
    both, and ``hetpart run`` executes them on CPU ranks. A planner barred from them would leave a one-GPU
    cluster no ``--offload full`` plan at all. ``hetpart plan`` says it in a note instead."""
    offload = getattr(plan, "offload", "none")
    if offload not in rules.accelerator_offloads:
        return [f"offload: {offload!r} keeps the optimizer on the host, and hetpart's runtime steps it on the "
                "device; run offload 'full' (FSDP2's CPUOffloadPolicy, zero 3), run on CPU ranks (--device cpu), "
                "or predict the plan"]
    if offload == "full" and plan.dp < rules.accelerator_full_offload_min_replicas:
        return [f"offload: 'full' runs on FSDP2's CPUOffloadPolicy, which offloads what FSDP shards, and "
                f"{plan.dp} replica shards nothing; use {rules.accelerator_full_offload_min_replicas} or more "
                "replicas, run on CPU ranks (--device cpu), or predict the plan"]
    return []


def schedule_problems(plan: "Plan", rules: RuntimeRules = RULES) -> list[str]:
    """The rules that depend on the plan alone, not on the model: the schedule, TP degrees that differ
    between the stages of a replica, interleaved rounds. (The runtime checks them on what runs too.)"""
    out: list[str] = []
    if plan.schedule not in rules.schedules:
        out.append(f"schedule: {plan.schedule!r} does not run; use one of {', '.join(rules.schedules)}")
    for i, r in enumerate(plan.replicas):
        out += _replica_rules(plan, i, r, rules)
    return out


def _replica_rules(plan: "Plan", i: int, r: "Replica", rules: RuntimeRules) -> list[str]:
    out = []
    tps = sorted({s.tp for s in r.stages})
    if len(tps) > 1 and not rules.stages_may_differ_in_tp(plan.schedule):
        out.append(f"replicas[{i}].stages: tensor-parallel degrees {tps} differ, which schedule {plan.schedule!r} "
                   f"does not run; use {' or '.join(rules.mixed_tp_schedules)}, or one tp for every stage")
    if plan.schedule == "interleaved" and rules.interleaved_whole_rounds and plan.interleave > 0:
        pp, m = max(1, r.pp // plan.interleave), plan.num_microbatches(i)
        rounds = max(1, m // pp)
        if m and m % rounds:
            out.append(f"replicas[{i}]: {m} micro-batches is not a multiple of {rounds} rounds of {pp} "
                       "(interleaved 1F1B); change micro_batch or the share")
    return out
