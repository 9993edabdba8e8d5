"""Per-unit compute and tensor-parallel communication times of one micro-batch on one device type.

These are the primitives planners call in their inner loops: pure functions of numbers, O(units)
(vectorized), returning per-unit arrays that callers prefix-sum to cost any stage ``[first, last)``
in O(1).

Compute: ``flops * micro_batch / tp / (peak * eff)`` per unit, with the efficiency of
:mod:`hetpart.costmodel.efficiency` (per architecture and precision; a head whose vocabulary is not
16-byte aligned runs its product at :data:`~hetpart.costmodel.efficiency.UNALIGNED_FRACTION` of the
16-bit peak at most), plus the memory-bound kernels' ``act_traffic * act_bytes / hbm`` (twice that in
the backward), against a fixed host cost per operator the unit runs (:data:`OPS_PER_UNIT` operators at
``curve.host_us_per_op`` each: kernel launches, PyTorch dispatch, autograd; it is what makes
micro-batch 1 slower per sample than 4). The host enqueues kernels while the device runs earlier ones,
so a unit takes the longer of the two (``dispatch="overlap"``, measured: :data:`DISPATCH_MODES`), not
their sum. The backward includes the recomputed forward of the
recompute mode, memory-bound share and operators too: all of it under full recompute, the attention
core's share of the activations under selective. Under fused attention (flash / SDPA) the ``a s^2``
score matrix is neither stored nor streamed through HBM, so the memory-bound term uses the
activations without it, and the backward always recomputes the scores (half the attention core's
FLOPs), which makes selective recomputation a no-op.

Under fp8 only the linear layers' products run at the fp8 rate: the attention core and the output head keep
the bf16 rate (:func:`fp8_bf16_flops`, as Transformer Engine's recipes and Megatron-LM run them); fp8 products
saturate at twice a 16-bit product's size (:data:`~hetpart.costmodel.efficiency.FP8_SIZE_FACTOR`), and Transformer
Engine's casts, amax and transposes of every linear input and output gradient add memory-bound time
(:func:`fp8_cast_bytes`).

Tensor parallelism (Megatron-LM; sequence parallelism assumed: its all-gather + reduce-scatter pair
moves the same bytes as the all-reduce it replaces) costs two all-reduces of ``s b h`` elements per
block in the forward and two in the backward, one per embedding or head, plus the forward's again
under full recompute; they are not overlapped with compute (Megatron 2022).
"""

from __future__ import annotations

import numpy as np

from hetpart.graph.model_graph import ModelGraph
from hetpart.hardware import GPUSpec

from hetpart.costmodel.activations import (FUSED_ATTENTION_DTYPE_BYTES, attention_kernel, check_kernels,
                                          effective_attention)
from hetpart.costmodel.efficiency import (UNALIGNED_FRACTION, EfficiencyCurve, aligned, curve_for,
                                         effective_precision, unit_gemm_width)

__all__ = ["unit_compute_s", "unit_attention_core_s", "fp8_bf16_flops", "fp8_cast_bytes", "FP8_CAST_BYTES", "CP_OPS_PER_STEP", "DISPATCH_MODES", "CHECKPOINT_HOST",
           "RECOMPUTE_HOST", "SELECTIVE_SCOPES", "sublayer_recompute_flops", "unit_tp_comm_s", "stage_compute_s", "stage_tp_comm_s", "OPS_PER_UNIT", "FUSED_BLOCK_OPS", "FUSED_EMBEDDING_OPS", "FUSED_HEAD_OPS", "fused_ops", "unit_ops",
           "saved_act_mode", "effective_attention", "attention_kernel", "FUSED_ATTENTION_DTYPE_BYTES"]

OPS_PER_UNIT: dict[str, tuple[int, int]] = {
    "block": (32, 112), "block/llama": (66, 138), "embedding": (4, 10), "head": (8, 24), "module": (0, 0),
}
"""MEASURED, kernel set ``torch`` (hetpart's runtime): top-level ATen operators one unit dispatches per
micro-batch, ``(forward, backward)``, counted with ``torch.profiler`` on hetpart's runtime units (Hugging
Face GPT-2 and Llama modules, SDPA attention; the head's count includes its cross-entropy loss); traced
modules have no count (0: no fixed cost). Recount with ``python -m hetpart.experiments.bench_validation
--count-ops``. The ``fused`` set (Megatron-Core with Transformer Engine) runs far fewer:
:data:`FUSED_BLOCK_OPS`."""

FUSED_BLOCK_OPS: tuple[tuple[str, int, int, str], ...] = (
    ("input norm: TE LayerNormLinear's norm kernel (backward: dx, then the dgamma/dbeta reduction)", 1, 2, ""),
    ("QKV GEMM, bias in the cuBLASLt epilogue (backward: dgrad, wgrad accumulating into main_grad)", 1, 2, ""),
    ("fused RoPE (apply_rope_fusion), on q and on k", 2, 2, "rotary"),
    ("flash / cuDNN fused attention, TEDotProductAttention (backward: dO.O, main, dQ conversion)", 1, 3, "flash"),
    ("unfused core attention: baddbmm, fused scale-mask-softmax, bmm, context permute-copy "
     "(backward: two bmm grads, softmax grad, two baddbmm grads, copy)", 4, 6, "eager"),
    ("attention-probability dropout", 1, 1, "eager+dropout"),
    ("attention output GEMM, bias handed to the bias-dropout-add (backward: dgrad, wgrad)", 1, 2, ""),
    ("bias-dropout-add, jit-fused (bias_dropout_add_fused_train)", 1, 0, ""),
    ("  its backward: dropout gradient", 0, 1, "dropout"),
    ("  its backward: bias gradient (sum over tokens)", 0, 1, "bias"),
    ("residual gradient sum (autograd)", 0, 1, ""),
    ("pre-MLP norm: TE LayerNormLinear of fc1", 1, 2, ""),
    ("fc1 GEMM (bias skipped into the activation fusion)", 1, 2, ""),
    ("bias-GeLU / bias-SwiGLU, jit-fused (bias_gelu_impl, bias_swiglu_impl)", 1, 1, ""),
    ("  its backward: bias gradient", 0, 1, "bias"),
    ("fc2 GEMM (backward: dgrad, wgrad)", 1, 2, ""),
    ("bias-dropout-add, jit-fused", 1, 0, ""),
    ("  its backward: dropout gradient", 0, 1, "dropout"),
    ("  its backward: bias gradient", 0, 1, "bias"),
    ("residual gradient sum (autograd)", 0, 1, ""),
)
"""DERIVED (read from the source, not measured: no GPU here), kernel set ``fused``: the operators a
Megatron-Core transformer layer with Transformer Engine dispatches per micro-batch on one rank,
``(kernel, forward, backward, when)``: an operator is one host dispatch that launches work (a cuBLASLt
GEMM, a TE or jit-fused kernel, an ATen op); views and splits launch nothing and count 0; the
tensor-parallel collectives (and sequence parallelism's all-gather / reduce-scatter) are priced by
:func:`unit_tp_comm_s`, not here. Structure from NVIDIA/Megatron-LM ``megatron/core/models/gpt/
gpt_layer_specs.py`` (``get_gpt_layer_with_transformer_engine_spec``: ``TELayerNormColumnParallelLinear``
for the QKV and fc1 linears with their norms, ``TEDotProductAttention``, ``TERowParallelLinear``,
``get_bias_dropout_add``), ``transformer/attention.py`` (QKV split as views, RoPE applied to q and k),
``transformer/mlp.py`` (``skip_bias_add`` and ``bias_gelu_impl`` / ``bias_swiglu_impl`` under
``bias_activation_fusion``); gradient-accumulation fusion (the wgrad GEMM adds into ``main_grad``) is
Megatron's default. ``when``: ``rotary`` (no learned positions), ``flash`` / ``eager`` (the workload's
attention kernel; ``eager`` is Megatron's unfused ``DotProductAttention``, what the 2019-2022 Megatron-LM
runs used), ``dropout``, ``bias``. A GPT block: 10 forward / 23 backward under flash attention, 14 / 27
unfused; a Llama block: 12 / 20. The Hugging Face block of the ``torch`` set runs 32 / 112 and 66 / 138."""

FUSED_EMBEDDING_OPS: tuple[tuple[str, int, int, str], ...] = (
    ("word-embedding lookup (backward: embedding_dense_backward)", 1, 1, ""),
    ("position-embedding lookup and the add", 2, 1, "learned"),
    ("[b, s, h] -> [s, b, h] transpose copy", 1, 1, ""),
    ("embedding dropout", 1, 1, "dropout"),
)
"""DERIVED, kernel set ``fused``: Megatron-Core's ``LanguageModelEmbedding`` (same conventions as
:data:`FUSED_BLOCK_OPS`)."""

FUSED_HEAD_OPS: tuple[tuple[str, int, int, str], ...] = (
    ("final norm, TENorm (backward: dx, dgamma/dbeta)", 1, 2, ""),
    ("output-layer GEMM (backward: dgrad, wgrad)", 1, 2, ""),
    ("fp32 cast of the logits", 1, 1, ""),
    ("vocabulary-parallel cross-entropy: max, sub, target masks (3), clone, shift, masked fill, arange, gather, "
     "clone, masked fill, exp, sum, log, sub, div (backward: arange, mask cast, 1 - mask, gather, sub, scatter, mul)",
     17, 7, ""),
    ("label / loss transposes and the loss-mask mean", 4, 3, ""),
)
"""DERIVED, kernel set ``fused``: Megatron-Core's head and loss (``TENorm``, the output
``ColumnParallelLinear``, ``tensor_parallel/cross_entropy.py``'s ``VocabParallelCrossEntropy`` in plain
PyTorch operators, its all-reduces excluded), 24 forward / 15 backward."""


def _count(rows: tuple[tuple[str, int, int, str], ...], features: set[str]) -> tuple[int, int]:
    """``(forward, backward)`` operators of the rows whose every ``+``-joined condition is in ``features``."""
    chosen = [(f, b) for _, f, b, when in rows if not when or all(w in features for w in when.split("+"))]
    return sum(f for f, _ in chosen), sum(b for _, b in chosen)


def fused_ops(config, attention: str = "fused") -> dict[str, tuple[int, int]]:
    """Operators per unit kind of the ``fused`` kernel set for a transformer ``config`` (GPT-style defaults
    where it has no field): ``{"block", "embedding", "head", "module"}`` -> ``(forward, backward)``."""
    learned = bool(getattr(config, "learned_positions", True))
    features = {"flash" if attention == "fused" else "eager"}
    features |= {name for name, on in (("rotary", not learned), ("learned", learned),
                                       ("dropout", getattr(config, "dropout", True)),
                                       ("bias", getattr(config, "bias", True))) if on}
    return {"block": _count(FUSED_BLOCK_OPS, features), "embedding": _count(FUSED_EMBEDDING_OPS, features),
            "head": _count(FUSED_HEAD_OPS, features), "module": (0, 0)}


def unit_ops(model: ModelGraph, kernels: str = "torch", attention: str = "fused") -> tuple[np.ndarray, np.ndarray]:
    """``(fwd_ops[units], bwd_ops[units])``: operators each unit dispatches per micro-batch under the kernel
    set ``kernels``: the runtime's measured counts (:data:`OPS_PER_UNIT`, ``torch``) or Megatron-Core /
    Transformer Engine's derived ones (:func:`fused_ops`, ``fused``, under the workload's ``attention``)."""
    check_kernels(kernels)
    attention = effective_attention(attention, model.dtype_bytes, kernels)
    if kernels == "torch":
        family = getattr(model.config, "family", "")
        keys = ["block/llama" if u.kind == "block" and family == "llama" else u.kind for u in model.units]
        table = OPS_PER_UNIT
    else:
        keys = [u.kind for u in model.units]
        table = fused_ops(model.config, attention)
    return (np.array([table[k][0] for k in keys], dtype=float),
            np.array([table[k][1] for k in keys], dtype=float))


def saved_act_mode(recompute: str, attention: str) -> str:
    """The activation column that holds what a unit saves: fused attention stores no score matrix, so
    without recomputation it saves what selective recomputation saves (the graph's ``none`` minus the
    ``a s^2`` terms)."""
    return "selective" if recompute == "none" and attention == "fused" else recompute


def _recomputed_flops(unit, recompute: str, attention: str) -> float:
    """Forward FLOPs a unit's backward runs again. Fused attention (FlashAttention, Dao et al. 2022)
    recomputes the scores ``Q K^T`` in its backward whatever the recompute mode (half of the attention
    core's ``4 s^2 h``), so selective recomputation adds nothing on top of it."""
    core = unit.recompute_flops["selective"]
    if attention != "fused":
        return unit.recompute_flops[recompute]
    if recompute == "full":
        return unit.recompute_flops["full"] + 0.5 * core
    return 0.5 * core


def _unit_arrays(model: ModelGraph, recompute: str, attention: str = "eager") -> dict[str, np.ndarray]:
    """Per-unit arrays of ``model`` (FLOPs, activation bytes, widths, ...), built once per model, recompute mode
    and attention kernel and kept on the model (read-only: every caller shares them). The search's LP splits of
    uneven tensor-parallel groups price every unit again and again (10,676 builds, 3 of 11 s, for the
    proportional planner on a cluster with five throttled devices)."""
    cache = model.__dict__.setdefault("_unit_arrays", {})  # frozen dataclass: its __dict__, as cached_property
    key = (recompute, attention)
    if key not in cache:
        arrays = _build_unit_arrays(model, recompute, attention)
        for array in arrays.values():
            array.flags.writeable = False
        cache[key] = arrays
    return cache[key]


def _build_unit_arrays(model: ModelGraph, recompute: str, attention: str) -> dict[str, np.ndarray]:
    units = model.units
    full = saved_act_mode("none", attention)
    return {
        "fwd": np.array([u.fwd_flops for u in units], dtype=float),
        "bwd": np.array([u.bwd_flops + _recomputed_flops(u, recompute, attention) for u in units], dtype=float),
        "none": np.array([u.act_bytes[full] for u in units], dtype=float),
        "selective": np.array([u.act_bytes["selective"] for u in units], dtype=float),
        "shardable": np.array([u.tp_shardable for u in units], dtype=bool),
        "inner": np.array([u.kind in ("block", "module") for u in units], dtype=bool),
        "width": np.array([unit_gemm_width(u.width, u.kind, 1, u.fwd_flops / model.seq_len) for u in units]),
        "tp_bytes": np.array([u.tp_comm_bytes_fwd for u in units], dtype=float),
        "calls": np.array([2.0 if u.kind == "block" else 1.0 for u in units]),
        "head": np.array([u.kind == "head" for u in units], dtype=bool),
    }


def _unit_rates(model: ModelGraph, gpu: GPUSpec, tp: int, micro_batch: int, precision: str,
                curve: EfficiencyCurve | None, cp: int = 1, u: dict | None = None, padded: bool = False
                ) -> tuple[np.ndarray, np.ndarray, EfficiencyCurve, str]:
    """``(FLOP/s of each unit on one device, its TP shard, the curve, the effective precision)``: the
    device's peak times the efficiency at the unit's per-device width and tokens (``micro_batch`` whole
    sequences, or ``1/cp`` of them under context parallelism). ``padded``: the engine pads the vocabulary
    (Megatron-LM's ``--make-vocab-size-divisible-by 128``, times TP, its default): the head's product is aligned
    whatever the model's vocabulary (GPT-2's 50,257 runs as 50,304; the 0.1% more FLOPs are not counted); eager
    modules (Hugging Face's GPT-2, hetpart's runtime) run the vocabulary as it is."""
    precision = effective_precision(gpu, precision)
    peak_tflops = gpu.tflops(precision)
    curve = curve or curve_for(gpu)
    u = u if u is not None else _unit_arrays(model, "none")
    shard = np.where(u["shardable"], tp, 1)
    width = np.maximum(np.where(u["inner"], u["width"] / shard, u["width"]), 1.0)  # see unit_gemm_width
    tokens = max(micro_batch * model.seq_len, 1) if cp == 1 else max(micro_batch * model.seq_len / cp, 1.0)
    # the device's size (SMs) sets where its products saturate; fp8 products need twice the size (FP8_SIZE_FACTOR)
    size = gpu.tflops_bf16 * curve.size_ratio(precision)
    eff = curve.e_peak(precision) / (1.0 + (curve.w0(size) / width) ** curve.alpha
                                     + (curve.t0(size) / tokens) ** curve.alpha)
    vocab = int(getattr(model.config, "head_outputs", getattr(model.config, "vocab_size", 0)) or 0)
    if vocab and not padded and not aligned(vocab, precision):
        cap = UNALIGNED_FRACTION * gpu.tflops_bf16 / peak_tflops
        eff = np.where(u["head"], np.minimum(eff, cap), eff)
    return peak_tflops * 1e12 * eff * shard, shard, curve, precision


def unit_compute_s(model: ModelGraph, gpu: GPUSpec, tp: int, micro_batch: int, precision: str,
                   recompute: str, curve: EfficiencyCurve | None = None,
                   attention: str = "fused", cp: int = 1, kernels: str = "torch", dispatch: str = "overlap",
                   speed: float = 1.0, selective: str = "core") -> tuple[np.ndarray, np.ndarray]:
    """``(fwd_s[units], bwd_s[units])``: compute seconds of each unit for one micro-batch on one device.

    The backward includes the recomputation of ``recompute`` (``none``, ``selective`` or ``full``).
    ``curve`` overrides the device's efficiency curve (calibration uses it); ``attention`` is the
    workload's kernel (``fused`` or ``eager``). ``cp``: context parallelism
    (:mod:`~hetpart.costmodel.context_parallel`): the device holds ``1/cp`` of each sequence, so every
    unit's FLOPs (the attention core's too: the load-balanced causal split gives each rank an equal
    share of the score blocks) and activation traffic divide by ``cp``, its products run on ``1/cp`` of
    the tokens, and each block launches :data:`CP_OPS_PER_STEP` more operators per extra ring step.
    ``kernels``: the kernel set whose operator counts pay the fixed host cost (:func:`unit_ops`;
    ``torch``, the measured counts of hetpart's runtime, unless given: the simulator passes its kernel set's,
    ``op_counts="engine"``, its default, or ``torch`` under ``op_counts="measured"``); under ``fused`` the head's
    vocabulary is padded as Megatron pads it (:func:`_unit_rates`).
    ``dispatch``: how the host's fixed cost meets the device's work (:data:`DISPATCH_MODES`): ``overlap``
    (eager CUDA launches are asynchronous: a unit takes the longer of its host and device times) or
    ``serial`` (their sum, the simulator before 2026-11-27). ``speed``: the device's speed factor (``slow:`` in
    the cluster file): its device work takes ``1 / speed`` as long; the host's dispatch does not slow with it.
    ``selective``: what selective recomputation re-runs (:data:`SELECTIVE_SCOPES`): ``core``, the attention core
    (Korthikanti et al. 2022; Megatron-LM), or ``sublayer``, the whole attention sublayer, its projections
    included (hetpart's runtime, ``UnitModel.set_recompute``; :func:`sublayer_recompute_flops`).
    """
    if dispatch not in DISPATCH_MODES:
        raise ValueError(f"dispatch: unknown {dispatch!r}; use one of {', '.join(DISPATCH_MODES)}")
    if selective not in SELECTIVE_SCOPES:
        raise ValueError(f"selective: unknown {selective!r}; use one of {', '.join(SELECTIVE_SCOPES)}")
    attention = effective_attention(attention, model.dtype_bytes, kernels)  # 32-bit under the engine: eager
    u = _unit_arrays(model, recompute, attention)
    sublayer = recompute == "selective" and selective == "sublayer"
    if sublayer:  # the projections (and, under fused attention, the core's forward) run again as well
        more, rewritten = sublayer_recompute_flops(model, attention)
        u = dict(u, bwd=u["bwd"] + more)
    padded = kernels == "fused"  # Megatron pads the vocabulary; eager modules do not (_unit_rates)
    rate, shard, curve, _ = _unit_rates(model, gpu, tp, micro_batch, precision, curve, cp, u, padded)
    work = micro_batch if cp == 1 else micro_batch / cp  # sequences' worth of tokens on this device
    memory = curve.act_traffic * u["none"] * work / shard / (gpu.hbm_gbyte_s * 1e9)
    if recompute == "full":
        extra = memory
    elif sublayer:
        extra = memory * rewritten
    elif recompute == "selective":
        share = np.divide(u["selective"], u["none"], out=np.ones_like(memory), where=u["none"] > 0)
        extra = memory * (1.0 - share)
    else:
        extra = np.zeros_like(memory)
    ops_fwd, ops_bwd = unit_ops(model, kernels, attention)
    if cp > 1:  # the ring's extra attention calls, corrections and send/recv launches, per block
        blocks = np.array([un.kind == "block" for un in model.units], dtype=float)
        ops_fwd = ops_fwd + blocks * (cp - 1) * CP_OPS_PER_STEP[0]
        ops_bwd = ops_bwd + blocks * (cp - 1) * CP_OPS_PER_STEP[1]
    host = curve.host_us_per_op * 1e-6
    host_f, host_b = host * ops_fwd, host * ops_bwd
    if kernels == "torch" and (recompute == "full" or sublayer):  # torch.utils.checkpoint's host cost (measured)
        fwd_factor, total_factor = RECOMPUTE_HOST[recompute]
        # only units with attention recompute anything (UnitModel.set_recompute): blocks
        blocks = np.array([un.kind == "block" for un in model.units])
        host_f, host_b = (np.where(blocks, fwd_factor * host_f, host_f),
                          np.where(blocks, total_factor * (host_f + host_b) - fwd_factor * host_f, host_b))
    elif recompute == "full":  # the engine's recomputed forward: its operators once more
        host_b = host_b + host_f
    gemm_f, gemm_b = u["fwd"] * work / rate, u["bwd"] * work / rate
    if effective_precision(gpu, precision) == "fp8":  # only the linear layers' products run in fp8
        f16, b16 = fp8_bf16_flops(model, recompute, attention)
        rate16, _, _, _ = _unit_rates(model, gpu, tp, micro_batch, "bf16", curve, cp, u, padded)
        gemm_f = gemm_f + f16 * work * (1.0 / rate16 - 1.0 / rate)
        gemm_b = gemm_b + b16 * work * (1.0 / rate16 - 1.0 / rate)
        cast_f, cast_b = fp8_cast_bytes(model, recompute)  # Transformer Engine's casts and transposes
        memory_f = memory + cast_f * work / shard / (gpu.hbm_gbyte_s * 1e9)
        memory_b = 2 * memory + cast_b * work / shard / (gpu.hbm_gbyte_s * 1e9)
    else:
        memory_f, memory_b = memory, 2 * memory
    device_f = (gemm_f + memory_f) / speed
    device_b = (gemm_b + memory_b + extra) / speed
    if dispatch == "overlap":  # the host enqueues while the device runs: the longer of the two
        return np.maximum(device_f, host_f), np.maximum(device_b, host_b)
    return device_f + host_f, device_b + host_b


def fp8_bf16_flops(model: ModelGraph, recompute: str, attention: str) -> tuple[np.ndarray, np.ndarray]:
    """``(fwd, bwd)`` FLOPs per unit and sequence that an fp8 run still computes in bf16: the attention core (its
    ``Q K^T`` and product with ``V``, forward, their gradients and what the backward recomputes of them) and the
    output head. Transformer Engine's fp8 recipes quantize the GEMMs of its ``Linear`` layers only: its
    ``DotProductAttention`` runs bf16 unless fp8 attention is asked for (Megatron-LM's
    ``--fp8-dot-product-attention``, off by default), and Megatron's output layer is a plain
    ``ColumnParallelLinear``, outside Transformer Engine. Everything else of the unit runs at the fp8 rate."""
    cache = model.__dict__.setdefault("_fp8_bf16_flops", {})
    key = (recompute, attention)
    if key not in cache:
        fwd, bwd = [], []
        for un in model.units:
            if un.kind == "head":
                fwd.append(un.fwd_flops)
                bwd.append(un.bwd_flops)
                continue
            core = un.recompute_flops["selective"] if un.kind == "block" else 0.0
            again = core if recompute == "full" or (attention != "fused" and recompute == "selective") else 0.0
            fwd.append(core)  # fused attention's backward recomputes the scores: half the core, always
            bwd.append(2.0 * core + again + (0.5 * core if attention == "fused" else 0.0))
        cache[key] = (np.array(fwd, dtype=float), np.array(bwd, dtype=float))
    return cache[key]


FP8_CAST_BYTES: dict[str, float] = {"norm_linear_input": 1.0, "linear_input": 4.0, "output_grad": 4.0}
"""DERIVED from Transformer Engine's source (``transformer_engine/pytorch/module/linear.py``,
``layernorm_linear.py``; not measured: no GPU here): HBM bytes per element that an fp8 ``Linear`` moves beyond its
bf16 form, under the delayed-scaling recipe (Megatron-LM's default ``--fp8-recipe delayed``) on Hopper, whose fp8
GEMMs take both operands in the ``TN`` layout, so each quantized tensor is kept in a row-wise copy (for the
forward or dgrad GEMM) and a column-wise, transposed copy (for the wgrad GEMM; TE's "tensor usages",
``docs/features/low_precision_training/performance_considerations``):

* ``linear_input``, a plain ``Linear``'s input (the attention output into the output projection, the activation
  into fc2): a fused cast-transpose reads the bf16 input (2) and writes the fp8 row-wise and column-wise copies
  (1 + 1); the amax is reduced inside the same kernel (delayed scaling updates the scale once per step);
* ``norm_linear_input``, a ``LayerNormLinear``'s input (QKV, fc1): the norm kernel writes its output straight in
  fp8 (1 instead of 2) and a transpose reads and writes it once more (1 + 1): net 1;
* ``output_grad``, every ``Linear``'s output gradient in the backward: cast-transposed like an input to E5M2
  (2 read, 1 + 1 written; the bias gradient is fused into it).

The weights are cast (and transposed) once per step and cached across micro-batches (Megatron passes
``is_first_microbatch``): not counted per micro-batch. :func:`fp8_cast_bytes` adds them up per block."""


def fp8_cast_bytes(model: ModelGraph, recompute: str = "none") -> tuple[np.ndarray, np.ndarray]:
    """``(fwd, bwd)`` HBM bytes per unit and sequence of Transformer Engine's fp8 casts (:data:`FP8_CAST_BYTES`),
    before tensor parallelism divides them (sequence parallelism splits every term): per token of a block, the QKV
    and fc1 inputs (``h`` each, a ``LayerNormLinear``), the output projection's input (``q``) and fc2's (``f``),
    and in the backward the output gradients of QKV (``q + 2 kv``), the projection (``h``), fc1 (``2 f`` gated, else
    ``f``) and fc2 (``h``). Full recomputation runs the forward's casts again in the backward. 0 for the embedding,
    the head (a plain ``ColumnParallelLinear`` outside TE: :func:`fp8_bf16_flops`) and graphs without a config."""
    cfg = getattr(model, "config", None)
    n = len(model.units)
    if cfg is None or not hasattr(cfg, "kv_dim"):
        return np.zeros(n), np.zeros(n)
    c = FP8_CAST_BYTES
    h, kv, f = cfg.hidden_size, cfg.kv_dim, cfg.ffn
    q = getattr(cfg, "q_dim", h)
    fc1_out = 2 * f if cfg.activation == "swiglu" else f
    fwd = c["norm_linear_input"] * 2 * h + c["linear_input"] * (q + f)
    bwd = c["output_grad"] * (q + 2 * kv + h + fc1_out + h) + (fwd if recompute == "full" else 0.0)
    blocks = np.array([un.kind == "block" for un in model.units], dtype=float)
    return blocks * fwd * model.seq_len, blocks * bwd * model.seq_len


RECOMPUTE_HOST: dict[str, tuple[float, float]] = {"full": (1.602, 2.006), "selective": (1.403, 1.615)}
"""MEASURED: host time of a block under recomputation with ``torch.utils.checkpoint`` (non-reentrant; the
runtime's ``UnitModel.set_recompute``: ``full`` checkpoints the whole block, ``selective`` its attention
sublayer), as ``(forward factor, forward + backward factor)`` over the same block without it; units without
attention recompute nothing. ``python -m hetpart.experiments.bench_host_ops --recompute-host``
(``experiments/data/recompute_host.json``): the runtime's first block at one token (host time only), this
project's CPU, one thread, the three modes measured in turn, 5 rounds of 200 calls, the median of the round
medians; the mean of the GPT-2 and Llama blocks to three decimals (2026-11-27 17:25 UTC; GPT-2 / Llama: ``full``
forward x1.603 / x1.601, forward + backward x1.958 / x2.054; ``selective`` x1.407 / x1.400 and x1.611 / x1.619;
tests/test_host_ops.py recomputes the means from the file). Until 2026-12-01 the constants were rounded by hand to
(1.60, 2.0) and (1.41, 1.62): selective's two were one block's figure each, not the mean (1.403, 1.615). Two more
runs within 0.05 of these (full x1.98-2.04, selective x1.59-1.68). The ``selective`` factor applies where selective
recomputation re-runs the attention sublayer as the runtime does (:data:`SELECTIVE_SCOPES` ``sublayer``);
Megatron's (``core``) checkpoints the attention core alone, a few operators, and pays nothing here. The checkpoint's saved-tensor hooks, recomputation frames and
RNG state handling cost more host time than the recomputed operators alone (x1.22 by operator count under
``full``). An earlier, unscripted measurement (2026-11-27, separate calls per mode) gave x2.31 / x2.23 for
``full``; it is not reproduced by the script and is no longer used: with it (and on every unit, the embedding and
head included) the H100's held-out runtime runs with full recompute (``experiments/data/h100_runs.jsonl`` rows 6
and 8, hidden 768, micro-batch 1 and 4) came out +16.4% and +12.5% too slow; with these factors on blocks only,
-0.1% and -2.2% (2026-11-27; +0.2% and -1.9% with the means of 2026-12-01). Those rows are not a blind check of
this choice: the script was written, x2.31 dropped and the factors confined to blocks in one change (commit
012a769, 2026-11-27), whose message reports these held-out rows before and after, so the choice was made with the
rows in view. The factors themselves come from the script's file alone. Operator counts of the ``torch`` set only: an engine's own
recomputation (kernel set ``fused`` with ``op_counts="engine"``) pays its forward's operators once more. On CUDA (one H200,
2026-11-29, ``--device cuda``; experiments/data/h200_session_2026-11-29.txt), where the checkpoint also saves and
restores the device's RNG state, the mean of the two blocks was ``full`` x1.59 / x1.93 and ``selective`` x1.35 /
x1.51: within the spread between the models, so these constants serve GPUs too."""

CHECKPOINT_HOST = RECOMPUTE_HOST["full"]
""":data:`RECOMPUTE_HOST` under full recomputation (the name earlier code and tests use)."""

SELECTIVE_SCOPES = ("core", "sublayer")
"""What selective recomputation re-runs in the backward: ``core``, the attention core (``Q K^T``, softmax,
the product with ``V``: Korthikanti et al. 2022, Megatron-LM's ``--recompute-granularity selective``), or
``sublayer``, the whole attention sublayer, projections included (hetpart's runtime checkpoints the
attention module: ``UnitModel.set_recompute``). MEASURED on this CPU (one thread, the runtime's first block,
one sequence of 256 tokens, forward + backward, selective over none, median of 5): GPT-2 at width 768 x1.088
and a Llama block at width 512 x1.137, against the sublayer's FLOPs x1.123 and x1.128 (the core alone: x1.02
and x1.03); ``bench_host_ops --recompute-host`` measures the host side, the
``tests/test_host_ops.py`` sublayer test the device side's arithmetic."""


def sublayer_recompute_flops(model: ModelGraph, attention: str = "fused") -> tuple[np.ndarray, np.ndarray]:
    """``(flops[units], traffic_share[units])`` that recomputing the whole attention sublayer adds over
    :func:`_recomputed_flops` under selective recomputation (:data:`SELECTIVE_SCOPES` ``sublayer``): per
    sequence, the q, k, v and output projections' forward, ``2 s h (2 h + 2 kv)``, and under fused attention
    the core's forward once more (``4 s^2 h``; its backward's own recomputation of the scores is already
    counted); and the share of the block's saved activations the recomputed sublayer writes again (its
    q, k, v, output and input: ``(3 h + 2 kv) / (the block's)`` per token, the graph's accounting). 0 for units
    without attention and for graphs without a transformer config."""
    cfg = getattr(model, "config", None)
    n = len(model.units)
    if cfg is None or not hasattr(cfg, "kv_dim"):
        return np.zeros(n), np.zeros(n)
    s, h, kv = model.seq_len, cfg.hidden_size, cfg.kv_dim
    q = getattr(cfg, "q_dim", h)
    flops = np.zeros(n)
    share = np.zeros(n)
    full = saved_act_mode("none", attention)
    for i, un in enumerate(model.units):
        if un.kind != "block":
            continue
        flops[i] = 2 * s * h * (2 * q + 2 * kv) + (un.recompute_flops["selective"] if attention == "fused" else 0.0)
        p = un.out_act_bytes / (s * h) if s * h else 0.0
        if un.act_bytes[full] > 0:
            share[i] = min(1.0, p * s * (h + 2 * q + 2 * kv) / un.act_bytes[full])
    return flops, share


DISPATCH_MODES = ("overlap", "serial")
"""How a unit's host dispatch and its device work combine. MEASURED (``experiments/data/h100_host_overlap.json``,
``python -m hetpart.experiments.bench_host_overlap``): on one H100, back-to-back forward + backward of the
runtime's GPT-2 blocks (hidden 256 to 2,560, micro-batches 1-8, bf16 and fp32) and of 14-unit chains with the
loss took 0.99x (blocks; 0.57-1.20) and 1.01x (chains; 0.60-1.24) the larger of the host's issue time and the
kernels' own time, against 0.73x / 0.72x their sum (median of 40 rows each): ``overlap``."""

CP_OPS_PER_STEP = (4, 4)
"""ASSUMED (counted from Transformer Engine's ring-attention loop, ``AttnFuncWithCPAndKVP2P``, not
measured): operators a block launches per extra context-parallel ring step, ``(forward, backward)``:
one attention kernel, two output / log-sum-exp corrections (forward) or gradient accumulations
(backward), and one batched send/receive."""


def unit_attention_core_s(model: ModelGraph, gpu: GPUSpec, tp: int, micro_batch: int, precision: str,
                          curve: EfficiencyCurve | None = None, cp: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """``(fwd_s[units], bwd_s[units])``: the part of :func:`unit_compute_s` (fused attention) that the
    attention core's products take on one device for one micro-batch: ``Q K^T`` and the product with
    ``V`` forward (the graph's ``4 s^2 h``, its selective-recompute FLOPs), and their gradients plus
    the recomputed scores backward (2.5 times that); 0 for units without attention. Context
    parallelism's ring overlaps its transfers with this (:mod:`~hetpart.costmodel.context_parallel`)."""
    if effective_precision(gpu, precision) == "fp8":  # the core runs bf16 (fp8_bf16_flops)
        precision = "bf16"
    rate, _, _, _ = _unit_rates(model, gpu, tp, micro_batch, precision, curve, cp)
    core = np.array([un.recompute_flops["selective"] if un.kind == "block" else 0.0 for un in model.units])
    fwd = core * micro_batch / cp / rate
    return fwd, 2.5 * fwd


def unit_tp_comm_s(model: ModelGraph, tp: int, micro_batch: int, recompute: str, bandwidth_gbyte_s: float,
                   latency_us: float, lines: tuple[tuple[float, float], ...] = (),
                   selective: str = "core") -> tuple[np.ndarray, np.ndarray]:
    """``(fwd_s[units], bwd_s[units])``: tensor-parallel all-reduce seconds per unit and micro-batch.

    Args:
        bandwidth_gbyte_s, latency_us: the slowest hop of the tensor-parallel group's ring.
        lines: candidate ``(fixed_s, per_byte_s)`` lines of one call among the group (NCCL's,
            :func:`~hetpart.costmodel.collectives.allreduce_cost`; ``Simulator(tp_comm=...)``): each call
            takes the fastest for its bytes; without them, one ring on ``bandwidth_gbyte_s`` and ``latency_us``.
        selective: :data:`SELECTIVE_SCOPES`; a recomputed attention sublayer (``sublayer``) runs its output
            projection's all-reduce again in the backward (one of a block's two forward calls).
    """
    if tp <= 1:
        return np.zeros(model.num_units), np.zeros(model.num_units)
    u = _unit_arrays(model, recompute)
    if lines:
        calls = np.maximum(u["calls"], 1)
        per_call = u["tp_bytes"] * micro_batch / calls
        best = np.min([fixed + per_byte * per_call for fixed, per_byte in lines], axis=0)
        one = np.where(u["shardable"] & (u["tp_bytes"] > 0), calls * best, 0.0)
        return one, one * _tp_backward_factor(model, recompute, selective, u)
    steps = 2 * (tp - 1)
    # each of ``calls`` all-reduces moves ``bytes / calls``: a ring all-reduce per call (ring_allreduce_time_s)
    one = np.where(u["shardable"] & (u["tp_bytes"] > 0),
                   u["calls"] * steps * latency_us * 1e-6
                   + steps / tp * u["tp_bytes"] * micro_batch / (bandwidth_gbyte_s * 1e9), 0.0)
    return one, one * _tp_backward_factor(model, recompute, selective, u)


def _tp_backward_factor(model: ModelGraph, recompute: str, selective: str, u: dict) -> "float | np.ndarray":
    """The backward's tensor-parallel calls over the forward's, per unit: the same, twice under full
    recomputation, and for blocks ``1 + 1 / calls`` when selective recomputation re-runs the attention
    sublayer (its output projection's all-reduce)."""
    if recompute == "full":
        return 2.0
    if recompute == "selective" and selective == "sublayer":
        blocks = np.array([un.kind == "block" for un in model.units])
        return np.where(blocks, 1.0 + 1.0 / np.maximum(u["calls"], 1.0), 1.0)
    return 1.0


def stage_compute_s(model: ModelGraph, first: int, last: int, gpu: GPUSpec, tp: int, micro_batch: int,
                    precision: str = "bf16", recompute: str = "none", attention: str = "fused",
                    dispatch: str = "overlap") -> tuple[float, float]:
    """``(fwd_s, bwd_s)`` of units ``[first, last)`` for one micro-batch (bwd includes recompute).

    For many stages of one model, call :func:`unit_compute_s` once and prefix-sum instead.
    """
    fwd, bwd = unit_compute_s(model, gpu, tp, micro_batch, precision, recompute, attention=attention,
                              dispatch=dispatch)
    return float(fwd[first:last].sum()), float(bwd[first:last].sum())


def stage_tp_comm_s(model: ModelGraph, first: int, last: int, tp: int, micro_batch: int, recompute: str,
                    bandwidth_gbyte_s: float, latency_us: float) -> tuple[float, float]:
    """``(fwd_s, bwd_s)`` tensor-parallel communication of units ``[first, last)`` for one micro-batch."""
    fwd, bwd = unit_tp_comm_s(model, tp, micro_batch, recompute, bandwidth_gbyte_s, latency_us)
    return float(fwd[first:last].sum()), float(bwd[first:last].sum())
