"""A classifier head (reward models: ``*ForSequenceClassification``) in the cost model and the runtime: its working
memory is its labels', not the vocabulary's, and ``hetpart run`` refuses it (its runners build a language-model head)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetpart import ModelError
from hetpart.costmodel.activations import unit_working_bytes
from hetpart.graph.hf_config import hf_config_to_transformer
from hetpart.graph.transformer import transformer_graph
from hetpart.runtime.models import runnable_spec

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 1024, "intermediate_size": 2816,
         "num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 4, "vocab_size": 32000,
         "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}
REWARD = LLAMA | {"architectures": ["LlamaForSequenceClassification"], "num_labels": 1}


def _graph(data: dict):
    return transformer_graph(hf_config_to_transformer(data, "c.json"), "m", 512)


def test_a_classifier_heads_working_memory_is_its_labels() -> None:
    lm, reward = _graph(LLAMA), _graph(REWARD)
    head_lm, head_reward = unit_working_bytes(lm, "none")[-1], unit_working_bytes(reward, "none")[-1]
    assert head_reward * 1000 < head_lm  # 8 bytes x 1 label x 512 tokens against 8 x 32,000 x 512
    assert unit_working_bytes(lm, "none")[1] == unit_working_bytes(reward, "none")[1]  # the blocks are the same


def test_run_refuses_a_classifier_head(tmp_path: Path) -> None:
    path = tmp_path / "reward" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(REWARD))
    with pytest.raises(ModelError, match="sequence-classification head \\(1 label\\).*does not build"):
        runnable_spec(str(path), "tiny")
    path.write_text(json.dumps(LLAMA))
    assert runnable_spec(str(path), "tiny").config.head_task == "lm"
