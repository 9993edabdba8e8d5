"""Hugging Face config.json files an outside probe found modelled wrong or refused with an unclear line: reward
and token classifiers, sequences past a rotary model's max_position_embeddings, sliding-window attention,
Qwen2's q/k/v biases, Gemma's GeGLU in the Megatron export, encoder-decoder configs without a model_type,
legacy Falcon (RefinedWeb) types, and the messages of bad head counts, huge position limits, the native OLMo
format and a --tp that does not divide the heads.

The true counts are what transformers builds from the same config on the meta device
(``AutoModelForSequenceClassification`` / ``AutoModelForTokenClassification`` / ``AutoModelForCausalLM``;
Falcon's legacy keys n_head, n_layer, n_head_kv renamed as transformers' conversion does).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from hetpart import ModelError, load_model
from hetpart.export import export_plan
from hetpart.graph.hf_config import hf_config_to_transformer
from hetpart.graph.load import ModelNote
from hetpart.graph.transformer import causal_keys, transformer_graph
from hetpart.plan import Plan, Replica, Stage
from tests._cli import run_cli
from tests.test_export import _megatron_args

LLAMA31_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
              "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
              "vocab_size": 128256, "max_position_embeddings": 131072, "tie_word_embeddings": False,
              "attention_bias": False, "rope_theta": 500000.0}
REWARD = LLAMA31_8B | {"architectures": ["LlamaForSequenceClassification"], "vocab_size": 128257, "num_labels": 1,
                       "id2label": {"0": "LABEL_0"}, "pad_token_id": 128256}
MISTRAL_V01 = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096,
               "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
               "vocab_size": 32000, "max_position_embeddings": 32768, "sliding_window": 4096}
GEMMA2_9B = {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "hidden_size": 3584,
             "intermediate_size": 14336, "num_hidden_layers": 42, "num_attention_heads": 16, "num_key_value_heads": 8,
             "head_dim": 256, "vocab_size": 256000, "max_position_embeddings": 8192, "sliding_window": 4096,
             "hidden_activation": "gelu_pytorch_tanh"}
GEMMA3_1B = {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 1152,
             "intermediate_size": 6912, "num_hidden_layers": 26, "num_attention_heads": 4, "num_key_value_heads": 1,
             "head_dim": 256, "vocab_size": 262144, "max_position_embeddings": 32768, "sliding_window": 512,
             "sliding_window_pattern": 6, "hidden_activation": "gelu_pytorch_tanh"}
QWEN2_7B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
            "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
            "vocab_size": 152064, "max_position_embeddings": 32768, "tie_word_embeddings": False,
            "sliding_window": 131072, "use_sliding_window": False, "max_window_layers": 28}
STARCODER2_15B = {"architectures": ["Starcoder2ForCausalLM"], "model_type": "starcoder2", "hidden_size": 6144,
                  "intermediate_size": 24576, "num_hidden_layers": 40, "num_attention_heads": 48,
                  "num_key_value_heads": 4, "vocab_size": 49152, "max_position_embeddings": 16384,
                  "sliding_window": 4096, "use_bias": True}
PHI3_MINI = {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192,
             "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32064,
             "max_position_embeddings": 4096, "tie_word_embeddings": False, "sliding_window": None}
FALCON_7B_LEGACY = {"architectures": ["RWForCausalLM"], "model_type": "RefinedWebModel", "alibi": False, "bias": False,
                    "hidden_size": 4544, "multi_query": True, "n_head": 71, "n_layer": 32, "parallel_attn": True,
                    "vocab_size": 65024, "hidden_dropout": 0.0, "attention_dropout": 0.0}
FALCON_40B_LEGACY = {"architectures": ["RWForCausalLM"], "model_type": "RefinedWeb", "alibi": False, "bias": False,
                     "hidden_size": 8192, "n_head": 128, "n_head_kv": 8, "n_layer": 60, "parallel_attn": True,
                     "vocab_size": 65024}
BART_NO_TYPE = {"architectures": ["BartForConditionalGeneration"], "d_model": 1024, "encoder_layers": 12,
                "decoder_layers": 12, "hidden_size": 1024, "num_hidden_layers": 12, "encoder_attention_heads": 16,
                "num_attention_heads": 16, "vocab_size": 50265, "is_encoder_decoder": True}
BERT_BASE = {"architectures": ["BertForMaskedLM"], "model_type": "bert", "hidden_size": 768, "num_hidden_layers": 12,
             "num_attention_heads": 12, "intermediate_size": 3072, "vocab_size": 30522,
             "max_position_embeddings": 512, "is_encoder_decoder": False}


def _graph(data: dict, seq_len: int = 2048):
    return transformer_graph(hf_config_to_transformer(data, "c.json"), "m", seq_len)


def _whole_plan(graph, seq_len: int) -> Plan:
    return Plan(global_batch=8, micro_batch=1, seq_len=seq_len, recompute="selective",
                replicas=(Replica(1.0, (Stage((0, graph.num_units), ("0/0/0",), 1),)),))


# ------------------------------------------------------------------------------------------- classifiers
def test_a_reward_model_has_a_num_labels_head_not_the_vocabulary() -> None:
    """LlamaForSequenceClassification (num_labels 1) was counted with a 128k-row LM head: 8.03 B, +7.0%."""
    graph = _graph(REWARD)
    assert graph.num_params == 7_504_932_864  # = transformers AutoModelForSequenceClassification
    head = graph.units[-1]
    assert head.params == 4096 + 4096 and head.shared_params == 0 and graph.tied_owner is None
    assert head.fwd_flops == 2 * 2048 * 4096 * 1
    lm = _graph(LLAMA31_8B | {"vocab_size": 128257})
    assert head.act_bytes["none"] < lm.units[-1].act_bytes["none"] / 20  # no fp32 logits over the vocabulary
    assert graph.config.head_task == "sequence_classification" and graph.config.head_outputs == 1
    # the blocks and the embedding are the language model's
    assert [u.params for u in graph.units[:-1]] == [u.params for u in lm.units[:-1]]


def test_a_token_classifier_has_a_biased_head_and_scores_every_token() -> None:
    graph = _graph(REWARD | {"architectures": ["LlamaForTokenClassification"], "num_labels": 5})
    assert graph.num_params == 7_504_949_253  # = transformers AutoModelForTokenClassification
    seq = _graph(REWARD | {"num_labels": 5})
    assert graph.units[-1].act_bytes["none"] > seq.units[-1].act_bytes["none"]  # logits of every token
    # num_labels left out: transformers' default of 2 (or id2label's size)
    assert _graph({k: v for k, v in REWARD.items() if k != "num_labels"}).config.num_labels == 1
    assert _graph({k: v for k, v in REWARD.items() if k not in ("num_labels", "id2label")}).config.num_labels == 2


def test_a_classifier_export_names_its_head() -> None:
    graph = _graph(REWARD, 256)
    result = export_plan(_whole_plan(graph, 256), graph, "megatron")
    assert any(p.startswith("a sequence classification head (1 label") for p in result.cannot_express)
    assert _megatron_args(result.text)["--untie-embeddings-and-output-weights"] is True


# ------------------------------------------------------------------------------- positions past the limit
def test_a_rotary_model_takes_a_longer_sequence_and_says_so(capsys, tmp_path: Path) -> None:
    """phi-3-mini (4096 positions) at 16384 tokens: accepted (context extension), its max_positions raised to the
    length, so that Megatron's assertion max_position_embeddings >= seq_length holds; one note on stderr."""
    config = tmp_path / "phi-3-mini" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(PHI3_MINI))
    with pytest.warns(ModelNote, match="16384 exceeds phi-3-mini's max_position_embeddings 4096"):
        graph = load_model(str(config), seq_len=16384)
    assert graph.config.max_positions == 16384 and graph.seq_len == 16384
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_model(str(config), seq_len=4096).config.max_positions == 4096  # within the limit: no note
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(_whole_plan(graph, 16384).to_dict() | {
        "meta": {"model": str(config), "cluster": "tiny-mixed"}}))
    code, out, err = run_cli(capsys, "export", str(plan), "--to", "megatron", "--json")
    assert code == 0, err
    data = json.loads(out)["data"]  # stdout is the JSON object alone
    assert data["--max-position-embeddings"] >= data["--seq-length"] == 16384
    assert err.count("hetpart: note:") == 1 and "rotary/ALiBi positions extrapolated" in err
    with pytest.raises(ModelError, match="exceeds the 1024 learned positions"):  # a position table still limits
        load_model("gpt2-small", seq_len=2048)


def test_a_huge_rotary_position_limit_is_accepted() -> None:
    """Llama 4 Scout states max_position_embeddings 10,485,760: rotary positions hold no table."""
    assert _graph(LLAMA31_8B | {"max_position_embeddings": 10_485_760}).config.max_positions == 10_485_760
    with pytest.raises(ModelError, match="n_positions: 10485760 is absurdly large"):  # a learned table
        hf_config_to_transformer({"model_type": "gpt2", "n_embd": 768, "n_layer": 2, "n_head": 12,
                                  "vocab_size": 100, "n_positions": 10_485_760}, "c.json")


# ------------------------------------------------------------------------------------------ sliding windows
def test_causal_keys_is_the_exact_sum() -> None:
    for s in (1, 7, 10, 64):
        for w in (0, 1, 3, 4, 10, 100):
            assert causal_keys(s, w) == sum(min(i + 1, w or s) for i in range(s)), (s, w)


def test_mistral_v01_windows_every_layer() -> None:
    cfg = hf_config_to_transformer(MISTRAL_V01, "c.json")
    assert cfg.sliding_windows == (4096,) * 32
    at_window, past = _graph(MISTRAL_V01, 4096), _graph(MISTRAL_V01, 8192)
    full = _graph(MISTRAL_V01 | {"sliding_window": None}, 8192)
    assert at_window.fwd_flops == _graph(MISTRAL_V01 | {"sliding_window": None}, 4096).fwd_flops
    s, q = 8192, 4096
    core = past.units[1].recompute_flops["selective"]  # selective recomputation re-runs the windowed core
    assert core == pytest.approx(4 * s * s * q * causal_keys(s, 4096) / causal_keys(s), rel=1e-12)
    assert full.units[1].fwd_flops - past.units[1].fwd_flops == pytest.approx(4 * s * s * q - core, rel=1e-12)
    assert full.train_flops / past.train_flops == pytest.approx(1.0616, abs=1e-4)
    assert full.units[1].act_bytes == past.units[1].act_bytes  # eager kernels still keep the s x s scores
    long, long_full = _graph(MISTRAL_V01, 32768), _graph(MISTRAL_V01 | {"sliding_window": None}, 32768)
    assert long_full.train_flops / long.train_flops == pytest.approx(1.7208, abs=1e-4)
    assert sum(u.fwd_flops for u in past.units) == past.fwd_flops and past.train_flops == 3 * past.fwd_flops
    assert not hf_config_to_transformer(MISTRAL_V01 | {"sliding_window": None}, "c.json").sliding_windows


def test_gemma2_alternates_local_and_global_layers() -> None:
    cfg = hf_config_to_transformer(GEMMA2_9B, "c.json")
    assert cfg.sliding_windows == (4096, 0) * 21
    typed = GEMMA2_9B | {"layer_types": ["full_attention", "sliding_attention"] * 21}
    assert hf_config_to_transformer(typed, "c.json").sliding_windows == (0, 4096) * 21
    graph = _graph(GEMMA2_9B, 8192)
    assert graph.units[2].fwd_flops > graph.units[1].fwd_flops  # block_1 global, block_0 local
    with pytest.raises(ModelError, match=r"c.json: layer_types: expected a list of 42 entries"):
        hf_config_to_transformer(GEMMA2_9B | {"layer_types": ["full_attention"]}, "c.json")
    with pytest.raises(ModelError, match=r"c.json: layer_types\[0\]: 'chunked_attention' is not an attention"):
        hf_config_to_transformer(GEMMA2_9B | {"layer_types": ["chunked_attention"] * 42}, "c.json")


def test_gemma3_has_five_local_layers_to_one_global() -> None:
    windows = hf_config_to_transformer(GEMMA3_1B, "c.json").sliding_windows
    assert windows == ((512,) * 5 + (0,)) * 4 + (512, 512)
    typed = {k: v for k, v in GEMMA3_1B.items() if k != "sliding_window_pattern"} | {
        "layer_types": ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(26)]}
    assert hf_config_to_transformer(typed, "c.json").sliding_windows == windows
    full = _graph(GEMMA3_1B | {"sliding_window": None}, 8192)
    assert full.train_flops / _graph(GEMMA3_1B, 8192).train_flops == pytest.approx(1.2918, abs=1e-4)


def test_qwen2_uses_no_window_unless_asked() -> None:
    assert not hf_config_to_transformer(QWEN2_7B, "c.json").sliding_windows
    on = QWEN2_7B | {"use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 20}
    assert hf_config_to_transformer(on, "c.json").sliding_windows == (0,) * 20 + (4096,) * 8


def test_starcoder2_windows_every_layer_and_phi3_without_a_window_has_none() -> None:
    assert hf_config_to_transformer(STARCODER2_15B, "c.json").sliding_windows == (4096,) * 40
    assert not hf_config_to_transformer(PHI3_MINI, "c.json").sliding_windows
    graph = _graph(STARCODER2_15B, 8192)
    result = export_plan(_whole_plan(graph, 8192), graph, "megatron")
    assert any(p.startswith("sliding-window attention (window 4096 on 40 of 40 layers)") for p in result.cannot_express)
    # a window of at least the sequence covers every key: full causal attention, nothing to warn about (probe s48)
    for seq in (256, 4096):
        graph = _graph(STARCODER2_15B, seq)
        result = export_plan(_whole_plan(graph, seq), graph, "megatron")
        assert not any(p.startswith("sliding-window") for p in result.cannot_express)


def test_windows_survive_a_json_round_trip() -> None:
    """Run records rebuild the config from its dict (TransformerConfig(**run_config)): lists become tuples."""
    cfg = hf_config_to_transformer(GEMMA2_9B, "c.json")
    again = type(cfg)(**json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg and hash(again) == hash(cfg)


# ------------------------------------------------------------------------------ biases and gates in export
def test_qwen2_counts_its_qkv_biases_and_exports_them() -> None:
    graph = _graph(QWEN2_7B, 256)
    assert graph.num_params == 7_615_616_512  # = transformers (was 129,024 short: 28 x (3584 + 2 x 512))
    args = _megatron_args(export_plan(_whole_plan(graph, 256), graph, "megatron").text)
    assert args["--add-qkv-bias"] is True and args["--disable-bias-linear"] is True
    llama = _graph(LLAMA31_8B, 256)
    assert "--add-qkv-bias" not in _megatron_args(export_plan(_whole_plan(llama, 256), llama, "megatron").text)


def test_gemma_geglu_is_not_exported_as_swiglu() -> None:
    graph = _graph(GEMMA2_9B, 256)
    assert graph.config.gate_activation == "gelu" and graph.config.activation == "swiglu"
    result = export_plan(_whole_plan(graph, 256), graph, "megatron")
    assert "--swiglu" not in _megatron_args(result.text)
    assert any(p.startswith("a GeGLU MLP (GELU-gated, Gemma)") for p in result.cannot_express)


# -------------------------------------------------------------------------------------- refused or renamed
def test_an_encoder_decoder_without_model_type_is_refused(capsys, tmp_path: Path) -> None:
    with pytest.raises(ModelError, match=r"^c.json: is_encoder_decoder: an encoder-decoder \(sequence-to-sequence\) "
                                         r"model \(BartForConditionalGeneration\) is not supported"):
        hf_config_to_transformer(BART_NO_TYPE, "c.json")
    named = {k: v for k, v in BART_NO_TYPE.items() if k != "is_encoder_decoder"}
    with pytest.raises(ModelError, match=r"^c.json: architectures: a sequence-to-sequence or multimodal model"):
        hf_config_to_transformer(named, "c.json")
    config = tmp_path / "config.json"
    config.write_text(json.dumps(BART_NO_TYPE))
    code, _, err = run_cli(capsys, "inspect", "model", str(config))
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    # BERT-style encoders still read; the masked-LM head without the pooler, as BertForMaskedLM (transformers)
    assert _graph(BERT_BASE, 512).num_params == 109_514_298


def test_legacy_falcon_types_read_as_falcon() -> None:
    """RWForCausalLM configs: RefinedWebModel is Falcon-7B (transformers 6,921,720,704: its one LayerNorm per
    parallel block is counted as two), RefinedWeb Falcon-40B (new decoder architecture, also when unstated)."""
    assert _graph(FALCON_7B_LEGACY).num_params == 6_922_011_520
    assert _graph(FALCON_40B_LEGACY).num_params == 41_303_293_952  # = transformers
    assert _graph(FALCON_40B_LEGACY | {"new_decoder_architecture": None}).num_params == 41_303_293_952


# ------------------------------------------------------------------------------------------------- messages
def test_a_bad_head_count_names_the_config_fields() -> None:
    with pytest.raises(ModelError, match=r"^c.json: num_key_value_heads: 3 key/value heads do not divide the 32 "
                                         r"attention heads \(num_attention_heads\); use one of 1, 2, 4, 8, 16, 32$"):
        hf_config_to_transformer(LLAMA31_8B | {"num_key_value_heads": 3}, "c.json")


def test_the_native_olmo_format_points_to_the_hf_config() -> None:
    native = {"architectures": ["OLMoForCausalLM"], "model_type": "olmo", "d_model": 4096, "n_heads": 32,
              "n_layers": 32, "mlp_ratio": 8, "max_sequence_length": 2048, "vocab_size": 50280}
    with pytest.raises(ModelError, match=r"^c.json: d_model: this is the native OLMo config .* use the config.json of "
                                         r"the Hugging Face conversion \(the -hf checkpoint"):
        hf_config_to_transformer(native, "c.json")


@pytest.mark.parametrize("config, tp, message", [
    ({**PHI3_MINI, "hidden_size": 5120, "intermediate_size": 17920, "num_hidden_layers": 4, "num_attention_heads": 40,
      "num_key_value_heads": 10}, "4",
     "--tp: 4 does not divide the 10 key/value heads of phi-3-medium; use one of 1, 2, 5, 10"),
    ({"model_type": "falcon", "hidden_size": 4544, "num_attention_heads": 71, "num_hidden_layers": 4,
      "vocab_size": 65024, "multi_query": True}, "2",
     "--tp: 2 does not divide the 71 attention heads or the 1 key/value head of phi-3-medium; use 1"),
])
def test_a_tp_flag_that_does_not_divide_the_heads_says_which_do(capsys, tmp_path: Path, config, tp, message) -> None:
    path = tmp_path / "phi-3-medium" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(config))
    code, _, err = run_cli(capsys, "predict", "--model", str(path), "--cluster", "a100-v100-16", "--tp", tp, "--pp", "1",
                           "--dp", "1", "--micro-batch", "1", "--global-batch", "8", "--seq-len", "2048")
    assert code == 2 and err == f"hetpart: error: {message}\n"
