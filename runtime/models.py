"""Models that run: real torch modules split into the sequential units of hetpart's unit graph.

A transformer becomes ``embedding, block_0 .. block_{L-1}, head`` (the head returns logits; the
loss is applied by the engine), exactly the units a plan's ``layers`` ranges index. Three sources:

* ``transformers`` GPT-2 (``GPT2LMHeadModel``) and Llama (``LlamaForCausalLM``) built from a config
  on the meta device (no weights, no network), then materialised unit by unit. GPT-2's ``Conv1D``
  projections are re-expressed as ``nn.Linear`` with q, k and v apart (its fused q/k/v matrix, cut
  column-wise, would mix q, k and v across ranks), so that torch's tensor-parallel styles apply;
* hetpart's own small GPT implementation (:class:`GPTBlock` ...), with separate q/k/v projections; it
  stands in for the OPT and BERT families and the other GPT lineages (``family`` ``gpt``: GPT-NeoX, Falcon,
  Phi, StarCoder2, BLOOM, MPT), which are run as pre-LN causal GPTs of the same shape; where their positions
  are rotary or ALiBi the runner adds none (the rotation's elementwise cost and the bias are left out of the
  run; causal attention still orders the tokens);
* ``python:MODULE:FUNCTION``: a function returning ``(module, example_inputs)`` whose top-level
  children, run one after the other, compute the module (checked on the example input, in eval mode).
  Its dropout modules (``nn.Dropout*``, ``nn.MultiheadAttention``'s rate) run at rate 0, as every runner
  trains without dropout; a functional ``F.dropout`` in its own ``forward`` is not reached
  (``--check-gradients`` then reports the run against the reference as different).

Weights are initialised per parameter from ``(seed, canonical name)``, so any process that builds any
subset of units gets the same numbers as the single-process reference.
"""

from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Literal

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from hetpart.errors import ModelError
from hetpart.graph.load import resolve_transformer
from hetpart.graph.scales import SCALES, Scale, scale_of
from hetpart.graph.transformer import TransformerConfig

__all__ = [
    "Scale", "SCALES", "scaled_config", "scaled_seq_len", "RunnableSpec", "runnable_spec", "ParamInfo",
    "UnitInfo", "UnitModel", "build_units", "unit_infos", "synthetic_batch", "GPTBlock",
]

Impl = Literal["transformers", "hetpart"]
_INIT_STD = 0.02


# ----------------------------------------------------------------------------------- shrinking
# Scale, SCALES and the scale of a name or hidden size live torch-free in hetpart.graph.scales (the CLI checks
# a sequence length against them before importing torch); they stay importable from here.
_scale_of = scale_of


def scaled_config(config: TransformerConfig, scale: str | int = "tiny", heads_multiple_of: int = 1) -> TransformerConfig:
    """The same family and number of units with a small hidden size, head count and vocabulary.

    What makes a family itself stays: the ratios of grouped-query heads, MLP width and vocabulary to the width
    (so the head weighs as many blocks as in the full model, and llama3-8b's 128,256 tokens do not shrink to
    mistral-7b's 32,000's size), the query width where heads are wider than ``hidden / heads`` (Gemma, Qwen3),
    and every flag (tied embeddings, norm, activation, biases, positions, sliding windows, head task). A
    window stays as long as it was: the shrunken run's sequences are shorter than any published window.

    Args:
        config: the full-size shape.
        scale: ``"tiny"``, ``"small"`` or an explicit hidden size.
        heads_multiple_of: the head count (and key/value head count) is raised to a multiple of this,
            so that a plan's tensor-parallel degrees still divide them.

    Example:
        >>> from hetpart.catalog.models import MODEL_CATALOG
        >>> c = scaled_config(MODEL_CATALOG["llama2-70b"], "tiny", heads_multiple_of=2)
        >>> (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.vocab_size)
        (80, 64, 4, 2, 256)
    """
    s = _scale_of(scale)
    m = max(1, heads_multiple_of)
    heads = -(-s.num_heads // m) * m
    hidden = -(-s.hidden_size // heads) * heads
    group = max(1, config.num_heads // config.kv_heads)
    kv = max(m, heads // group)
    while heads % kv:
        kv += m
    ffn_ratio = config.ffn / config.hidden_size
    ffn = max(m, int(round(hidden * ffn_ratio / (2 * m))) * 2 * m)
    return replace(
        config, hidden_size=hidden, num_heads=heads, num_kv_heads=kv if config.num_kv_heads else 0,
        ffn_hidden_size=ffn, vocab_size=_scaled_vocab(config, hidden, s.vocab_size),
        max_positions=max(s.seq_len, 8), embed_dim=0, position_offset=0,
        head_size=_scaled_head_size(config, hidden, heads), published_params=0.0,
    )


def _scaled_vocab(config: TransformerConfig, hidden: int, cap: int) -> int:
    """The vocabulary at the full model's vocabulary / width ratio, in whole tiles of 64 rows (at least one)."""
    rows = config.vocab_size * hidden / config.hidden_size
    return min(config.vocab_size, cap, max(64, -(-int(round(rows)) // 64) * 64))


def _scaled_head_size(config: TransformerConfig, hidden: int, heads: int) -> int:
    """Heads as much wider than ``hidden / heads`` as the full model's (0: not apart), an even width (rotary)."""
    if not config.head_size:
        return 0
    width = max(2, 2 * int(round(config.q_dim / config.hidden_size * hidden / heads / 2)))
    return 0 if width * heads == hidden else width


def scaled_seq_len(seq_len: int, scale: str | int = "tiny") -> int:
    """The sequence length a shrunken run uses for a plan of ``seq_len`` tokens."""
    return max(1, min(seq_len, _scale_of(scale).seq_len))


# ----------------------------------------------------------------------------------- the spec
@dataclass(frozen=True)
class RunnableSpec:
    """What model a runtime process builds: plain data, JSON-ready for the launcher's job file."""

    name: str
    """Model name (catalog name or config path), for reports."""
    config: TransformerConfig | None = None
    """Transformer shape (None for ``python:`` models)."""
    python_spec: str = ""
    """``python:MODULE:FUNCTION`` for user models ("" for transformers)."""
    impl: Impl = "transformers"
    """Which implementation runs a transformer: the ``transformers`` library or hetpart's own."""
    seed: int = 0
    """Seed of the deterministic per-parameter initialisation."""
    scaled_from: str = ""
    """Scale used to shrink the model ("" when it runs at full size)."""

    def __post_init__(self) -> None:
        if (self.config is None) == (not self.python_spec):
            raise ModelError("runnable model: give exactly one of a transformer config or a python: spec")
        if self.impl not in ("transformers", "hetpart"):
            raise ModelError(f"runnable model: impl {self.impl!r}; use transformers or hetpart")

    @property
    def num_units(self) -> int:
        if self.config is not None:
            return self.config.num_layers + 2
        return _python_num_units(self.python_spec)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "config": self.config.to_dict() if self.config else None,
                "python_spec": self.python_spec, "impl": self.impl, "seed": self.seed, "scaled_from": self.scaled_from}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunnableSpec":
        cfg = data.get("config")
        return cls(name=data["name"], config=TransformerConfig(**cfg) if cfg else None,
                   python_spec=data.get("python_spec", ""), impl=data.get("impl", "transformers"),
                   seed=int(data.get("seed", 0)), scaled_from=data.get("scaled_from", ""))


def runnable_spec(model: str, scale: str | int | None = None, *, max_tp: int = 1,
                  impl: Impl | Literal["auto"] = "auto", seed: int = 0) -> RunnableSpec:
    """Resolve ``--model`` (catalog name, config.json, ``python:``) into what a process builds.

    ``impl="auto"`` runs GPT-2 and Llama with ``transformers`` and OPT/BERT shapes with hetpart's GPT.
    """
    if model.startswith("python:"):
        _python_children(model)  # fail early with a clear message
        return RunnableSpec(name=model, python_spec=model, seed=seed)
    resolved = resolve_transformer(model)
    assert resolved is not None
    name, cfg, _ = resolved
    if getattr(cfg, "head_task", "lm") != "lm":  # the planner prices it; the runners build a language-model head
        raise ModelError(f"--model: {name} has a {cfg.head_task.replace('_', '-')} head ({cfg.num_labels} label{'s' if cfg.num_labels != 1 else ''}), "
                         "which hetpart run does not build (its runners train a language-model head); plan and "
                         "predict it, or run the causal-LM config of the same model")
    if scale is not None:
        cfg = scaled_config(cfg, scale, heads_multiple_of=max_tp)
    # Every runner trains without dropout (ranks must agree with the reference bit for bit); the
    # config says so, so that the unit graph built from it counts no dropout masks.
    cfg = replace(cfg, dropout=False)
    if impl == "auto":
        impl = "transformers" if cfg.family in ("gpt2", "llama") else "hetpart"
    if impl == "transformers" and cfg.family not in ("gpt2", "llama"):
        raise ModelError(f"--model: {name} ({cfg.family}) has no transformers runner here; use impl 'hetpart'")
    if impl == "hetpart" and (cfg.activation == "swiglu" or cfg.norm == "rmsnorm"):
        raise ModelError(f"--model: {name} ({cfg.family}: SwiGLU, RMSNorm) is not a GPT shape; "
                         "run it with impl 'transformers'")
    return RunnableSpec(name=name, config=cfg, impl=impl, seed=seed, scaled_from=str(scale or ""))


# ----------------------------------------------------------------------------------- unit modules
@dataclass(frozen=True)
class ParamInfo:
    """One parameter of a unit, as every process can know it without building the unit."""

    key: str
    """Canonical name (``"block_3.attn.q.weight"``); a tied copy carries its owner's key."""
    shape: tuple[int, ...]
    """Full (unsharded) shape."""
    tp_dim: int | None
    """Dimension split by tensor parallelism, or None when replicated across the TP group."""


@dataclass(frozen=True)
class UnitInfo:
    """A unit's parameters and how tensor parallelism treats them."""

    index: int
    name: str
    params: tuple[ParamInfo, ...]
    tp_plan: dict[str, str] = field(default_factory=dict)
    """Submodule path -> style, for ``torch.distributed.tensor.parallel`` (empty: not shardable):
    ``colwise`` and ``rowwise`` linears, and ``input`` (``input:<kwarg>`` when the input is passed by
    name) on a module whose replicated input feeds several column-parallel linears: the input becomes
    one replicated DTensor there, so their input gradients are summed locally and all-reduced once
    (Megatron's fused QKV: one all-reduce for attention's backward, one for the MLP's)."""


class UnitModel(nn.Module):
    """One unit: ``forward(x) -> y``; ``tied`` maps local parameter names to their owner's key."""

    def __init__(self, name: str, body: nn.Module, run: Callable[[nn.Module, torch.Tensor], torch.Tensor],
                 tp_plan: dict[str, str] | None = None, tied: dict[str, str] | None = None,
                 attention: str = "", after_tp: Callable[[nn.Module, int], None] | None = None):
        super().__init__()
        self.unit_name = name
        self.body = body
        self._run = run
        self.tp_plan = dict(tp_plan or {})
        self.tied = dict(tied or {})
        self.attention = attention
        """Path of the attention sublayer inside ``body`` ("" when the unit has none)."""
        self._recompute_all = False
        self._after_tp = after_tp

    def tensor_parallel_applied(self, tp: int) -> None:
        """Tell the unit that ``tp_plan`` was applied over ``tp`` ranks (it may adjust local widths)."""
        if self._after_tp is not None:
            self._after_tp(self.body, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._recompute_all and torch.is_grad_enabled():
            return checkpoint(self._run, self.body, x, use_reentrant=False)
        return self._run(self.body, x)

    def set_recompute(self, mode: str) -> None:
        """Activation recomputation: ``full`` re-runs the whole unit in the backward, ``selective``
        its attention sublayer (projections included: coarser than Korthikanti's attention core),
        ``none`` keeps every activation. Units without attention recompute nothing."""
        if not self.attention or mode == "none":
            return
        if mode == "full":
            self._recompute_all = True
            return
        attn = self.body.get_submodule(self.attention)
        plain = attn.forward

        def recomputed(*args, **kwargs):
            if not torch.is_grad_enabled():
                return plain(*args, **kwargs)
            return checkpoint(plain, *args, use_reentrant=False, **kwargs)

        attn.forward = recomputed

    def canonical_names(self) -> dict[str, str]:
        """Local parameter name -> canonical key."""
        out = {}
        for n, _ in self.named_parameters(remove_duplicate=False):
            short = n.removeprefix("body.")
            out[n] = self.tied.get(short, f"{self.unit_name}.{short}")
        return out


def _first(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, (tuple, list)) else out


# -- hetpart's own GPT ------------------------------------------------------------------------
class _Attention(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        h, q, kv = cfg.hidden_size, cfg.q_dim, cfg.kv_dim
        self.head_dim = cfg.head_dim
        self.q = nn.Linear(h, q, bias=cfg.bias)
        self.k = nn.Linear(h, kv, bias=cfg.bias)
        self.v = nn.Linear(h, kv, bias=cfg.bias)
        self.o = nn.Linear(q, h, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds a slice of the heads.
        q = self.q(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=k.shape[1] != q.shape[1])
        return self.o(y.transpose(1, 2).reshape(b, s, -1))


class _MLP(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.hidden_size, cfg.ffn, bias=cfg.bias)
        self.proj = nn.Linear(cfg.ffn, cfg.hidden_size, bias=cfg.bias)
        self.act = nn.ReLU() if cfg.activation == "relu" else nn.GELU(approximate="tanh")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.act(self.fc(x)))


class GPTBlock(nn.Module):
    """A pre-LayerNorm GPT block (GPT-2 math with separate q/k/v projections)."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.hidden_size)
        self.attn = _Attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.hidden_size)
        self.mlp = _MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


_HETPART_TP = {"attn": "input", "attn.q": "colwise", "attn.k": "colwise", "attn.v": "colwise", "attn.o": "rowwise",
               "mlp.fc": "colwise", "mlp.proj": "rowwise"}
_LLAMA_TP = {"self_attn": "input:hidden_states", "self_attn.q_proj": "colwise", "self_attn.k_proj": "colwise",
             "self_attn.v_proj": "colwise", "self_attn.o_proj": "rowwise", "mlp": "input", "mlp.gate_proj": "colwise",
             "mlp.up_proj": "colwise", "mlp.down_proj": "rowwise"}


def _positions(x: torch.Tensor) -> torch.Tensor:
    return torch.arange(x.shape[1], device=x.device)


def _hetpart_unit(cfg: TransformerConfig, index: int) -> UnitModel:
    last = cfg.num_layers + 1
    if index == 0:
        if not cfg.learned_positions:  # rotary or ALiBi: applied inside attention, not run here (module docstring)
            return UnitModel("embedding", nn.ModuleDict({"wte": nn.Embedding(cfg.vocab_size, cfg.hidden_size)}),
                             lambda m, x: m["wte"](x))
        body = nn.ModuleDict({"wte": nn.Embedding(cfg.vocab_size, cfg.hidden_size),
                              "wpe": nn.Embedding(cfg.max_positions, cfg.hidden_size)})
        return UnitModel("embedding", body, lambda m, x: m["wte"](x) + m["wpe"](_positions(x)))
    if index == last:
        norm = nn.LayerNorm(cfg.hidden_size) if cfg.final_norm else nn.Identity()
        body = nn.ModuleDict({"ln_f": norm, "lm_head": nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)})
        tied = {"lm_head.weight": "embedding.wte.weight"} if cfg.tied_embeddings else {}
        return UnitModel("head", body, lambda m, x: m["lm_head"](m["ln_f"](x)), tied=tied)
    return UnitModel(f"block_{index - 1}", GPTBlock(cfg), lambda m, x: m(x), tp_plan=_HETPART_TP, attention="attn")


# -- transformers GPT-2 and Llama -------------------------------------------------------------
def _hf_model(cfg: TransformerConfig) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # token ids of the full vocabulary outside a shrunken one
    if cfg.family == "gpt2":
        hf = GPT2Config(n_embd=cfg.hidden_size, n_layer=cfg.num_layers, n_head=cfg.num_heads,
                        n_inner=cfg.ffn, vocab_size=cfg.vocab_size, n_positions=cfg.max_positions,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
                        tie_word_embeddings=cfg.tied_embeddings)
        cls = GPT2LMHeadModel
    else:
        hf = LlamaConfig(hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
                         num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.kv_heads,
                         intermediate_size=cfg.ffn, vocab_size=cfg.vocab_size,
                         max_position_embeddings=cfg.max_positions, tie_word_embeddings=cfg.tied_embeddings,
                         head_dim=cfg.head_dim,
                         bos_token_id=0, eos_token_id=0, pad_token_id=None)
        cls = LlamaForCausalLM
    # sdpa with no mask runs causal attention (is_causal), which is what a bare block needs.
    hf._attn_implementation = "sdpa"
    with torch.device("meta"):
        return cls(hf)


def _gpt2_unit(hf: nn.Module, cfg: TransformerConfig, index: int) -> UnitModel:
    t = hf.transformer
    if index == 0:
        body = nn.ModuleDict({"wte": t.wte, "wpe": t.wpe})
        return UnitModel("embedding", body, lambda m, x: m["wte"](x) + m["wpe"](_positions(x)))
    if index == cfg.num_layers + 1:
        lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, device="meta")  # untie: own copy
        body = nn.ModuleDict({"ln_f": t.ln_f, "lm_head": lm_head})
        tied = {"lm_head.weight": "embedding.wte.weight"} if cfg.tied_embeddings else {}
        return UnitModel("head", body, lambda m, x: m["lm_head"](m["ln_f"](x)), tied=tied)
    block = _linear_gpt2_block(t.h[index - 1], cfg)
    return UnitModel(f"block_{index - 1}", block, lambda m, x: _first(m(x)), tp_plan=_GPT2_TP, attention="attn",
                     after_tp=_gpt2_after_tp)


class _QKV(nn.Module):
    """GPT-2's fused ``c_attn`` as three linears: ``[q | k | v]`` out, so column-parallel q, k and v
    give each rank ``[q_t | k_t | v_t]`` of its own heads (sharding the fused matrix would not)."""

    def __init__(self, hidden: int):
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(hidden, hidden) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.q(x), self.k(x), self.v(x)], dim=-1)


def _linear_gpt2_block(block: nn.Module, cfg: TransformerConfig) -> nn.Module:
    """Re-express a transformers GPT-2 block's ``Conv1D`` projections (``x @ W + b``) as ``nn.Linear``
    (``x @ A.T + b``, ``A = W.T``) so that torch's tensor-parallel styles apply; the block's own
    forward (layer norms, attention, activation, residuals) is unchanged."""
    h, f = cfg.hidden_size, cfg.ffn
    with torch.device("meta"):
        block.attn.c_attn = _QKV(h)
        block.attn.c_proj = nn.Linear(h, h)
        block.mlp.c_fc = nn.Linear(h, f)
        block.mlp.c_proj = nn.Linear(f, h)
    return block


def _gpt2_after_tp(block: nn.Module, tp: int) -> None:
    block.attn.split_size = block.attn.embed_dim // tp  # the local width of q, k and v


_GPT2_TP = {"attn.c_attn": "input", "attn.c_attn.q": "colwise", "attn.c_attn.k": "colwise", "attn.c_attn.v": "colwise",
            "attn.c_proj": "rowwise", "mlp.c_fc": "colwise", "mlp.c_proj": "rowwise"}


class _LlamaBlock(nn.Module):
    def __init__(self, layer: nn.Module, config: Any):
        super().__init__()
        self.layer = layer
        self._config = config
        self._rotary: list[nn.Module] = []  # a list, so the parameterless rotary table is no submodule

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self._rotary or self._rotary[0].inv_freq.device != x.device:
            from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

            with torch.device("cpu"):
                self._rotary[:] = [LlamaRotaryEmbedding(self._config).to(x.device)]
        pos = _positions(x).unsqueeze(0)
        return _first(self.layer(x, position_ids=pos, position_embeddings=self._rotary[0](x, pos)))


def _llama_unit(hf: nn.Module, cfg: TransformerConfig, index: int) -> UnitModel:
    m = hf.model
    if index == 0:
        return UnitModel("embedding", nn.ModuleDict({"embed_tokens": m.embed_tokens}),
                         lambda b, x: b["embed_tokens"](x))
    if index == cfg.num_layers + 1:
        lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, device="meta")
        body = nn.ModuleDict({"norm": m.norm, "lm_head": lm_head})
        tied = {"lm_head.weight": "embedding.embed_tokens.weight"} if cfg.tied_embeddings else {}
        return UnitModel("head", body, lambda b, x: b["lm_head"](b["norm"](x)), tied=tied)
    tp = {f"layer.{k}": v for k, v in _LLAMA_TP.items()}
    return UnitModel(f"block_{index - 1}", _LlamaBlock(m.layers[index - 1], hf.config), lambda b, x: b(x), tp_plan=tp,
                     attention="layer.self_attn")


# -- python: models ----------------------------------------------------------------------------
def _python_children(spec: str) -> tuple[list[tuple[str, nn.Module]], Any]:
    """``[(unit name, module)]`` of a ``python:`` model, split as hetpart.graph.trace splits it:
    around a top-level list of repeated blocks (``embedding``, ``block_i``, ``head``), else into the
    top-level children; checked to reproduce the module's output on its example input."""
    from hetpart.graph.user_module import import_python_module, split_python_spec

    _, func_name = split_python_spec(spec)
    try:
        func = getattr(import_python_module(spec), func_name)
        # Seeded, so that every rank and the reference draw the same example (its token range sets the data).
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            module, example = func()
    except ModelError:  # not found, or its name taken: already one clear line
        raise
    except Exception as exc:  # user code: any failure becomes one clear line
        raise ModelError(f"--model: {spec}: calling the model function failed: {exc.__class__.__name__}: {exc}") from None
    if not isinstance(module, nn.Module):
        raise ModelError(f"--model: {spec}: the function must return (torch.nn.Module, example_inputs)")
    if any(t.is_meta for t in [*module.parameters(), *module.buffers()]):
        module.to_empty(device="cpu")
    example = _real(example)
    units = _split_top_level(module)
    if not units:
        raise ModelError(f"--model: {spec}: the module has no child modules to split into units")
    _check_sequential(spec, module, units, example)
    _without_dropout(module)
    return units, example


_DROPOUTS = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)


def _without_dropout(module: nn.Module) -> None:
    """Rate 0 for ``module``'s dropout: every runner trains without it, since the ranks' masks could never
    match the single-process reference's (the transformer runners' configs say ``dropout=False``)."""
    for m in module.modules():
        if isinstance(m, _DROPOUTS):
            m.p = 0.0
        elif isinstance(m, nn.MultiheadAttention):
            m.dropout = 0.0


def _real(example: Any) -> Any:
    """Example inputs with meta tensors replaced by CPU ones (zeros: token id 0, or 0.0)."""
    if isinstance(example, tuple):
        return tuple(_real(e) for e in example)
    if isinstance(example, torch.Tensor) and example.is_meta:
        return torch.zeros(example.shape, dtype=example.dtype)
    return example


@functools.lru_cache(maxsize=16)
def _python_num_units(spec: str) -> int:
    return len(_python_children(spec)[0])


def _split_top_level(module: nn.Module) -> list[tuple[str, nn.Module]]:
    children = list(module.named_children())
    lists = [(n, c) for n, c in children if isinstance(c, (nn.ModuleList, nn.Sequential)) and len(c) >= 2
             and len({type(b) for b in c}) == 1]
    if not lists:
        return children
    name, blocks = max(lists, key=lambda nc: sum(p.numel() for p in nc[1].parameters()))
    at = [n for n, _ in children].index(name)
    before = [c for _, c in children[:at]]
    after = [c for _, c in children[at + 1:]]
    units = [("embedding", nn.Sequential(*before))] if before else []
    units += [(f"block_{i}", b) for i, b in enumerate(blocks)]
    return units + ([("head", nn.Sequential(*after))] if after else [])


def _check_sequential(spec: str, module: nn.Module, units: list[tuple[str, nn.Module]], example: Any) -> None:
    args = example if isinstance(example, tuple) else (example,)
    gen = torch.Generator().manual_seed(0)
    # Random floats, so that a skipped residual or a reordered child shows (zeros can hide both).
    args = tuple(torch.randn(a.shape, generator=gen, dtype=a.dtype)
                 if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
    # In eval mode: dropout would draw different masks in the two passes and refuse any module that has it
    # (nn.TransformerEncoderLayer does by default); each submodule's own mode is restored afterwards.
    modes = {m: m.training for m in module.modules()}
    module.eval()
    try:
        with torch.no_grad():
            for key, p in module.named_parameters():
                p.copy_(_init_value(key, p.shape, 0))
            full = module(*args)
            x = args[0] if len(args) == 1 else args
            for _, unit in units:
                x = unit(x)
    finally:
        for m, training in modes.items():
            m.training = training
    if not isinstance(full, torch.Tensor) or not isinstance(x, torch.Tensor) or not torch.allclose(full, x):
        raise ModelError(f"--model: {spec}: running its units one after the other does not give the module's "
                         "output; return a module whose top-level children (or blocks) form a sequence")


# ----------------------------------------------------------------------------------- building
def build_units(spec: RunnableSpec, indices: list[int] | range, device: torch.device | str = "cpu",
                dtype: torch.dtype = torch.float32) -> list[UnitModel]:
    """The unit modules ``indices`` of ``spec``, initialised deterministically on ``device``."""
    n = spec.num_units
    bad = [i for i in indices if not 0 <= i < n]
    if bad:
        raise ModelError(f"runtime: units {bad} do not exist; {spec.name} has {n} units")
    units = _meta_units(spec, list(indices))
    for unit in units:
        _materialise(unit, spec.seed, torch.device(device), dtype)
    return units


def _meta_units(spec: RunnableSpec, indices: list[int]) -> list[UnitModel]:
    cfg = spec.config
    if cfg is None:
        children, _ = _python_children(spec.python_spec)
        return [UnitModel(children[i][0], children[i][1], lambda m, x: m(x)) for i in indices]
    if spec.impl == "hetpart":
        with torch.device("meta"):
            return [_hetpart_unit(cfg, i) for i in indices]
    hf = _hf_model(cfg)
    make = _gpt2_unit if cfg.family == "gpt2" else _llama_unit
    return [make(hf, cfg, i) for i in indices]


def _materialise(unit: UnitModel, seed: int, device: torch.device, dtype: torch.dtype) -> None:
    if any(t.is_meta for t in [*unit.parameters(), *unit.buffers()]):
        unit.to_empty(device=device)
    else:
        unit.to(device)
    names = unit.canonical_names()
    with torch.no_grad():
        for local, p in unit.named_parameters():
            p.copy_(_init_value(names[local], p.shape, seed).to(device))
    unit.to(dtype)


def _init_value(key: str, shape: torch.Size, seed: int) -> torch.Tensor:
    """GPT-2 style values: norms 1, biases 0, matrices N(0, 0.02), from (seed, key) alone."""
    leaf = key.rsplit(".", 1)[-1]
    if len(shape) == 1:
        parent = key.rsplit(".", 2)[-2] if key.count(".") >= 1 else ""
        is_norm = leaf == "weight" and any(s in parent for s in ("ln", "norm"))
        return torch.ones(shape) if is_norm else torch.zeros(shape)
    gen = torch.Generator().manual_seed((zlib.crc32(key.encode()) + 1_000_003 * seed) % (2**63))
    return torch.randn(shape, generator=gen) * _INIT_STD


def unit_infos(spec: RunnableSpec) -> list[UnitInfo]:
    """Every unit's parameters (canonical keys, full shapes, TP split), built on the meta device."""
    out = []
    for i, unit in enumerate(_meta_units(spec, list(range(spec.num_units)))):
        names = unit.canonical_names()
        params = tuple(ParamInfo(names[n], tuple(p.shape), _tp_dim(n, unit.tp_plan))
                       for n, p in unit.named_parameters())
        out.append(UnitInfo(i, unit.unit_name, params, dict(unit.tp_plan)))
    return out


def _tp_dim(local: str, tp_plan: dict[str, str]) -> int | None:
    module, _, leaf = local.removeprefix("body.").rpartition(".")
    style = tp_plan.get(module)
    if style == "colwise":
        return 0
    if style == "rowwise":
        return 1 if leaf == "weight" else None
    return None


# ----------------------------------------------------------------------------------- data
def synthetic_batch(spec: RunnableSpec, global_batch: int, seq_len: int, step: int = 0
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """A deterministic, learnable global batch ``(inputs, targets)`` for training step ``step``.

    Transformers get token sequences ``start, start+k, start+2k, ...`` (mod vocabulary) with a stride
    ``k`` in 1..3, and the next tokens as targets: a pattern a model learns within a few steps.

    Shapes:
        inputs, targets: ``[global_batch, seq_len]`` (int64) for transformers; for ``python:`` models
        inputs repeat the example's per-sample shape and targets are zeros of the output's shape.
    """
    gen = torch.Generator().manual_seed(1_000_003 * spec.seed + step)
    if spec.config is not None:
        vocab = spec.config.vocab_size
        start = torch.randint(0, vocab, (global_batch, 1), generator=gen)
        stride = torch.randint(1, 4, (global_batch, 1), generator=gen)
        seq = (start + stride * torch.arange(seq_len + 1)) % vocab
        return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()
    return _python_batch(spec, global_batch, gen)


def _python_batch(spec: RunnableSpec, global_batch: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    shape, dtype, high, out_shape, out_dtype = _python_io(spec.python_spec)
    if high:
        inputs = torch.randint(0, high, (global_batch, *shape), generator=gen, dtype=dtype)
    else:
        inputs = torch.randn((global_batch, *shape), generator=gen, dtype=dtype)
    return inputs, torch.zeros((global_batch, *out_shape), dtype=out_dtype)


@functools.lru_cache(maxsize=16)
def _python_io(spec: str) -> tuple[tuple[int, ...], torch.dtype, int, tuple[int, ...], torch.dtype]:
    """Per-sample input shape, dtype, token range (0 for floats) and output shape/dtype, computed once."""
    children, example = _python_children(spec)
    x = example[0] if isinstance(example, tuple) else example
    sample = x[:1]
    high = 0
    if not sample.is_floating_point():
        high = max(2, int(x.max()) + 1 if x.numel() else 2)
    with torch.no_grad():
        out = nn.Sequential(*(m for _, m in children))(sample)
    return tuple(sample.shape[1:]), sample.dtype, high, tuple(out.shape[1:]), out.dtype
