"""What a Hugging Face config.json that leaves a key out means, and the messages of unreadable config files.

A left-out key is what transformers builds from the same file: its configuration class's default for the
model_type. Where that default is a fixed number of one published model (LlamaConfig's intermediate_size
11008 is Llama 7B's), the MLP's width is refused rather than taken; the Llama family's position limit, key/value
heads and head width are taken with one ``hetpart: note:`` line naming the key and the value. GPT-2's n_inner
stays 4 * n_embd, as transformers derives it. The defaults are checked against the installed transformers.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from hetpart import ModelError
from hetpart.graph.hf_config import hf_config_to_transformer, read_hf_config
from hetpart.graph.load import ModelNote
from hetpart.graph.transformer import transformer_graph
from tests._cli import run_cli

LLAMA3_8B = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
             "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
             "max_position_embeddings": 8192, "tie_word_embeddings": False, "architectures": ["LlamaForCausalLM"]}
GPT2 = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024, "vocab_size": 50257}


def _without(config: dict, *keys: str) -> dict:
    return {k: v for k, v in config.items() if k not in keys}


def _write(tmp_path: Path, config: dict | str, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(config if isinstance(config, str) else json.dumps(config), encoding="utf-8")
    return path


def _refused(capsys, path: Path | str) -> str:
    """The one stderr line of ``inspect model`` refusing ``path`` with exit code 2."""
    code, out, err = run_cli(capsys, "inspect", "model", str(path))
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hetpart: error: "), err
    return lines[0]


# ------------------------------------------------------------------------------------------- left-out keys
def test_llama_without_intermediate_size_is_refused_not_guessed(capsys, tmp_path: Path) -> None:
    """It was read as 4 * hidden_size = 16384 (8.84B parameters for Llama 3 8B's shape; transformers would build
    LlamaConfig's 11008): neither is this model's width."""
    path = _write(tmp_path, _without(LLAMA3_8B, "intermediate_size"))
    line = _refused(capsys, path)
    assert f"{path}: intermediate_size: missing required field" in line
    assert "add the model's own value" in line and "LlamaConfig default, 11008" in line
    with pytest.raises(ModelError, match="intermediate_size: missing required field"):
        hf_config_to_transformer(LLAMA3_8B | {"intermediate_size": None}, "x")


@pytest.mark.parametrize(("model_type", "key"), [("mistral", "intermediate_size"), ("qwen2", "intermediate_size"),
                                                 ("gemma", "intermediate_size"), ("gpt_neox", "intermediate_size"),
                                                 ("phi", "intermediate_size"), ("starcoder2", "intermediate_size"),
                                                 ("opt", "ffn_dim"), ("bert", "intermediate_size")])
def test_an_mlp_width_with_a_fixed_transformers_default_is_required(model_type: str, key: str) -> None:
    config = _without(LLAMA3_8B, "intermediate_size", "num_key_value_heads", "architectures") | {
        "model_type": model_type, "num_key_value_heads": 8}
    with pytest.raises(ModelError, match=rf"^x: {key}: missing required field \(the width of the MLP\)"):
        hf_config_to_transformer(config, "x")


def test_gpt2_n_inner_stays_four_times_the_width_without_a_note() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert hf_config_to_transformer(GPT2, "x").ffn == 4 * 768


def test_llama_without_max_position_embeddings_takes_transformers_default_and_says_so(capsys, tmp_path: Path) -> None:
    """It was 4096, silently; transformers' LlamaConfig builds 2048."""
    path = _write(tmp_path, _without(LLAMA3_8B, "max_position_embeddings"))
    code, out, err = run_cli(capsys, "inspect", "model", str(path), "--json")
    assert code == 0, err
    assert json.loads(out)["arch"]["max_positions"] == 2048
    assert err.strip() == (f"hetpart: note: {path}: max_position_embeddings not set; taking 2048 (the default of "
                           "transformers' LlamaConfig)")


def test_left_out_keys_take_the_transformers_default_of_each_model_type() -> None:
    """max_position_embeddings, num_key_value_heads, head_dim and tie_word_embeddings, where a config of each
    Llama-like type leaves them out, are what transformers' class for the type builds (Mistral: 8 key/value
    heads, not one per attention head; Gemma: heads 256 wide; Qwen2: 32768 positions)."""
    transformers = pytest.importorskip("transformers")
    base = {"hidden_size": 4096, "num_hidden_layers": 2, "num_attention_heads": 32, "intermediate_size": 11008,
            "vocab_size": 32000}
    for model_type in ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "olmo", "olmo2",
                       "granite", "phi3", "stablelm", "cohere"):
        hf = transformers.AutoConfig.for_model(model_type, **base)
        with pytest.warns(ModelNote) as notes:
            cfg = hf_config_to_transformer(base | {"model_type": model_type}, "x")
        said = " | ".join(str(n.message) for n in notes)
        assert cfg.max_positions == hf.max_position_embeddings, model_type
        assert cfg.kv_heads == hf.num_key_value_heads, model_type
        assert cfg.head_dim == (getattr(hf, "head_dim", None) or 4096 // 32), model_type
        assert cfg.tied_embeddings is hf.tie_word_embeddings, model_type
        for key, value in [("max_position_embeddings", hf.max_position_embeddings),
                           ("num_key_value_heads", hf.num_key_value_heads),
                           ("tie_word_embeddings", str(hf.tie_word_embeddings).lower())]:
            assert f"x: {key} not set; taking {value} (" in said, (model_type, said)


def test_mistral_without_num_key_value_heads_counts_its_eight_heads() -> None:
    mistral = _without(LLAMA3_8B, "num_key_value_heads", "architectures") | {"model_type": "mistral"}
    with pytest.warns(ModelNote, match=r"^x: num_key_value_heads not set; taking 8 \(the default of transformers' "
                                       r"MistralConfig\)$"):
        cfg = hf_config_to_transformer(mistral, "x")
    assert cfg.kv_heads == 8
    assert transformer_graph(cfg, "m", 16).num_params == transformer_graph(
        hf_config_to_transformer(LLAMA3_8B, "y"), "l", 16).num_params


def test_a_transformers_default_that_cannot_be_built_is_refused() -> None:
    """Qwen2Config's 32 key/value heads do not divide 16 attention heads: transformers would build nonsense."""
    qwen = _without(LLAMA3_8B, "num_key_value_heads") | {"model_type": "qwen2", "num_attention_heads": 16}
    with pytest.raises(ModelError, match=r"^x: num_key_value_heads: not set, and transformers' Qwen2Config default, "
                                         r"32 key/value heads, does not divide the 16 attention heads"):
        hf_config_to_transformer(qwen, "x")


def test_a_gemma_config_without_head_dim_has_heads_256_wide() -> None:
    gemma = {"model_type": "gemma", "hidden_size": 3072, "num_attention_heads": 16, "num_key_value_heads": 16,
             "intermediate_size": 24576, "num_hidden_layers": 28, "vocab_size": 256000, "max_position_embeddings": 8192}
    with pytest.warns(ModelNote, match=r"x: head_dim not set; taking 256 \(the default of transformers' GemmaConfig\)"):
        cfg = hf_config_to_transformer(gemma, "x")
    assert transformer_graph(cfg, "gemma-7b", 16).num_params == 8_537_680_896  # the model card's Gemma 7B


# ---------------------------------------------------------------------------------------- file messages
def test_an_unknown_layer_type_is_one_clear_sentence(capsys, tmp_path: Path) -> None:
    gemma3 = {"model_type": "gemma3_text", "hidden_size": 2560, "num_hidden_layers": 2, "num_attention_heads": 8,
              "num_key_value_heads": 4, "head_dim": 256, "intermediate_size": 10240, "vocab_size": 262208,
              "max_position_embeddings": 8192, "tie_word_embeddings": True, "sliding_window": 512,
              "layer_types": ["sliding_attention", "bogus"]}
    path = _write(tmp_path, gemma3)
    assert _refused(capsys, path) == (f"hetpart: error: {path}: layer_types[1]: 'bogus' is not an attention type "
                                      "hetpart knows; use sliding_attention or full_attention")


def test_a_device_is_not_called_missing(capsys) -> None:
    line = _refused(capsys, "/dev/null")
    assert "'/dev/null': not a regular file" in line and "no such file" not in line


def test_an_empty_config_says_it_is_empty(capsys, tmp_path: Path) -> None:
    for text in ("", " \n"):
        path = _write(tmp_path, text)
        assert _refused(capsys, path) == (f"hetpart: error: {path}: the file is empty; give the path of a Hugging "
                                          "Face config.json")


def test_a_utf8_bom_is_read_as_utf8_sig(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(GPT2).encode())
    assert read_hf_config(path) == hf_config_to_transformer(GPT2, str(path))


def test_a_repeated_key_is_refused_naming_it(capsys, tmp_path: Path) -> None:
    """JSON readers take the last value silently; the YAML inputs refuse a repeated key, and so does config.json."""
    path = _write(tmp_path, '{"model_type": "gpt2", "n_embd": 768, "n_embd": 1024, "n_layer": 12, "n_head": 16, '
                            '"n_positions": 1024, "vocab_size": 50257}')
    assert _refused(capsys, path) == (f"hetpart: error: {path}: n_embd: this key appears twice in one JSON object "
                                      "(a JSON reader would silently take the last value); keep one")
    nested = _write(tmp_path, '{"model_type": "mpt", "d_model": 4096, "n_heads": 32, "n_layers": 32, '
                              '"vocab_size": 50432, "attn_config": {"alibi": true, "alibi": false}}', "mpt.json")
    with pytest.raises(ModelError, match=r"mpt.json: alibi: this key appears twice"):
        read_hf_config(nested)


def test_a_refused_config_gives_its_error_line_alone(capsys, tmp_path: Path) -> None:
    """The notes of keys left out come only when the whole config reads through."""
    path = _write(tmp_path, _without(LLAMA3_8B, "max_position_embeddings", "tie_word_embeddings")
                  | {"num_key_value_heads": []})
    assert _refused(capsys, path).endswith("num_key_value_heads: expected a whole number, got []")
