"""A config.json without ``model_type`` is read by its keys' shape, and hetpart says when it assumed a Llama block.

transformers' AutoConfig refuses such a file; hetpart reads it (Llama keys as a Llama block, GPT-2's own key names
n_embd/n_layer/n_head as GPT-2, without a note: they name the architecture) but a GeLU or parallel block read as a
Llama one would be priced wrongly without a word, so one note names the assumption.
"""

from __future__ import annotations

import warnings

import pytest

from hetpart.graph.hf_config import hf_config_to_transformer
from hetpart.graph.load import ModelNote

LLAMA_KEYS = {"hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 16,
              "intermediate_size": 2816, "vocab_size": 32000, "max_position_embeddings": 2048,
              "tie_word_embeddings": False}
GPT2_KEYS = {"n_embd": 768, "n_layer": 2, "n_head": 12, "n_positions": 1024, "vocab_size": 50257}


def _notes(config: dict) -> tuple[object, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = hf_config_to_transformer(config, "c.json")
    return cfg, [str(w.message) for w in caught if issubclass(w.category, ModelNote)]


def test_llama_keys_without_model_type_say_they_are_read_as_a_llama_block() -> None:
    cfg, notes = _notes(LLAMA_KEYS)
    assert cfg.family == "llama"
    said = "c.json: model_type not set; read as a Llama block (RMSNorm, SwiGLU, rotary)"
    assert sum(n.startswith(said) for n in notes) == 1, notes


def test_gpt2_keys_without_model_type_are_gpt2_without_a_note() -> None:
    cfg, notes = _notes(GPT2_KEYS)
    assert cfg.family == "gpt2" and not [n for n in notes if "model_type" in n], notes


@pytest.mark.parametrize("config", [LLAMA_KEYS | {"model_type": "llama"}, GPT2_KEYS | {"model_type": "gpt2"}])
def test_a_config_naming_its_type_gets_no_such_note(config: dict) -> None:
    _, notes = _notes(config)
    assert not [n for n in notes if "model_type not set" in n], notes
