"""What a Hugging Face ``config.json`` says beyond a family's shape: the attention's sliding windows per layer
and the task of the output head. :mod:`hetpart.graph.hf_config` reads the shape and applies these to it."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from hetpart import _validate as v
from hetpart.errors import ModelError
from hetpart.graph.transformer import TransformerConfig

__all__ = ["sliding_windows", "with_head_task", "whole_number"]


def whole_number(value: Any, source: str, key: str, *, minimum: int = 1, maximum: int = 10**7) -> int:
    """An integer field of a config.json. A float with no fraction (``4096.0``, as some converters and
    hand-edited files write it) is that integer, as Python's JSON reader cannot tell them apart by intent;
    one with a fraction is refused, naming the two whole numbers around it."""
    if isinstance(value, float) and math.isfinite(value):
        if not value.is_integer():
            raise v.fail(ModelError, source, key, f"{value!r} is not a whole number; use {math.floor(value)} or "
                         f"{math.ceil(value)}")
        value = int(value)
    return v.integer(ModelError, value, source, key, minimum=minimum, maximum=maximum)

_WINDOW_DEFAULTS = {"mistral": 4096, "gemma2": 4096, "gemma3_text": 4096}
"""transformers' ``sliding_window`` where a config of these types leaves the key out."""
_WINDOW_OFF_BY_DEFAULT = {"qwen2", "qwen3"}
"""Types whose ``use_sliding_window`` defaults to false (Qwen2/2.5 and Qwen3 ship ``sliding_window`` unused)."""
_LAYER_KINDS = {"sliding_attention": True, "full_attention": False}
_MAX_WINDOW = 2**31 - 1


def sliding_windows(data: dict, source: str, model_type: str, layers: int) -> tuple[int, ...]:
    """Each layer's causal window (0: full attention) as transformers builds the model, or ``()`` when no
    layer has one. The window is ``sliding_window`` (null: none), unless ``use_sliding_window`` is false;
    the layers it applies to are ``layer_types`` where the config lists them, else the type's rule: Gemma 2
    every other layer from the first, Gemma 3 all but every ``sliding_window_pattern``-th (6), Qwen2/Qwen3
    the layers from ``max_window_layers`` on, every layer elsewhere (Mistral, StarCoder2, Phi-3)."""
    window = data["sliding_window"] if "sliding_window" in data else _WINDOW_DEFAULTS.get(model_type)
    if window is None:
        return ()
    window = whole_number(window, source, "sliding_window", maximum=_MAX_WINDOW)
    use = data.get("use_sliding_window")
    if not (model_type not in _WINDOW_OFF_BY_DEFAULT if use is None
            else v.boolean(ModelError, use, source, "use_sliding_window")):
        return ()
    if data.get("layer_types") is not None:
        local = _layer_types(data["layer_types"], source, layers)
    elif model_type == "gemma2":
        local = [i % 2 == 0 for i in range(layers)]
    elif model_type == "gemma3_text":
        key = "sliding_window_pattern" if data.get("sliding_window_pattern") is not None else "_sliding_window_pattern"
        pattern = whole_number(data.get(key, 6) or 6, source, key, maximum=10_000)
        local = [(i + 1) % pattern != 0 for i in range(layers)]
    elif model_type in _WINDOW_OFF_BY_DEFAULT:
        first = data.get("max_window_layers")
        first = 28 if first is None else whole_number(first, source, "max_window_layers", minimum=0,
                                                   maximum=10_000)
        local = [i >= first for i in range(layers)]
    else:
        local = [True] * layers
    return tuple(window if is_local else 0 for is_local in local) if any(local) else ()


def _layer_types(value: Any, source: str, layers: int) -> list[bool]:
    """Whether each layer of ``layer_types`` is a sliding-window one."""
    if not isinstance(value, list) or len(value) != layers:
        raise v.fail(ModelError, source, "layer_types", f"expected a list of {layers} entries (one per layer, "
                     f"num_hidden_layers), got {v.kind(value) if not isinstance(value, list) else len(value)}")
    for i, kind in enumerate(value):
        if kind not in _LAYER_KINDS:
            raise v.fail(ModelError, source, f"layer_types[{i}]", f"{v.show(kind)} is not an attention type "
                         "hetpart knows; use sliding_attention or full_attention")
    return [_LAYER_KINDS[kind] for kind in value]


_HEAD_TASKS = {"ForSequenceClassification": "sequence_classification",
               "ForTokenClassification": "token_classification"}


def with_head_task(cfg: TransformerConfig, data: dict, source: str) -> TransformerConfig:
    """``cfg`` with the classification head that ``architectures`` names (``LlamaForSequenceClassification``:
    a reward model, ``num_labels`` 1), untied; unchanged for a language model."""
    arch = data.get("architectures")
    names = [a for a in arch if isinstance(a, str)] if isinstance(arch, list) else []
    task = next((t for suffix, t in _HEAD_TASKS.items() for a in names if a.endswith(suffix)), None)
    if task is None:
        return cfg
    labels = data.get("num_labels")
    if labels is None:  # transformers: the id2label mapping's size, 2 without one
        id2label = data.get("id2label")
        labels = len(id2label) if isinstance(id2label, dict) and id2label else 2
    labels = whole_number(labels, source, "num_labels", maximum=10**7)
    return replace(cfg, head_task=task, num_labels=labels, tied_embeddings=False)
