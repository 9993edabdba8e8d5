"""BERT's kin given as config.json (RoBERTa, XLM-R, CamemBERT, DistilBERT), the heads a BERT-style encoder counts,
and integer fields written as floats.

Parameter counts are transformers' own (5.x, the model built from the config on the meta device): the class the
config's ``architectures`` names, ``*ForMaskedLM`` for the published checkpoints (the masked-LM head, no pooler;
``AutoModel``'s bare encoder has the pooler and no head), ``BertForPreTraining`` (MLM head + pooler + NSP) where
named. The configs are the published ones (hyper-parameters as on the Hugging Face hub)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetpart import load_model
from hetpart.errors import ModelError
from hetpart.graph.hf_config import hf_config_to_transformer
from hetpart.graph.transformer import transformer_graph
from tests._cli import run_cli

_ROBERTA = {"attention_probs_dropout_prob": 0.1, "bos_token_id": 0, "eos_token_id": 2, "hidden_act": "gelu",
            "hidden_dropout_prob": 0.1, "initializer_range": 0.02, "layer_norm_eps": 1e-05,
            "max_position_embeddings": 514, "pad_token_id": 1, "type_vocab_size": 1}
ROBERTA_BASE = _ROBERTA | {"architectures": ["RobertaForMaskedLM"], "model_type": "roberta", "hidden_size": 768,
                           "intermediate_size": 3072, "num_attention_heads": 12, "num_hidden_layers": 12,
                           "vocab_size": 50265}
ROBERTA_LARGE = ROBERTA_BASE | {"hidden_size": 1024, "intermediate_size": 4096, "num_attention_heads": 16,
                                "num_hidden_layers": 24}
XLMR_BASE = _ROBERTA | {"architectures": ["XLMRobertaForMaskedLM"], "model_type": "xlm-roberta", "hidden_size": 768,
                        "intermediate_size": 3072, "num_attention_heads": 12, "num_hidden_layers": 12,
                        "vocab_size": 250002, "output_past": True}
XLMR_LARGE = XLMR_BASE | {"hidden_size": 1024, "intermediate_size": 4096, "num_attention_heads": 16,
                          "num_hidden_layers": 24}
CAMEMBERT_BASE = _ROBERTA | {"architectures": ["CamembertForMaskedLM"], "model_type": "camembert",
                             "hidden_size": 768, "intermediate_size": 3072, "num_attention_heads": 12,
                             "num_hidden_layers": 12, "vocab_size": 32005, "bos_token_id": 5, "eos_token_id": 6}
DISTILBERT_BASE = {"activation": "gelu", "architectures": ["DistilBertForMaskedLM"], "dim": 768, "dropout": 0.1,
                   "hidden_dim": 3072, "max_position_embeddings": 512, "model_type": "distilbert", "n_heads": 12,
                   "n_layers": 6, "pad_token_id": 0, "sinusoidal_pos_embds": False, "vocab_size": 30522}
BERT_LARGE = {"architectures": ["BertForMaskedLM"], "model_type": "bert", "hidden_size": 1024,
              "intermediate_size": 4096, "num_attention_heads": 16, "num_hidden_layers": 24, "vocab_size": 30522,
              "max_position_embeddings": 512, "type_vocab_size": 2, "pad_token_id": 0, "hidden_act": "gelu"}


def _graph(data: dict, seq_len: int = 512):
    return transformer_graph(hf_config_to_transformer(data, "c.json"), "m", seq_len)


# transformers 5: *ForMaskedLM (= what hetpart counts) and AutoModel (bare encoder with pooler, no head)
@pytest.mark.parametrize("data, masked_lm, bare", [
    (ROBERTA_BASE, 124_697_433, 124_645_632),
    (ROBERTA_LARGE, 355_412_057, 355_359_744),
    (XLMR_BASE, 278_295_186, 278_043_648),
    (XLMR_LARGE, 560_142_482, 559_890_432),
    (CAMEMBERT_BASE, 110_655_493, 110_621_952),
    (DISTILBERT_BASE, 66_985_530, 66_362_880),
    (BERT_LARGE, 335_174_458, 335_141_888),
])
def test_masked_lm_counts_are_transformers_own(data: dict, masked_lm: int, bare: int) -> None:
    graph = _graph(data)
    assert graph.num_params == masked_lm
    assert graph.config.family == "bert" and not graph.config.pretraining_head
    # the bare encoder differs by the head less the pooler: transform + LayerNorm + decoder bias - pooler
    h, V = graph.config.hidden_size, graph.config.vocab_size
    assert masked_lm - bare == (h * h + h) + 2 * h + V - (0 if data is DISTILBERT_BASE else h * h + h)


def test_roberta_positions_start_after_the_padding_index() -> None:
    cfg = hf_config_to_transformer(ROBERTA_BASE, "c.json")
    assert cfg.max_positions == 512 and cfg.position_offset == 2  # a 514-row table, 512 usable positions
    assert cfg.token_types == 1 and cfg.tied_embeddings and cfg.learned_positions
    assert load_model_from(ROBERTA_BASE).seq_len == 512  # the default length: every usable position
    with pytest.raises(ModelError, match=r"--seq-len: 513 exceeds the 512 learned positions"):
        load_model_from(ROBERTA_BASE, 513)
    # the embedding: words, 514 positions, one token type, LayerNorm
    assert _graph(ROBERTA_BASE).units[0].params == 50265 * 768 + 514 * 768 + 768 + 2 * 768
    with pytest.raises(ModelError, match=r"^c.json: max_position_embeddings: 2 rows leave no position after the "
                                         r"padding index \(pad_token_id 1: positions start at 2\); use 514"):
        hf_config_to_transformer(ROBERTA_BASE | {"max_position_embeddings": 2}, "c.json")


def load_model_from(data: dict, seq_len: int | None = None):
    import tempfile

    path = Path(tempfile.mkdtemp()) / "config.json"
    path.write_text(json.dumps(data))
    return load_model(str(path), seq_len=seq_len)


def test_bert_counts_the_head_its_architecture_trains() -> None:
    """bert-large-uncased counted 336.2 M where transformers' BertForMaskedLM (the checkpoint's class) holds
    335.2 M: the pooler was counted with the MLM head. BertForPreTraining (MLM + NSP) has the pooler and the
    next-sentence classifier: 336,226,108; the catalog's bert-large is that pretraining model."""
    masked = _graph(BERT_LARGE)
    pretraining = _graph(BERT_LARGE | {"architectures": ["BertForPreTraining"]})
    assert masked.num_params == 335_174_458
    assert pretraining.num_params == 336_226_108  # = transformers BertForPreTraining
    assert pretraining.num_params - masked.num_params == 1024 * 1024 + 1024 + 2 * 1024 + 2  # pooler + NSP
    assert pretraining.units[-1].fwd_flops > masked.units[-1].fwd_flops
    assert load_model("bert-large", seq_len=128).num_params == 336_226_108
    # no architectures: the masked-LM head (what BERT-style pretraining needs), as for RoBERTa
    assert _graph({k: v for k, v in BERT_LARGE.items() if k != "architectures"}).num_params == 335_174_458
    # a classifier keeps BERT's pooler + classifier, the same count as RoBERTa's dense + out_proj head
    cls = _graph(ROBERTA_BASE | {"architectures": ["RobertaForSequenceClassification"], "num_labels": 3})
    assert cls.num_params == 124_647_939  # = transformers RobertaForSequenceClassification


def test_roberta_and_bert_differ_only_in_positions_vocabulary_and_token_types() -> None:
    bert = _graph(BERT_LARGE)
    roberta = _graph(ROBERTA_LARGE)
    assert [u.params for u in bert.units[1:-1]] == [u.params for u in roberta.units[1:-1]]
    assert [u.fwd_flops for u in bert.units[1:-1]] == [u.fwd_flops for u in roberta.units[1:-1]]
    assert roberta.units[-1].params - bert.units[-1].params == 50265 - 30522  # the decoder bias
    assert roberta.units[0].params - bert.units[0].params == (50265 - 30522) * 1024 + 2 * 1024 - 1024


def test_the_cli_reads_xlm_roberta(capsys, tmp_path: Path) -> None:
    path = tmp_path / "xlm-roberta-large" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(XLMR_LARGE))
    code, out, err = run_cli(capsys, "inspect", "model", str(path), "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["num_params"] == 560_142_482 and data["seq_len"] == 512 and data["num_units"] == 26


def test_an_integral_float_is_the_integer_and_a_fraction_is_refused(capsys, tmp_path: Path) -> None:
    assert _graph(ROBERTA_LARGE | {"hidden_size": 1024.0, "num_hidden_layers": 24.0}).num_params == 355_412_057
    llama = {"model_type": "llama", "hidden_size": 4096.0, "intermediate_size": 11008, "num_attention_heads": 32,
             "num_hidden_layers": 2, "vocab_size": 32000, "max_position_embeddings": 4096,
             "tie_word_embeddings": False, "num_key_value_heads": 32}
    assert hf_config_to_transformer(llama, "c.json").hidden_size == 4096
    assert type(hf_config_to_transformer(llama, "c.json").hidden_size) is int
    with pytest.raises(ModelError, match=r"^c.json: hidden_size: 4096.5 is not a whole number; use 4096 or 4097$"):
        hf_config_to_transformer(llama | {"hidden_size": 4096.5}, "c.json")
    with pytest.raises(ModelError, match=r"^c.json: num_labels: 2.5 is not a whole number; use 2 or 3$"):
        hf_config_to_transformer(ROBERTA_BASE | {"architectures": ["RobertaForSequenceClassification"],
                                                 "num_labels": 2.5}, "c.json")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(llama | {"hidden_size": 4096.5}))
    code, out, err = run_cli(capsys, "inspect", "model", str(path))
    assert code == 2 and out == ""
    assert err == f"hetpart: error: {path}: hidden_size: 4096.5 is not a whole number; use 4096 or 4097\n"
    code, out, err = run_cli(capsys, "inspect", "model", str(path), "--json")
    assert code == 2 and json.loads(out)["kind"] == "bad_input"
    # an expert count written as a float is still a mixture of experts, not a dense model
    with pytest.raises(ModelError, match=r"num_local_experts: mixture-of-experts"):
        hf_config_to_transformer(llama | {"num_local_experts": 8.0}, "c.json")


def test_tiny_configs_match_transformers_built_on_meta() -> None:
    """The counts above, re-derived live on small configs of each type (skipped without transformers)."""
    transformers = pytest.importorskip("transformers")
    import torch

    tiny = {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4, "num_hidden_layers": 2,
            "vocab_size": 101, "max_position_embeddings": 40}
    cases = [("bert", tiny | {"architectures": ["BertForPreTraining"], "type_vocab_size": 3}),
             ("bert", tiny | {"architectures": ["BertForMaskedLM"]}),
             ("roberta", tiny | {"architectures": ["RobertaForMaskedLM"], "type_vocab_size": 1, "pad_token_id": 1}),
             ("xlm-roberta", tiny | {"architectures": ["XLMRobertaForMaskedLM"], "pad_token_id": 3}),
             ("distilbert", {"architectures": ["DistilBertForMaskedLM"], "dim": 64, "hidden_dim": 96, "n_heads": 4,
                             "n_layers": 2, "vocab_size": 101, "max_position_embeddings": 40})]
    for model_type, data in cases:
        data = data | {"model_type": model_type}
        config = transformers.AutoConfig.for_model(**data)
        cls = getattr(transformers, data["architectures"][0])
        with torch.device("meta"):
            model = cls(config)
        expected = sum(p.numel() for p in model.parameters())
        assert hf_config_to_transformer(data, "c.json").max_positions >= 1
        assert transformer_graph(hf_config_to_transformer(data, "c.json"), "m", 16).num_params == expected, model_type
