"""The model graph: a DAG of partitionable units with their costs.

All per-unit quantities are for ONE sequence of ``seq_len`` tokens (micro-batch 1); every one of
them is linear in the micro-batch size, so ``b`` sequences cost ``b`` times as much. Bytes are at
the graph's precision (``dtype_bytes`` per element).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import networkx as nx

from hetpart.vocabulary import RECOMPUTE_MODES, UNIT_KINDS, RecomputeMode, UnitKind

if TYPE_CHECKING:  # pragma: no cover
    from hetpart.graph.transformer import TransformerConfig

__all__ = ["RecomputeMode", "UnitKind", "Unit", "ModelGraph"]


@dataclass(frozen=True)
class Unit:
    """One partitionable unit (an embedding, a transformer block, the output head, a module)."""

    name: str
    kind: UnitKind
    """``embedding``, ``block``, ``head`` or ``module`` (traced)."""
    fwd_flops: float
    """Forward FLOPs for one sequence (matrix products and attention; 2 FLOPs per multiply-add)."""
    bwd_flops: float
    """Backward FLOPs for one sequence (about twice the forward)."""
    params: int
    """Parameters owned by the unit (tied weights are owned by the first unit that uses them)."""
    out_act_bytes: float
    """Bytes of the unit's output for one sequence: what a pipeline sends to the next stage."""
    act_bytes: dict[str, float]
    """Activation bytes saved for backward, per sequence, by recompute mode (none/selective/full)."""
    recompute_flops: dict[str, float]
    """Extra forward FLOPs re-run during backward, per sequence, by recompute mode."""
    tp_comm_bytes_fwd: float = 0.0
    """Bytes all-reduced across a tensor-parallel group in one forward pass of one sequence
    (Megatron: two all-reduces of ``s*h`` elements per transformer block; the backward does the same)."""
    tp_shardable: bool = True
    """Whether tensor parallelism splits this unit's weights and work."""
    shared_params: int = 0
    """Parameters this unit uses but does not own (tied embeddings): a stage holding this unit without
    the owner keeps a copy, and the two copies' gradients are all-reduced."""
    width: int = 0
    """Hidden width of the unit's matrix products (sizes the efficiency of matrix units)."""

    def __post_init__(self) -> None:
        if self.kind not in UNIT_KINDS:
            raise ValueError(f"unit {self.name}: kind {self.kind!r}; use one of {', '.join(UNIT_KINDS)}")
        for mode in RECOMPUTE_MODES:
            if mode not in self.act_bytes or mode not in self.recompute_flops:
                raise ValueError(f"unit {self.name}: act_bytes and recompute_flops need none/selective/full")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ModelGraph:
    """A model as a DAG of units (a chain for the models hetpart partitions today)."""

    name: str
    units: tuple[Unit, ...]
    seq_len: int
    dtype_bytes: int
    edges: tuple[tuple[int, int], ...] = ()
    """Data dependencies between units (defaults to the chain 0 -> 1 -> ... -> n-1)."""
    config: "TransformerConfig | None" = field(default=None, compare=False)
    """The transformer's shape when the graph was built from one (catalog, config.json); None when the
    graph was traced from a module (:attr:`traced`)."""
    tied_owner: str | None = field(default=None, compare=False)
    """Name of the unit that owns tied weights (the embedding of tied-embedding models); None without ties."""
    source: str = field(default="", compare=False)
    """Where the model came from: catalog, config.json, or python:MODULE:FUNCTION."""

    @property
    def traced(self) -> bool:
        """Whether the graph was traced from a module (no transformer config: no tensor parallelism)."""
        return self.config is None

    @property
    def num_heads(self) -> int | None:
        """Attention heads of the transformer (None when traced)."""
        return self.config.num_heads if self.config is not None else None

    @cached_property
    def tied_owner_index(self) -> int:
        """Index of :attr:`tied_owner` among the units, -1 without ties."""
        names = [u.name for u in self.units]
        return names.index(self.tied_owner) if self.tied_owner in names else -1

    @property
    def arch(self) -> dict[str, Any] | None:
        """A plain-dict view of :attr:`config` and :attr:`tied_owner` (the JSON summary's ``arch``); code
        reads the typed fields."""
        if self.config is None and self.tied_owner is None:
            return None
        return (self.config.to_dict() if self.config is not None else {}) | (
            {"tied_owner": self.tied_owner} if self.tied_owner else {})

    @property
    def num_units(self) -> int:
        return len(self.units)

    @cached_property
    def dag(self) -> nx.DiGraph:
        """The networkx DAG; node ``i`` carries the unit, edge ``(i, j)`` the bytes sent from i to j."""
        g = nx.DiGraph(name=self.name)
        for i, unit in enumerate(self.units):
            g.add_node(i, unit=unit, name=unit.name)
        for a, b in self.edges or tuple((i, i + 1) for i in range(self.num_units - 1)):
            g.add_edge(a, b, bytes=self.units[a].out_act_bytes)
        return g

    @cached_property
    def num_params(self) -> int:
        """Parameters of the model, tied weights counted once."""
        return sum(u.params for u in self.units)

    @cached_property
    def fwd_flops(self) -> float:
        """Forward FLOPs per sequence."""
        return sum(u.fwd_flops for u in self.units)

    @cached_property
    def train_flops(self) -> float:
        """Model FLOPs of one training pass (forward + backward, no recomputation) per sequence."""
        return sum(u.fwd_flops + u.bwd_flops for u in self.units)

    @property
    def flops_per_token(self) -> float:
        return self.train_flops / self.seq_len

    def range_params(self, first: int, last: int, tp: int = 1) -> float:
        """Parameters one device of a ``tp``-way stage holding units ``[first, last)`` keeps, tied copies
        included (a unit using tied weights keeps a copy unless the stage holds their owner). The one
        definition: model-state memory and the prefix tables of the cost model follow it."""
        units = self.units[first:last]
        keeps_copy = not any(u.name == self.tied_owner for u in units)
        total = 0.0
        for u in units:
            p = u.params + (u.shared_params if u.shared_params and keeps_copy else 0)
            total += p / tp if u.tp_shardable else p
        return total

    def summary(self) -> dict[str, Any]:
        """A JSON-ready description (``hetpart inspect model --json``)."""
        return {
            "name": self.name,
            "source": self.source,
            "num_params": self.num_params,
            "num_units": self.num_units,
            "seq_len": self.seq_len,
            "dtype_bytes": self.dtype_bytes,
            "fwd_flops_per_sequence": self.fwd_flops,
            "train_flops_per_token": self.flops_per_token,
            "arch": self.arch,
            "units": [
                {"index": i, "name": u.name, "kind": u.kind, "fwd_flops": u.fwd_flops, "bwd_flops": u.bwd_flops,
                 "params": u.params, "out_act_bytes": u.out_act_bytes, "act_bytes": u.act_bytes}
                for i, u in enumerate(self.units)
            ],
        }
