"""A parallel plan: data-parallel replicas of pipelines whose stages hold layer ranges on device groups.

The plan is plain data with a JSON round trip (shared/CONTRACT.md), a :meth:`Plan.validate` that
lists every broken rule, and a rich rendering.

Example:
    >>> plan = Plan(global_batch=8, micro_batch=1, seq_len=128, replicas=(
    ...     Replica(1.0, (Stage((0, 3), ("0/0/0",)), Stage((3, 14), ("0/0/1",)))),))
    >>> Plan.from_dict(plan.to_dict()) == plan
    True
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from itertools import filterfalse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hetpart import _validate as v
from hetpart.errors import PlanError
from hetpart.vocabulary import ATTENTIONS, OFFLOADS, OPTIMIZERS, PRECISIONS, RECOMPUTE_MODES, SCHEDULES, Attention, Offload, \
    Optimizer, Precision, RecomputeMode, Schedule, chunks_per_device

if TYPE_CHECKING:  # pragma: no cover
    from rich.table import Table

    from hetpart.cluster import Cluster
    from hetpart.graph.model_graph import ModelGraph

__all__ = ["Schedule", "TPSplit", "Stage", "Replica", "Plan", "load_plan", "compress_device_ids", "units_text", "ZERO_LEVELS"]

_SHARE_TOL = 1e-6
ZERO_LEVELS = (0, 1, 2, 3)
"""Sharding levels of data parallelism (ZeRO stages; 3 is FSDP's full shard)."""
_MAX_UNITS = 10**6


_SPLIT_DIMS = ("heads", "ffn", "vocab")


@dataclass(frozen=True)
class TPSplit:
    """An uneven tensor-parallel split (HAP): how many whole units of each split dimension each device
    of the group holds, in the order of the stage's ``devices``. An empty tuple means an even split of
    that dimension. The sizes must add up to the model's (:func:`hetpart.rules.tp_split_problems`)."""

    heads: tuple[int, ...] = ()
    """Attention heads per device (whole key/value groups under grouped-query attention)."""
    ffn: tuple[int, ...] = ()
    """Feed-forward (MLP) columns per device, in multiples of 64 where the width allows."""
    vocab: tuple[int, ...] = ()
    """Vocabulary rows of the embedding and output head per device."""

    def to_dict(self) -> dict[str, list[int]]:
        return {k: list(getattr(self, k)) for k in _SPLIT_DIMS if getattr(self, k)}

    @property
    def empty(self) -> bool:
        return not (self.heads or self.ffn or self.vocab)


@dataclass(frozen=True)
class Stage:
    """One pipeline stage of one replica."""

    layers: tuple[int, int]
    """Units ``[first, last)`` of the model graph this stage runs."""
    devices: tuple[str, ...]
    """Device ids of the stage, ``"<node-group>/<node>/<gpu>"``: its tensor-parallel group, or with
    context parallelism (:attr:`Plan.cp`) the ``cp`` groups of ``tp`` devices one after another
    (tensor parallelism innermost: context-parallel rank ``c`` holds ``devices[c * tp:(c + 1) * tp]``)."""
    tp: int = 1
    """Tensor-parallel degree (``len(devices) / cp``)."""
    tp_split: TPSplit | None = None
    """Uneven split of the group's work (None: even, Megatron's ``1/tp`` each)."""

    @property
    def num_layers(self) -> int:
        return self.layers[1] - self.layers[0]


@dataclass(frozen=True)
class Replica:
    """One data-parallel replica: a pipeline that processes ``batch_share`` of the global batch."""

    batch_share: float
    stages: tuple[Stage, ...]

    @property
    def pp(self) -> int:
        """Pipeline depth (stages, virtual chunks included)."""
        return len(self.stages)

    @property
    def devices(self) -> list[str]:
        return list(dict.fromkeys(d for s in self.stages for d in s.devices))

    def num_samples(self, global_batch: int) -> int:
        """Sequences this replica processes per step."""
        return int(round(self.batch_share * global_batch))


@dataclass(frozen=True)
class Plan:
    """A whole plan (shared/CONTRACT.md, "A plan JSON")."""

    global_batch: int
    micro_batch: int
    seq_len: int
    replicas: tuple[Replica, ...]
    schedule: Schedule = "1f1b"
    recompute: RecomputeMode = "none"
    interleave: int = 1
    """Virtual stages per device group for the interleaved schedule (1 otherwise)."""
    precision: Precision = "bf16"
    optimizer: Optimizer = "adam"
    """The workload's optimizer (model-state bytes and step time, :mod:`hetpart.costmodel.memory`)."""
    attention: Attention = "fused"
    """The workload's attention kernel: ``fused`` stores no attention-score matrix, ``eager`` does."""
    allow_cross_node_tp: bool = False
    """Allow a tensor-parallel group to span nodes (slow; off unless asked)."""
    zero: int = 0
    """Sharded data parallelism (ZeRO stage): 0 none, 1 optimizer states, 2 also gradients, 3 also
    parameters (FSDP full shard). The states of a unit are sharded over the replicas holding it."""
    offload: Offload = "none"
    """Model states kept in host memory (:data:`hetpart.vocabulary.OFFLOADS`, :mod:`hetpart.costmodel.offload`):
    ``none``, ``optimizer`` (ZeRO-Offload: master weights, moments and gradient shards; the step on the CPU)
    or ``full`` (also the parameters, gathered unit by unit; needs ``zero`` 3). Left out of the JSON when
    ``none``."""
    shard_group: int = 0
    """Hybrid sharding (HSDP): states are sharded inside groups of this many consecutive replicas and
    replicated across the groups; 0 shards over all replicas (plain ZeRO / FSDP)."""
    shard_fractions: tuple[float, ...] | None = None
    """Per replica, the fraction of its shard group's states it holds (each group's fractions sum to 1);
    None: even shards. Uneven fractions let a small device hold less."""
    cp: int = 1
    """Context parallelism (Megatron-Core's ``context_parallel_size``): every stage's sequence is split
    ``cp`` ways, each context-parallel rank holding two of ``2 cp`` chunks (load-balanced causal split) and
    exchanging keys and values with the others in a ring inside attention; parameters are replicated
    over the ``cp`` ranks and their gradients reduced over ``dp x cp``. Each stage then lists ``tp x cp``
    devices (:attr:`Stage.devices`). It is one degree for the whole plan, not per stage, because the
    activations a stage hands to the next are split along the sequence: a stage with another degree
    would need a re-split at every boundary, which no engine does (Megatron-Core, torchtitan and NeMo
    all take one ``cp`` for the model), while tensor parallelism may differ per stage because the
    boundary carries the full hidden state. 1: no context parallelism (the field is then left out of
    the JSON). Prediction only: ``hetpart run`` refuses ``cp > 1``."""
    meta: dict[str, Any] = field(default_factory=dict, compare=False)
    """Free-form provenance: model, cluster, planner."""

    # ------------------------------------------------------------------------------- views
    @property
    def devices(self) -> list[str]:
        return list(dict.fromkeys(d for r in self.replicas for d in r.devices))

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def dp(self) -> int:
        return len(self.replicas)

    def replica_samples(self) -> list[int]:
        return [r.num_samples(self.global_batch) for r in self.replicas]

    @property
    def chunks_per_device(self) -> int:
        """Model chunks each pipeline device runs (``interleave`` under the interleaved schedule, else 1)."""
        return chunks_per_device(self.schedule, self.interleave)

    def pipeline_devices(self, replica: int) -> int:
        """Device groups of a replica's pipeline (its stages over the chunks each group runs)."""
        return self.replicas[replica].pp // self.chunks_per_device

    def num_microbatches(self, replica: int) -> int:
        return self.replicas[replica].num_samples(self.global_batch) // self.micro_batch

    def shard_groups(self) -> list[list[int]]:
        """Replica indices of each shard group (one group of all replicas unless ``shard_group`` is set)."""
        size = self.shard_group if 0 < self.shard_group < self.dp else self.dp
        return [list(range(i, min(i + size, self.dp))) for i in range(0, self.dp, size)]

    def shard_fraction(self, replica: int) -> float:
        """The fraction of the sharded states that ``replica`` holds (1.0 without sharding)."""
        if self.zero == 0:
            return 1.0
        if self.shard_fractions is not None:
            return self.shard_fractions[replica]
        size = self.shard_group if 0 < self.shard_group < self.dp else self.dp
        return 1.0 / size

    # ------------------------------------------------------------------------------- JSON
    def to_dict(self) -> dict[str, Any]:
        return {
            "global_batch": self.global_batch,
            "micro_batch": self.micro_batch,
            "seq_len": self.seq_len,
            "schedule": self.schedule,
            "interleave": self.interleave,
            "recompute": self.recompute,
            "precision": self.precision,
            "optimizer": self.optimizer,
            "attention": self.attention,
            "allow_cross_node_tp": self.allow_cross_node_tp,
            "zero": self.zero,
            **({"offload": self.offload} if self.offload != "none" else {}),
            **({"cp": self.cp} if self.cp != 1 else {}),
            **({"shard_group": self.shard_group} if self.shard_group else {}),
            **({"shard_fractions": list(self.shard_fractions)} if self.shard_fractions is not None else {}),
            "replicas": [
                {"batch_share": r.batch_share,
                 "stages": [_stage_dict(s) for s in r.stages]}
                for r in self.replicas
            ],
            "meta": dict(self.meta),
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: Any, source: str = "<plan>") -> "Plan":
        """Parse a plan mapping; structural problems raise :class:`PlanError` naming the field."""
        data = v.require_mapping(PlanError, data, source, "")
        if isinstance(data.get("plan"), dict) and "replicas" not in data:  # `hetpart plan --json` output, whole
            raise v.fail(PlanError, source, "plan", "this is the output of 'hetpart plan --json', whose plan is "
                         "its \"plan\" object: write the plan itself with 'hetpart plan --out FILE'")
        v.require_keys(PlanError, data, source, "", ["global_batch", "micro_batch", "seq_len", "replicas"],
                       ["schedule", "interleave", "recompute", "precision", "optimizer", "attention",
                        "allow_cross_node_tp", "meta", "zero", "offload", "shard_group", "shard_fractions", "cp"])
        schedule = data.get("schedule", "1f1b")
        if schedule not in SCHEDULES:
            raise v.fail(PlanError, source, "schedule", f"unknown schedule {v.show(schedule)}; use {', '.join(SCHEDULES)}")
        recompute = data.get("recompute", "none")
        if recompute not in RECOMPUTE_MODES:
            raise v.fail(PlanError, source, "recompute", f"unknown mode {v.show(recompute)}; use none, selective or full")
        precision = data.get("precision", "bf16")
        if not isinstance(precision, str) or precision not in PRECISIONS:
            raise v.fail(PlanError, source, "precision", f"unknown precision {v.show(precision)}; use {', '.join(PRECISIONS)}")
        optimizer = data.get("optimizer", "adam")
        if not isinstance(optimizer, str) or optimizer not in OPTIMIZERS:
            raise v.fail(PlanError, source, "optimizer", f"unknown optimizer {v.show(optimizer)}; use {', '.join(OPTIMIZERS)}")
        attention = data.get("attention", "fused")
        if not isinstance(attention, str) or attention not in ATTENTIONS:
            raise v.fail(PlanError, source, "attention", f"unknown attention kernel {v.show(attention)}; use "
                         f"{', '.join(ATTENTIONS)}")
        offload = data.get("offload", "none")
        if not isinstance(offload, str) or offload not in OFFLOADS:
            raise v.fail(PlanError, source, "offload", f"unknown offload {v.show(offload)}; use {', '.join(OFFLOADS)}")
        replicas = data["replicas"]
        if not isinstance(replicas, list) or not replicas:
            raise v.fail(PlanError, source, "replicas", "expected a non-empty list of replicas")
        meta = data.get("meta", {})
        return cls(
            global_batch=v.integer(PlanError, data["global_batch"], source, "global_batch", maximum=10**8),
            micro_batch=v.integer(PlanError, data["micro_batch"], source, "micro_batch", maximum=10**8),
            seq_len=v.integer(PlanError, data["seq_len"], source, "seq_len", maximum=10**7),
            replicas=tuple(_replica(r, source, f"replicas[{i}]") for i, r in enumerate(replicas)),
            schedule=schedule, recompute=recompute, precision=precision, optimizer=optimizer, attention=attention,
            interleave=v.integer(PlanError, data.get("interleave", 1), source, "interleave", maximum=128),
            allow_cross_node_tp=v.boolean(PlanError, data.get("allow_cross_node_tp", False), source, "allow_cross_node_tp"),
            zero=_zero(data.get("zero", 0), source), offload=offload,
            shard_group=v.integer(PlanError, data.get("shard_group", 0), source, "shard_group", minimum=0,
                                  maximum=10**6),
            shard_fractions=_fractions(data.get("shard_fractions"), source),
            cp=v.integer(PlanError, data.get("cp", 1), source, "cp", maximum=1024),
            meta=meta if isinstance(meta, dict) else {},
        )

    @classmethod
    def from_json(cls, text: str, source: str = "<plan>") -> "Plan":
        return cls.read_json(text, source)[0]

    @classmethod
    def read_json(cls, text: str, source: str = "<plan>") -> tuple["Plan", bool]:
        """:meth:`from_json`, and whether the text names the plan's precision (the key is optional: see
        :func:`states_precision`), from one parse (``predict --plans`` lines are tens of KB each)."""
        try:
            data = json.loads(text)
            return cls.from_dict(data, source), "precision" in data
        except json.JSONDecodeError as exc:
            raise PlanError(f"{source}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}; "
                            "give a plan written by 'hetpart plan --out'") from None
        except RecursionError:
            raise PlanError(f"{source}: JSON nested too deeply") from None
        except ValueError as exc:  # e.g. an integer with more digits than Python converts
            raise PlanError(f"{source}: unreadable JSON value ({exc}); give a plan written by 'hetpart plan --out'") from None

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n")

    # ------------------------------------------------------------------------------- rules
    def validate(self, model: "ModelGraph", cluster: "Cluster") -> list[str]:
        """Every rule the plan breaks for ``model`` on ``cluster`` (empty when valid): its structure and
        the runtime's rules (:mod:`hetpart.rules`), so a valid plan is one that ``hetpart run`` executes,
        except context parallelism (``cp > 1``), which is valid for prediction and refused by the runtime
        (no planner emits it)."""
        from hetpart import rules

        problems: list[str] = []
        problems += self._check_batch()
        problems += self._check_sharding()
        problems += self._check_context(model)
        problems += self._check_layers(model)
        problems += self._check_devices(cluster)
        problems += rules.check(self, model, cluster)  # both skip unknown devices, reported above
        problems += self._check_zones(cluster, model)
        return problems

    def check(self, model: "ModelGraph", cluster: "Cluster", source: str = "plan") -> None:
        """Raise :class:`PlanError` listing every broken rule (one line, rules joined by '; ')."""
        problems = self.validate(model, cluster)
        if problems:
            rest, shown = problems[1:], problems[1:4]
            hidden = f"; and {len(rest) - len(shown)} not shown" if len(rest) > len(shown) else ""
            more = f" (+{len(rest)} more: {'; '.join(shown)}{hidden})" if rest else ""
            raise PlanError(f"{source}: {problems[0]}{more}")

    def _check_batch(self) -> list[str]:
        out = []
        shares = [r.batch_share for r in self.replicas]
        if any(s <= 0 for s in shares):
            out.append("replicas[*].batch_share: every share must be > 0")
        if abs(sum(shares) - 1.0) > _SHARE_TOL:
            out.append(f"replicas[*].batch_share: shares sum to {sum(shares):.6g}, not 1; rescale them")
        for i, r in enumerate(self.replicas):
            exact = r.batch_share * self.global_batch
            n = round(exact)
            if abs(exact - n) > 1e-6 * max(1.0, exact):
                out.append(f"replicas[{i}].batch_share: {r.batch_share:.6g} x global_batch {self.global_batch} = "
                           f"{exact:.6g} is not a whole number of sequences")
            elif n % self.micro_batch or n == 0:
                out.append(f"replicas[{i}].batch_share: {n} sequences is not a positive multiple of "
                           f"micro_batch {self.micro_batch}")
        if self.schedule == "interleaved" and self.interleave < 2:
            # Megatron-LM interleaves only with a virtual pipeline size of 2 or more; one chunk per device is plain
            # 1F1B, which the simulator and the runtime price and run as such only under schedule '1f1b'
            out.append(f"interleave: schedule 'interleaved' needs interleave >= 2 model chunks per device, got "
                       f"{self.interleave} (1 where the key is left out); give "
                       "interleave 2 or more, or use schedule '1f1b' (one chunk per device is plain 1F1B)")
        elif self.schedule == "interleaved":
            for i, r in enumerate(self.replicas):
                if r.pp % self.interleave:
                    out.append(f"replicas[{i}].stages: {r.pp} stages is not a multiple of interleave {self.interleave}")
        elif self.interleave != 1:
            out.append(f"interleave: {self.interleave} needs schedule 'interleaved'")
        return out

    def _check_sharding(self) -> list[str]:
        out = []
        if self.zero not in ZERO_LEVELS:
            out.append(f"zero: {self.zero} is not a sharding level; use 0, 1, 2 or 3")
        if self.offload not in OFFLOADS:
            out.append(f"offload: {self.offload!r} is not an offload level; use {', '.join(OFFLOADS)}")
        if self.offload == "full" and self.zero != 3:
            out.append(f"offload: 'full' keeps the parameters on the host and gathers them unit by unit, which "
                       f"needs zero 3 (not {self.zero}); set zero 3 or offload 'optimizer'")
        if self.shard_group and (self.zero == 0 or self.dp % self.shard_group or self.shard_group == 1):
            why = ("needs zero >= 1" if self.zero == 0 else "shards nothing" if self.shard_group == 1
                   else f"does not divide the {self.dp} replicas")
            out.append(f"shard_group: {self.shard_group} {why}; use a divisor (>= 2) of dp with zero 1-3, or 0")
        fractions = self.shard_fractions
        if fractions is None:
            return out
        if self.zero == 0:
            out.append("shard_fractions: given but zero is 0 (nothing is sharded); set zero 1-3 or drop them")
        if len(fractions) != self.dp:
            out.append(f"shard_fractions: {len(fractions)} fractions for {self.dp} replicas; give one per replica")
            return out
        if any(f <= 0 for f in fractions):
            out.append("shard_fractions: every fraction must be > 0")
        for group in self.shard_groups():
            total = sum(fractions[i] for i in group)
            if abs(total - 1.0) > _SHARE_TOL:
                out.append(f"shard_fractions: replicas {group[0]}-{group[-1]} hold {total:.6g} of their shard "
                           "group's states, not 1; rescale them")
        return out

    def _check_context(self, model: "ModelGraph") -> list[str]:
        """Context parallelism's rules (Megatron-Core's): the sequence splits into ``2 cp`` equal chunks
        (two per rank, for the load-balanced causal split), attention runs in the fused kernel (the
        ring exchange lives inside Transformer Engine's flash attention), and the model is a
        transformer (a traced module has no attention to split)."""
        cp = self.cp
        if cp == 1:
            return []
        out = []
        if cp < 1:
            return [f"cp: {cp} must be a whole number >= 1 (1: no context parallelism)"]
        if self.seq_len % (2 * cp):
            out.append(f"cp: seq_len {self.seq_len} is not divisible by 2 x cp = {2 * cp} (each context-parallel "
                       f"rank holds two equal chunks of the sequence); use a seq_len that is a multiple of {2 * cp} "
                       "or another cp")
        if self.attention != "fused":
            out.append(f"cp: context parallelism runs inside the fused attention kernel; set attention 'fused' "
                       f"(not {self.attention!r}) or cp 1")
        if model.config is None:
            out.append(f"cp: {model.name} has no transformer config (no attention to split); use cp 1")
        for i, r in enumerate(self.replicas):
            for j, s in enumerate(r.stages):
                if s.tp_split is not None:
                    out.append(f"replicas[{i}].stages[{j}].tp_split: an uneven tensor-parallel split is not "
                               f"modelled with cp {cp}; drop tp_split or use cp 1")
        return out

    def _check_layers(self, model: "ModelGraph") -> list[str]:
        out = []
        n = model.num_units
        for i, r in enumerate(self.replicas):
            expect = 0
            for j, s in enumerate(r.stages):
                first, last = s.layers
                if first != expect:
                    what = "overlaps the previous stage" if first < expect else "leaves a gap after the previous stage"
                    out.append(f"replicas[{i}].stages[{j}].layers: starts at {first}, expected {expect} ({what})")
                if last <= first:
                    out.append(f"replicas[{i}].stages[{j}].layers: [{first}, {last}) is empty")
                expect = max(expect, last)
            if expect != n:
                out.append(f"replicas[{i}]: stages cover units [0, {expect}), but the model has {n} units "
                           f"({model.name}); every unit must be covered exactly once")
        return out

    def _check_devices(self, cluster: "Cluster") -> list[str]:
        out = []
        uses: Counter[str] = Counter()
        listed = [d for r in self.replicas for s in r.stages for d in s.devices]
        unknown = set(filterfalse(cluster.has_device, listed))
        # no device listed twice anywhere (a planner's plan): no stage repeats one and none is used twice, so
        # the per-stage sets and the count of uses (a 1,024-GPU plan's most of this check) are skipped
        once = len(set(listed)) == len(listed)
        for i, r in enumerate(self.replicas):
            groups = [s.devices for s in r.stages]
            for j, s in enumerate(r.stages):
                if self.cp == 1 and s.tp != len(s.devices):
                    out.append(f"replicas[{i}].stages[{j}].tp: {s.tp} but {len(s.devices)} devices listed; "
                               "tp must equal the number of devices")
                elif s.tp * self.cp != len(s.devices):
                    out.append(f"replicas[{i}].stages[{j}].devices: {len(s.devices)} devices listed, but tp {s.tp} x "
                               f"cp {self.cp} = {s.tp * self.cp}; list tp x cp devices (tensor-parallel groups one "
                               "after another) or change tp")
                if not once and len(s.devices) > 1 and len(set(s.devices)) != len(s.devices):
                    out.append(f"replicas[{i}].stages[{j}].devices: a device is listed twice")
                for d in s.devices if unknown else ():
                    if d in unknown:
                        out.append(f"replicas[{i}].stages[{j}].devices: {d!r} does not exist in cluster "
                                   f"{cluster.name!r} ({cluster.num_devices} devices)")
            distinct = list(dict.fromkeys(groups))
            if self.schedule == "interleaved":
                pp = max(1, r.pp // max(1, self.interleave))
                if any(groups[k] != groups[k % pp] for k in range(len(groups))):
                    out.append(f"replicas[{i}].stages: interleaved stage k must run on the devices of stage k mod {pp}")
            elif len(distinct) != len(groups):
                out.append(f"replicas[{i}].stages: two stages share devices; use schedule 'interleaved' for that")
            if not once:
                uses.update(d for g in distinct for d in set(g))
        twice = [d for d, c in uses.items() if c > 1]
        if twice:
            out.append(f"devices {compress_device_ids(sorted(twice))} are used more than once; a device serves one stage of one replica")
        return out

    def _check_zones(self, cluster: "Cluster", model: "ModelGraph | None" = None) -> list[str]:
        out = []
        names = cluster.zones
        if all(cluster.zones_connected(a, b) for a in names for b in names):
            return out  # every rule below is about two zones without a link

        def zones(stage: Stage) -> list[str]:
            return list(dict.fromkeys(cluster.device(d).zone for d in stage.devices if cluster.has_device(d)))

        reported: set[frozenset] = set()  # zone pairs already named (the tied rule names no pair twice)
        for i, r in enumerate(self.replicas):
            for j in range(1, len(r.stages)):
                cut = {(a, b) for a in zones(r.stages[j - 1]) for b in zones(r.stages[j])
                       if not cluster.zones_connected(a, b)}
                reported.update(frozenset(pair) for pair in cut)
                for a, b in sorted(cut):
                    out.append(f"replicas[{i}].stages[{j}]: zones {a!r} and {b!r} have no link; add one under 'links'")
        # Every zone holding a copy of a unit (data-parallel replicas, or a TP group across zones)
        # must exchange its gradients with every other such zone. Ranges, not units, keep this fast.
        ranges: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for r in self.replicas:
            for s in r.stages:
                for z in zones(s):
                    ranges[z].append(s.layers)
        names = sorted(ranges)
        for k, a in enumerate(names):
            for b in names[k + 1:]:
                if not cluster.zones_connected(a, b) and _ranges_overlap(ranges[a], ranges[b]):
                    reported.add(frozenset((a, b)))
                    out.append(f"replicas: data-parallel copies in zones {a!r} and {b!r} must sync gradients but "
                               "the zones have no link; add one under 'links'")
        return out + self._check_tied_zones(cluster, model, zones, reported)

    def _check_tied_zones(self, cluster: "Cluster", model: "ModelGraph | None", zones, reported: set) -> list[str]:
        """A stage holding a unit that uses tied weights (the head of a tied-embedding model) without their
        owner keeps a copy, reduced with every holder of either at each step: their zones need links (pairs in
        ``reported`` are already named by another rule)."""
        owner = model.tied_owner_index if model is not None else -1
        if owner < 0:
            return []
        out = []
        for u in (i for i, unit in enumerate(model.units) if unit.shared_params):
            holds = [(s.layers[0] <= u < s.layers[1], s.layers[0] <= owner < s.layers[1], s)
                     for r in self.replicas for s in r.stages]
            if not any(has_u and not has_owner for has_u, has_owner, _ in holds):
                continue  # every copy sits beside its owner: nothing to reduce
            names = sorted({z for has_u, has_owner, s in holds if has_u or has_owner for z in zones(s)})
            for k, a in enumerate(names):
                for b in names[k + 1:]:
                    if not cluster.zones_connected(a, b) and frozenset((a, b)) not in reported:
                        reported.add(frozenset((a, b)))
                        out.append(f"replicas: the tied weights of {model.units[u].name!r} and "
                                   f"{model.units[owner].name!r} are reduced together at each step, but zones {a!r} and {b!r} have no "
                                   "link; add one under 'links', or keep the stages holding them in linked zones")
        return out

    # ------------------------------------------------------------------------------- rendering
    def _sharding_text(self) -> str:
        offload = f", offload={self.offload}" if self.offload != "none" else ""
        if not self.zero:
            return offload
        hybrid = f" (hybrid: groups of {self.shard_group})" if self.shard_group else ""
        uneven = ", uneven shards" if self.shard_fractions is not None else ""
        return f", zero={self.zero}{hybrid}{uneven}{offload}"

    def table(self, cluster: "Cluster | None" = None, model: "ModelGraph | None" = None, full: bool = False) -> "Table":
        """A rich table: one row per stage of each replica; identical replicas (same share, layers, TP
        degrees and device types) share one set of rows marked ``xN`` unless ``full``."""
        from rich.table import Table

        t = Table(title=f"plan: dp={self.dp}, micro_batch={self.micro_batch}, schedule={self.schedule}"
                        f"{f' x{self.interleave}' if self.interleave > 1 else ''}, recompute={self.recompute}"
                        f"{self._sharding_text()}{f', cp={self.cp}' if self.cp > 1 else ''}")
        for col in ("replica", "share", "stage", "units", "devices", "gpu", "tp") + (("cp",) if self.cp > 1 else ()):
            t.add_column(col, justify="right" if col in ("share", "tp", "cp") else "left")

        def gpus(s: Stage) -> str:
            if cluster is None or not all(cluster.has_device(d) for d in s.devices):
                return ""
            return ",".join(dict.fromkeys(cluster.device(d).gpu.name for d in s.devices))

        groups: dict[Any, list[int]] = {}
        for i, r in enumerate(self.replicas):
            key = i if full else (round(r.batch_share, 9), tuple((s.layers, s.tp, gpus(s), s.tp_split) for s in r.stages))
            groups.setdefault(key, []).append(i)
        if any(s.tp_split is not None for r in self.replicas for s in r.stages):
            t.caption = "tp (heads h / columns c): an uneven split, in the order of the devices"
        for members in groups.values():
            r = self.replicas[members[0]]
            label = str(members[0]) if len(members) == 1 else f"{_index_ranges(members)} (x{len(members)})"
            for j, s in enumerate(r.stages):
                units = units_text(s.layers, model)
                devices = [d for m in members for d in self.replicas[m].stages[j].devices]
                tp = str(s.tp) if s.tp_split is None else f"{s.tp} ({_split_text(s.tp_split)})"
                t.add_row(label if j == 0 else "", f"{r.batch_share:.3f}" if j == 0 else "", str(j), units,
                          _devices_text(devices, len(members)), gpus(s), tp, *((str(self.cp),) if self.cp > 1 else ()))
        if len(groups) < len(self.replicas):
            t.caption = (f"{t.caption}; " if t.caption else "") + (f"{len(self.replicas)} replicas in {len(groups)} group{'s' if len(groups) > 1 else ''} of "
                         "identical ones (--full lists each)")
        return t


def units_text(layers: tuple[int, int], model: "ModelGraph | None" = None) -> str:
    """A stage's units ``[first, last)`` as the tables print them, with their names where ``model`` has them.

    >>> units_text((13, 22)), units_text((24, 25))
    ('13-21', '24')
    """
    first, last = layers
    text = f"{first}" if last - first == 1 else f"{first}-{last - 1}"
    if model is None or not first < last <= model.num_units:
        return text
    names = model.units[first].name if last - first == 1 else f"{model.units[first].name}..{model.units[last - 1].name}"
    return f"{text} ({names})"


def _split_text(split: TPSplit) -> str:
    parts = []
    if split.heads:
        parts.append("h " + ":".join(map(str, split.heads)))
    if split.ffn:
        parts.append("c " + ":".join(map(str, split.ffn)))
    if split.vocab:
        parts.append("v " + ":".join(map(str, split.vocab)))
    return ", ".join(parts)


def _index_ranges(indices: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2,5``."""
    out, start = [], indices[0]
    for prev, cur in zip(indices, indices[1:] + [None]):
        if cur != prev + 1:
            out.append(str(start) if start == prev else f"{start}-{prev}")
            start = cur
    return ",".join(out)


def _devices_text(devices: list[str], replicas: int, limit: int = 6) -> str:
    """Device ids of a (collapsed) stage, compressed; beyond ``limit`` runs, the first and last and a count."""
    runs = compress_device_ids(devices).split(",")
    if len(runs) <= limit:
        return ",".join(runs)
    return f"{','.join(runs[:2])},...,{runs[-1]} ({len(devices)} devices)"


def _ranges_overlap(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> bool:
    """Whether some unit lies in a range ``[first, last)`` of ``a`` and in one of ``b``."""
    a, b = sorted(x for x in a if x[0] < x[1]), sorted(x for x in b if x[0] < x[1])
    i = j = 0
    while i < len(a) and j < len(b):
        if max(a[i][0], b[j][0]) < min(a[i][1], b[j][1]):
            return True
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return False


def _stage_dict(s: Stage) -> dict[str, Any]:
    out: dict[str, Any] = {"layers": list(s.layers), "devices": list(s.devices), "tp": s.tp}
    if s.tp_split is not None:
        out["tp_split"] = s.tp_split.to_dict()
    return out


def _tp_split(data: Any, source: str, field: str) -> TPSplit | None:
    data = v.require_mapping(PlanError, data, source, field)
    v.require_keys(PlanError, data, source, field, [], list(_SPLIT_DIMS))
    out = {}
    for key, value in data.items():
        if (not isinstance(value, list) or not value or len(value) > 1024
                or any(isinstance(x, bool) or not isinstance(x, int) or not 0 <= x <= 10**9 for x in value)):
            raise v.fail(PlanError, source, f"{field}.{key}",
                         f"expected a list of whole numbers, one per device of the group, got {v.show(value)}")
        out[key] = tuple(value)
    split = TPSplit(**out)
    return None if split.empty else split


def _zero(value: Any, source: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value not in ZERO_LEVELS:
        raise v.fail(PlanError, source, "zero", f"expected a sharding level 0, 1, 2 or 3, got {v.show(value)}")
    return value


def _fractions(value: Any, source: str) -> tuple[float, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not value:
        raise v.fail(PlanError, source, "shard_fractions", f"expected a list of fractions, one per replica, "
                     f"got {v.show(value)}")
    return tuple(v.number(PlanError, f, source, f"shard_fractions[{i}]", maximum=1.0 + _SHARE_TOL)
                 for i, f in enumerate(value))


_PLAIN_STAGE_KEYS = frozenset(("layers", "devices", "tp"))
_new_stage = object.__new__


def _plain_stage(data: Any) -> Stage | None:
    """The common stage (layers, devices, tp; no split) when it is well-formed, else None: a fast path
    that accepts only what :func:`_stage` accepts, and builds the same stage."""
    if type(data) is not dict or not data.keys() <= _PLAIN_STAGE_KEYS:
        return None
    layers, devices, tp = data.get("layers"), data.get("devices"), data.get("tp")
    if (type(layers) is list and len(layers) == 2 and type(layers[0]) is int and type(layers[1]) is int
            and 0 <= layers[0] <= _MAX_UNITS and 0 <= layers[1] <= _MAX_UNITS
            and type(devices) is list and devices and all(type(d) is str for d in devices)
            and type(tp) is int and 1 <= tp <= 1024):
        # Stage(...) itself, without the frozen dataclass's four object.__setattr__ calls (plans of
        # 1,024 GPUs bring hundreds of stages each): same fields, same object
        stage = _new_stage(Stage)
        stage.__dict__.update(layers=(layers[0], layers[1]), devices=tuple(devices), tp=tp, tp_split=None)
        return stage
    return None


def _stage(data: Any, source: str, field: str) -> Stage:
    plain = _plain_stage(data)
    if plain is not None:
        return plain
    data = v.require_mapping(PlanError, data, source, field)
    v.require_keys(PlanError, data, source, field, ["layers", "devices"], ["tp", "tp_split"])
    layers = data["layers"]
    if (not isinstance(layers, list) or len(layers) != 2
            or any(isinstance(x, bool) or not isinstance(x, int) or not 0 <= x <= _MAX_UNITS for x in layers)):
        raise v.fail(PlanError, source, f"{field}.layers",
                     f"expected [first, last_exclusive] of unit indices (0 to {_MAX_UNITS}), got {v.show(layers)}")
    devices = data["devices"]
    if not isinstance(devices, list) or not devices or not all(isinstance(d, str) for d in devices):
        raise v.fail(PlanError, source, f"{field}.devices", f"expected a non-empty list of device ids 'g/n/i', got {v.show(devices)}")
    tp = v.integer(PlanError, data.get("tp", len(devices)), source, f"{field}.tp", maximum=1024)
    split = _tp_split(data["tp_split"], source, f"{field}.tp_split") if "tp_split" in data else None
    return Stage(layers=(layers[0], layers[1]), devices=tuple(devices), tp=tp, tp_split=split)


def _replica(data: Any, source: str, field: str) -> Replica:
    if type(data) is dict and len(data) == 2 and type(data.get("stages")) is list and data["stages"]:
        share = data.get("batch_share")  # the common replica, checked quickly (what the full path accepts)
        stages = [_plain_stage(s) for s in data["stages"]]
        if type(share) is float and 0.0 < share <= 1.0 + _SHARE_TOL and all(s is not None for s in stages):
            return Replica(batch_share=share, stages=tuple(stages))
    data = v.require_mapping(PlanError, data, source, field)
    v.require_keys(PlanError, data, source, field, ["batch_share", "stages"], [])
    share = v.number(PlanError, data["batch_share"], source, f"{field}.batch_share", maximum=1.0 + _SHARE_TOL)
    stages = data["stages"]
    if not isinstance(stages, list) or not stages:
        raise v.fail(PlanError, source, f"{field}.stages", "expected a non-empty list of stages")
    return Replica(batch_share=share, stages=tuple(_stage(s, source, f"{field}.stages[{j}]") for j, s in enumerate(stages)))


def load_plan(path: str | Path) -> Plan:
    """Read a plan JSON file."""
    path = Path(path)
    return Plan.from_json(v.read_text(PlanError, path, "the plan"), source=str(path))


def states_precision(path: str | Path) -> bool:
    """Whether the plan file ``path`` (read by :func:`load_plan` already) names its precision. A file without one
    is priced and run in the devices' default, as ``--precision`` left out (``hetpart.workload.default_precision``:
    bf16 where every device has it, else fp16); :class:`Plan` itself defaults to bf16."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return True
    return not isinstance(data, dict) or "precision" in data


def compress_device_ids(ids) -> str:
    """``0/0/0,0/0/1,0/0/2`` -> ``0/0/0-2`` (runs of consecutive GPUs on one node)."""
    out: list[str] = []
    run: list[tuple[str, int]] = []

    def flush():
        if run:
            prefix, a = run[0]
            b = run[-1][1]
            out.append(f"{prefix}/{a}" if a == b else f"{prefix}/{a}-{b}")
            run.clear()

    for d in ids:
        prefix, _, local = d.rpartition("/")
        if not local.isdigit():
            flush()
            out.append(d)
            continue
        if run and run[0][0] == prefix and run[-1][1] + 1 == int(local):
            run.append((prefix, int(local)))
        else:
            flush()
            run.append((prefix, int(local)))
    flush()
    return ",".join(out)
