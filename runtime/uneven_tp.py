"""Uneven tensor parallelism at run time: local parameter slices at prefix-sum offsets (Megatron style).

DTensor cannot shard unevenly (its shards follow ``torch.chunk``), so a stage with a ``tp_split``
runs its blocks the way Megatron-LM does by hand:

* every column-parallel linear (q/k/v, the MLP's first projections) keeps the rows of its own heads or
  columns, at the prefix sum of the ranks before it; every row-parallel linear (attention output, the
  MLP's last projection) keeps the matching input columns;
* Megatron's two autograd wrappers: ``copy to the TP region`` (identity forward, all-reduce of the
  input gradient backward) where a replicated input enters the column-parallel linears, and ``reduce
  from the TP region`` (all-reduce forward, identity backward) on each row-parallel output, after which
  the row-parallel bias is added once;
* attention runs on the local heads (hetpart's GPT and Llama reshape with ``-1`` heads; GPT-2's
  ``split_size`` is set to the local width);
* the vocabulary is not split: the embedding and the output head run whole on every rank of the group
  (as the even runtime does), so a plan's ``tp_split.vocab`` is priced by the simulator but runs
  replicated (:func:`runtime_split` drops it and says so in ``notes``).

gloo's ``all_gather`` refuses unequal sizes, so nothing here gathers: the all-reduces are full size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

if TYPE_CHECKING:  # pragma: no cover
    from hetpart.graph.transformer import TransformerConfig
    from hetpart.plan import Plan, TPSplit

__all__ = ["LocalSplit", "runtime_split", "scale_plan_splits", "parallelize_uneven", "split_heads_multiple"]


@dataclass(frozen=True)
class LocalSplit:
    """Heads and feed-forward columns of every rank of one TP group, in the runtime model's sizes."""

    heads: tuple[int, ...]
    ffn: tuple[int, ...]

    def offset(self, dim: str, rank: int) -> int:
        return sum(getattr(self, dim)[:rank])


def _largest_remainder(parts, total: int, unit: int = 1) -> tuple[int, ...]:
    from hetpart.costmodel.tp_split import largest_remainder

    out = largest_remainder([p / sum(parts) for p in parts], total // unit)
    if out is None:
        raise ValueError(f"cannot give {len(parts)} devices a share each of {total // unit} units")
    return tuple(x * unit for x in out)


def runtime_split(split: "TPSplit | None", cfg: "TransformerConfig", tp: int) -> LocalSplit:
    """The per-rank heads and columns of the model that runs (its sizes may be a shrunken model's:
    the split's proportions carry over by largest remainder, in whole key/value groups)."""
    group = cfg.num_heads // cfg.kv_heads
    if split is not None and split.heads:
        heads = tuple(split.heads) if sum(split.heads) == cfg.num_heads else _largest_remainder(
            split.heads, cfg.num_heads, group)
    else:
        heads = (cfg.num_heads // tp,) * tp
    if split is not None and split.ffn:
        ffn = tuple(split.ffn) if sum(split.ffn) == cfg.ffn else _largest_remainder(split.ffn, cfg.ffn)
    else:
        ffn = (cfg.ffn // tp,) * tp
    return LocalSplit(heads, ffn)


def split_heads_multiple(plan: "Plan", cap: int = 32) -> int:
    """A head count multiple under which every uneven head split of ``plan`` keeps its exact ratio when
    the model is shrunk (``[5, 5, 3, 3]`` of 16 needs 16 heads), capped at ``cap`` (beyond it the
    shrunken split is the nearest one by largest remainder)."""
    m = 1
    for r in plan.replicas:
        for s in r.stages:
            if s.tp_split is not None and s.tp_split.heads:
                total = sum(s.tp_split.heads)
                need = total // math.gcd(total, *s.tp_split.heads)
                if math.lcm(m, need) <= cap:
                    m = math.lcm(m, need)
    return m


def scale_plan_splits(plan: "Plan", cfg: "TransformerConfig") -> tuple["Plan", list[str]]:
    """``plan`` with every ``tp_split`` in the sizes of ``cfg`` (the model that runs), the vocabulary
    split dropped (the runtime keeps the vocabulary whole), and notes on what changed."""
    from hetpart.plan import TPSplit

    notes: list[str] = []
    replicas = []
    for i, r in enumerate(plan.replicas):
        stages = []
        for j, s in enumerate(r.stages):
            if s.tp_split is not None:
                local = runtime_split(s.tp_split, cfg, s.tp)
                if s.tp_split.vocab:
                    notes.append(f"replicas[{i}].stages[{j}]: vocabulary split {list(s.tp_split.vocab)} runs whole "
                                 "on every rank (the runtime does not split the vocabulary)")
                heads = local.heads if s.tp_split.heads else ()
                ffn = local.ffn if s.tp_split.ffn else ()
                if heads and tuple(s.tp_split.heads) != heads:
                    notes.append(f"replicas[{i}].stages[{j}]: heads {list(s.tp_split.heads)} run as {list(heads)} "
                                 f"of the {cfg.num_heads} heads of the shrunken model")
                s = replace(s, tp_split=TPSplit(heads=heads, ffn=ffn) if heads or ffn else None)
            stages.append(s)
        replicas.append(replace(r, stages=tuple(stages)))
    return replace(plan, replicas=tuple(replicas)), notes


# ------------------------------------------------------------------------------------- autograd
class _CopyToTP(torch.autograd.Function):
    """Megatron's ``f``: identity forward; the input gradient is all-reduced over the TP group."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Any, reporter: Any) -> torch.Tensor:
        ctx.group, ctx.reporter = group, reporter
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous().clone()
        ctx.reporter.before_sync()
        dist.all_reduce(grad, group=ctx.group)
        ctx.reporter.report(grad)
        ctx.reporter.after_sync()
        return grad, None, None


class _ReduceFromTP(torch.autograd.Function):
    """Megatron's ``g``: the partial sums of the row-parallel linears are all-reduced; identity backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Any, reporter: Any) -> torch.Tensor:
        x = x.contiguous().clone()
        reporter.before_sync()
        dist.all_reduce(x, group=group)
        reporter.report(x)
        reporter.after_sync()
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None, None


# ------------------------------------------------------------------------------------- slicing
_HEAD_COLS = ("q", "q_proj")
_KV_COLS = ("k", "v", "k_proj", "v_proj")
_FFN_COLS = ("fc", "c_fc", "gate_proj", "up_proj")
_HEAD_ROWS = ("o", "o_proj")
_FFN_ROWS = ("proj", "down_proj")


def _family(path: str, style: str) -> str:
    """Which split a linear follows: ``heads`` (q, attention output), ``kv`` or ``ffn``."""
    leaf = path.rsplit(".", 1)[-1]
    if style == "colwise":
        if leaf in _HEAD_COLS:
            return "heads"
        if leaf in _KV_COLS:
            return "kv"
        if leaf in _FFN_COLS:
            return "ffn"
    elif style == "rowwise":
        if leaf in _HEAD_ROWS or (leaf == "c_proj" and ".attn" in f".{path}"):
            return "heads"
        if leaf in _FFN_ROWS or leaf == "c_proj":
            return "ffn"
    raise ValueError(f"runtime: no uneven split rule for {path!r} ({style})")


def _slice_of(family: str, split: LocalSplit, rank: int, cfg: "TransformerConfig") -> tuple[int, int]:
    """``(offset, length)`` of this rank's rows/columns of a linear of ``family``."""
    hd = cfg.head_dim
    if family == "ffn":
        return split.offset("ffn", rank), split.ffn[rank]
    group = cfg.num_heads // cfg.kv_heads
    if family == "kv":
        return split.offset("heads", rank) // group * hd, split.heads[rank] // group * hd
    return split.offset("heads", rank) * hd, split.heads[rank] * hd


def _column_slice(linear: nn.Linear, offset: int, length: int) -> None:
    with torch.no_grad():
        linear.weight = nn.Parameter(linear.weight[offset:offset + length].clone())
        if linear.bias is not None:
            linear.bias = nn.Parameter(linear.bias[offset:offset + length].clone())
    linear.out_features = length


def _row_slice(linear: nn.Linear, offset: int, length: int, group: Any, reporter: Any) -> None:
    with torch.no_grad():
        linear.weight = nn.Parameter(linear.weight[:, offset:offset + length].clone())
    linear.in_features = length

    def forward(x: torch.Tensor) -> torch.Tensor:
        y = _ReduceFromTP.apply(F.linear(x, linear.weight), group, reporter)
        return y if linear.bias is None else y + linear.bias  # added once, after the sum

    linear.forward = forward  # type: ignore[method-assign]


def _copy_in(module: nn.Module, kwarg: str, group: Any, reporter: Any) -> None:
    def pre(_m, args, kwargs):
        x = kwargs[kwarg] if kwarg else args[0]
        if not isinstance(x, torch.Tensor):
            return None
        x = _CopyToTP.apply(x, group, reporter)
        return (args, {**kwargs, kwarg: x}) if kwarg else ((x, *args[1:]), kwargs)

    module.register_forward_pre_hook(pre, with_kwargs=True)


def parallelize_uneven(units, split: LocalSplit, rank: int, cfg: "TransformerConfig", group: Any,
                       reporter: Any) -> dict[str, tuple[int, int, int]]:
    """Cut every unit's tensor-parallel linears to this rank's slice of ``split`` (in place).

    Returns:
        canonical parameter key -> ``(dim, offset, length)`` of this rank's slice (what gradient sync
        between replicas and checkpoints need).
    """
    slices: dict[str, tuple[int, int, int]] = {}
    for unit in units:
        if not unit.tp_plan:
            continue
        names = unit.canonical_names()
        fed = [p for p, st in unit.tp_plan.items() if st.startswith("input")]
        for path, style in unit.tp_plan.items():
            module = unit.get_submodule(f"body.{path}")
            if style.startswith("input"):
                _copy_in(module, style.partition(":")[2], group, reporter)
                continue
            offset, length = _slice_of(_family(path, style), split, rank, cfg)
            if style == "colwise":
                if not any(path.startswith(f + ".") for f in fed):
                    _copy_in(module, "", group, reporter)
                _column_slice(module, offset, length)
                slices[names[f"body.{path}.weight"]] = (0, offset, length)
                if module.bias is not None:
                    slices[names[f"body.{path}.bias"]] = (0, offset, length)
            else:
                _row_slice(module, offset, length, group, reporter)
                slices[names[f"body.{path}.weight"]] = (1, offset, length)
        for sub in unit.body.modules():  # GPT-2 splits q|k|v at split_size: the local width
            if hasattr(sub, "split_size") and hasattr(sub, "head_dim"):
                sub.split_size = split.heads[rank] * cfg.head_dim
    return slices
