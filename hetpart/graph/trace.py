"""Model graphs from any ``torch.nn.Module``, measured by tracing one training step on fake tensors.

The module runs forward and backward once under torch's ``FakeTensorMode`` (via :mod:`hetpart._torch_compat`)
(CPU fake tensors: shapes and dtypes, no data, no memory), so that PyTorch picks the kernels it would
pick on a real CPU run (``scaled_dot_product_attention`` becomes the CPU flash kernel, whose FLOP
formulas we register because torch 2.13 has none). While it runs:

- :class:`~torch.utils.flop_counter.FlopCounterMode` counts matrix FLOPs (2 per multiply-add);
- a dispatch-mode recorder gives each op's FLOPs to the unit running it: in the forward the unit whose
  module was entered last, in the backward the unit whose forward created the autograd node being run
  (a function mode tags every node at creation);
- ``saved_tensors_hooks`` record the bytes autograd keeps for backward, once per storage, parameters
  and buffers excluded;
- parameters belong to the first unit whose ops read them; later readers hold them as ``shared_params``.

Units are, in order of execution: the modules named by ``units=``; otherwise, when the module holds a
list of repeated blocks (a ``ModuleList``/``Sequential`` of one class, the largest such), ``embedding``
(everything that runs before the first block), ``block_0 .. block_{L-1}`` and ``head`` (everything
after, the loss included); otherwise each top-level child module. Code between units belongs to the
unit that ran last before it. All numbers are per sequence: totals divided by the batch size (the
leading dimension of the first input tensor).

A trace dispatches every operator the module runs, on fake tensors, one at a time in Python: a model that loops
over tokens (Hugging Face's Mamba without its CUDA kernels runs a sequential scan, ``seq_len`` small ops per
layer) takes minutes. A trace running longer than :data:`PROGRESS_EVERY_S` prints a progress line on stderr
(never stdout: ``--json`` output stays one object) every that many seconds, and stops after
``HETPART_TRACE_LIMIT_S`` seconds (:data:`DEFAULT_LIMIT_S`; 0: no limit) with one error line naming the fixes.
``HETPART_TRACE_BLOCKS=K`` traces only the first ``K`` of the repeated blocks and gives the others the numbers
of the last one traced: exact where the blocks are identical (Mamba, Llama, GPT), wrong where blocks of one
class compute differently by index (Gemma 2/3's alternating local and global attention).
"""

from __future__ import annotations

import inspect
import io
import os
import sys
import time
import warnings
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from math import prod
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from hetpart._torch_compat import FakeTensorMode, TorchDispatchMode, current_autograd_node, fake_tensor_log_silenced, \
    in_backward, pytree, storage_key
from hetpart.errors import ModelError
from hetpart.graph.model_graph import ModelGraph, Unit
from hetpart.graph.user_module import import_python_module, split_python_spec

__all__ = ["trace_module", "trace_python_spec"]

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
aten = torch.ops.aten
_BATCHED_MATMULS = {aten.bmm, aten.baddbmm}
_MATMULS = {aten.mm, aten.addmm, aten._grouped_mm} | _BATCHED_MATMULS
_SOFTMAXES = {aten._softmax, aten._safe_softmax}
_LOOKUPS = {aten.embedding, aten.index_select, aten._embedding_bag, aten.embedding_bag}
"""Ops that read a weight matrix without multiplying it (an embedding table's rows): no FLOPs, rightly."""
UNCOUNTED_SHARE = 0.05
"""A trace fails when more than this share of the parameters sits in weight matrices that no op with a FLOP
formula reads (nor a lookup): an op torch's counter does not know does their work, and every step time built on
the count would be too fast (a mixture of experts run through ``aten._grouped_mm`` before it had a formula here
counted 1.9 of 10.4 GFLOP per token)."""
_TAG = "hetpart_unit"
PROGRESS_EVERY_S = 15.0
"""Seconds between the progress lines of a long trace (the first after as many)."""
DEFAULT_LIMIT_S = 900.0
"""A trace stops after this many seconds unless ``HETPART_TRACE_LIMIT_S`` says otherwise."""
_CHECK_EVERY_OPS = 64
"""Operators between two looks at the clock."""


def _env_number(name: str, default: float, integer: bool = False) -> float:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        value = -1
    if not value >= 0 or value == float("inf"):
        raise ModelError(f"{name}: {text!r} is not a {'whole ' if integer else ''}number >= 0; "
                         f"{'use e.g. 2' if integer else 'give seconds, 0 for no limit'}")
    return value


class _TraceTooLong(ModelError):
    """The trace ran past its time limit."""


def _cpu_flash_flop(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _cpu_flash_backward_flop(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None,
                             **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


def _grouped_mm_flop(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    """``aten._grouped_mm`` (mixture-of-experts layers: transformers 5 runs every expert in one call), by
    the shapes its meta function accepts: 2D x 3D (tokens sorted by expert, ``offs`` cutting the rows) and
    3D x 2D (``offs`` cutting the columns) give one row of ``a`` times one column of ``b`` per output
    element; 3D x 3D is a batched matmul; 2D x 2D (the weight gradient) cuts the contraction instead, so
    its ``G`` outputs share one pass over it."""
    if len(a_shape) == 2 and len(b_shape) == 2:
        return 2 * a_shape[0] * a_shape[1] * b_shape[1]
    return 2 * prod(out_shape) * a_shape[-1]


# torch 2.13 counts the CUDA flash/efficient kernels but not the CPU flash kernel that fake CPU
# tensors dispatch to (the formulas are the ones torch uses for the CUDA kernels), nor grouped matmuls.
_EXTRA_FLOP_FORMULAS = {
    aten._scaled_dot_product_flash_attention_for_cpu: _cpu_flash_flop,
    aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_flash_backward_flop,
    aten._grouped_mm: _grouped_mm_flop,
}


@dataclass
class _UnitStats:
    """What the trace measured for one unit (totals over the example batch)."""

    name: str
    kind: str
    fwd_flops: float = 0.0
    bwd_flops: float = 0.0
    score_flops: float = 0.0
    saved_bytes: float = 0.0
    score_bytes: float = 0.0
    in_bytes: float = 0.0
    contraction_flops: Counter = field(default_factory=Counter)


class _Tracker:
    """Which unit is running, and the per-unit tallies."""

    def __init__(self, seq_len: int, param_keys: dict[int, int], buffer_keys: set[int]) -> None:
        self.seq_len = seq_len
        self.param_keys = param_keys
        """storage key -> number of elements, for every parameter."""
        self.buffer_keys = buffer_keys
        self.units: list[_UnitStats] = [_UnitStats(name="", kind="module")]
        self.index: dict[str, int] = {}
        self.current = 0
        self.param_users: dict[int, list[int]] = {}
        self.saved_storages: dict[int, torch.Tensor] = {}
        self.score_keys: dict[int, torch.Tensor] = {}
        self.derived: dict[int, frozenset[int]] = {key: frozenset((key,)) for key in param_keys}
        """storage key -> the parameters a forward tensor was made from by ops without FLOPs (views, casts)."""
        self.derived_alive: list[torch.Tensor] = []
        """Those tensors, kept alive so that no other storage reuses their keys."""
        self.counted: set[int] = set()
        """Parameters an op with a FLOP formula (or a lookup) read, directly or through :attr:`derived`."""
        self.readers: dict[int, set[str]] = {}
        """parameter storage key -> the ops without FLOP formulas that combined it with activations."""
        self.ops = 0
        """Operators dispatched so far."""
        self.blocks = 0
        """Repeated blocks the trace runs (0: none found), for the progress line."""
        self.where = ""
        self.started = time.monotonic()
        self.next_report = self.started + PROGRESS_EVERY_S
        self.limit_s = 0.0
        self.reports = 0

    def tick(self, backward: bool) -> None:
        """Count one operator; now and then, look at the clock: a progress line, or the time limit's error."""
        self.ops += 1
        if self.ops % _CHECK_EVERY_OPS:
            return
        now = time.monotonic()
        elapsed = now - self.started
        if self.limit_s and elapsed > self.limit_s:
            raise _TraceTooLong(
                f"tracing stopped after {elapsed:.0f} s ({self.ops:,} operators, {self._position(backward)}): "
                "every operator runs once, on fake tensors; a model that loops over tokens (a sequential scan, "
                "as Hugging Face's Mamba without its CUDA kernels) runs seq_len x layers of them. Trace a "
                "shorter sequence (--seq-len, or the example inputs' length), trace a few of the identical "
                "blocks and copy them (HETPART_TRACE_BLOCKS=2), or allow longer (HETPART_TRACE_LIMIT_S="
                f"{int(self.limit_s * 4)}, 0 for no limit)")
        if now >= self.next_report:
            self.next_report = now + PROGRESS_EVERY_S
            hint = ""
            if not self.reports and self.blocks > 2:
                hint = "; HETPART_TRACE_BLOCKS=2 traces 2 of the identical blocks and copies them"
            self.reports += 1
            limit = f" of at most {self.limit_s:.0f} s" if self.limit_s else ""
            print(f"hetpart: tracing {self.where}: {elapsed:.0f} s{limit}, {self.ops:,} operators, "
                  f"{self._position(backward)}{hint}", file=sys.stderr, flush=True)

    def _position(self, backward: bool) -> str:
        unit = self.units[self.current].name or "(first unit)"
        of = f" of {self.blocks} blocks" if self.blocks and unit.startswith("block_") else ""
        return f"{'backward' if backward else 'forward'} in {unit}{of}"

    def enter(self, name: str, kind: str, in_bytes: float) -> None:
        if name not in self.index:
            if self.index:  # the placeholder is taken by the first unit
                self.units.append(_UnitStats(name=name, kind=kind))
            else:
                self.units[0].name, self.units[0].kind = name, kind
            self.index[name] = len(self.units) - 1
            self.units[-1].in_bytes = in_bytes
        self.current = self.index[name]

    def tag(self, node: Any) -> None:
        """Give ``node`` and its untagged ancestors (the nodes the current op created) to the current unit."""
        stack = [node]
        while stack:
            n = stack.pop()
            if n is None or _TAG in n.metadata:
                continue
            n.metadata[_TAG] = self.current
            stack.extend(nxt for nxt, _ in n.next_functions)

    def backward_unit(self) -> int:
        node = current_autograd_node()
        if node is not None and _TAG in node.metadata:
            self.current = node.metadata[_TAG]
        return self.current

    def _square(self, t: Any) -> bool:
        return isinstance(t, torch.Tensor) and t.dim() >= 2 and tuple(t.shape[-2:]) == (self.seq_len, self.seq_len)

    def mark_scores(self, packet: Any, args: Sequence[Any], out: Any) -> bool:
        """Track attention-score tensors through the forward; True when the op reads or makes scores.

        Scores are ``seq_len x seq_len`` tensors that a batched matmul makes from non-scores (Q K^T),
        that a softmax makes, or that an elementwise op (mask, dropout, cast) makes from scores. A matmul
        reading scores (P V) makes no scores, even when the head dimension equals ``seq_len``.
        """
        reads = any(isinstance(a, torch.Tensor) and _storage_key(a) in self.score_keys
                    for a in pytree.tree_leaves(args))
        makes = packet in _SOFTMAXES or (packet in _BATCHED_MATMULS and not reads) or (
            reads and packet not in _MATMULS)
        made = False
        for o in pytree.tree_leaves(out):
            if makes and self._square(o):
                self.score_keys[_storage_key(o)] = o  # kept alive, so that no other storage reuses the key
                made = True
        return reads or made

    def add_flops(self, packet: Any, flops: int, args: Sequence[Any], backward: bool, scores: bool) -> None:
        unit = self.units[self.backward_unit() if backward else self.current]
        if backward:
            unit.bwd_flops += flops
            return
        unit.fwd_flops += flops
        if packet in _MATMULS:
            if scores:
                unit.score_flops += flops
            mat1 = args[1] if packet in (aten.addmm, aten.baddbmm) else args[0]
            unit.contraction_flops[int(mat1.shape[-1])] += flops

    def follow_params(self, packet: Any, args: Sequence[Any], out: Any, counted: bool) -> None:
        """Note which parameters a forward op reads (through views and casts): counted where the op has a FLOP
        formula or looks rows up, else passed on to its outputs where it reads parameters alone (an op that
        also reads activations makes activations: a weight only an unknown op multiplies must stay uncounted
        when the activations it made reach a counted matmul later)."""
        sources: frozenset[int] = frozenset()
        activations = False
        for a in pytree.tree_leaves(args):
            if isinstance(a, torch.Tensor) and a.dim() > 0:
                key = _storage_key(a)
                found = self.derived.get(key)
                if found is not None:
                    sources |= found
                elif key not in self.buffer_keys:
                    activations = True
        if not sources:
            return
        if counted or packet in _LOOKUPS:
            self.counted |= sources
            return
        if activations:
            for key in sources:
                self.readers.setdefault(key, set()).add(str(packet))
            return
        for o in pytree.tree_leaves(out):
            if isinstance(o, torch.Tensor):
                self.derived[_storage_key(o)] = self.derived.get(_storage_key(o), frozenset()) | sources
                self.derived_alive.append(o)

    def use_params(self, args: Sequence[Any]) -> None:
        for a in pytree.tree_leaves(args):
            if isinstance(a, torch.Tensor):
                key = _storage_key(a)
                if key in self.param_keys:
                    users = self.param_users.setdefault(key, [])
                    if self.current not in users:
                        users.append(self.current)

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        key = _storage_key(t)
        if key in self.param_keys or key in self.buffer_keys or key in self.saved_storages:
            return t
        self.saved_storages[key] = t  # keeps the storage alive, so its key is never reused
        unit = self.units[self.current]
        nbytes = float(t.untyped_storage().nbytes())
        unit.saved_bytes += nbytes
        if key in self.score_keys:
            unit.score_bytes += nbytes
        return t


def _storage_key(t: torch.Tensor) -> int:
    return storage_key(t)


class _Recorder(TorchDispatchMode):
    """Attributes every aten op's FLOPs, and its parameter reads, to a unit."""

    def __init__(self, tracker: _Tracker, flop_registry: dict[Any, Callable]) -> None:
        super().__init__()
        self.tracker = tracker
        self.registry = flop_registry

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = func.overloadpacket
        backward = in_backward()
        self.tracker.tick(backward)
        scores = not backward and self.tracker.mark_scores(packet, args, out)
        if packet in self.registry:
            flops = self.registry[packet](*args, **kwargs, out_val=out)
            self.tracker.add_flops(packet, flops, args, backward, scores)
        if not backward:
            self.tracker.use_params(args)
            self.tracker.follow_params(packet, args, out, packet in self.registry)
        return out


def _fused_dropout(input, p=0.5, training=True, inplace=False):
    """Dropout as the fused kernel GPUs run (it keeps a 1-byte mask for backward); CPU's composite
    dropout would keep a mask in the activation dtype, which no GPU training run does."""
    if not training or p == 0 or inplace:
        return nn.functional.dropout(input, p, training, inplace)
    return torch.native_dropout(input, p, True)[0]


class _NodeTagger(TorchFunctionMode):
    """Tags the autograd nodes each torch call creates with the unit running it (and runs dropout fused)."""

    def __init__(self, tracker: _Tracker) -> None:
        super().__init__()
        self.tracker = tracker

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is nn.functional.dropout:
            func = _fused_dropout
        out = func(*args, **(kwargs or {}))
        if torch.is_grad_enabled():
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor) and t.grad_fn is not None:
                    self.tracker.tag(t.grad_fn)
        return out


def _tensor_bytes(tree: Any, grad_only: bool) -> float:
    seen: dict[int, float] = {}
    for t in pytree.tree_leaves(tree):
        if isinstance(t, torch.Tensor) and (t.requires_grad or not grad_only):
            seen[_storage_key(t)] = float(t.numel() * t.element_size())
    return sum(seen.values())


def _find_blocks(module: nn.Module) -> tuple[str, nn.Module] | None:
    """The largest ModuleList/Sequential whose children (two or more) are all of one class."""
    best, best_params = None, -1
    for path, m in module.named_modules():
        if not isinstance(m, (nn.ModuleList, nn.Sequential)) or len(m) < 2:
            continue
        if len({type(c) for c in m}) != 1:
            continue
        params = sum(p.numel() for p in m.parameters())
        if params > best_params:
            best, best_params = (path, m), params
    return best


def _unit_hooks(module: nn.Module, units: Sequence[str | Sequence[str]] | None,
                tracker: _Tracker, found: tuple[str, nn.Module] | None = None) -> list[tuple[nn.Module, Callable]]:
    """``(module, pre_hook)`` pairs that mark where each unit starts (``found``: the blocks, when known)."""

    def hook(name_of: Callable[[], tuple[str, str]]):
        def pre(_mod, args, kwargs):
            name, kind = name_of()
            tracker.enter(name, kind, _tensor_bytes((args, kwargs), grad_only=bool(tracker.index)))
        return pre

    modules = dict(module.named_modules())
    if units is not None:
        return _explicit_hooks(modules, units, hook)
    found = found or _find_blocks(module)
    if found is None:
        return [(child, hook(lambda n=name: (n, "module"))) for name, child in module.named_children()]
    path, blocks = found
    tracker.blocks = tracker.blocks or len(blocks)
    started = []
    pairs = []
    for i, block in enumerate(blocks):
        def block_name(i=i):
            started.append(i)
            return f"block_{i}", "block"
        pairs.append((block, hook(block_name)))
    parts = path.split(".") if path else []  # the module itself may be the list of blocks
    for depth in range(len(parts)):
        parent = modules[".".join(parts[:depth])]
        for name, child in parent.named_children():
            if name != parts[depth]:
                pairs.append((child, hook(lambda: ("head", "head") if started else ("embedding", "embedding"))))
    return pairs


def _explicit_hooks(modules: dict[str, nn.Module], units: Sequence[str | Sequence[str]], hook) -> list:
    pairs, claimed = [], []
    for entry in units:
        paths = [entry] if isinstance(entry, str) else list(entry)
        if not paths or not all(isinstance(p, str) for p in paths):
            raise ModelError(f"units: {entry!r}: expected a module name or a list of module names")
        label = "+".join(paths)
        for p in paths:
            if p not in modules:
                known = ", ".join(list(n for n in modules if n)[:8])
                raise ModelError(f"units: {p!r}: no such submodule; names look like: {known}, ...")
            for q in claimed:
                if p == q or p.startswith(q + ".") or q.startswith(p + ".") or not p or not q:
                    raise ModelError(f"units: {p!r} overlaps {q!r}; name disjoint submodules, one unit each")
            claimed.append(p)
            pairs.append((modules[p], hook(lambda n=label: (n, "module"))))
    return pairs


def _fake_inputs(example_inputs: Any, dtype: torch.dtype) -> tuple[tuple, dict]:
    if isinstance(example_inputs, torch.Tensor):
        args, kwargs = (example_inputs,), {}
    elif isinstance(example_inputs, dict):
        args, kwargs = (), dict(example_inputs)
    elif isinstance(example_inputs, (tuple, list)):
        args, kwargs = tuple(example_inputs), {}
    else:
        raise ModelError(f"example_inputs: expected a tensor, a tuple of arguments or a dict of keyword "
                         f"arguments, got {type(example_inputs).__name__}")
    return pytree.tree_map(lambda t: _fake_like(t, dtype) if isinstance(t, torch.Tensor) else t, (args, kwargs))


def _fake_like(t: torch.Tensor, dtype: torch.dtype, requires_grad: bool = False) -> torch.Tensor:
    """A CPU tensor of ``t``'s shape (floating ones cast to ``dtype``); fake when called under FakeTensorMode."""
    out_dtype = dtype if t.is_floating_point() else t.dtype
    return torch.empty(tuple(t.shape), dtype=out_dtype, device="cpu").requires_grad_(requires_grad)


def _batch_size(args: tuple, kwargs: dict) -> int:
    for t in pytree.tree_leaves((args, kwargs)):
        if isinstance(t, torch.Tensor) and t.dim() >= 1:
            return max(1, int(t.shape[0]))
    return 1


def _backward_roots(out: Any) -> list[torch.Tensor]:
    loss = out.get("loss") if isinstance(out, dict) else getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.requires_grad:
        return [loss]
    return [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]


@dataclass
class _Trace:
    tracker: _Tracker
    batch: int
    out_bytes: float
    """Bytes per sequence of the outputs differentiated (the loss)."""
    counter_flops: int
    param_numel: dict[int, int]
    param_names: dict[int, str]
    """storage key -> the parameter's first name."""
    matrices: set[int]
    """Storage keys of the parameters of two or more dimensions (weight matrices, tables, kernels)."""
    blocks: int = 0
    """The repeated blocks of the module, where only the first :attr:`traced_blocks` of them were traced."""
    traced_blocks: int = 0


def _block_shapes(block: nn.Module) -> list[tuple[str, tuple[int, ...]]]:
    return [(name, tuple(p.shape)) for name, p in block.named_parameters()]


@contextmanager
def _fewer_blocks(module: nn.Module, units, keep: int, where: str) -> Iterator[tuple[tuple[str, nn.Module] | None, int]]:
    """The module with only its first ``keep`` repeated blocks while the trace runs (``keep`` 0: all), and
    ``(the blocks' path and list as traced, how many the module has)``."""
    found = _find_blocks(module) if units is None else None
    if not keep or found is None or len(found[1]) <= keep:
        yield found, 0
        return
    path, blocks = found
    if not path:
        raise ModelError(f"HETPART_TRACE_BLOCKS: the module itself is the list of blocks ({type(module).__name__}); "
                         "wrap it in a module, or unset HETPART_TRACE_BLOCKS")
    first = _block_shapes(blocks[0])
    odd = next((i for i, b in enumerate(blocks) if _block_shapes(b) != first), None)
    if odd is not None:
        raise ModelError(f"HETPART_TRACE_BLOCKS: {path}[{odd}] has other parameters than {path}[0]; the blocks "
                         "are not identical, trace them all (unset HETPART_TRACE_BLOCKS)")
    parent_path, _, attr = path.rpartition(".")
    parent = module.get_submodule(parent_path)
    kept = list(blocks)[:keep]
    parent._modules[attr] = nn.Sequential(*kept) if isinstance(blocks, nn.Sequential) else nn.ModuleList(kept)
    try:
        yield (path, parent._modules[attr]), len(blocks)
    finally:
        parent._modules[attr] = blocks


def _run(module: nn.Module, example_inputs: Any, units, seq_len: int, dtype: torch.dtype, where: str = "") -> _Trace:
    keep = int(_env_number("HETPART_TRACE_BLOCKS", 0, integer=True))
    with _fewer_blocks(module, units, keep, where) as (found, blocks):
        trace = _run_all(module, example_inputs, units, seq_len, dtype, where, found, blocks)
    if blocks:
        trace.blocks, trace.traced_blocks = blocks, keep
    return trace


def _run_all(module: nn.Module, example_inputs: Any, units, seq_len: int, dtype: torch.dtype, where: str,
             found: tuple[str, nn.Module] | None, blocks: int) -> _Trace:
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        fakes: dict[int, torch.Tensor] = {}
        state: dict[str, torch.Tensor] = {}
        for name, p in module.named_parameters(remove_duplicate=False):
            state[name] = fakes.setdefault(id(p), _fake_like(p, dtype, p.requires_grad))
        buffers = {name: _fake_like(b, dtype) for name, b in module.named_buffers(remove_duplicate=False)}
        args, kwargs = _fake_inputs(example_inputs, dtype)
    param_keys = {_storage_key(t): t.numel() for t in fakes.values()}
    names: dict[int, str] = {}
    for name, t in state.items():
        names.setdefault(_storage_key(t), name)
    matrices = {_storage_key(t) for t in fakes.values() if t.dim() >= 2}
    tracker = _Tracker(seq_len, param_keys, {_storage_key(b) for b in buffers.values()})
    tracker.where, tracker.limit_s, tracker.blocks = where, _env_number("HETPART_TRACE_LIMIT_S", DEFAULT_LIMIT_S), blocks
    tracker.units[0].in_bytes = _tensor_bytes((args, kwargs), grad_only=False)  # until a unit is entered
    counter = FlopCounterMode(display=False, custom_mapping=_EXTRA_FLOP_FORMULAS)
    handles = [m.register_forward_pre_hook(h, with_kwargs=True)
               for m, h in _unit_hooks(module, units, tracker, found)]
    was_training = module.training
    module.train()
    try:
        with mode, counter, _Recorder(tracker, counter.flop_registry), _NodeTagger(tracker), \
                torch.autograd.graph.saved_tensors_hooks(tracker.pack, lambda t: t):
            out = torch.func.functional_call(module, {**state, **buffers}, args, kwargs, strict=False)
            roots = _backward_roots(out)
            if not roots:
                raise ModelError("the module's output holds no tensor that needs a gradient; return a loss or "
                                 "outputs computed from trainable parameters")
            batch = _batch_size(args, kwargs)
            # per sequence; a scalar loss is sent whole, whatever the batch
            out_bytes = sum(r.numel() * r.element_size() / (1 if r.dim() == 0 else batch) for r in roots)
            torch.autograd.backward(roots, [torch.ones_like(r) for r in roots])
    finally:
        for h in handles:
            h.remove()
        module.train(was_training)
    return _Trace(tracker, batch, float(out_bytes), counter.get_total_flops(), param_keys, names, matrices)


def _check_counted(trace: _Trace) -> None:
    """Raise when weight matrices holding more than :data:`UNCOUNTED_SHARE` of the parameters were read in the
    forward only by ops without a FLOP formula, naming them and those ops."""
    tracker = trace.tracker
    missed = [k for k in trace.matrices if k in tracker.readers and k not in tracker.counted]
    total = sum(trace.param_numel.values())
    share = sum(trace.param_numel[k] for k in missed) / max(total, 1)
    if share <= UNCOUNTED_SHARE:
        return
    missed.sort(key=lambda k: (-trace.param_numel[k], trace.param_names[k]))
    ops = sorted({op for k in missed for op in tracker.readers[k]})
    raise ModelError(f"{share:.0%} of the parameters ({', '.join(trace.param_names[k] for k in missed[:3])}"
                     f"{', ...' if len(missed) > 3 else ''}) are read only by ops whose FLOPs torch's counter does "
                     f"not know ({', '.join(ops[:6])}): every step time would be too fast; compute with ops it counts "
                     "(torch.matmul, nn.Linear, F.scaled_dot_product_attention)")


def _owners(trace: _Trace) -> tuple[Counter, Counter, int | None]:
    """Parameters owned and shared per unit index (unread parameters go to the first unit), and the
    index of the unit owning the largest shared (tied) parameter."""
    owned: Counter = Counter()
    shared: Counter = Counter()
    tied_owner, tied_numel = None, 0
    for key, numel in trace.param_numel.items():
        users = trace.tracker.param_users.get(key, [0])
        owned[users[0]] += numel
        for u in users[1:]:
            shared[u] += numel
        if len(users) > 1 and numel > tied_numel:
            tied_owner, tied_numel = users[0], numel
    return owned, shared, tied_owner


def _units(trace: _Trace, dtype_bytes: int, name: str) -> tuple[list[Unit], str | None]:
    """The graph's units, and the name of the unit owning tied parameters (None without ties)."""
    stats, b = trace.tracker.units, trace.batch
    owned, shared, tied_owner = _owners(trace)
    result = []
    for i, s in enumerate(stats):
        out_bytes = stats[i + 1].in_bytes / b if i + 1 < len(stats) else trace.out_bytes
        none = s.saved_bytes / b
        selective = none - s.score_bytes / b
        # Like Megatron, full recomputation re-runs blocks (and generic modules), never embedding or head.
        full = none if s.kind in ("embedding", "head") else min(none, s.in_bytes / b)
        width = s.contraction_flops.most_common(1)[0][0] if s.contraction_flops else 0
        width = width or int(out_bytes // (trace.tracker.seq_len * dtype_bytes))
        result.append(Unit(
            name=s.name or name, kind=s.kind, fwd_flops=s.fwd_flops / b, bwd_flops=s.bwd_flops / b,
            params=owned[i], out_act_bytes=out_bytes,
            act_bytes={"none": none, "selective": selective, "full": full},
            recompute_flops={"none": 0.0, "selective": s.score_flops / b if s.score_bytes else 0.0,
                             "full": s.fwd_flops / b if full < none else 0.0},
            tp_comm_bytes_fwd=0.0, tp_shardable=False, shared_params=shared[i], width=width))
    return result, (result[tied_owner].name if tied_owner is not None else None)


def trace_module(module: nn.Module, example_inputs: Any, *, name: str, seq_len: int, precision: str = "bf16",
                 units: Sequence[str | Sequence[str]] | None = None, source: str = "") -> ModelGraph:
    """Measure a module's unit graph by tracing one training step (forward and backward) on fake tensors.

    Args:
        module: any ``torch.nn.Module`` (on any device, meta included; its weights are never read). It is
            put in training mode for the trace (dropout active) and restored afterwards.
        example_inputs: a tensor, a tuple of positional arguments, or a dict of keyword arguments for one
            forward call, holding ``batch`` sequences of ``seq_len`` tokens (values are never read).
            A Hugging Face model given ``labels`` returns a loss, and the loss is what the trace
            differentiates; otherwise every output that needs a gradient is differentiated with ones.
        name: the graph's name.
        seq_len: tokens per sequence (identifies the ``seq_len x seq_len`` attention scores).
        precision: ``bf16``, ``fp16`` or ``fp32``: floating parameters and inputs are traced in that dtype.
        units: module names (``"model.layers.0"``), or lists of names for a unit made of several modules,
            one entry per unit; None picks them as the module docstring says.
        source: recorded as the graph's source.

    Returns:
        A :class:`ModelGraph` whose per-unit numbers are per sequence. ``act_bytes["none"]`` is measured,
        ``"selective"`` drops the saved ``seq_len x seq_len`` tensors (attention scores, when the
        implementation materialises them; otherwise it equals ``"none"``), ``"full"`` keeps only the
        unit's input. Traced units are not tensor-parallel shardable (``tp_shardable=False``).
    """
    where = source or name
    if precision not in _DTYPES:
        raise ModelError(f"{where}: --precision: {precision!r} is not one of {', '.join(_DTYPES)}")
    if not isinstance(module, nn.Module):
        raise ModelError(f"{where}: expected a torch.nn.Module, got {type(module).__name__}")
    trace = _trace_step(module, example_inputs, units, seq_len, precision, where)
    dtype_bytes = torch.empty((), dtype=_DTYPES[precision]).element_size()
    graph_units, tied_owner = _units(trace, dtype_bytes, name)
    measured = sum(u.fwd_flops + u.bwd_flops for u in graph_units) * trace.batch
    if abs(measured - trace.counter_flops) > 1e-6 * max(1.0, trace.counter_flops):
        raise ModelError(f"{where}: per-unit FLOPs ({measured:.4g}) differ from FlopCounterMode's total "
                         f"({trace.counter_flops:.4g}); an op ran outside the trace")
    if trace.blocks:
        graph_units = _copy_blocks(graph_units, trace, where)
    return ModelGraph(name=name, units=tuple(graph_units), seq_len=seq_len, dtype_bytes=dtype_bytes,
                      tied_owner=tied_owner or None, source=source or f"trace:{name}")


def _copy_blocks(units: list[Unit], trace: _Trace, where: str) -> list[Unit]:
    """The units of a trace of the first ``traced_blocks`` blocks, the last of them copied to the untraced ones."""
    from dataclasses import replace

    from hetpart.graph.load import ModelNote  # load imports this module

    last = max(i for i, u in enumerate(units) if u.kind == "block")
    copies = [replace(units[last], name=f"block_{i}") for i in range(trace.traced_blocks, trace.blocks)]
    warnings.warn(ModelNote(f"{where}: traced {trace.traced_blocks} of {trace.blocks} blocks "
                            f"(HETPART_TRACE_BLOCKS); block_{trace.traced_blocks} .. block_{trace.blocks - 1} copy "
                            f"block_{trace.traced_blocks - 1}'s numbers (right for identical blocks, not for "
                            "blocks that compute differently by index)"), stacklevel=3)
    return units[:last + 1] + copies + units[last + 1:]


def _trace_step(module: nn.Module, example_inputs: Any, units, seq_len: int, precision: str, where: str) -> _Trace:
    """:func:`_run` in ``precision``, its FLOPs checked (:func:`_check_counted`), failures as one ModelError.
    An fp16 trace that fails is retried in bf16: some CPU kernels take bf16 only (``aten._grouped_mm``), and
    a 2-byte dtype gives the same FLOPs and bytes either way."""
    try:
        with fake_tensor_log_silenced():  # a failing op is reported below, in one line
            trace = _run(module, example_inputs, units, seq_len, _DTYPES[precision], where)
        _check_counted(trace)
        return trace
    except ModelError as exc:
        raise ModelError(f"{where}: {exc}") from None
    except Exception as exc:  # the module's own code, run on fake tensors
        cause: BaseException | None = exc
        while cause is not None and not isinstance(cause, _TraceTooLong):  # the limit, re-raised by other code
            cause = cause.__cause__ or cause.__context__
        if cause is not None:
            raise ModelError(f"{where}: {cause}") from None
        if precision == "fp16":
            try:
                trace = _trace_step(module, example_inputs, units, seq_len, "bf16", where)
            except ModelError:
                pass
            else:
                from hetpart.graph.load import ModelNote  # load imports this module

                warnings.warn(ModelNote(f"{where}: traced in bf16 (same bytes as fp16): the fp16 trace failed "
                                        f"({_first_line(exc)})"), stacklevel=2)
                return trace
        raise ModelError(f"{where}: tracing one training step failed ({_first_line(exc)}); the module must run "
                         "on shapes alone (no .item(), no data-dependent shapes)") from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


@contextmanager
def _own_argv(module_name: str) -> Iterator[list[str]]:
    """Run a builder as if its module were the program: ``sys.argv`` is just the module's name (an argparse in
    it parses no hetpart options), and what it writes to stderr is held back and replayed, except when it
    exits: then its last line (argparse's error) goes into the yielded list for the one-line error."""
    argv, stderr, held = sys.argv, sys.stderr, io.StringIO()
    said: list[str] = []
    sys.argv, sys.stderr = [module_name], held
    try:
        yield said
    except SystemExit:
        said += [line.strip() for line in held.getvalue().splitlines() if line.strip()][-1:]
        raise
    finally:
        sys.argv, sys.stderr = argv, stderr
        if not said:
            stderr.write(held.getvalue())


def _why(exc: BaseException, said: list[str]) -> str:
    """What user code failed with: the exception's first line, and for an exit what it said last."""
    return _first_line(exc) + (f": {said[-1]}" if isinstance(exc, SystemExit) and said else "")


def _call_builder(spec: str, seq_len: int) -> tuple[nn.Module, Any, bool]:
    """``(module, example_inputs, whether the function took seq_len)``."""
    module_name, func_name = split_python_spec(spec)
    try:
        with _own_argv(module_name) as said:
            fn = getattr(import_python_module(spec), func_name)
    except ModelError:
        raise
    except AttributeError:
        raise ModelError(f"{spec}: module {module_name!r} has no function {func_name!r}; check the name") from None
    except (Exception, SystemExit) as exc:  # user code: any failure while importing it
        raise ModelError(f"{spec}: importing {module_name} failed ({_why(exc, said)}); fix the module") from None
    if not callable(fn):
        raise ModelError(f"{spec}: {func_name!r} is a {type(fn).__name__}, not a function")
    try:
        takes_seq_len = "seq_len" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        takes_seq_len = False
    try:
        with _own_argv(module_name) as said:
            result = fn(seq_len=seq_len) if takes_seq_len else fn()
    except (Exception, SystemExit) as exc:  # user code; sys.exit() or argparse must not end hetpart
        raise ModelError(f"{spec}: calling {func_name}() failed ({_why(exc, said)}); fix the function") from None
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], nn.Module)):
        raise ModelError(f"{spec}: {func_name}() must return (torch.nn.Module, example_inputs), got "
                         f"{type(result).__name__}")
    return result[0], result[1], takes_seq_len


def _inputs_seq_len(example_inputs: Any) -> int | None:
    for t in pytree.tree_leaves(example_inputs):
        if isinstance(t, torch.Tensor) and t.dim() >= 2:
            return int(t.shape[1])
    return None


def trace_python_spec(spec: str, seq_len: int | None = None, precision: str = "bf16",
                      seq_len_source: str | None = None) -> ModelGraph:
    """Import and call ``python:MODULE:FUNCTION`` and trace the module it returns.

    Loading a ``python:`` spec runs user code: it is an explicit opt-in. The function returns
    ``(torch.nn.Module, example_inputs)``; a function with a ``seq_len`` parameter is called with
    ``seq_len=`` (2048 when None), otherwise its example inputs fix the sequence length (their second
    dimension). With ``seq_len_source`` (where ``seq_len`` came from: ``--seq-len``, a plan's field), a
    ``seq_len`` the example inputs do not have is an error instead.
    Any failure in user code becomes one :class:`ModelError` line.
    """
    module, example_inputs, takes_seq_len = _call_builder(spec, seq_len or 2048)
    own = None if takes_seq_len else _inputs_seq_len(example_inputs)
    if seq_len_source and seq_len is not None and own is not None and own != seq_len:
        func = spec.split(":")[2]
        fix = "drop --seq-len" if seq_len_source == "--seq-len" else f"use a plan made for {own} tokens"
        raise ModelError(f"{spec}: {seq_len_source} {seq_len} does not match the {own} tokens of {func}()'s "
                         f"example inputs (their dimension 1); make the example inputs {seq_len} tokens long "
                         f"(or give {func} a seq_len parameter), or {fix}")
    return trace_module(module, example_inputs, name=spec.split(":")[2], seq_len=own or seq_len or 2048,
                        precision=precision, source=spec)
