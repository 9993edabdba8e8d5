"""Read a Hugging Face ``config.json`` (GPT-2, Llama-like, OPT, BERT) into a :class:`TransformerConfig`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hetpart import _validate as v
from hetpart.errors import ModelError
from hetpart.graph.transformer import TransformerConfig

__all__ = ["read_hf_config", "hf_config_to_transformer"]

_LLAMA_LIKE = {"llama", "mistral", "qwen2", "qwen3", "gemma", "yi", "internlm2"}


def read_hf_config(path: Path) -> TransformerConfig:
    """Parse ``path`` (a config.json) into a transformer shape; :class:`ModelError` on anything wrong."""
    text = v.read_text(ModelError, path, "the config")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelError(f"{path}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}; fix the syntax") from None
    except RecursionError:
        raise ModelError(f"{path}: JSON nested too deeply") from None
    except ValueError as exc:  # e.g. an integer with more digits than Python converts
        raise ModelError(f"{path}: unreadable JSON value ({exc}); fix the file") from None
    return hf_config_to_transformer(data, str(path))


# Far above any published model (Llama 3 405B: 126 layers, width 16384, 128 heads, 128k vocabulary), low
# enough that a typo cannot make hetpart build millions of units or overflow its sums.
_LIMITS = {"n_layer": 10_000, "num_hidden_layers": 10_000, "n_head": 100_000, "num_attention_heads": 100_000,
           "num_key_value_heads": 100_000, "head_dim": 100_000}
_MAX_WIDTH = 10**7


def _int(data: dict, key: str, source: str, default: Any = None, minimum: int = 1) -> int:
    if key not in data or data[key] is None:
        if default is None:
            raise v.fail(ModelError, source, key, "missing required field; add it to the config")
        return default
    return v.integer(ModelError, data[key], source, key, minimum=minimum, maximum=_LIMITS.get(key, _MAX_WIDTH))


def _bool(data: dict, key: str, source: str, default: bool) -> bool:
    value = data.get(key)
    return default if value is None else v.boolean(ModelError, value, source, key)


def _head_size(data: dict, source: str, hidden: int, heads: int) -> int:
    """``head_dim`` where the config sets it apart from ``hidden_size / num_attention_heads`` (Gemma, Qwen3,
    Mistral Nemo), else 0 (the default width)."""
    if data.get("head_dim") is None:
        if hidden % heads:
            raise v.fail(ModelError, source, "num_attention_heads", f"{heads} heads do not divide hidden_size "
                         f"{hidden}; add head_dim (the width of one head) or fix the head count")
        return 0
    head_dim = _int(data, "head_dim", source)
    return 0 if head_dim * heads == hidden else head_dim


_SUPPORTED = "gpt2, llama, " + ", ".join(sorted(_LLAMA_LIKE - {"llama"})) + ", opt, bert"
_NOT_TRANSFORMER_KEYS = ("state_size", "ssm_cfg", "d_state", "conv_kernel", "time_step_rank")
"""Keys of state-space models (Mamba, Mamba-2): their configs also carry hidden_size and num_hidden_layers."""


def hf_config_to_transformer(data: Any, source: str) -> TransformerConfig:
    data = v.require_mapping(ModelError, data, source, "")
    model_type = data.get("model_type") or ""
    if not isinstance(model_type, str):
        raise v.fail(ModelError, source, "model_type", f"expected text such as \"llama\", got {v.kind(model_type)}")
    model_type = model_type.lower()
    _refuse_unsupported(data, model_type, source)
    try:
        if "n_embd" in data or model_type == "gpt2":
            return _gpt2(data, source)
        if model_type == "opt":
            return _opt(data, source)
        if model_type == "bert":
            return _bert(data, source)
        if model_type in _LLAMA_LIKE or ("hidden_size" in data and "num_hidden_layers" in data):
            return _llama(data, source)
    except ValueError as exc:  # shape checks of TransformerConfig
        raise ModelError(f"{source}: {exc}; fix the config") from None
    raise ModelError(f"{source}: model_type {model_type or '(missing)'!r} is not a GPT-2, Llama, OPT or BERT "
                     "config; give n_embd/n_layer/n_head (GPT-2) or hidden_size/num_hidden_layers/"
                     "num_attention_heads (Llama), or use python:MODULE:FUNCTION")


def _refuse_unsupported(data: dict, model_type: str, source: str) -> None:
    """A config of another architecture must not be modelled as a Llama because it shares two key names."""
    arch = data.get("architectures")
    named = f" ({', '.join(map(str, arch))})" if isinstance(arch, list) and arch and len(str(arch)) < 200 else ""
    if model_type and model_type not in _LLAMA_LIKE | {"gpt2", "opt", "bert"}:
        raise ModelError(f"{source}: model_type: {v.show(model_type)}{named} is not supported; supported model "
                         f"types: {_SUPPORTED} (or describe the model with python:MODULE:FUNCTION)")
    odd = [k for k in _NOT_TRANSFORMER_KEYS if k in data]
    if not model_type and odd:
        raise ModelError(f"{source}: {odd[0]}: a state-space model config{named} is not supported; supported "
                         f"model types: {_SUPPORTED} (or use python:MODULE:FUNCTION)")


def _gpt2(data: dict, source: str) -> TransformerConfig:
    h = _int(data, "n_embd", source)
    return TransformerConfig(
        "gpt2", _int(data, "n_layer", source), h, _int(data, "n_head", source), _int(data, "vocab_size", source),
        _int(data, "n_positions", source, default=1024), ffn_hidden_size=_int(data, "n_inner", source, default=4 * h),
        tied_embeddings=_bool(data, "tie_word_embeddings", source, True))


def _llama(data: dict, source: str) -> TransformerConfig:
    h = _int(data, "hidden_size", source)
    heads = _int(data, "num_attention_heads", source)
    head_size = _head_size(data, source, h, heads)
    return TransformerConfig(
        "llama", _int(data, "num_hidden_layers", source), h, heads, _int(data, "vocab_size", source),
        _int(data, "max_position_embeddings", source, default=4096),
        ffn_hidden_size=_int(data, "intermediate_size", source, default=4 * h),
        num_kv_heads=_int(data, "num_key_value_heads", source, default=heads),
        tied_embeddings=_bool(data, "tie_word_embeddings", source, False), activation="swiglu", norm="rmsnorm",
        bias=_bool(data, "attention_bias", source, False), learned_positions=False, dropout=False,
        head_size=head_size)


def _opt(data: dict, source: str) -> TransformerConfig:
    h = _int(data, "hidden_size", source)
    return TransformerConfig(
        "opt", _int(data, "num_hidden_layers", source), h, _int(data, "num_attention_heads", source),
        _int(data, "vocab_size", source), _int(data, "max_position_embeddings", source, default=2048),
        ffn_hidden_size=_int(data, "ffn_dim", source, default=4 * h), activation="relu",
        embed_dim=_int(data, "word_embed_proj_dim", source, default=h), position_offset=2,
        final_norm=_bool(data, "do_layer_norm_before", source, True),
        tied_embeddings=_bool(data, "tie_word_embeddings", source, True))


def _bert(data: dict, source: str) -> TransformerConfig:
    h = _int(data, "hidden_size", source)
    return TransformerConfig(
        "bert", _int(data, "num_hidden_layers", source), h, _int(data, "num_attention_heads", source),
        _int(data, "vocab_size", source), _int(data, "max_position_embeddings", source, default=512),
        ffn_hidden_size=_int(data, "intermediate_size", source, default=4 * h), final_norm=False)
