"""Read a Hugging Face ``config.json`` (GPT-2, Llama-like, other dense GPT lineages, OPT, BERT and its kin RoBERTa,
XLM-R, CamemBERT, DistilBERT) into a
:class:`TransformerConfig`, and the language model of vision-language configs (Gemma 3, LLaVA: their ``text_config``);
mixture-of-experts, encoder-decoder and state-space configs are refused."""

from __future__ import annotations

import json
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

from hetpart import _validate as v
from hetpart.errors import ModelError
from hetpart.graph.hf_features import sliding_windows, whole_number, with_head_task
from hetpart.graph.transformer import TransformerConfig

__all__ = ["read_hf_config", "hf_config_to_transformer"]

_LLAMA_LIKE = {"llama", "mistral", "qwen2", "qwen3", "gemma", "yi", "internlm2", "gemma2", "gemma3_text", "olmo",
               "olmo2", "granite", "phi3", "stablelm", "cohere"}
"""Gated MLP (SwiGLU/GeGLU), rotary positions, RMSNorm (LayerNorm for StableLM and Cohere)."""


def read_hf_config(path: Path) -> TransformerConfig:
    """Parse ``path`` (a config.json) into a transformer shape; :class:`ModelError` on anything wrong."""
    text = v.read_text(ModelError, path, "the config").removeprefix("\ufeff")  # a BOM: read as utf-8-sig
    if not text.strip():
        raise ModelError(f"{path}: the file is empty; give the path of a Hugging Face config.json")
    try:
        data = json.loads(text, object_pairs_hook=_unique_keys)
    except _DuplicateKey as exc:
        raise ModelError(f"{path}: {exc.key}: this key appears twice in one JSON object (a JSON reader would "
                         "silently take the last value); keep one") from None
    except json.JSONDecodeError as exc:
        raise ModelError(f"{path}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}; fix the syntax") from None
    except RecursionError:
        raise ModelError(f"{path}: JSON nested too deeply") from None
    except ValueError as exc:  # e.g. an integer with more digits than Python converts
        raise ModelError(f"{path}: unreadable JSON value ({exc}); fix the file") from None
    return hf_config_to_transformer(data, str(path))


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    """A JSON object's mapping, refusing a repeated key as the YAML inputs do."""
    data: dict = {}
    for key, value in pairs:
        if key in data:
            raise _DuplicateKey(key if key.isprintable() and len(key) <= 60 else v.show(key))
        data[key] = value
    return data


_PENDING_NOTES: list[list[str]] = []
"""The notes of the configs being read: given only once a config reads through, so that a refused one gives
its one error line alone."""


def _note(message: str) -> None:
    """A remark on how the config was read (the CLI prints it as one ``hetpart: note:`` line on stderr)."""
    if _PENDING_NOTES:
        _PENDING_NOTES[-1].append(message)
    else:
        _warn(message)


def _warn(message: str) -> None:
    from hetpart.graph.load import ModelNote  # load imports this module

    warnings.warn(ModelNote(message), stacklevel=4)


_HF_CLASSES = {"llama": "LlamaConfig", "mistral": "MistralConfig", "qwen2": "Qwen2Config", "qwen3": "Qwen3Config",
               "gemma": "GemmaConfig", "gemma2": "Gemma2Config", "gemma3_text": "Gemma3TextConfig",
               "olmo": "OlmoConfig", "olmo2": "Olmo2Config", "granite": "GraniteConfig", "phi3": "Phi3Config",
               "stablelm": "StableLmConfig", "cohere": "CohereConfig", "gpt_neox": "GPTNeoXConfig",
               "phi": "PhiConfig", "starcoder2": "Starcoder2Config", "opt": "OPTConfig", "bert": "BertConfig",
               "roberta": "RobertaConfig", "xlm-roberta": "XLMRobertaConfig", "camembert": "CamembertConfig",
               "distilbert": "DistilBertConfig"}
"""transformers' configuration class of each type (yi and internlm2 are remote code, read as Llama)."""
_HF_FIXED_DEFAULTS = {
    "llama": {"intermediate_size": 11008, "max_position_embeddings": 2048},
    "mistral": {"intermediate_size": 14336, "max_position_embeddings": 131072, "num_key_value_heads": 8},
    "qwen2": {"intermediate_size": 22016, "max_position_embeddings": 32768, "num_key_value_heads": 32},
    "qwen3": {"intermediate_size": 22016, "max_position_embeddings": 32768, "num_key_value_heads": 32,
              "head_dim": 128},
    "gemma": {"intermediate_size": 24576, "max_position_embeddings": 8192, "num_key_value_heads": 16,
              "head_dim": 256},
    "gemma2": {"intermediate_size": 9216, "max_position_embeddings": 8192, "num_key_value_heads": 4, "head_dim": 256},
    "gemma3_text": {"intermediate_size": 9216, "max_position_embeddings": 131072, "num_key_value_heads": 4,
                    "head_dim": 256},
    "olmo": {"intermediate_size": 11008, "max_position_embeddings": 2048},
    "olmo2": {"intermediate_size": 11008, "max_position_embeddings": 2048},
    "granite": {"intermediate_size": 11008, "max_position_embeddings": 2048},
    "phi3": {"intermediate_size": 8192, "max_position_embeddings": 4096},
    "stablelm": {"intermediate_size": 6912, "max_position_embeddings": 4096, "num_key_value_heads": 32},
    "cohere": {"intermediate_size": 22528, "max_position_embeddings": 8192},
    "gpt_neox": {"intermediate_size": 24576},
    "phi": {"intermediate_size": 8192},
    "starcoder2": {"intermediate_size": 12288, "num_key_value_heads": 2},
    "opt": {"ffn_dim": 3072},
    "bert": {"intermediate_size": 3072},
    "roberta": {"intermediate_size": 3072},
    "xlm-roberta": {"intermediate_size": 3072},
    "camembert": {"intermediate_size": 3072},
    "distilbert": {"hidden_dim": 3072},
}
"""The defaults of transformers' configuration classes (5.x) that are fixed numbers, one published model's,
rather than derived from the config's own widths: what Hugging Face builds when a config.json leaves the key
out. The width of the MLP is required (a fixed default is some other model's width: a wrong parameter
count). The Llama family's position limit (rotary: no table, no parameters; taken as GPT-2's n_positions and
the other families' limits are), key/value head count and head width are taken from here, with a note.
``num_key_value_heads`` of the types not listed is one per attention head, and ``head_dim`` is
``hidden_size / num_attention_heads``, as in transformers."""


def _hf_default(model_type: str, key: str) -> str:
    """Why transformers' fixed default for ``key`` is not taken, or "" where transformers has no class."""
    cls = _HF_CLASSES.get(model_type)
    value = _HF_FIXED_DEFAULTS.get(model_type, {}).get(key)
    if cls is None or value is None:
        return ""
    return f" (hetpart does not take transformers' {cls} default, {value}: it is one published model's value)"


def _class_default(key: str, source: str, model_type: str) -> int:
    """transformers' default for a key the config leaves out (yi and internlm2: Llama's), with a note."""
    if model_type not in _HF_CLASSES:
        model_type = "llama"
    value = _HF_FIXED_DEFAULTS[model_type][key]
    _note(f"{source}: {key} not set; taking {value} (the default of transformers' {_HF_CLASSES[model_type]})")
    return value


def _required(data: dict, key: str, source: str, model_type: str, what: str) -> int:
    """A key without which hetpart would have to guess the shape: refused, naming transformers' fixed default."""
    if data.get(key) is None:
        raise v.fail(ModelError, source, key, f"missing required field ({what}); add the model's own value to "
                     f"the config{_hf_default(model_type, key)}")
    return _int(data, key, source)


# Far above any published model (Llama 3 405B: 126 layers, width 16384, 128 heads, 128k vocabulary), low
# enough that a typo cannot make hetpart build millions of units or overflow its sums.
_LIMITS = {"n_layer": 10_000, "num_hidden_layers": 10_000, "n_head": 100_000, "num_attention_heads": 100_000,
           "num_key_value_heads": 100_000, "head_dim": 100_000, "n_layers": 10_000, "n_heads": 100_000,
           "num_kv_heads": 100_000, "n_head_kv": 100_000, "kv_n_heads": 100_000}
_MAX_WIDTH = 10**7
_MAX_ROTARY_POSITIONS = 2**31 - 1
"""Rotary and ALiBi models hold no table of positions, so their limit only bounds a typo (Llama 4 Scout
states 10,485,760)."""


def _int(data: dict, key: str, source: str, default: Any = None, minimum: int = 1) -> int:
    if key not in data or data[key] is None:
        if default is None:
            raise v.fail(ModelError, source, key, "missing required field; add it to the config")
        return default
    return whole_number(data[key], source, key, minimum=minimum, maximum=_LIMITS.get(key, _MAX_WIDTH))


def _positions(data: dict, key: str, source: str, default: int) -> int:
    """The position limit of a rotary or ALiBi model: a stated number, not a table's size."""
    if data.get(key) is None:
        return default
    return whole_number(data[key], source, key, maximum=_MAX_ROTARY_POSITIONS)


def _first_key(data: dict, keys: tuple[str, ...]) -> str:
    """The first of ``keys`` the config sets (``keys[0]`` when none is)."""
    return next((key for key in keys if data.get(key) is not None), keys[0])


def _kv_heads(data: dict, source: str, heads: int, keys: tuple[str, ...] = ("num_key_value_heads",),
              heads_key: str = "num_attention_heads", default: int | None = None, model_type: str = "") -> int:
    """Key/value heads under the config's own field names; they must divide the attention heads. With
    ``model_type``, a config that leaves them out takes transformers' default for the type, with a note."""
    key = _first_key(data, keys)
    if model_type and data.get(key) is None:
        fixed = _HF_FIXED_DEFAULTS.get(model_type, {}).get("num_key_value_heads")
        cls = _HF_CLASSES.get(model_type, "LlamaConfig")
        if fixed is not None and heads % fixed:
            raise v.fail(ModelError, source, key, f"not set, and transformers' {cls} default, {fixed} key/value "
                         f"heads, does not divide the {heads} attention heads ({heads_key}); add {key}: one of "
                         f"{_divisors(heads)}")
        default = heads if fixed is None else fixed
        _note(f"{source}: {key} not set; taking {default} ("
              f"{'one per attention head, as' if fixed is None else 'the default of'} transformers' {cls})")
    kv = _int(data, key, source, default=heads if default is None else default)
    if heads % kv:
        raise v.fail(ModelError, source, key, f"{kv} key/value heads do not divide the {heads} attention heads "
                     f"({heads_key}); use one of {_divisors(heads)}")
    return kv


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def _heads(data: dict, source: str, hidden: int, key: str, hidden_key: str) -> int:
    """The attention heads of a family without ``head_dim``: they must divide the hidden width."""
    heads = _int(data, key, source)
    if hidden % heads:
        below = max(d for d in range(1, min(heads, hidden)) if hidden % d == 0)
        above = next((d for d in range(heads + 1, hidden + 1) if hidden % d == 0), None)
        near = f"{below} or {above}" if above else str(below)
        raise v.fail(ModelError, source, key, f"{heads} heads do not divide {hidden_key} {hidden}; use a divisor of "
                     f"{hidden} such as {near}")
    return heads


def _bool(data: dict, key: str, source: str, default: bool) -> bool:
    value = data.get(key)
    return default if value is None else v.boolean(ModelError, value, source, key)


def _head_size(data: dict, source: str, hidden: int, heads: int, model_type: str = "") -> int:
    """``head_dim`` where the config sets it apart from ``hidden_size / num_attention_heads`` (Gemma, Qwen3,
    Mistral Nemo), else 0 (the default width). A config that leaves it out takes transformers' default for
    ``model_type`` where that is a fixed width (Gemma 256, Qwen3 128), with a note."""
    if data.get("head_dim") is None:
        fixed = _HF_FIXED_DEFAULTS.get(model_type, {}).get("head_dim")
        if fixed is not None:
            _note(f"{source}: head_dim not set; taking {fixed} (the default of transformers' "
                  f"{_HF_CLASSES[model_type]})")
            return 0 if fixed * heads == hidden else fixed
        if hidden % heads:
            raise v.fail(ModelError, source, "num_attention_heads", f"{heads} heads do not divide hidden_size "
                         f"{hidden}; add head_dim (the width of one head) or fix the head count")
        return 0
    head_dim = _int(data, "head_dim", source)
    return 0 if head_dim * heads == hidden else head_dim


_GPT_LINEAGE_TYPES = ("bloom", "falcon", "gpt_bigcode", "gpt_neox", "gptj", "mpt", "phi", "starcoder2")
"""Pre-LayerNorm GPTs of other lineages, family ``gpt`` (non-gated MLP)."""
_BERT_LIKE = ("bert", "roberta", "xlm-roberta", "camembert", "distilbert")
"""BERT-style encoders (family ``bert``): post-LayerNorm blocks, learned positions, a masked-LM head."""
_SUPPORTED = ", ".join(["gpt2", "llama", *sorted(_LLAMA_LIKE - {"llama"}), *_GPT_LINEAGE_TYPES, "opt", *_BERT_LIKE])
_NOT_TRANSFORMER_KEYS = ("state_size", "ssm_cfg", "d_state", "conv_kernel", "time_step_rank")
"""Keys of state-space models (Mamba, Mamba-2): their configs also carry hidden_size and num_hidden_layers."""
_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
"""Expert counts of mixture-of-experts configs: Mixtral, Granite MoE, PhiMoE num_local_experts; Qwen2/Qwen3 MoE,
OLMoE, Jamba num_experts; DeepSeek V2/V3 n_routed_experts; DBRX ffn_config.moe_num_experts."""
_MOE_TYPES = {"mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "dbrx", "jamba", "olmoe",
              "granitemoe", "granitemoeshared", "phimoe"}


def hf_config_to_transformer(data: Any, source: str) -> TransformerConfig:
    """The shape of the config ``data`` (read from ``source``); its notes (keys left out, transformers' default
    taken) are given as :class:`~hetpart.graph.load.ModelNote` warnings once the whole config reads through."""
    _PENDING_NOTES.append([])
    try:
        cfg = _to_transformer(data, source)
    finally:
        notes = _PENDING_NOTES.pop()
    for message in dict.fromkeys(notes):
        _warn(message)
    return cfg


def _to_transformer(data: Any, source: str) -> TransformerConfig:
    data = v.require_mapping(ModelError, data, source, "")
    model_type = data.get("model_type") or ""
    if not isinstance(model_type, str):
        raise v.fail(ModelError, source, "model_type", f"expected text such as \"llama\", got {v.kind(model_type)}")
    model_type = model_type.lower()
    if model_type == "refinedweb" and data.get("new_decoder_architecture") is None:
        data = data | {"new_decoder_architecture": True}  # RefinedWeb is Falcon-40B's architecture
    model_type = _ALIASES.get(model_type, model_type)
    if model_type in _VISION_LANGUAGE:
        return _text_model(data, source, model_type)
    _refuse_unsupported(data, model_type, source)
    try:
        cfg = _shape(data, source, model_type)
        if cfg is None:
            raise ModelError(f"{source}: model_type '(missing)' is not a GPT-2, Llama, OPT or BERT config; set "
                             f"model_type (supported: {_SUPPORTED}), or give n_embd/n_layer/n_head (GPT-2) or "
                             "hidden_size/num_hidden_layers/num_attention_heads (Llama), or use python:MODULE:FUNCTION")
        windows = sliding_windows(data, source, model_type, cfg.num_layers)
        cfg = replace(cfg, sliding_windows=windows) if windows else cfg
        unmodelled = _unmodelled(data, model_type, source)  # said by export and inspect, not as a note on every load
        return with_head_task(replace(cfg, unmodelled=unmodelled) if unmodelled else cfg, data, source)
    except ValueError as exc:  # shape checks of TransformerConfig
        raise ModelError(f"{source}: {exc}; fix the config") from None


_VISION_LANGUAGE = {"gemma3": ("gemma3_text", "Gemma3Config"), "llava": ("llama", "LlavaConfig"),
                    "llava_next": ("llama", "LlavaNextConfig"), "llava_onevision": ("qwen2", "LlavaOnevisionConfig"),
                    "mistral3": ("mistral", "Mistral3Config"), "paligemma": ("gemma", "PaliGemmaConfig")}
"""Vision-language configs whose language model is a decoder read here, in ``text_config``: the model type
transformers gives a ``text_config`` that states none (``sub_configs_defaults`` of the class named), and the
class. The vision tower and projector in front of it are left out (a note says so)."""
_IMAGE_TOKENS = ("mm_tokens_per_image", "image_seq_length")
"""Keys of the tokens one image adds to the sequence (Gemma3Config, LlavaConfig)."""


def _text_model(data: dict, source: str, model_type: str) -> TransformerConfig:
    """The language model of the vision-language config ``data``: its ``text_config`` read as a config of its
    own, ``tie_word_embeddings`` of the whole model applied (Gemma 3 ties by the top-level key; LLaVA ties when
    either says so), with a note that the vision tower is left out."""
    default_type, cls = _VISION_LANGUAGE[model_type]
    text = data.get("text_config")
    if not isinstance(text, dict):
        raise v.fail(ModelError, source, "text_config", f"{'missing' if text is None else 'expected a mapping'}: a "
                     f"{model_type} config ({cls}) holds its language model there, which hetpart reads (the vision "
                     "tower is left out); add the text model's config")
    text = {"model_type": default_type} | text
    tied = data.get("tie_word_embeddings")
    if isinstance(tied, bool) and (tied or model_type == "gemma3"):
        text["tie_word_embeddings"] = tied
    vision = data.get("vision_config")
    tower = (f" ({vision.get('model_type')}, {vision.get('num_hidden_layers')} layers)"
             if isinstance(vision, dict) and vision.get("model_type") else "")
    per_image = next((data[k] for k in _IMAGE_TOKENS if isinstance(data.get(k), int)), None)
    tokens = f"; each image's {per_image} tokens count as text tokens in the sequence length" if per_image else ""
    _note(f"{source}: model_type {model_type} ({cls}): the language model (text_config, "
          f"{text['model_type']}) alone is modelled; the vision tower{tower} and its projector are left out"
          f"{tokens}")
    return _to_transformer(text, f"{source}: text_config")


_PARALLEL_BLOCK = {"falcon": ("parallel_attn", True), "gpt_neox": ("use_parallel_residual", True), "phi": (None, True),
                   "gptj": (None, True), "stablelm": ("use_parallel_residual", False), "cohere": (None, True)}
"""Architectures whose block may run attention and the MLP side by side on the same input (``x + attn(ln(x)) +
mlp(ln(x))``): the key that says so and its default in transformers (None: always)."""


def _unmodelled(data: dict, model_type: str, source: str) -> tuple[str, ...]:
    """What of the config hetpart prices and runs as something close (:attr:`TransformerConfig.unmodelled`)."""
    out = []
    if model_type in _PARALLEL_BLOCK:
        key, default = _PARALLEL_BLOCK[model_type]
        parallel = default if key is None else _bool(data, key, source, default)
        if model_type == "falcon" and _bool(data, "new_decoder_architecture", source, False):
            parallel = True
        if parallel:
            said = f"{key}: true" if key else f"model_type {model_type}"
            out.append(f"{said}: attention and MLP run side by side on one input; hetpart prices (and runs) the "
                       "sequential block of the same FLOPs (an engine that fuses the two output all-reduces pays half "
                       "the tensor-parallel all-reduces priced)")
    for key, where in (("attn_logit_softcapping", "attention scores soft-capped (tanh) before the softmax; not "
                        "every fused attention kernel takes a cap"),
                       ("final_logit_softcapping", "output logits soft-capped (tanh)")):
        value = data.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            out.append(f"{key}: {value}: {where}; hetpart neither prices nor runs the cap (an elementwise op, a cost "
                       "near nothing)")
    return tuple(out)


_ALIASES = {"refinedwebmodel": "falcon", "refinedweb": "falcon"}
"""Legacy model types of a supported architecture: Falcon's before transformers took it in (``RWForCausalLM``;
RefinedWebModel is Falcon-7B's shape, RefinedWeb Falcon-40B's new decoder architecture)."""


def _shape(data: dict, source: str, model_type: str) -> TransformerConfig | None:
    """The family's shape, or None when the config is of no family hetpart reads."""
    if model_type in _GPT_LINEAGES:
        return _GPT_LINEAGES[model_type](data, source)
    if model_type == "gpt2" or (not model_type and "n_embd" in data):
        return _gpt2(data, source)
    if model_type == "opt":
        return _opt(data, source)
    if model_type in _BERT_LIKE:
        return _bert(data, source, model_type)
    if model_type == "olmo" and data.get("hidden_size") is None and "d_model" in data:
        raise v.fail(ModelError, source, "d_model", "this is the native OLMo config (d_model, n_layers), not the "
                     "Hugging Face one; use the config.json of the Hugging Face conversion (the -hf checkpoint, "
                     "e.g. allenai/OLMo-7B-hf)")
    if model_type in _LLAMA_LIKE or ("hidden_size" in data and "num_hidden_layers" in data):
        if not model_type:  # a Llama block (RMSNorm, SwiGLU, rotary) is assumed: say so, a GeLU MLP would differ
            _note(f"{source}: model_type not set; read as a Llama block (RMSNorm, SwiGLU, rotary) from "
                  "hidden_size/num_hidden_layers; set model_type if it is another architecture")
        return _llama(data, source, model_type)
    return None


def _experts_key(data: dict) -> str | None:
    """The key of an expert count above 1, if the config has one."""
    ffn = data.get("ffn_config")
    places = [(key, data.get(key)) for key in _EXPERT_KEYS]
    if isinstance(ffn, dict):
        places += [(f"ffn_config.{key}", ffn.get(key)) for key in _EXPERT_KEYS]
    for key, value in places:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 1:  # 8.0 experts too
            return key
    return None


def _refuse_unsupported(data: dict, model_type: str, source: str) -> None:
    """A config of another architecture must not be modelled as a Llama because it shares two key names."""
    arch = data.get("architectures")
    arch_names = ", ".join(map(str, arch)) if isinstance(arch, list) and arch and len(str(arch)) < 200 else ""
    named = f" ({arch_names})" if arch_names else ""
    experts_key = _experts_key(data)
    if experts_key or model_type in _MOE_TYPES:
        # A dense shape would count every expert's weights as computed per token, or only one expert's weights.
        label = v.show(model_type).strip("'\"") if model_type else arch_names
        raise ModelError(f"{source}: {experts_key or 'model_type'}: mixture-of-experts models"
                         f"{f' ({label})' if label else ''} are not supported; supported model types: {_SUPPORTED}")
    seq2seq = data.get("is_encoder_decoder") is True
    if seq2seq or (not model_type and any(str(a).endswith("ForConditionalGeneration") for a in (arch if isinstance(arch, list) else ()))):
        what = "an encoder-decoder (sequence-to-sequence)" if seq2seq else "a sequence-to-sequence or multimodal"
        raise ModelError(f"{source}: {'is_encoder_decoder' if seq2seq else 'architectures'}: {what} model{named} is "
                         f"not supported: hetpart models decoders and BERT-style encoders (supported model types: "
                         f"{_SUPPORTED}); describe it with python:MODULE:FUNCTION")
    if model_type and model_type not in _LLAMA_LIKE | set(_GPT_LINEAGE_TYPES) | {"gpt2", "opt", *_BERT_LIKE}:
        raise ModelError(f"{source}: model_type: {v.show(model_type)}{named} is not supported; supported model "
                         f"types: {_SUPPORTED} (or describe the model with python:MODULE:FUNCTION)")
    odd = [k for k in _NOT_TRANSFORMER_KEYS if k in data]
    if not model_type and odd:
        raise ModelError(f"{source}: {odd[0]}: a state-space model config{named} is not supported; supported "
                         f"model types: {_SUPPORTED} (or use python:MODULE:FUNCTION)")


def _int_of(data: dict, keys: tuple[str, ...], source: str, default: Any = None) -> int:
    """The first of ``keys`` the config sets (a field and its older alias: n_layer / num_hidden_layers)."""
    for key in keys:
        if data.get(key) is not None:
            return _int(data, key, source)
    return _int(data, keys[0], source, default=default)


def _activation(data: dict, key: str, source: str) -> str:
    """A non-gated MLP's activation: ReLU, or GELU standing for every other (gelu_new, gelu_pytorch_tanh, ...)."""
    value = data.get(key)
    if value is None:
        return "gelu"
    if not isinstance(value, str):
        raise v.fail(ModelError, source, key, f"expected text such as \"gelu\", got {v.kind(value)}")
    return "relu" if value.lower() == "relu" else "gelu"


def _dropout(data: dict, keys: tuple[str, ...], source: str, default: float = 0.0) -> bool:
    """Whether any of the dropout rates ``keys`` is above 0 (``default`` where the config leaves one out)."""
    rates = []
    for key in keys:
        value = data.get(key)
        rates.append(default if value is None else v.number(ModelError, value, source, key, strict=False, maximum=1))
    return any(rate > 0 for rate in rates)


def _gpt2(data: dict, source: str) -> TransformerConfig:
    h = _int(data, "n_embd", source)
    return TransformerConfig(
        "gpt2", _int(data, "n_layer", source), h, _heads(data, source, h, "n_head", "n_embd"),
        _int(data, "vocab_size", source),
        _int(data, "n_positions", source, default=1024), ffn_hidden_size=_int(data, "n_inner", source, default=4 * h),
        tied_embeddings=_bool(data, "tie_word_embeddings", source, True))


_TIED_BY_DEFAULT = {"gemma", "gemma2", "gemma3_text", "cohere"}
"""Llama-like families whose configuration class ties the embeddings unless the config says otherwise."""
_LAYERNORM = {"stablelm", "cohere"}
"""Llama-like families with LayerNorm (Cohere's has no bias: h weights, counted as 2h) instead of RMSNorm."""


def _llama(data: dict, source: str, model_type: str = "llama") -> TransformerConfig:
    """Llama and the decoders of its shape: gated MLP, rotary positions, untied unless the family ties.

    Small terms hetpart leaves out (each well under 0.1% of the published counts): the q/k norms of Qwen3,
    OLMo 2, Gemma 3 and Cohere with ``use_qk_norm``; the extra post-attention/post-MLP norms of Gemma 2 and 3
    (2 h per layer); OLMo's parameter-free norms and Cohere's single norm per (parallel) layer, counted as
    two. Phi-3 fuses qkv and gate/up in the checkpoint, with the same shapes. Qwen2 (no ``attention_bias``
    key) and StableLM with ``use_qkv_bias`` have q/k/v biases; Gemma gates with GELU (GeGLU).
    """
    h = _int(data, "hidden_size", source)
    heads = _int(data, "num_attention_heads", source)
    layers = _int(data, "num_hidden_layers", source)
    vocab = _int(data, "vocab_size", source)
    ffn = _required(data, "intermediate_size", source, model_type, "the width of the MLP")
    positions = (_positions(data, "max_position_embeddings", source, default=0)
                 if data.get("max_position_embeddings") is not None
                 else _class_default("max_position_embeddings", source, model_type))
    head_size = _head_size(data, source, h, heads, model_type)
    tied = model_type in _TIED_BY_DEFAULT
    if data.get("tie_word_embeddings") is None:
        _note(f"{source}: tie_word_embeddings not set; taking {str(tied).lower()} (the default of transformers' "
              f"{_HF_CLASSES.get(model_type, 'LlamaConfig')})")
    return TransformerConfig(
        "llama", layers, h, heads, vocab, positions, ffn_hidden_size=ffn,
        num_kv_heads=_kv_heads(data, source, heads, model_type=model_type or "llama"),
        tied_embeddings=_bool(data, "tie_word_embeddings", source, tied),
        activation="swiglu", norm="layernorm" if model_type in _LAYERNORM else "rmsnorm",
        bias=_bool(data, "attention_bias", source, False), learned_positions=False, dropout=False,
        head_size=head_size, qkv_bias=model_type in _QKV_BIAS or _bool(data, "use_qkv_bias", source, False),
        gate_activation=_gate_activation(data, source, model_type))


_QKV_BIAS = {"qwen2"}
"""Llama-like types with q/k/v biases and no key that says so (Qwen2, Qwen2.5)."""


def _gate_activation(data: dict, source: str, model_type: str) -> str:
    """``gelu`` for a GELU-gated MLP (GeGLU: Gemma's ``hidden_activation``/``hidden_act`` gelu*), else ``silu``."""
    key = _first_key(data, ("hidden_activation", "hidden_act"))
    value = data.get(key)
    if value is None:
        return "gelu" if model_type.startswith("gemma") else "silu"
    if not isinstance(value, str):
        raise v.fail(ModelError, source, key, f"expected text such as \"silu\", got {v.kind(value)}")
    return "gelu" if value.lower().startswith("gelu") else "silu"


def _rotary_gpt(data: dict, source: str, model_type: str, *, positions: int, tied: bool, bias_key: str,
                dropout_keys: tuple[str, ...]) -> TransformerConfig:
    """A rotary GPT in the Hugging Face key names (``hidden_size``, ``num_hidden_layers``, ``intermediate_size``,
    ``num_key_value_heads``, ``hidden_act``): GPT-NeoX, Phi, StarCoder2 differ in their defaults only."""
    h = _int(data, "hidden_size", source)
    heads = _int(data, "num_attention_heads", source)
    return TransformerConfig(
        "gpt", _int(data, "num_hidden_layers", source), h, heads, _int(data, "vocab_size", source),
        _positions(data, "max_position_embeddings", source, default=positions),
        ffn_hidden_size=_required(data, "intermediate_size", source, model_type, "the width of the MLP"),
        num_kv_heads=_kv_heads(data, source, heads, model_type=model_type if model_type == "starcoder2" else ""),
        tied_embeddings=_bool(data, "tie_word_embeddings", source, tied),
        activation=_activation(data, "hidden_act", source), bias=_bool(data, bias_key, source, True),
        learned_positions=False, dropout=_dropout(data, dropout_keys, source), head_size=_head_size(data, source, h, heads))


def _gpt_neox(data: dict, source: str) -> TransformerConfig:
    """GPT-NeoX, Pythia: rotary, parallel attention and MLP with two LayerNorms, untied output."""
    return _rotary_gpt(data, source, "gpt_neox", positions=2048, tied=False, bias_key="attention_bias",
                       dropout_keys=("hidden_dropout", "attention_dropout"))


def _falcon(data: dict, source: str) -> TransformerConfig:
    """Falcon: multi-query (7B) or grouped-query (40B, 180B, ``new_decoder_architecture``) attention, rotary
    unless ALiBi. Falcon-7B's parallel block has one LayerNorm, hetpart counts two (2 h per layer more)."""
    h = _int_of(data, ("hidden_size", "n_embed"), source)
    heads = _int_of(data, ("num_attention_heads", "n_head"), source)
    if _bool(data, "new_decoder_architecture", source, False):
        kv_heads = _kv_heads(data, source, heads, ("num_kv_heads", "n_head_kv"),
                             _first_key(data, ("num_attention_heads", "n_head")))
    elif _bool(data, "multi_query", source, True):
        kv_heads = 1
    else:
        kv_heads = heads
    return TransformerConfig(
        "gpt", _int_of(data, ("num_hidden_layers", "n_layer"), source), h, heads, _int(data, "vocab_size", source),
        _positions(data, "max_position_embeddings", source, default=2048),
        ffn_hidden_size=_int(data, "ffn_hidden_size", source, default=4 * h), num_kv_heads=kv_heads,
        tied_embeddings=_bool(data, "tie_word_embeddings", source, True),
        activation=_activation(data, "activation", source), bias=_bool(data, "bias", source, False),
        learned_positions=False, dropout=_dropout(data, ("hidden_dropout", "attention_dropout"), source),
        head_size=_head_size(data, source, h, heads))


def _phi(data: dict, source: str) -> TransformerConfig:
    """Phi-1, Phi-1.5, Phi-2: partial rotary, parallel attention and MLP with one LayerNorm (counted as two,
    2 h per layer more), an lm_head bias (vocab_size, left out). Phi has no bias switch: the ``bias`` key
    is read as absent, so biases are on."""
    return _rotary_gpt(data, source, "phi", positions=2048, tied=False, bias_key="bias",
                       dropout_keys=("resid_pdrop", "embd_pdrop", "attention_dropout"))


def _starcoder2(data: dict, source: str) -> TransformerConfig:
    """StarCoder2: grouped-query attention, rotary, LayerNorm, biases (``use_bias``)."""
    return _rotary_gpt(data, source, "starcoder2", positions=4096, tied=True, bias_key="use_bias",
                       dropout_keys=("residual_dropout", "embedding_dropout", "attention_dropout"))


def _bloom(data: dict, source: str) -> TransformerConfig:
    """BLOOM: ALiBi (no position table), tied; its LayerNorm after the embedding (2 h) is left out."""
    h = _int_of(data, ("hidden_size", "n_embed"), source)
    heads = _int_of(data, ("n_head", "num_attention_heads"), source)
    return TransformerConfig(
        "gpt", _int_of(data, ("n_layer", "num_hidden_layers"), source), h, heads, _int(data, "vocab_size", source),
        _positions(data, "seq_length", source, default=2048), tied_embeddings=_bool(data, "tie_word_embeddings", source, True),
        learned_positions=False, dropout=_dropout(data, ("hidden_dropout", "attention_dropout"), source),
        head_size=_head_size(data, source, h, heads))


def _mpt(data: dict, source: str) -> TransformerConfig:
    """MPT: ALiBi, tied, no biases (``no_bias``; its bias-free LayerNorms, h each, are counted as 2 h)."""
    h = _int(data, "d_model", source)
    heads = _int(data, "n_heads", source)
    attn = data.get("attn_config")
    attn = {} if attn is None else v.require_mapping(ModelError, attn, source, "attn_config")
    attn_source = f"{source}: attn_config"
    alibi = _bool(attn, "alibi", attn_source, True)
    ratio = data.get("expansion_ratio")
    ffn = 4 * h if ratio is None else round(h * v.number(ModelError, ratio, source, "expansion_ratio", maximum=1000))
    learned = _bool(data, "learned_pos_emb", source, True) and not alibi
    attn_type = attn.get("attn_type")
    kv_heads = heads
    if attn_type == "multiquery_attention":
        kv_heads = 1
    elif attn_type == "grouped_query_attention":
        kv_heads = _kv_heads(attn, attn_source, heads, ("kv_n_heads",), "n_heads")
    return TransformerConfig(
        "gpt", _int(data, "n_layers", source), h, heads, _int(data, "vocab_size", source),
        (_int if learned else _positions)(data, "max_seq_len", source, default=2048), ffn_hidden_size=ffn,
        num_kv_heads=kv_heads,
        tied_embeddings=_bool(data, "tie_word_embeddings", source, True), bias=not _bool(data, "no_bias", source, True),
        learned_positions=learned,
        dropout=_dropout(data, ("resid_pdrop", "emb_pdrop"), source)
        or _dropout(attn, ("attn_pdrop",), attn_source),
        head_size=_head_size(data, source, h, heads))


def _gpt_bigcode(data: dict, source: str) -> TransformerConfig:
    """StarCoder (1), SantaCoder: GPT-2 with multi-query attention (``multi_query``)."""
    h = _int(data, "n_embd", source)
    heads = _heads(data, source, h, "n_head", "n_embd")
    return TransformerConfig(
        "gpt", _int(data, "n_layer", source), h, heads, _int(data, "vocab_size", source),
        _int(data, "n_positions", source, default=1024), ffn_hidden_size=_int(data, "n_inner", source, default=4 * h),
        num_kv_heads=1 if _bool(data, "multi_query", source, True) else heads,
        tied_embeddings=_bool(data, "tie_word_embeddings", source, True),
        activation=_activation(data, "activation_function", source), learned_positions=True,
        dropout=_dropout(data, ("resid_pdrop", "embd_pdrop", "attn_pdrop"), source, default=0.1))


def _gptj(data: dict, source: str) -> TransformerConfig:
    """GPT-J: rotary, untied, parallel attention and MLP with one LayerNorm. Its attention has no biases and
    its lm_head has one; hetpart counts GPT biases and two norms (together 0.01% more for GPT-J 6B)."""
    h = _int(data, "n_embd", source)
    heads = _heads(data, source, h, "n_head", "n_embd")
    return TransformerConfig(
        "gpt", _int(data, "n_layer", source), h, heads, _int(data, "vocab_size", source),
        _positions(data, "n_positions", source, default=2048),
        ffn_hidden_size=_int(data, "n_inner", source, default=4 * h),
        tied_embeddings=_bool(data, "tie_word_embeddings", source, False),
        activation=_activation(data, "activation_function", source), learned_positions=False,
        dropout=_dropout(data, ("resid_pdrop", "embd_pdrop", "attn_pdrop"), source))


def _opt(data: dict, source: str) -> TransformerConfig:
    h = _int(data, "hidden_size", source)
    return TransformerConfig(
        "opt", _int(data, "num_hidden_layers", source), h, _heads(data, source, h, "num_attention_heads", "hidden_size"),
        _int(data, "vocab_size", source), _int(data, "max_position_embeddings", source, default=2048),
        ffn_hidden_size=_required(data, "ffn_dim", source, "opt", "the width of the MLP"), activation="relu",
        embed_dim=_int(data, "word_embed_proj_dim", source, default=h), position_offset=2,
        final_norm=_bool(data, "do_layer_norm_before", source, True),
        tied_embeddings=_bool(data, "tie_word_embeddings", source, True))


_ROBERTA_POSITIONS = {"roberta", "xlm-roberta", "camembert"}
"""Types whose position ids start after the padding index (``pad_token_id + 1``, fairseq's convention): their
table holds ``max_position_embeddings`` rows (514) of which ``pad_token_id + 1`` (2) are never a position, so
sequences are at most 512 tokens long."""


def _bert(data: dict, source: str, model_type: str = "bert") -> TransformerConfig:
    """BERT and the encoders that differ from it in vocabulary, position offset and token types only:
    RoBERTa, XLM-R and CamemBERT (one token type in the published configs; ``type_vocab_size``), DistilBERT
    (its own key names, no token types). The head is the masked-LM head of ``*ForMaskedLM`` (transform,
    LayerNorm, decoder bias, decoder tied to the embedding; no pooler, see
    :class:`~hetpart.graph.transformer.TransformerConfig`'s ``pretraining_head``), plus BERT's pooler and
    next-sentence classifier where ``architectures`` names ``BertForPreTraining``."""
    if model_type == "distilbert":
        h = _int(data, "dim", source)
        layers = _int(data, "n_layers", source)
        heads = _heads(data, source, h, "n_heads", "dim")
        ffn = _required(data, "hidden_dim", source, model_type, "the width of the MLP")
        token_types = 0
    else:
        h = _int(data, "hidden_size", source)
        layers = _int(data, "num_hidden_layers", source)
        heads = _heads(data, source, h, "num_attention_heads", "hidden_size")
        ffn = _required(data, "intermediate_size", source, model_type, "the width of the MLP")
        token_types = _int(data, "type_vocab_size", source, default=2, minimum=0)
    table = _int(data, "max_position_embeddings", source, default=514 if model_type in _ROBERTA_POSITIONS else 512)
    offset = 0
    if model_type in _ROBERTA_POSITIONS:
        offset = _int(data, "pad_token_id", source, default=1, minimum=0) + 1
        if table <= offset:
            raise v.fail(ModelError, source, "max_position_embeddings", f"{table} rows leave no position after the "
                         f"padding index (pad_token_id {offset - 1}: positions start at {offset}); use "
                         f"{offset + 512} for 512-token sequences")
    arch = data.get("architectures")
    pretraining = isinstance(arch, list) and any(isinstance(a, str) and a.endswith("ForPreTraining") for a in arch)
    return TransformerConfig(
        "bert", layers, h, heads, _int(data, "vocab_size", source), table - offset, ffn_hidden_size=ffn,
        position_offset=offset, final_norm=False, tied_embeddings=_bool(data, "tie_word_embeddings", source, True),
        token_types=token_types, pretraining_head=pretraining)


_GPT_LINEAGES = {"bloom": _bloom, "falcon": _falcon, "gpt_bigcode": _gpt_bigcode, "gpt_neox": _gpt_neox, "gptj": _gptj,
                 "mpt": _mpt, "phi": _phi, "starcoder2": _starcoder2}
