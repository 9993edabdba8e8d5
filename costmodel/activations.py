"""Activation bytes a unit keeps for its backward (per sequence): what the memory model counts.

Two kernel sets, because what a block saves depends on the kernels that run it more than on its math:

* ``torch`` -- hetpart's runtime: Hugging Face ``transformers`` GPT-2 and Llama blocks and hetpart's own
  GPT block (OPT and BERT shapes), on PyTorch's kernels (SDPA attention). **MEASURED**: bytes autograd
  saves for one forward (``torch.autograd.graph.saved_tensors_hooks``, one count per storage, parameters
  left out), fitted per token over 10 shapes each, exactly (largest residual < 0.01%):
  ``experiments/data/activation_bytes.json``, produced by ``python -m hetpart.experiments.measure_activations``
  (torch 2.13, transformers 5.23, CPU). Per token and block, 16-bit activations (fp32: see
  :data:`TORCH_BLOCK`), SDPA, no recomputation:

  - GPT-2 (transformers): ``16 h + 10 f + 4 a + 8``: its tanh-GELU is composed of five element-wise
    operators that each save an ``f``-wide tensor (Korthikanti's fused GeLU keeps 2);
  - Llama (transformers): ``20 h + 4 kv + 8 f + 4 a + 8 + 4 d``: each RMSNorm keeps an fp32 copy of its
    input (``4 h``) besides its 16-bit output; SwiGLU keeps gate, up, silu(gate) and their product;
  - hetpart's GPT block: ``16 h + 4 f + 4 a + 8`` (Korthikanti's ``34 s h`` for GPT without dropout,
    plus the attention kernel's fp32 log-sum-exp ``4 a`` and the norms' fp32 statistics);
  - full recomputation keeps the block's input (``2 h``); selective (the attention sublayer
    checkpointed) keeps its input instead of q, k, v and the output.

  The head (final norm, vocabulary projection, fp32 cross-entropy as the runtime computes it) keeps
  ``4 V`` (fp32 log-probabilities) plus 4-12 ``h``. On top of what autograd saves, the last pipeline
  stage's output stays alive until that micro-batch's backward: ``torch.distributed.pipelining`` keeps each
  stage's outputs in its forward cache (``fwd_cache``) for ``stage_backward``, and the last stage's output
  is the logits, ``p V`` per token (:data:`TORCH_HELD_LOGITS`; measured with
  :class:`hetpart.runtime.live_memory.LiveTensorBytes`: one ``(tokens, V)`` tensor besides the log-softmax).

  Tensor parallelism (:func:`unit_replicated_bytes`): the runtime's TP plans split the blocks' linears
  only (column-parallel q/k/v and fc1, row-parallel out-projection and fc2, no sequence parallelism), so on
  every TP rank the embedding and head are whole (parameters and activations), and a block's residual
  stream, norm outputs and norm statistics are whole too; only the attention's q, k, v and output, the
  fp32 log-sum-exp (and eager scores), and the ``f``-wide MLP tensors divide by ``tp`` (measured, gpt2-small
  tiny, TP-2: 3.17 MB of block activations per rank against 3.16 MB so counted).

* ``fused`` -- Megatron-Core with Transformer Engine, what published large runs use (the default).
  DERIVED, kernel by kernel, from what each fused kernel saves (not measured here: no GPU): the fused
  norm + linear keeps the norm's input and output (``2 p h`` each norm), flash attention q, k, v, its
  output and an fp32 log-sum-exp, the fused bias-SwiGLU its input (gate and up, ``2 p f``) and the second
  linear its output (``p f``), a GeLU MLP its two ``f``-wide tensors, dropout a 1-byte mask per output:
  ``p (6 h + 2 kv + n f) + 2 d h + 4 a`` per token (``n`` 3 for SwiGLU, 2 for GeLU; Korthikanti et al.
  2022's ``34 s h`` for GPT with dropout, ``12 h + 4 kv + 6 f`` for a 16-bit Llama block). The pieces
  that coincide with the runtime's kernels agree with the measurement (q, k, v, output and ``4 a`` of the
  attention kernel; the input kept by full recomputation). Eager attention adds Korthikanti's
  ``a s (p + d (1 + p))`` score terms, selective recomputation drops them. The embedding and head keep
  what the unit graph says (token ids; norm and projection inputs, fp32 log-probabilities).

Graphs traced from modules (no transformer config) keep their traced ``act_bytes`` under both sets.

**Working set** (:func:`unit_working_bytes`): what a unit's backward allocates on top of what was saved,
alive while it runs (one unit at a time, so a stage adds its largest): MEASURED on the runtime's units
(the allocator's in-use bytes, ``mallinfo2``, sampled after every operator; /tmp-free script in
``experiments/measure_activations.py --working-set``): the head's cross-entropy backward holds the fp32
gradients of the log-probabilities and of the logits, ``8 V`` bytes per token (8.0-8.1 V measured, fp32
and bf16); a block's MLP backward two ``f``-wide gradients, ``2 p f`` (8.0-8.5 f measured in fp32 at
micro-batch 2-4; 4.9-5.0 f in bf16). For the fused set: Megatron's vocabulary-parallel cross-entropy
computes its gradient in place in the saved fp32 softmax and casts it, ``p V``; the MLP backward the
gradients of the fc1 output and of the activation, ``p n f``. Megatron's last stage returns the loss, not
the logits, and its schedule frees (``deallocate_output_tensor``) what earlier stages sent, so the fused
set holds no stage output; its embedding and head are vocabulary-parallel (``V / tp`` each) and sequence
parallelism splits the rest, so every fused term divides by ``tp`` where the unit is shardable. Under full recomputation the unit being
recomputed also holds its whole activations again.
"""

from __future__ import annotations

import weakref

from typing import TYPE_CHECKING

from hetpart.errors import PlanError

if TYPE_CHECKING:  # pragma: no cover
    from hetpart.graph.model_graph import ModelGraph

__all__ = ["KERNELS", "DEFAULT_KERNELS", "TORCH_BLOCK", "TORCH_HEAD", "TORCH_HELD_LOGITS", "unit_saved_bytes",
           "FP8_WEIGHT_CACHE_BYTES", "FP8_SAVED_BYTES", "unit_fp8_cached_params", "unit_fp8_saved_delta",
           "unit_working_bytes", "unit_held_bytes", "unit_kept_bytes", "unit_params_split", "unit_replicated_bytes", "unit_replicated_working_bytes",
           "check_kernels", "FUSED_ATTENTION_DTYPE_BYTES", "attention_kernel", "effective_attention"]

KERNELS = ("fused", "torch")
"""Kernel sets the memory model knows (module docstring)."""
DEFAULT_KERNELS = "fused"

# MEASURED (experiments/data/activation_bytes.json): bytes per token and block by
# (runtime implementation, activation precision, attention, recompute); terms: h width, kv key/value
# width, f MLP width, a heads, one constant, d head dim (rotary tables, per sequence position), as heads x
# sequence (eager attention's score matrix).
TORCH_BLOCK: dict[tuple[str, str, str, str], dict[str, float]] = {
    ("gpt2", "bf16", "sdpa", "none"): {"h": 16, "f": 10, "a": 4, "one": 8},
    ("gpt2", "bf16", "sdpa", "selective"): {"h": 8, "f": 10, "one": 8},
    ("gpt2", "bf16", "eager", "none"): {"h": 16, "f": 10, "one": 8, "as": 2},
    ("gpt2", "bf16", "eager", "selective"): {"h": 8, "f": 10, "one": 8},
    ("gpt2", "fp32", "sdpa", "none"): {"h": 32, "f": 20, "a": 4, "one": 16},
    ("gpt2", "fp32", "sdpa", "selective"): {"h": 16, "f": 20, "one": 16},
    ("gpt2", "fp32", "eager", "none"): {"h": 32, "f": 20, "one": 16, "as": 4},
    ("gpt2", "fp32", "eager", "selective"): {"h": 16, "f": 20, "one": 16},
    ("llama", "bf16", "sdpa", "none"): {"h": 20, "kv": 4, "f": 8, "a": 4, "one": 8, "d": 4},
    ("llama", "bf16", "sdpa", "selective"): {"h": 14, "f": 8, "one": 8},
    ("llama", "bf16", "eager", "none"): {"h": 24, "f": 8, "one": 8, "d": 4, "as": 6},
    ("llama", "bf16", "eager", "selective"): {"h": 14, "f": 8, "one": 8},
    ("llama", "fp32", "sdpa", "none"): {"h": 32, "kv": 8, "f": 16, "a": 4, "one": 8, "d": 8},
    ("llama", "fp32", "sdpa", "selective"): {"h": 20, "f": 16, "one": 8},
    ("llama", "fp32", "eager", "none"): {"h": 40, "f": 16, "one": 8, "d": 8, "as": 4},
    ("llama", "fp32", "eager", "selective"): {"h": 20, "f": 16, "one": 8},
    ("gpt", "bf16", "sdpa", "none"): {"h": 16, "f": 4, "a": 4, "one": 8},
    ("gpt", "bf16", "sdpa", "selective"): {"h": 8, "f": 4, "one": 8},
    ("gpt", "fp32", "sdpa", "none"): {"h": 32, "f": 8, "a": 4, "one": 16},
    ("gpt", "fp32", "sdpa", "selective"): {"h": 16, "f": 8, "one": 16},
}
"""Full recomputation keeps the block's input, ``p h`` (measured: 2 h in bf16, 4 h in fp32, every family)."""
TORCH_HEAD: dict[tuple[str, str], dict[str, float]] = {
    ("gpt2", "bf16"): {"h": 4, "V": 4, "one": 12}, ("gpt2", "fp32"): {"h": 8, "V": 4, "one": 16},
    ("llama", "bf16"): {"h": 8, "V": 4, "one": 12}, ("llama", "fp32"): {"h": 12, "V": 4, "one": 12},
    ("gpt", "bf16"): {"h": 4, "V": 4, "one": 12}, ("gpt", "fp32"): {"h": 8, "V": 4, "one": 16},
}
"""MEASURED: the head with the runtime's loss (cross-entropy of the fp32 logits), bytes per token."""
TORCH_HELD_LOGITS = 1.0
"""The logits the runtime's last pipeline stage keeps until its backward, in activation bytes ``p`` per
token and head output: ``torch.distributed.pipelining`` holds every stage output in ``fwd_cache`` until
``stage_backward`` (module docstring). MEASURED: one ``(tokens, V)`` fp32 tensor at the peak of the
gpt2-small tiny step (1.08 MB = 64 x 4224 x 4)."""


def check_kernels(kernels: str) -> str:
    if kernels not in KERNELS:
        raise PlanError(f"kernels: unknown kernel set {kernels!r}; use {' or '.join(KERNELS)}")
    return kernels


def _torch_impl(family: str) -> str:
    """The runtime's implementation of a family: transformers for GPT-2 and Llama, hetpart's GPT else."""
    return family if family in ("gpt2", "llama") else "gpt"


def _terms(cfg, seq_len: int) -> dict[str, float]:
    return {"h": cfg.hidden_size, "kv": cfg.kv_dim, "f": cfg.ffn, "a": cfg.num_heads, "one": 1.0,
            "d": cfg.head_dim, "as": cfg.num_heads * seq_len, "V": _head_outputs(cfg)}


def _head_outputs(cfg) -> int:
    """The head's outputs per token: the vocabulary, or a classifier's labels (``TransformerConfig.head_outputs``)."""
    return int(getattr(cfg, "head_outputs", cfg.vocab_size))


def _dot(coef: dict[str, float], terms: dict[str, float]) -> float:
    return sum(c * terms[k] for k, c in coef.items())


def _torch_block(cfg, seq_len: int, p: int, recompute: str, attention: str) -> float:
    if recompute == "full":
        return float(p * cfg.hidden_size * seq_len)
    return _dot(_torch_block_coef(cfg, seq_len, p, recompute, attention), _terms(cfg, seq_len)) * seq_len


def _torch_block_coef(cfg, seq_len: int, p: int, recompute: str, attention: str) -> dict[str, float]:
    """:data:`TORCH_BLOCK`'s coefficients for ``cfg``'s runtime block (recompute ``none`` or ``selective``)."""
    prec = "fp32" if p >= 4 else "bf16"
    impl = _torch_impl(cfg.family)
    att = "sdpa" if attention == "fused" else "eager"
    coef = TORCH_BLOCK.get((impl, prec, att, recompute))
    if coef is None:  # hetpart's GPT block runs SDPA only; its eager form adds GPT-2's measured scores
        coef = dict(TORCH_BLOCK[(impl, prec, "sdpa", recompute)])
        if recompute == "none":
            coef.pop("a", None)
            coef["as"] = TORCH_BLOCK[("gpt2", prec, "eager", "none")]["as"]
    return coef


def _fused_block(cfg, seq_len: int, p: int, recompute: str, attention: str) -> float:
    h, kv, f, a, s = cfg.hidden_size, cfg.kv_dim, cfg.ffn, cfg.num_heads, seq_len
    if recompute == "full":
        return float(p * h * s)
    d = 1 if cfg.dropout else 0
    n = 3 if cfg.activation == "swiglu" else 2
    q = getattr(cfg, "q_dim", h)  # queries and attention output; the rest of 6 h is the two inputs and norms
    per_token = p * (4 * h + 2 * q + 2 * kv + n * f) + 2 * d * h
    if attention == "fused":
        per_token += 4 * a  # flash attention's fp32 log-sum-exp
    elif recompute == "none":
        per_token += a * s * (p + d * (1 + p))  # scores: softmax output, dropout mask and output
    return float(per_token * s)


_CACHE: dict[int, tuple["weakref.ref[ModelGraph]", dict[tuple, tuple[float, ...]]]] = {}
"""Per model (by identity: graphs are frozen but hold lists, so they do not hash), the answers of
:func:`unit_saved_bytes` and :func:`unit_working_bytes` by their arguments; planners' memory checks ask
them thousands of times per plan. An entry leaves with its graph."""


def _cached(model: "ModelGraph", key: tuple, compute) -> list[float]:
    entry = _CACHE.get(id(model))
    if entry is None or entry[0]() is not model:
        ident = id(model)
        entry = _CACHE[ident] = (weakref.ref(model, lambda _ref: _CACHE.pop(ident, None)), {})
    hit = entry[1].get(key)
    if hit is None:
        hit = entry[1][key] = tuple(compute())
    return list(hit)


FUSED_ATTENTION_DTYPE_BYTES = (1, 2)
"""Activation widths, bytes, whose attention the ``fused`` kernel set (Megatron-Core with Transformer Engine) runs
in a fused kernel: FlashAttention-2 and cuDNN's fused attention take fp16/bf16 (and fp8) only (cuDNN frontend's
SDPA support matrix; TE's ``get_attention_backend`` disables both for any other ``qkv_dtype`` and falls back to
``UnfusedDotProductAttention``), and Megatron's ``FusedScaleMaskSoftmax`` needs 16-bit input. A 32-bit run (fp32,
tf32) therefore materialises the ``a s^2`` scores there: eager attention, in time and memory."""


def attention_kernel(attention: str, dtype_bytes: int, kernels: str) -> tuple[str, str, str]:
    """``(priced, kernel, why)``: the attention a run really gets for the workload's ``attention``, its activation
    width ``dtype_bytes`` (the model graph's: 4 under fp32 and tf32) and the kernel set ``kernels``. ``priced`` is
    ``fused`` (no score matrix stored or streamed) or ``eager``; ``kernel`` names the kernel and ``why`` says why.

    Under ``fused`` (Megatron-Core / Transformer Engine) a 32-bit run falls back to the unfused core
    (:data:`FUSED_ATTENTION_DTYPE_BYTES`). Under ``torch`` (hetpart's runtime, PyTorch SDPA) a 32-bit run takes
    SDPA's memory-efficient kernel, which accepts fp32 on every CUDA architecture (PyTorch
    ``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``, ``can_use_mem_efficient_attention``: half, float
    and, from sm80, bfloat16), while the flash backend takes 16-bit only: no score matrix either, so ``fused``."""
    check_kernels(kernels)
    if attention != "fused":
        return attention, ("unfused core (scores materialised)" if kernels == "fused" else "eager PyTorch modules"), \
            "the workload asks for eager attention"
    if dtype_bytes in FUSED_ATTENTION_DTYPE_BYTES:
        return "fused", ("flash / cuDNN fused attention (Transformer Engine)" if kernels == "fused" else
                         "PyTorch SDPA (flash or memory-efficient)"), f"{dtype_bytes * 8}-bit activations"
    if kernels == "torch":
        return "fused", "PyTorch SDPA memory-efficient kernel", \
            f"{dtype_bytes * 8}-bit activations: SDPA's flash backend takes 16-bit only, its memory-efficient one fp32"
    return "eager", "unfused core (scores materialised): UnfusedDotProductAttention", \
        (f"{dtype_bytes * 8}-bit activations: flash and cuDNN fused attention take fp16/bf16/fp8 only, so Transformer "
         "Engine falls back to the unfused core")


def effective_attention(attention: str, dtype_bytes: int, kernels: str) -> str:
    """The attention a run is priced with (``fused`` or ``eager``): :func:`attention_kernel`'s first field."""
    if attention == "eager" or dtype_bytes in FUSED_ATTENTION_DTYPE_BYTES:
        return attention
    return attention_kernel(attention, dtype_bytes, kernels)[0]


def unit_saved_bytes(model: "ModelGraph", recompute: str, attention: str = "fused",
                     kernels: str = DEFAULT_KERNELS) -> list[float]:
    """Bytes each unit of ``model`` keeps for its backward, per sequence, under ``recompute`` with the
    ``attention`` kernel and the ``kernels`` set (module docstring)."""
    check_kernels(kernels)
    attention = effective_attention(attention, model.dtype_bytes, kernels)
    return _cached(model, ("saved", recompute, attention, kernels),
                   lambda: _unit_saved_bytes(model, recompute, attention, kernels))


def _unit_saved_bytes(model: "ModelGraph", recompute: str, attention: str, kernels: str) -> list[float]:
    from hetpart.costmodel.compute import saved_act_mode

    cfg = model.config
    if cfg is None:  # traced: what the trace measured
        mode = saved_act_mode(recompute, attention)
        return [float(u.act_bytes[mode]) for u in model.units]
    p, s = model.dtype_bytes, model.seq_len
    out = []
    for u in model.units:
        if u.kind == "block":
            block = _torch_block if kernels == "torch" else _fused_block
            out.append(block(cfg, s, p, recompute, attention))
        elif u.kind == "head" and kernels == "torch":
            prec = "fp32" if p >= 4 else "bf16"
            out.append(_dot(TORCH_HEAD[(_torch_impl(cfg.family), prec)], _terms(cfg, s)) * s)
        else:
            out.append(float(u.act_bytes[saved_act_mode(recompute, attention)]))
    return out


def unit_working_bytes(model: "ModelGraph", recompute: str, attention: str = "fused",
                       kernels: str = DEFAULT_KERNELS) -> list[float]:
    """Bytes each unit holds on top of its saved activations while its backward runs, per sequence (module
    docstring): its backward's transient gradients, plus under full recomputation its activations
    recomputed without recomputation."""
    check_kernels(kernels)
    attention = effective_attention(attention, model.dtype_bytes, kernels)
    return _cached(model, ("working", recompute, attention, kernels),
                   lambda: _unit_working_bytes(model, recompute, attention, kernels))


def _unit_working_bytes(model: "ModelGraph", recompute: str, attention: str, kernels: str) -> list[float]:
    out = unit_saved_bytes(model, "none", attention, kernels) if recompute == "full" else [0.0] * model.num_units
    cfg = model.config
    if cfg is None:
        return out
    if recompute == "full" and kernels == "torch":
        # hetpart's runtime checkpoints only units with an attention sublayer (UnitModule.set_recompute): the
        # embedding and head recompute nothing, their activations are the saved ones, not a second copy
        # (counting the head's again put a 2-stage run's last stage 8% over its measured peak)
        out = [b if u.kind == "block" else 0.0 for b, u in zip(out, model.units)]
    p, s = model.dtype_bytes, model.seq_len
    n = 3 if cfg.activation == "swiglu" else 2
    for i, u in enumerate(model.units):
        if u.kind == "block":
            out[i] += (2 if kernels == "torch" else n) * p * cfg.ffn * s
        elif u.kind == "head":
            out[i] += (8 if kernels == "torch" else p) * _head_outputs(cfg) * s
    return [float(b) for b in out]


def unit_held_bytes(model: "ModelGraph", kernels: str = DEFAULT_KERNELS) -> list[float]:
    """Bytes per sequence each unit's outputs stay alive beyond what autograd saves, until the micro-batch's
    backward: under ``torch`` the head's logits, the last pipeline stage's output that
    ``torch.distributed.pipelining`` keeps in its forward cache (:data:`TORCH_HELD_LOGITS`); none under
    ``fused`` (Megatron's last stage outputs the loss)."""
    check_kernels(kernels)
    cfg = model.config
    if kernels != "torch" or cfg is None:
        return [0.0] * model.num_units
    held = TORCH_HELD_LOGITS * model.dtype_bytes * _head_outputs(cfg) * model.seq_len
    return [held if u.kind == "head" else 0.0 for u in model.units]


def unit_kept_bytes(model: "ModelGraph", recompute: str, attention: str = "fused",
                    kernels: str = DEFAULT_KERNELS) -> list[float]:
    """What each unit keeps per sequence and micro-batch in flight, the memory model's activation term:
    :func:`unit_saved_bytes` plus :func:`unit_held_bytes`."""
    return [a + b for a, b in zip(unit_saved_bytes(model, recompute, attention, kernels),
                                  unit_held_bytes(model, kernels))]


FP8_WEIGHT_CACHE_BYTES = 2.0
"""Bytes per linear-layer weight element that an fp8 run keeps on top of the model states under the ``fused`` set:
Transformer Engine's fp8 copy of each ``Linear`` weight (1) and its transpose (1; Hopper's fp8 GEMMs take both
operands ``TN``, so dgrad needs the column-wise copy), cast on the first micro-batch and cached for the rest of
the step: Megatron-Core's TE wrappers pass ``is_first_microbatch`` unless ``--disable-parameter-transpose-cache``
(off by default; ``megatron/core/extensions/transformer_engine.py``, ``TELinear.forward``). Counted below level
3 only: Megatron-FSDP's ``keep_fp8_transpose_cache`` is off by default (its README: "number of parameter x 1 Byte"
when on) and its gathered weights are freed after each use."""

FP8_SAVED_BYTES = 1.0
"""Bytes per element of an fp8 ``Linear`` input that Transformer Engine saves for the wgrad GEMM (its column-wise
fp8 copy) in place of the 16-bit input (``transformer_engine/pytorch/module/linear.py`` and
``layernorm_linear.py``: ``update_usage(rowwise_usage=False)`` before saving)."""


def unit_fp8_cached_params(model: "ModelGraph", kernels: str = DEFAULT_KERNELS) -> list[float]:
    """Per unit, the linear-layer weight elements whose fp8 copies an fp8 run caches (:data:`FP8_WEIGHT_CACHE_BYTES`):
    a block's QKV, output projection, fc1 and fc2 weights under ``fused`` (``h (q + 2 kv) + q h + h f_1 + f h``,
    ``f_1`` = ``2 f`` gated); 0 elsewhere (the embedding, the head, which Megatron keeps outside TE, and ``torch``)."""
    check_kernels(kernels)
    cfg = model.config
    if kernels != "fused" or cfg is None or not hasattr(cfg, "kv_dim"):
        return [0.0] * model.num_units
    h, kv, f = cfg.hidden_size, cfg.kv_dim, cfg.ffn
    q = getattr(cfg, "q_dim", h)
    fc1 = 2 * f if cfg.activation == "swiglu" else f
    per_block = float(h * (q + 2 * kv) + q * h + h * fc1 + f * h)
    return [per_block if u.kind == "block" else 0.0 for u in model.units]


def unit_fp8_saved_delta(model: "ModelGraph", recompute: str, kernels: str = DEFAULT_KERNELS) -> list[float]:
    """Per unit and sequence, what an fp8 run saves for the backward beyond the 16-bit accounting of
    :func:`unit_saved_bytes` (negative: less), under ``fused``: the two norms' outputs (the QKV and fc1 inputs)
    and fc2's input are saved as fp8 (:data:`FP8_SAVED_BYTES` instead of ``p``, ``2 h + f`` per token), and the
    output projection saves an fp8 copy of the attention output beside the 16-bit one flash attention keeps
    (``+q``). 0 under full recomputation (a block keeps its input only), for other units and under ``torch``."""
    check_kernels(kernels)
    cfg = model.config
    if kernels != "fused" or recompute == "full" or cfg is None or not hasattr(cfg, "kv_dim"):
        return [0.0] * model.num_units
    p, s = model.dtype_bytes, model.seq_len
    h, f = cfg.hidden_size, cfg.ffn
    q = getattr(cfg, "q_dim", h)
    per_token = (FP8_SAVED_BYTES - p) * (2 * h + f) + FP8_SAVED_BYTES * q
    return [per_token * s if u.kind == "block" else 0.0 for u in model.units]


def unit_params_split(model: "ModelGraph", kernels: str = DEFAULT_KERNELS) -> list[bool]:
    """Whether each unit's parameters divide by ``tp``: the graph's ``tp_shardable`` under ``fused``
    (vocabulary-parallel embedding and head); under ``torch`` the blocks' only, as the runtime's TP plans
    split the blocks and keep the embedding and head whole on every rank (module docstring)."""
    check_kernels(kernels)
    if kernels == "torch" and model.config is not None:
        return [bool(u.tp_shardable and u.kind == "block") for u in model.units]
    return [bool(u.tp_shardable) for u in model.units]


def unit_replicated_bytes(model: "ModelGraph", recompute: str, attention: str = "fused",
                          kernels: str = DEFAULT_KERNELS) -> list[float]:
    """Of :func:`unit_kept_bytes`, the bytes every rank of a ``tp``-way stage keeps whole, per sequence
    (the rest divides by ``tp``): a unit that is not shardable keeps all; under ``torch`` the embedding and
    head keep all and a block its residual stream, norm outputs and statistics (module docstring)."""
    check_kernels(kernels)
    attention = effective_attention(attention, model.dtype_bytes, kernels)
    return _cached(model, ("replicated", recompute, attention, kernels),
                   lambda: _unit_replicated_bytes(model, recompute, attention, kernels))


def _unit_replicated_bytes(model: "ModelGraph", recompute: str, attention: str, kernels: str) -> list[float]:
    saved = unit_kept_bytes(model, recompute, attention, kernels)
    split = unit_params_split(model, kernels)
    out = [0.0 if sh else b for b, sh in zip(saved, split)]
    cfg = model.config
    if kernels != "torch" or cfg is None:
        return out
    p, s = model.dtype_bytes, model.seq_len
    for i, u in enumerate(model.units):
        if u.kind != "block" or not split[i]:
            continue
        if recompute == "full":  # the block's input: the residual stream
            out[i] = saved[i]
            continue
        coef = _torch_block_coef(cfg, s, p, recompute, attention)
        sharded = sum(coef.get(k, 0.0) * _terms(cfg, s)[k] for k in ("f", "a", "as"))
        if recompute == "none":  # q, k, v and the attention output (selective keeps the sublayer's input)
            sharded += p * (2 * getattr(cfg, "q_dim", cfg.hidden_size) + 2 * cfg.kv_dim)
        out[i] = max(0.0, saved[i] - sharded * s)
    return out


def unit_replicated_working_bytes(model: "ModelGraph", recompute: str, attention: str = "fused",
                                  kernels: str = DEFAULT_KERNELS) -> list[float]:
    """Of :func:`unit_working_bytes`, the bytes every rank of a ``tp``-way stage holds whole: all of a unit
    that is not split (under ``torch`` the head's cross-entropy gradients); under full recomputation also the
    recomputed activations' whole part (:func:`unit_replicated_bytes` without recomputation)."""
    check_kernels(kernels)
    attention = effective_attention(attention, model.dtype_bytes, kernels)
    work = unit_working_bytes(model, recompute, attention, kernels)
    split = unit_params_split(model, kernels)
    out = [0.0 if sh else b for b, sh in zip(work, split)]
    if recompute == "full":
        again = unit_replicated_bytes(model, "none", attention, kernels)
        out = [b if not sh else r for b, r, sh in zip(out, again, split)]
    return out
