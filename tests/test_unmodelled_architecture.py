"""What a config declares that hetpart holds only approximately (a parallel attention + MLP block, logit
soft-capping) is kept on the model, shown by inspect and named by export as what the engine is not told."""

from __future__ import annotations

import json
from pathlib import Path

from hetpart.export import export_plan
from hetpart.graph.hf_config import hf_config_to_transformer
from hetpart.graph.load import load_model
from tests._cli import cli_json

FALCON = {"model_type": "falcon", "hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 16,
          "multi_query": True, "parallel_attn": True, "new_decoder_architecture": False, "bias": False,
          "vocab_size": 32000, "alibi": False, "max_position_embeddings": 2048, "tie_word_embeddings": True}
GEMMA2 = {"model_type": "gemma2", "hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 8,
          "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 4096, "vocab_size": 32000,
          "max_position_embeddings": 4096, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
          "tie_word_embeddings": True, "sliding_window": 4096, "query_pre_attn_scalar": 128}


def test_parallel_blocks_and_soft_caps_are_recorded() -> None:
    falcon = hf_config_to_transformer(FALCON, "falcon.json")
    assert len(falcon.unmodelled) == 1 and falcon.unmodelled[0].startswith("parallel_attn: true")
    sequential = hf_config_to_transformer(FALCON | {"parallel_attn": False}, "falcon.json")
    assert sequential.unmodelled == ()
    gemma = hf_config_to_transformer(GEMMA2, "gemma2.json")
    assert [u.split(":")[0] for u in gemma.unmodelled] == ["attn_logit_softcapping", "final_logit_softcapping"]
    neox = hf_config_to_transformer({"model_type": "gpt_neox", "hidden_size": 512, "num_hidden_layers": 2,
                                     "num_attention_heads": 8, "intermediate_size": 2048, "vocab_size": 5000,
                                     "max_position_embeddings": 2048, "tie_word_embeddings": False}, "neox.json")
    assert neox.unmodelled and "use_parallel_residual" in neox.unmodelled[0]  # transformers' default: parallel


def test_export_names_them_and_inspect_lists_them(capsys, tmp_path: Path) -> None:
    path = tmp_path / "falcon" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(FALCON))
    shown = cli_json(capsys, "inspect", "model", str(path), "--json")
    assert shown["unmodelled"] and shown["unmodelled"][0].startswith("parallel_attn")
    plan_path = tmp_path / "plan.json"
    cli_json(capsys, "plan", "--model", str(path), "--cluster", "a100-8", "--global-batch", "8", "--seq-len", "512",
             "--planner", "uniform", "--no-bound", "--out", str(plan_path), "--json")
    from hetpart.cluster import load_cluster
    from hetpart.plan import load_plan

    plan = load_plan(plan_path)
    graph = load_model(str(path), seq_len=512)
    for target in ("megatron", "torchtitan"):  # a DeepSpeed config holds no architecture: the model is your code
        result = export_plan(plan, graph, target, load_cluster("a100-8"))
        assert any("parallel_attn" in what for what in result.cannot_express), target
