"""Hugging Face config.json files of the GPT-2 and Llama families become transformer graphs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetpart import ModelError, load_model
from hetpart.graph.hf_config import hf_config_to_transformer, read_hf_config
from hetpart.graph.load import resolve_transformer
from hetpart.graph.transformer import transformer_graph

# The published config.json files (keys that do not change the shape trimmed).
GPT2_CONFIG = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768,
               "n_head": 12, "n_inner": None, "n_layer": 12, "n_positions": 1024, "vocab_size": 50257,
               "activation_function": "gelu_new", "layer_norm_epsilon": 1e-05}
LLAMA2_7B_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
                    "intermediate_size": 11008, "max_position_embeddings": 4096, "num_attention_heads": 32,
                    "num_hidden_layers": 32, "num_key_value_heads": 32, "rms_norm_eps": 1e-05,
                    "tie_word_embeddings": False, "vocab_size": 32000, "hidden_act": "silu"}
LLAMA2_70B_CONFIG = LLAMA2_7B_CONFIG | {"hidden_size": 8192, "intermediate_size": 28672, "num_attention_heads": 64,
                                        "num_hidden_layers": 80, "num_key_value_heads": 8}


def _write(tmp_path: Path, data, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("config, catalog", [(GPT2_CONFIG, "gpt2-small"), (LLAMA2_7B_CONFIG, "llama2-7b"),
                                             (LLAMA2_70B_CONFIG, "llama2-70b")])
def test_published_configs_match_the_catalog(tmp_path: Path, config: dict, catalog: str) -> None:
    path = _write(tmp_path, config)
    from_file = load_model(str(path), seq_len=256)
    from_catalog = load_model(catalog, seq_len=256)
    assert from_file.num_params == from_catalog.num_params
    assert from_file.units == from_catalog.units
    assert from_file.source == str(path)


def test_directory_with_config_json_is_accepted(tmp_path: Path) -> None:
    folder = tmp_path / "my-llama"
    folder.mkdir()
    _write(folder, LLAMA2_7B_CONFIG)
    name, cfg, source = resolve_transformer(str(folder))
    assert name == "my-llama" and source.endswith("config.json") and cfg.family == "llama"
    assert load_model(str(folder), seq_len=64).name == "my-llama"


def test_gpt2_defaults_and_n_inner() -> None:
    cfg = hf_config_to_transformer(GPT2_CONFIG, "gpt2.json")
    assert (cfg.family, cfg.num_layers, cfg.hidden_size, cfg.num_heads) == ("gpt2", 12, 768, 12)
    assert cfg.ffn == 4 * 768 and cfg.tied_embeddings and cfg.learned_positions
    wide = hf_config_to_transformer(GPT2_CONFIG | {"n_inner": 1000}, "gpt2.json")
    assert wide.ffn == 1000
    small = {"n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 100}  # no model_type, no n_positions
    assert hf_config_to_transformer(small, "x").max_positions == 1024


def test_n_inner_changes_exactly_the_mlp_params() -> None:
    base = hf_config_to_transformer(GPT2_CONFIG, "a")
    wide = hf_config_to_transformer(GPT2_CONFIG | {"n_inner": 4 * 768 + 100}, "b")
    from hetpart.graph.transformer import transformer_graph

    diff = transformer_graph(wide, "b", 16).num_params - transformer_graph(base, "a", 16).num_params
    # Per layer: fc weight h x 100, its bias 100, proj weight 100 x h.
    assert diff == 12 * (2 * 768 * 100 + 100)


def test_llama_gqa_and_swiglu() -> None:
    cfg = hf_config_to_transformer(LLAMA2_70B_CONFIG, "70b.json")
    assert (cfg.num_heads, cfg.kv_heads, cfg.kv_dim) == (64, 8, 1024)
    assert cfg.activation == "swiglu" and cfg.norm == "rmsnorm" and not cfg.bias and not cfg.tied_embeddings
    mha = hf_config_to_transformer({k: v for k, v in LLAMA2_7B_CONFIG.items() if k != "num_key_value_heads"}, "x")
    assert mha.kv_heads == 32
    # GQA shrinks k/v projections: 2 * h * (h - kv_dim) fewer weights per layer than MHA.
    from hetpart.graph.transformer import transformer_graph

    mha70 = hf_config_to_transformer(LLAMA2_70B_CONFIG | {"num_key_value_heads": 64}, "x")
    delta = transformer_graph(mha70, "m", 16).num_params - transformer_graph(cfg, "g", 16).num_params
    assert delta == 80 * 2 * 8192 * (8192 - 1024)


def test_tied_embeddings_count_the_table_once() -> None:
    from hetpart.graph.transformer import transformer_graph

    untied = hf_config_to_transformer(LLAMA2_7B_CONFIG, "x")
    tied = hf_config_to_transformer(LLAMA2_7B_CONFIG | {"tie_word_embeddings": True}, "x")
    g_untied, g_tied = transformer_graph(untied, "u", 16), transformer_graph(tied, "t", 16)
    assert g_untied.num_params - g_tied.num_params == 32000 * 4096
    head = g_tied.units[-1]
    assert head.shared_params == 32000 * 4096
    # A stage holding the head without the embedding keeps its own copy of the tied table.
    assert g_tied.range_params(33, 34) == head.params + head.shared_params
    assert g_tied.range_params(0, 34) == g_tied.num_params


def test_head_dim_apart_from_the_width_is_modelled() -> None:
    """Gemma and Qwen3 set head_dim apart from hidden_size / heads: queries and the attention output are
    heads x head_dim wide. Parameter counts against the published ones (Hugging Face model cards: Gemma 7B
    8,537,680,896; Qwen3-4B 4,022,468,096, whose q/k norms, 2 x 128 per layer, hetpart leaves out)."""
    assert hf_config_to_transformer(LLAMA2_7B_CONFIG | {"head_dim": 128}, "x").head_size == 0
    gemma = hf_config_to_transformer({"model_type": "gemma", "hidden_size": 3072, "num_attention_heads": 16,
                                      "num_key_value_heads": 16, "head_dim": 256, "intermediate_size": 24576,
                                      "num_hidden_layers": 28, "vocab_size": 256000, "tie_word_embeddings": True}, "g")
    assert (gemma.head_dim, gemma.q_dim, gemma.kv_dim) == (256, 4096, 4096)
    assert transformer_graph(gemma, "gemma-7b", 16).num_params == 8_537_680_896
    qwen3 = hf_config_to_transformer({"model_type": "qwen3", "hidden_size": 2560, "num_attention_heads": 32,
                                      "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 9728,
                                      "num_hidden_layers": 36, "vocab_size": 151936, "tie_word_embeddings": True}, "q")
    assert transformer_graph(qwen3, "qwen3-4b", 16).num_params == 4_022_468_096 - 36 * 2 * 128
    # the block's forward: q and output projections and the attention core at q_dim = 4096, not 2560
    s, h, q, kv, f = 16, 2560, 4096, 1024, 9728
    block = transformer_graph(qwen3, "q", s).units[1]
    assert block.fwd_flops == 2 * s * h * (q + 2 * kv) + 4 * s * s * q + 2 * s * q * h + 2 * s * h * f * 3
    with pytest.raises(ModelError, match=r"x.json: num_attention_heads: 30 heads do not divide hidden_size 4096; add head_dim"):
        hf_config_to_transformer(LLAMA2_7B_CONFIG | {"num_attention_heads": 30, "num_key_value_heads": 30}, "x.json")


def test_llama_like_model_types() -> None:
    for model_type in ("mistral", "qwen2"):
        assert hf_config_to_transformer(LLAMA2_7B_CONFIG | {"model_type": model_type}, "x").family == "llama"


def test_agrees_with_transformers_parameter_count() -> None:
    """The reader and the analytic formulas count what transformers builds (meta device, no weights)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from hetpart.graph.transformer import transformer_graph

    cases = [
        (transformers.GPT2Config, transformers.GPT2LMHeadModel,
         {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 128, "vocab_size": 1000, "n_inner": 96}),
        (transformers.LlamaConfig, transformers.LlamaForCausalLM,
         {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2,
          "intermediate_size": 160, "vocab_size": 1000, "max_position_embeddings": 256}),
        (transformers.LlamaConfig, transformers.LlamaForCausalLM,
         {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 8, "intermediate_size": 160,
          "vocab_size": 1000, "max_position_embeddings": 256, "tie_word_embeddings": True}),
    ]
    for config_cls, model_cls, kwargs in cases:
        config = config_cls(**kwargs, bos_token_id=0, eos_token_id=0)
        with torch.device("meta"):
            model = model_cls(config)
        expected = sum(p.numel() for p in model.parameters())  # tied parameters appear once
        ours = transformer_graph(hf_config_to_transformer(config.to_dict(), "x"), "x", 16).num_params
        assert ours == expected, (config_cls.__name__, kwargs)


# ------------------------------------------------------------------------------------------ errors


@pytest.mark.parametrize("data, match", [
    ({"n_embd": 64, "n_layer": 2, "n_head": 4}, r"c.json: vocab_size: missing required field; add it"),
    ({"model_type": "gpt2", "n_layer": 2}, r"c.json: n_embd: missing required field"),
    (LLAMA2_7B_CONFIG | {"num_hidden_layers": 0}, r"c.json: num_hidden_layers: must be >= 1, got 0"),
    (LLAMA2_7B_CONFIG | {"num_hidden_layers": 10**6}, r"num_hidden_layers: 1000000 is absurdly large"),
    (LLAMA2_7B_CONFIG | {"hidden_size": 4096.5}, r"hidden_size: 4096.5 is not a whole number; use 4096 or 4097$"),
    (LLAMA2_7B_CONFIG | {"vocab_size": "32000"}, r"vocab_size: expected a whole number, got '32000'"),
    (LLAMA2_7B_CONFIG | {"num_attention_heads": 31}, r"c.json: num_attention_heads: 31 heads do not divide hidden_size 4096; add head_dim"),
    (LLAMA2_7B_CONFIG | {"num_key_value_heads": 5}, r"c.json: num_key_value_heads: 5 key/value heads do not divide the 32 attention heads \(num_attention_heads\); "
         r"use one of 1, 2, 4, 8, 16, 32"),
    (LLAMA2_7B_CONFIG | {"tie_word_embeddings": "false"}, r"tie_word_embeddings: expected true or false, got 'false'"),
    (GPT2_CONFIG | {"n_head": 7}, r"c.json: n_head: 7 heads do not divide n_embd 768; use a divisor of 768 such as 6 or 8"),
    ({"model_type": "t5", "d_model": 512}, r"c.json: model_type: 't5' is not supported; supported model types: gpt2, llama, .*opt, bert"),
    ({}, r"model_type '\(missing\)' is not a GPT-2"),
    ([1, 2], r"c.json: expected a mapping"),
])
def test_bad_configs_are_one_clear_model_error(data, match: str) -> None:
    with pytest.raises(ModelError, match=match) as info:
        hf_config_to_transformer(data, "c.json")
    assert "\n" not in str(info.value)


def test_bad_config_files(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text('{"n_embd": 64,,}')
    with pytest.raises(ModelError, match=r"broken.json: invalid JSON at line 1, column \d+"):
        read_hf_config(broken)
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe\x00garbage\x80")
    with pytest.raises(ModelError, match=r"binary.json: cannot read the config: not UTF-8 text; check the path"):
        read_hf_config(binary)
    huge = tmp_path / "huge.json"
    huge.write_text('{"n_embd": ' + "9" * 5000 + "}")
    with pytest.raises(ModelError, match=r"huge.json: unreadable JSON value"):
        read_hf_config(huge)
    with pytest.raises(ModelError, match=r"--model: .*nope.json': no such file"):
        load_model(str(tmp_path / "nope.json"))


def test_load_model_arguments() -> None:
    with pytest.raises(ModelError, match=r"--seq-len: 2048 exceeds the 1024 learned positions of gpt2-small"):
        load_model("gpt2-small", seq_len=2048)
    with pytest.raises(ModelError, match=r"--seq-len: must be a whole number between 1 and 1e7, got 0"):
        load_model("gpt2-small", seq_len=0)
    with pytest.raises(ModelError, match=r"--precision: unknown precision 'int4'"):
        load_model("gpt2-small", precision="int4")
    assert load_model("llama2-7b").seq_len == 2048 and load_model("gpt2-small").seq_len == 1024
    assert load_model("gpt2-small", seq_len=64, precision="fp32").dtype_bytes == 4
