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
* a ``vocab`` split cuts the vocabulary rows the same way (Megatron's ``VocabParallelEmbedding`` and
  vocabulary-parallel cross-entropy): the embedding keeps rows ``[o, o + n)`` of the token table, looks
  up the ids it owns, zeroes the rest and all-reduces (``reduce from``); the output head keeps the same
  rows of its matrix behind ``copy to`` and returns the local logits slice; the loss all-reduces the
  slice's maximum, its sum of exponentials and the target logit (each from the rank that owns the
  target), and its backward is local (softmax minus the one-hot of the owned targets). A tied head
  shares the sliced tensor with its embedding. Without a ``vocab`` split both run whole on every rank.

gloo's ``all_gather`` refuses unequal sizes, so nothing here gathers: every exchange is an all-reduce
(full size for the blocks; a few scalars per token for the loss).
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

__all__ = ["LocalSplit", "runtime_split", "scale_plan_splits", "parallelize_uneven", "parallelize_vocab",
           "vocab_parallel_cross_entropy", "vocab_parallel_loss", "split_heads_multiple"]


@dataclass(frozen=True)
class LocalSplit:
    """Heads, feed-forward columns and vocabulary rows of every rank of one TP group, in the runtime
    model's sizes (``vocab`` empty: the vocabulary runs whole on every rank)."""

    heads: tuple[int, ...]
    ffn: tuple[int, ...]
    vocab: tuple[int, ...] = ()

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
    from hetpart.rules import ffn_split_unit

    group = cfg.num_heads // cfg.kv_heads
    if split is not None and split.heads:
        heads = tuple(split.heads) if sum(split.heads) == cfg.num_heads else _largest_remainder(
            split.heads, cfg.num_heads, group)
    else:
        heads = (cfg.num_heads // tp,) * tp
    if split is not None and split.ffn:
        # in the model's own unit (64 columns from 1,024: the runtime model must pass the plan's rules)
        ffn = tuple(split.ffn) if sum(split.ffn) == cfg.ffn else _largest_remainder(
            split.ffn, cfg.ffn, ffn_split_unit(cfg.ffn))
    else:
        ffn = (cfg.ffn // tp,) * tp
    vocab: tuple[int, ...] = ()
    if split is not None and split.vocab:
        vocab = tuple(split.vocab) if sum(split.vocab) == cfg.vocab_size else _largest_remainder(
            split.vocab, cfg.vocab_size)
    return LocalSplit(heads, ffn, vocab)


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
    """``plan`` with every ``tp_split`` in the sizes of ``cfg`` (the model that runs), and notes on what
    changed (a vocabulary split of the full model's vocabulary keeps its ratio in the shrunken one)."""
    from hetpart.plan import TPSplit

    notes: list[str] = []
    replicas = []
    for i, r in enumerate(plan.replicas):
        stages = []
        for j, s in enumerate(r.stages):
            if s.tp_split is not None:
                local = runtime_split(s.tp_split, cfg, s.tp)
                heads = local.heads if s.tp_split.heads else ()
                ffn = local.ffn if s.tp_split.ffn else ()
                if heads and tuple(s.tp_split.heads) != heads:
                    notes.append(f"replicas[{i}].stages[{j}]: heads {list(s.tp_split.heads)} run as {list(heads)} "
                                 f"of the {cfg.num_heads} heads of the shrunken model")
                if local.vocab and tuple(s.tp_split.vocab) != local.vocab:
                    notes.append(f"replicas[{i}].stages[{j}]: vocabulary {list(s.tp_split.vocab)} runs as "
                                 f"{list(local.vocab)} of the {cfg.vocab_size} rows of the shrunken model")
                split = TPSplit(heads=heads, ffn=ffn, vocab=local.vocab)
                s = replace(s, tp_split=None if split.empty else split)
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


# ------------------------------------------------------------------------------------- vocabulary
_TOKEN_TABLES = ("wte", "embed_tokens")
"""The token embedding of each runtime family (positions stay whole: they are not vocabulary rows)."""


def _vocab_parallel_embedding(emb: nn.Embedding, offset: int, length: int, group: Any, reporter: Any) -> None:
    """Cut ``emb`` to rows ``[offset, offset + length)``: ids outside them look up zeros, and the
    partial embeddings are summed over the group (each id is owned by exactly one rank)."""
    with torch.no_grad():
        emb.weight = nn.Parameter(emb.weight[offset:offset + length].clone())
    emb.num_embeddings = length

    def forward(ids: torch.Tensor) -> torch.Tensor:
        local = ids - offset
        outside = (local < 0) | (local >= length)
        y = F.embedding(local.masked_fill(outside, 0), emb.weight)
        return _ReduceFromTP.apply(y.masked_fill(outside.unsqueeze(-1), 0.0), group, reporter)

    emb.forward = forward  # type: ignore[method-assign]


def parallelize_vocab(units, split: LocalSplit, rank: int, group: Any, reporter: Any
                      ) -> dict[str, tuple[int, int, int]]:
    """Cut the token embedding and the output head among ``units`` to this rank's vocabulary rows (in
    place; nothing happens without a ``vocab`` split). A tied head must be re-tied to the embedding's
    new tensor by the caller where both sit on this rank.

    Returns:
        canonical parameter key -> ``(0, offset, length)`` of the sliced tables.
    """
    if not split.vocab:
        return {}
    offset, length = split.offset("vocab", rank), split.vocab[rank]
    slices: dict[str, tuple[int, int, int]] = {}
    for unit in units:
        names = unit.canonical_names()
        if unit.unit_name == "embedding":
            for leaf in _TOKEN_TABLES:
                if leaf in unit.body:
                    _vocab_parallel_embedding(unit.body[leaf], offset, length, group, reporter)
                    slices[names[f"body.{leaf}.weight"]] = (0, offset, length)
        elif unit.unit_name == "head" and "lm_head" in unit.body:
            head = unit.body["lm_head"]
            _copy_in(head, "", group, reporter)
            _column_slice(head, offset, length)
            slices[names["body.lm_head.weight"]] = (0, offset, length)
    return slices


class _VocabParallelCE(torch.autograd.Function):
    """Megatron's vocabulary-parallel cross-entropy over a local logits slice ``[tokens, rows]``.

    Forward: the global maximum (all-reduce MAX), the target logit (all-reduce SUM of each rank's owned
    targets, zero elsewhere) and the sum of exponentials (all-reduce SUM); per-token loss
    ``log(sum exp) - target logit``. Backward is local: ``softmax - onehot(owned target)``.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, offset: int, group: Any) -> torch.Tensor:
        ctx.dtype = logits.dtype
        logits = logits.float()
        top = logits.max(dim=-1).values
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
        shifted = logits - top.unsqueeze(-1)
        local = targets - offset
        outside = (local < 0) | (local >= logits.shape[-1])
        local = local.masked_fill(outside, 0)
        picked = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        exp = shifted.exp()
        sums = torch.stack([exp.sum(dim=-1), picked])
        dist.all_reduce(sums, group=group)  # one exchange for both sums
        ctx.save_for_backward(exp.div_(sums[0].unsqueeze(-1)), local, outside)
        return sums[0].log() - sums[1]

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        softmax, local, outside = ctx.saved_tensors
        g = softmax.clone()
        owned = (~outside).to(g.dtype)
        g.scatter_add_(-1, local.unsqueeze(-1), -owned.unsqueeze(-1))
        return (g * grad.unsqueeze(-1)).to(ctx.dtype), None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, offset: int, group: Any) -> torch.Tensor:
    """Per-token cross-entropy of the whole vocabulary from this rank's logits slice.

    Shapes:
        logits: ``[..., rows]`` (this rank's vocabulary rows from ``offset``); targets: ``[...]`` global
        token ids. Returns ``[...]`` (equal on every rank of ``group``).
    """
    flat = logits.reshape(-1, logits.shape[-1])
    return _VocabParallelCE.apply(flat, targets.reshape(-1), offset, group).view(targets.shape)


def vocab_parallel_loss(scale: float, offset: int, group: Any):
    """The engine's per-micro-batch loss (:func:`hetpart.runtime.engine.loss_fn_for`) for a head whose
    vocabulary is split: the mean token cross-entropy times ``scale``."""
    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return vocab_parallel_cross_entropy(logits, targets, offset, group).mean() * scale
    return loss
