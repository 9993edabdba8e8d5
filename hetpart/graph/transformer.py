"""Analytic costs of decoder (GPT-2, GPT-3, OPT, Llama) and encoder (BERT) transformers.

Units are ``embedding, block_0 .. block_{L-1}, head``. FLOPs count matrix products (2 per
multiply-add) as Narayanan et al. (2021) do, so a layer's forward is ``24 s h^2 + 4 s^2 h`` for
GPT shapes. Saved activations follow Korthikanti et al. (2022), "Reducing Activation
Recomputation in Large Transformer Models", generalised to grouped-query attention and SwiGLU:
``34 s h + 5 a s^2`` bytes per layer and sequence for a 16-bit GPT layer without recomputation,
the ``s^2`` term dropped by selective recomputation, ``2 s h`` with full recomputation.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

from hetpart.graph.model_graph import ModelGraph, Unit

__all__ = ["TransformerConfig", "transformer_graph", "causal_keys", "NOT_ARCHITECTURE"]

NOT_ARCHITECTURE = ("max_positions", "published_params")
"""Fields of a :class:`TransformerConfig` that do not make it another network (:meth:`TransformerConfig.
architecture`): the longest sequence it was trained for (a learned position table's rows; the planned
sequence is the workload's) and the parameter count a paper cites."""

_INDEX_BYTES = 8
"""Bytes of an int64 index (token id, loss target) that backward keeps."""


@dataclass(frozen=True)
class TransformerConfig:
    """Shape of a transformer, in Hugging Face terms."""

    family: Literal["gpt2", "llama", "opt", "bert", "gpt"]
    """gpt: a pre-LayerNorm GPT of another lineage (GPT-NeoX, Falcon, Phi, StarCoder2, BLOOM, MPT, ...), its
    positions rotary or ALiBi unless ``learned_positions``."""
    num_layers: int
    hidden_size: int
    num_heads: int
    vocab_size: int
    max_positions: int
    ffn_hidden_size: int = 0
    """Inner MLP width; 0 means 4 * hidden_size."""
    num_kv_heads: int = 0
    """Key/value heads (grouped-query attention); 0 means num_heads."""
    tied_embeddings: bool = True
    activation: Literal["gelu", "relu", "swiglu"] = "gelu"
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    bias: bool = True
    learned_positions: bool = True
    dropout: bool = True
    """Whether dropout masks are kept for backward (GPT-2/GPT-3/OPT/BERT train with dropout)."""
    embed_dim: int = 0
    """Width of the token embedding when it differs from hidden_size (OPT-350m: 512); 0 = same."""
    position_offset: int = 0
    """Extra learned position rows (OPT keeps 2)."""
    final_norm: bool = True
    head_size: int = 0
    """Width of one attention head where it is not hidden_size / num_heads (Gemma, Qwen3, Mistral Nemo set
    ``head_dim`` apart); 0 = hidden_size / num_heads. The queries and the attention output are then
    ``num_heads * head_size`` wide (:attr:`q_dim`)."""
    published_params: float = 0.0
    """Published parameter count, for the catalog test (0 when unknown)."""
    qkv_bias: bool = False
    """Whether the query, key and value projections have biases where ``bias`` is off (Qwen2; StableLM's
    ``use_qkv_bias``); with ``bias`` on every projection has them anyway."""
    gate_activation: Literal["silu", "gelu"] = "silu"
    """The gate of a gated MLP (``activation`` swiglu, the shape both share): silu for SwiGLU, gelu for
    GeGLU (Gemma). Costs are the same; engines name them apart."""
    sliding_windows: tuple[int, ...] = ()
    """Per layer, the causal sliding window of its attention in tokens, 0 for full attention (Mistral v0.1,
    StarCoder2, Gemma 2/3's local layers); empty: every layer attends in full. Query ``i`` of a window ``W``
    attends to ``min(i + 1, W)`` keys."""
    head_task: Literal["lm", "sequence_classification", "token_classification"] = "lm"
    """What the head computes: a language-model head over the vocabulary (causal or masked), or a
    ``num_labels``-wide classifier (``*ForSequenceClassification``: reward models score the last token;
    ``*ForTokenClassification``: every token)."""
    num_labels: int = 0
    """Outputs of a classification head (0 with a language-model head)."""
    token_types: int = 2
    """Rows of a BERT-style encoder's token-type (segment) embedding: BERT 2, RoBERTa and XLM-R 1, DistilBERT 0
    (``type_vocab_size``); other families have none."""
    unmodelled: tuple[str, ...] = ()
    """Parts of the architecture the config declares that hetpart prices and runs as something close but not the
    same (read from the config: a parallel attention + MLP block priced as the sequential one, logit soft-capping
    not applied); the model's load notes them and ``export`` lists them as what the engine is not told."""
    pretraining_head: bool = False
    """A BERT-style encoder's language-model head is the masked-LM head alone, as ``BertForMaskedLM``,
    ``RobertaForMaskedLM`` and ``XLMRobertaForMaskedLM`` build it (no pooler); True adds the pooler and the
    next-sentence classifier of ``BertForPreTraining`` (Devlin et al. 2019's MLM + NSP pretraining)."""

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "num_heads", "vocab_size", "max_positions"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
        windows = tuple(self.sliding_windows)  # a JSON round trip (run records) gives a list
        object.__setattr__(self, "sliding_windows", windows)
        object.__setattr__(self, "unmodelled", tuple(self.unmodelled))  # as the windows: a list after JSON
        if windows and (len(windows) != self.num_layers or any(
                isinstance(w, bool) or not isinstance(w, int) or w < 0 for w in windows)):
            raise ValueError(f"sliding_windows must give a window >= 0 (0: full) for each of the {self.num_layers} "
                             f"layers, got {len(windows)} entries")
        if (self.head_task == "lm") != (self.num_labels == 0):
            raise ValueError(f"num_labels {self.num_labels!r} with head_task {self.head_task!r}: a classification "
                             "head needs num_labels >= 1, a language-model head 0")
        if isinstance(self.head_size, bool) or not isinstance(self.head_size, int) or self.head_size < 0:
            raise ValueError(f"head_size must be a whole number >= 0, got {self.head_size!r}")
        if not self.head_size and self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
        if self.num_kv_heads and self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not divisible by num_kv_heads {self.num_kv_heads}")

    @property
    def ffn(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden_size // self.num_heads

    @property
    def q_dim(self) -> int:
        """Width of the queries and of the attention output (hidden_size unless ``head_size`` sets it apart)."""
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def emb(self) -> int:
        return self.embed_dim or self.hidden_size

    @property
    def head_outputs(self) -> int:
        """Columns of the output head: the vocabulary, or the labels of a classification head."""
        return self.vocab_size if self.head_task == "lm" else self.num_labels

    def window(self, layer: int) -> int:
        """The sliding window of ``layer``'s attention, 0 where it attends in full."""
        return self.sliding_windows[layer] if self.sliding_windows else 0

    def architecture(self) -> tuple:
        """What the network is, hashable: every field but :data:`NOT_ARCHITECTURE`, with the defaults that
        stand for another field resolved (``ffn_hidden_size`` 0 is ``4 * hidden_size``, ``num_kv_heads`` 0 is
        ``num_heads``, ...). Equal keys mean one model under two names: a held-out model is held out by this
        key, not by its name."""
        out = {k: v for k, v in asdict(self).items() if k not in NOT_ARCHITECTURE}
        out.update(ffn_hidden_size=self.ffn, num_kv_heads=self.kv_heads, head_size=self.head_dim,
                   embed_dim=self.emb, unmodelled=tuple(self.unmodelled))
        return tuple(sorted(out.items()))

    def to_dict(self) -> dict:
        out = asdict(self)
        if not out["unmodelled"]:  # the dict of a config without any, as records and fingerprints hold it
            del out["unmodelled"]
        return out


def _norm_params(cfg: TransformerConfig) -> int:
    return 2 * cfg.hidden_size if cfg.norm == "layernorm" else cfg.hidden_size


def _block_params(cfg: TransformerConfig) -> int:
    h, q, kv, f = cfg.hidden_size, cfg.q_dim, cfg.kv_dim, cfg.ffn
    attn = 2 * h * q + 2 * h * kv + (q + h + 2 * kv if cfg.bias else q + 2 * kv if cfg.qkv_bias else 0)
    if cfg.activation == "swiglu":
        mlp = 3 * h * f + (2 * f + h if cfg.bias else 0)
    else:
        mlp = 2 * h * f + (f + h if cfg.bias else 0)
    return attn + mlp + 2 * _norm_params(cfg)


def causal_keys(s: int, window: int = 0) -> int:
    """Keys the ``s`` queries of a causal attention attend to in all: ``sum_i min(i + 1, W)``, the full
    triangle ``s (s + 1) / 2`` without a window (``window`` 0) or one of ``s`` tokens or more."""
    if not window or window >= s:
        return s * (s + 1) // 2
    return window * (window + 1) // 2 + (s - window) * window


def _attention_core_flops(cfg: TransformerConfig, i: int, s: int) -> float:
    """QK^T and attention x V of layer ``i``, all heads: ``4 s^2 q`` (the full square, Narayanan et al.'s
    count) scaled by the share of the causal triangle a sliding window keeps (exactly 1 without one)."""
    full = 4 * s * s * cfg.q_dim
    window = cfg.window(i)
    if not window or window >= s:
        return float(full)
    return full * causal_keys(s, window) / causal_keys(s)


def _block_unit(cfg: TransformerConfig, i: int, s: int, p: int) -> Unit:
    """Layer ``i``. A sliding window cuts its attention FLOPs, not the saved ``a s^2`` scores of eager
    attention: eager kernels (Hugging Face, Megatron's unfused softmax) mask a full ``s x s`` matrix, and
    the kernels that skip the masked blocks are fused ones, which store no scores."""
    h, q, kv, f, a = cfg.hidden_size, cfg.q_dim, cfg.kv_dim, cfg.ffn, cfg.num_heads
    d = 1 if cfg.dropout else 0
    n_mlp = 3 if cfg.activation == "swiglu" else 2
    attn_core = _attention_core_flops(cfg, i, s)  # QK^T and attention x V, all heads
    fwd = 2 * s * h * (q + 2 * kv) + attn_core + 2 * s * q * h + 2 * s * h * f * n_mlp
    attn_linear = p * s * h + p * s * (q + kv) + p * s * kv + p * s * q + d * s * h  # input; q, k; v; output
    attn_quadratic = a * s * s * (p + d * (1 + p))  # softmax output (+ dropout mask and output)
    if cfg.activation == "swiglu":
        mlp = p * s * h + 4 * p * s * f  # input; gate, up, act(gate), product
    else:
        mlp = p * s * h + 2 * p * s * f + d * s * h  # input; fc1 output, activation output; mask
    norms = 2 * p * s * h
    none = attn_linear + attn_quadratic + mlp + norms
    return Unit(
        name=f"block_{i}", kind="block", fwd_flops=float(fwd), bwd_flops=float(2 * fwd),
        params=_block_params(cfg), out_act_bytes=float(p * s * h),
        act_bytes={"none": float(none), "selective": float(none - attn_quadratic), "full": float(p * s * h)},
        recompute_flops={"none": 0.0, "selective": float(attn_core), "full": float(fwd)},
        tp_comm_bytes_fwd=float(2 * p * s * h), width=h,
    )


def _embedding_unit(cfg: TransformerConfig, s: int, p: int) -> Unit:
    h, e = cfg.hidden_size, cfg.emb
    params = cfg.vocab_size * e
    if cfg.learned_positions:
        params += (cfg.max_positions + cfg.position_offset) * h
    flops = 0
    # The lookups' backward keeps their int64 indices: token ids (and BERT's token types) per sequence;
    # position ids are one vector shared by the whole micro-batch, negligible per sequence.
    saved = cfg.dropout * s * h + _INDEX_BYTES * s * (1 + (cfg.family == "bert" and cfg.token_types > 0))
    if e != h:
        params += e * h  # project_in
        flops = 2 * s * e * h
        saved += p * s * e
    if cfg.family == "bert":
        params += cfg.token_types * h + _norm_params(cfg)  # token types, embedding LayerNorm
        saved += p * s * h
    acts = {"none": float(saved), "selective": float(saved), "full": float(saved)}
    return Unit(name="embedding", kind="embedding", fwd_flops=float(flops), bwd_flops=float(2 * flops),
                params=params, out_act_bytes=float(p * s * h), act_bytes=acts,
                recompute_flops={"none": 0.0, "selective": 0.0, "full": 0.0},
                tp_comm_bytes_fwd=float(p * s * h), width=h)


def _classifier_head_unit(cfg: TransformerConfig, s: int, p: int) -> Unit:
    """A ``num_labels``-wide classifier (untied): on every token's final hidden state, as Hugging Face's
    ``*ForSequenceClassification`` computes it before it keeps the last token's logits (the loss is over
    those alone) and ``*ForTokenClassification`` for every token's loss. Sequence classifiers have no bias
    (BERT's has one, after its pooler), token classifiers have one."""
    h, e, n = cfg.hidden_size, cfg.emb, cfg.num_labels
    sequence = cfg.head_task == "sequence_classification"
    bert = cfg.family == "bert"
    params = (_norm_params(cfg) if cfg.final_norm else 0) + n * e + (n if bert or not sequence else 0)
    flops = 2 * s * e * n
    # norm input, classifier input, fp32 logits and int64 targets of the tokens the loss reads
    scored = 1 if sequence else s
    saved = p * s * h + p * s * e + 4 * scored * n + _INDEX_BYTES * scored
    if e != h:
        params += h * e  # project_out
        flops += 2 * s * h * e
        saved += p * s * h
    if bert and sequence:
        params += h * h + h  # pooler over the first token
        flops += 2 * h * h
    acts = {"none": float(saved), "selective": float(saved), "full": float(saved)}
    return Unit(name="head", kind="head", fwd_flops=float(flops), bwd_flops=float(2 * flops), params=params,
                out_act_bytes=4.0, act_bytes=acts, recompute_flops={"none": 0.0, "selective": 0.0, "full": 0.0},
                tp_comm_bytes_fwd=float(p * s * h), width=h)


def _head_unit(cfg: TransformerConfig, s: int, p: int) -> Unit:
    if cfg.head_task != "lm":
        return _classifier_head_unit(cfg, s, p)
    h, e, V = cfg.hidden_size, cfg.emb, cfg.vocab_size
    params = _norm_params(cfg) if cfg.final_norm else 0
    flops = 2 * s * e * V
    # norm input, lm-head input, fp32 log-probabilities and int64 targets of the loss
    saved = p * s * h + p * s * e + 4 * s * V + _INDEX_BYTES * s
    if e != h:
        params += h * e  # project_out
        flops += 2 * s * h * e
        saved += p * s * h
    if cfg.family == "bert":
        # The masked-LM head (BertForMaskedLM, RobertaForMaskedLM): transform dense, LayerNorm, decoder bias;
        # the decoder's weight is the tied embedding. BertModel's pooler is not in it (transformers builds the
        # MLM model with add_pooling_layer=False), so a BERT-style config counts what transformers' *ForMaskedLM
        # holds: bert-large-uncased 335,174,458. BertForPreTraining (pretraining_head) adds the pooler over the
        # first token and the 2-way next-sentence classifier: 336,226,108.
        params += h * h + h + _norm_params(cfg) + V
        flops += 2 * s * h * h
        saved += 2 * p * s * h
        if cfg.pretraining_head:
            params += h * h + h + 2 * h + 2
            flops += 2 * h * h + 2 * h * 2
            saved += p * h + p * h + 4 * 2 + _INDEX_BYTES  # pooler input, NSP input, fp32 logits, label
    shared = cfg.vocab_size * e if cfg.tied_embeddings else 0
    if not cfg.tied_embeddings:
        params += V * e
    acts = {"none": float(saved), "selective": float(saved), "full": float(saved)}
    return Unit(name="head", kind="head", fwd_flops=float(flops), bwd_flops=float(2 * flops), params=params,
                out_act_bytes=4.0, act_bytes=acts, recompute_flops={"none": 0.0, "selective": 0.0, "full": 0.0},
                tp_comm_bytes_fwd=float(p * s * h), shared_params=shared, width=h)


def transformer_graph(cfg: TransformerConfig, name: str, seq_len: int, dtype_bytes: int = 2,
                      source: str = "") -> ModelGraph:
    """The unit graph of a transformer for sequences of ``seq_len`` tokens."""
    units = [_embedding_unit(cfg, seq_len, dtype_bytes)]
    units += [_block_unit(cfg, i, seq_len, dtype_bytes) for i in range(cfg.num_layers)]
    units.append(_head_unit(cfg, seq_len, dtype_bytes))
    tied = cfg.tied_embeddings and cfg.head_task == "lm"
    return ModelGraph(name=name, units=tuple(units), seq_len=seq_len, dtype_bytes=dtype_bytes, config=cfg,
                      tied_owner="embedding" if tied else None, source=source)
