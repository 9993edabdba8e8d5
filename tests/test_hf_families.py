"""Hugging Face config.json files of dense decoder families beyond GPT-2/Llama/OPT/BERT: Llama-shaped ones
(Gemma 2/3, OLMo, OLMo 2, Granite, Phi-3, StableLM, Cohere) and other GPT lineages (GPT-NeoX, Falcon, Phi,
StarCoder2, BLOOM, MPT, GPT-BigCode, GPT-J) map to the published parameter counts; mixture-of-experts configs
are refused with one line naming the key.

The configs are the published config.json files' shape keys. The published counts are the models' Hugging Face
pages (safetensors parameter count) or model cards; each was also checked against the model transformers builds
from the same config on the meta device (they agree exactly where the text says "= transformers")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetpart import ModelError, load_model
from hetpart.graph.hf_config import hf_config_to_transformer
from hetpart.graph.transformer import transformer_graph
from tests._cli import cli_json

PYTHIA_1B = {"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox", "hidden_size": 2048,
             "intermediate_size": 8192, "num_attention_heads": 8, "num_hidden_layers": 16, "vocab_size": 50304,
             "max_position_embeddings": 2048, "rotary_pct": 0.25, "tie_word_embeddings": False,
             "use_parallel_residual": True, "hidden_act": "gelu", "hidden_dropout": 0.0, "attention_dropout": 0.0}
FALCON_7B = {"architectures": ["FalconForCausalLM"], "model_type": "falcon", "alibi": False, "bias": False,
             "hidden_size": 4544, "multi_query": True, "new_decoder_architecture": False, "num_attention_heads": 71,
             "num_hidden_layers": 32, "parallel_attn": True, "vocab_size": 65024, "hidden_dropout": 0.0,
             "attention_dropout": 0.0}
FALCON_40B = {"architectures": ["FalconForCausalLM"], "model_type": "falcon", "alibi": False, "bias": False,
              "hidden_size": 8192, "new_decoder_architecture": True, "num_attention_heads": 128,
              "num_hidden_layers": 60, "num_kv_heads": 8, "parallel_attn": True, "vocab_size": 65024}
PHI_2 = {"architectures": ["PhiForCausalLM"], "model_type": "phi", "hidden_size": 2560, "intermediate_size": 10240,
         "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": None, "vocab_size": 51200,
         "max_position_embeddings": 2048, "partial_rotary_factor": 0.4, "tie_word_embeddings": False,
         "hidden_act": "gelu_new", "resid_pdrop": 0.1, "embd_pdrop": 0.0, "attention_dropout": 0.0}
STARCODER2_3B = {"architectures": ["Starcoder2ForCausalLM"], "model_type": "starcoder2", "hidden_size": 3072,
                 "intermediate_size": 12288, "num_hidden_layers": 30, "num_attention_heads": 24,
                 "num_key_value_heads": 2, "vocab_size": 49152, "max_position_embeddings": 16384, "use_bias": True,
                 "hidden_act": "gelu_pytorch_tanh", "residual_dropout": 0.1, "embedding_dropout": 0.1,
                 "attention_dropout": 0.1}
STARCODER2_7B = STARCODER2_3B | {"hidden_size": 4608, "intermediate_size": 18432, "num_hidden_layers": 32,
                                 "num_attention_heads": 36, "num_key_value_heads": 4}
BLOOM_560M = {"architectures": ["BloomForCausalLM"], "model_type": "bloom", "n_embed": 1024, "n_layer": 24,
              "num_attention_heads": 16, "vocab_size": 250880, "hidden_dropout": 0.0, "attention_dropout": 0.0}
BLOOM_7B1 = {"architectures": ["BloomForCausalLM"], "model_type": "bloom", "hidden_size": 4096, "n_layer": 30,
             "n_head": 32, "vocab_size": 250880, "hidden_dropout": 0.0, "attention_dropout": 0.0}
MPT_7B = {"architectures": ["MPTForCausalLM"], "model_type": "mpt", "d_model": 4096, "n_heads": 32, "n_layers": 32,
          "expansion_ratio": 4, "max_seq_len": 2048, "vocab_size": 50432, "no_bias": True, "learned_pos_emb": True,
          "resid_pdrop": 0, "emb_pdrop": 0,
          "attn_config": {"alibi": True, "attn_pdrop": 0, "attn_type": "multihead_attention", "qk_ln": False}}
STARCODER = {"architectures": ["GPTBigCodeForCausalLM"], "model_type": "gpt_bigcode", "n_embd": 6144, "n_head": 48,
             "n_inner": 24576, "n_layer": 40, "n_positions": 8192, "vocab_size": 49152, "multi_query": True,
             "activation_function": "gelu_pytorch_tanh", "attn_pdrop": 0.1, "embd_pdrop": 0.1, "resid_pdrop": 0.1}
GPTJ_6B = {"architectures": ["GPTJForCausalLM"], "model_type": "gptj", "n_embd": 4096, "n_head": 16, "n_layer": 28,
           "n_positions": 2048, "rotary_dim": 64, "vocab_size": 50400, "n_inner": None, "tie_word_embeddings": False,
           "activation_function": "gelu_new", "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
GEMMA2_9B = {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "hidden_size": 3584,
             "intermediate_size": 14336, "num_hidden_layers": 42, "num_attention_heads": 16, "num_key_value_heads": 8,
             "head_dim": 256, "vocab_size": 256000, "max_position_embeddings": 8192, "hidden_activation": "gelu_pytorch_tanh"}
GEMMA3_1B = {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 1152,
             "intermediate_size": 6912, "num_hidden_layers": 26, "num_attention_heads": 4, "num_key_value_heads": 1,
             "head_dim": 256, "vocab_size": 262144, "max_position_embeddings": 32768}
OLMO_7B = {"architectures": ["OlmoForCausalLM"], "model_type": "olmo", "hidden_size": 4096, "intermediate_size": 11008,
           "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 50304,
           "max_position_embeddings": 2048, "tie_word_embeddings": False, "attention_bias": False}
OLMO2_7B = OLMO_7B | {"architectures": ["Olmo2ForCausalLM"], "model_type": "olmo2", "vocab_size": 100352,
                      "max_position_embeddings": 4096}
GRANITE_8B = {"architectures": ["GraniteForCausalLM"], "model_type": "granite", "hidden_size": 4096,
              "intermediate_size": 12800, "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 8,
              "vocab_size": 49155, "max_position_embeddings": 4096, "tie_word_embeddings": True,
              "attention_bias": False}
PHI3_MINI = {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192,
             "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32064,
             "max_position_embeddings": 4096, "tie_word_embeddings": False}
STABLELM2_1_6B = {"architectures": ["StableLmForCausalLM"], "model_type": "stablelm", "hidden_size": 2048,
                  "intermediate_size": 5632, "num_hidden_layers": 24, "num_attention_heads": 32,
                  "num_key_value_heads": 32, "vocab_size": 100352, "max_position_embeddings": 4096,
                  "use_qkv_bias": True, "tie_word_embeddings": False}
COMMAND_R = {"architectures": ["CohereForCausalLM"], "model_type": "cohere", "hidden_size": 8192,
             "intermediate_size": 22528, "num_hidden_layers": 40, "num_attention_heads": 64, "num_key_value_heads": 64,
             "vocab_size": 256000, "max_position_embeddings": 8192, "use_qk_norm": False}

# name, config, published parameter count, (family, activation, norm, kv heads, tied)
CASES = [
    # Pythia model card: 805,736,448 non-embedding + 2 x 50304 x 2048 (untied in/out embeddings) = transformers
    ("pythia-1b", PYTHIA_1B, 1_011_781_632, ("gpt", "gelu", "layernorm", 8, False)),
    # 6.92B = transformers; the hub page's "7.22B" counts the checkpoint's copy of the tied lm_head (65024 x 4544)
    # again. hetpart counts two LayerNorms in Falcon-7B's parallel block, which has one (+2 h per layer).
    ("falcon-7b", FALCON_7B, 6_921_720_704, ("gpt", "gelu", "layernorm", 1, True)),
    ("phi-2", PHI_2, 2_779_683_840, ("gpt", "gelu", "layernorm", 32, False)),  # hub page 2.78B = transformers
    ("starcoder2-3b", STARCODER2_3B, 3_030_371_328, ("gpt", "gelu", "layernorm", 2, True)),  # 3.03B = transformers
    ("starcoder2-7b", STARCODER2_7B, 7_173_923_840, ("gpt", "gelu", "layernorm", 4, True)),  # 7.17B = transformers
    # 559M / 7.07B = transformers; hetpart leaves out BLOOM's embedding LayerNorm (2 h)
    ("bloom-560m", BLOOM_560M, 559_214_592, ("gpt", "gelu", "layernorm", 16, True)),
    ("bloom-7b1", BLOOM_7B1, 7_069_016_064, ("gpt", "gelu", "layernorm", 32, True)),
    ("mpt-7b", MPT_7B, 6_649_286_656, ("gpt", "gelu", "layernorm", 32, True)),  # hub page 6.65B = transformers
    ("starcoder", STARCODER, 15.5e9, ("gpt", "gelu", "layernorm", 1, True)),  # model card 15.5B (MQA)
    ("gpt-j-6b", GPTJ_6B, 6_053_381_344, ("gpt", "gelu", "layernorm", 16, False)),  # model card n_parameters
    # Gemma 2/3: hetpart leaves out the post-attention/post-MLP norms (and Gemma 3's q/k norms)
    ("gemma-2-9b", GEMMA2_9B, 9_241_705_984, ("llama", "swiglu", "rmsnorm", 8, True)),  # 9.24B = transformers
    ("gemma-3-1b", GEMMA3_1B, 999_885_952, ("llama", "swiglu", "rmsnorm", 1, True)),  # 1.0B = transformers
    ("olmo-7b", OLMO_7B, 6_888_095_744, ("llama", "swiglu", "rmsnorm", 32, False)),  # 6.89B = transformers
    ("olmo-2-1124-7b", OLMO2_7B, 7_298_617_344, ("llama", "swiglu", "rmsnorm", 32, False)),  # 7.3B = transformers
    ("granite-3.0-8b", GRANITE_8B, 8.17e9, ("llama", "swiglu", "rmsnorm", 8, True)),  # hub page 8.17B
    ("phi-3-mini-4k", PHI3_MINI, 3_821_079_552, ("llama", "swiglu", "rmsnorm", 32, False)),  # 3.82B = transformers
    # 1.64B = transformers; hetpart leaves out StableLM's q/k/v biases (3 h per layer)
    ("stablelm-2-1.6b", STABLELM2_1_6B, 1_644_515_328, ("llama", "swiglu", "layernorm", 32, False)),
    ("command-r-v01", COMMAND_R, 34_980_831_232, ("llama", "swiglu", "layernorm", 64, True)),  # 35B = transformers
]


@pytest.mark.parametrize("name, config, published, shape", CASES, ids=[c[0] for c in CASES])
def test_published_parameter_counts(name: str, config: dict, published: float, shape: tuple) -> None:
    cfg = hf_config_to_transformer(config, "x.json")
    ours = transformer_graph(cfg, name, 16).num_params
    assert ours == pytest.approx(published, rel=0.005), (name, ours, published)
    assert (cfg.family, cfg.activation, cfg.norm, cfg.kv_heads, cfg.tied_embeddings) == shape
    assert not cfg.learned_positions or config["model_type"] == "gpt_bigcode"


def test_falcon_40b_against_its_hub_count() -> None:
    """The hub page says 41.8B: the checkpoint stores the tied lm_head (65024 x 8192 = 0.53B) apart from the
    embedding. transformers builds 41,303,293,952 (tied); hetpart counts the same."""
    cfg = hf_config_to_transformer(FALCON_40B, "x.json")
    assert (cfg.num_heads, cfg.kv_heads, cfg.tied_embeddings) == (128, 8, True)
    ours = transformer_graph(cfg, "falcon-40b", 16).num_params
    assert ours == 41_303_293_952
    assert ours + 65024 * 8192 == pytest.approx(41.8e9, rel=0.005)


def test_family_specific_fields() -> None:
    falcon = hf_config_to_transformer(FALCON_7B | {"multi_query": False}, "x")
    assert falcon.kv_heads == 71 and not falcon.dropout
    assert hf_config_to_transformer({k: v for k, v in FALCON_7B.items() if k != "multi_query"}, "x").kv_heads == 1
    assert hf_config_to_transformer(FALCON_7B | {"ffn_hidden_size": 1000, "bias": True}, "x").ffn == 1000
    assert hf_config_to_transformer(PHI_2, "x").dropout  # resid_pdrop 0.1
    assert not hf_config_to_transformer(PYTHIA_1B, "x").dropout
    assert hf_config_to_transformer(STARCODER, "x").dropout  # GPT-BigCode's dropout rates default to 0.1
    assert not hf_config_to_transformer(STARCODER2_3B | {"use_bias": False}, "x").bias
    mpt = hf_config_to_transformer(MPT_7B, "x")
    assert (mpt.ffn, mpt.bias, mpt.learned_positions, mpt.dropout) == (4 * 4096, False, False, False)
    assert hf_config_to_transformer(MPT_7B | {"attn_config": {"alibi": False}}, "x").learned_positions
    gqa = MPT_7B | {"attn_config": {"attn_type": "grouped_query_attention", "kv_n_heads": 8}}
    assert hf_config_to_transformer(gqa, "x").kv_heads == 8
    assert hf_config_to_transformer(MPT_7B | {"expansion_ratio": 2.5}, "x").ffn == 10240
    # n_embd is GPT-2's key, but GPT-BigCode and GPT-J have their own mappings
    bigcode = hf_config_to_transformer(STARCODER, "x")
    assert (bigcode.family, bigcode.kv_heads, bigcode.learned_positions, bigcode.max_positions) == ("gpt", 1, True, 8192)
    assert hf_config_to_transformer(STARCODER | {"multi_query": False}, "x").kv_heads == 48
    gptj = hf_config_to_transformer(GPTJ_6B, "x")
    assert (gptj.family, gptj.learned_positions, gptj.tied_embeddings) == ("gpt", False, False)
    assert hf_config_to_transformer(BLOOM_7B1, "x").hidden_size == hf_config_to_transformer(BLOOM_560M, "x").hidden_size * 4


def test_tied_defaults_per_family() -> None:
    """Configs that leave tie_word_embeddings out get their configuration class's default."""
    def untied_key(config: dict) -> dict:
        return {k: v for k, v in config.items() if k != "tie_word_embeddings"}

    for config, tied in [(GEMMA2_9B, True), (GEMMA3_1B, True), (COMMAND_R, True), (OLMO_7B, False),
                         (PHI3_MINI, False), (STABLELM2_1_6B, False), (GRANITE_8B, False), (PYTHIA_1B, False),
                         (PHI_2, False), (GPTJ_6B, False), (FALCON_7B, True), (STARCODER2_3B, True), (MPT_7B, True),
                         (BLOOM_560M, True), (STARCODER, True)]:
        assert hf_config_to_transformer(untied_key(config), "x").tied_embeddings is tied, config["model_type"]
    assert not hf_config_to_transformer(GEMMA2_9B | {"tie_word_embeddings": False}, "x").tied_embeddings
    # gemma (1) ties by default too: the Gemma 7B config.json has no tie_word_embeddings
    gemma = {"model_type": "gemma", "hidden_size": 3072, "num_attention_heads": 16, "num_key_value_heads": 16,
             "head_dim": 256, "intermediate_size": 24576, "num_hidden_layers": 28, "vocab_size": 256000}
    assert hf_config_to_transformer(gemma, "x").tied_embeddings


# ------------------------------------------------------------------------------------------ end to end


def test_load_model_and_predict_from_a_config_file(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "pythia-1b"
    folder.mkdir()
    path = folder / "config.json"
    path.write_text(json.dumps(PYTHIA_1B))
    graph = load_model(str(path), seq_len=1024)
    assert (graph.name, graph.num_params, graph.config.family, graph.source) == ("pythia-1b", 1_011_781_632, "gpt",
                                                                                 str(path))
    assert load_model(str(path), seq_len=4096).seq_len == 4096  # rotary: no learned-position limit
    out = cli_json(capsys, "predict", "--model", str(path), "--cluster", "a100-v100-16", "--global-batch", "32",
                   "--seq-len", "1024", "--tp", "1", "--pp", "2", "--dp", "8", "--micro-batch", "1", "--json")
    assert out["metrics"]["step_time_s"] > 0 and out["metrics"]["fits_in_memory"]


# ------------------------------------------------------------------------------------------ refusals


@pytest.mark.parametrize("data, field", [
    ({"model_type": "mixtral", "hidden_size": 4096, "num_hidden_layers": 32, "num_local_experts": 8}, "num_local_experts"),
    ({"model_type": "qwen2_moe", "hidden_size": 2048, "num_hidden_layers": 24, "num_experts": 60}, "num_experts"),
    ({"model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 48, "num_experts": 128}, "num_experts"),
    ({"model_type": "deepseek_v3", "hidden_size": 7168, "num_hidden_layers": 61, "n_routed_experts": 256},
     "n_routed_experts"),
    ({"model_type": "deepseek_v2", "hidden_size": 5120, "num_hidden_layers": 60, "n_routed_experts": 160},
     "n_routed_experts"),
    ({"model_type": "dbrx", "d_model": 6144, "n_layers": 40, "ffn_config": {"moe_num_experts": 16}},
     "ffn_config.moe_num_experts"),
    ({"model_type": "jamba", "hidden_size": 4096, "num_hidden_layers": 32, "num_experts": 16}, "num_experts"),
    ({"model_type": "olmoe", "hidden_size": 2048, "num_hidden_layers": 16, "num_experts": 64}, "num_experts"),
    ({"model_type": "granitemoe", "hidden_size": 1024, "num_hidden_layers": 24, "num_local_experts": 32},
     "num_local_experts"),
    # a Llama-typed config with experts, and an MoE type whose count is missing
    ({"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_local_experts": 8}, "num_local_experts"),
    ({"model_type": "mixtral", "hidden_size": 4096, "num_hidden_layers": 32}, "model_type"),
])
def test_mixture_of_experts_is_refused(data: dict, field: str) -> None:
    with pytest.raises(ModelError) as info:
        hf_config_to_transformer(data, "x.json")
    text = str(info.value)
    assert text.startswith(f"x.json: {field}: mixture-of-experts models ({data['model_type']}) are not supported; "
                           "supported model types: gpt2, llama, "), text
    assert "\n" not in text and "gpt_neox" in text and "falcon" in text


def test_experts_without_model_type_name_the_architecture() -> None:
    with pytest.raises(ModelError, match=r"^x.json: num_local_experts: mixture-of-experts models \(MixtralForCausalLM\) "
                                         r"are not supported; supported model types: gpt2, llama, .*bert$"):
        hf_config_to_transformer({"architectures": ["MixtralForCausalLM"], "hidden_size": 64,
                                  "num_hidden_layers": 2, "num_local_experts": 8}, "x.json")
    # one expert is a dense model
    assert hf_config_to_transformer(PHI3_MINI | {"num_local_experts": 1}, "x").family == "llama"


@pytest.mark.parametrize("data, match", [
    ({"model_type": "rwkv", "hidden_size": 2048, "num_hidden_layers": 24},
     r"^c.json: model_type: 'rwkv' is not supported; supported model types: gpt2, llama, cohere, gemma, gemma2, "
     r"gemma3_text, .*stablelm, yi, bloom, falcon, gpt_bigcode, gpt_neox, gptj, mpt, phi, starcoder2, opt, bert, "
     r"roberta, xlm-roberta, camembert, distilbert "
     r"\(or describe the model with python:MODULE:FUNCTION\)$"),
    ({"model_type": "bart", "d_model": 1024}, r"^c.json: model_type: 'bart' is not supported"),
    ({"hidden": 3}, r"^c.json: model_type '\(missing\)' is not a GPT-2, Llama, OPT or BERT config; set model_type "
                    r"\(supported: gpt2, llama, .*\), or give"),
    (BLOOM_560M | {"n_layer": None}, r"^c.json: n_layer: missing required field; add it"),
    (FALCON_7B | {"num_attention_heads": 70}, r"^c.json: num_attention_heads: 70 heads do not divide hidden_size 4544"),
    (FALCON_40B | {"num_kv_heads": 7}, r"^c.json: num_kv_heads: 7 key/value heads do not divide the 128 attention heads \(num_attention_heads\); "
     r"use one of 1, 2, 4, 8, 16, 32, 64, 128$"),
    (FALCON_7B | {"multi_query": "yes"}, r"^c.json: multi_query: expected true or false, got 'yes'$"),
    (MPT_7B | {"expansion_ratio": "4"}, r"^c.json: expansion_ratio: expected a number, got '4'$"),
    (MPT_7B | {"attn_config": [1]}, r"^c.json: attn_config: expected a mapping"),
    (MPT_7B | {"attn_config": {"alibi": 1}}, r"^c.json: attn_config: alibi: expected true or false, got 1$"),
    (PHI_2 | {"resid_pdrop": "0.1"}, r"^c.json: resid_pdrop: expected a number, got '0.1'$"),
    (PYTHIA_1B | {"hidden_act": 3}, r"^c.json: hidden_act: expected text such as \"gelu\", got a number 3$"),
    (STARCODER | {"n_embd": 0}, r"^c.json: n_embd: must be >= 1, got 0$"),
])
def test_bad_configs_are_one_clear_model_error(data, match: str) -> None:
    with pytest.raises(ModelError, match=match) as info:
        hf_config_to_transformer(data, "c.json")
    assert "\n" not in str(info.value)
