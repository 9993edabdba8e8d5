"""The model catalog: published shapes of well-known models (Hugging Face configs and papers)."""

from __future__ import annotations

from hetpart.graph.transformer import TransformerConfig

__all__ = ["MODEL_CATALOG"]


def _gpt2(layers, hidden, heads, published, positions=1024, vocab=50257):
    # GPT-2 (Radford et al. 2019) HF configs; GPT-3 shapes from Brown et al. 2020, Table 2.1.
    return TransformerConfig("gpt2", layers, hidden, heads, vocab, positions, published_params=published)


def _llama(layers, hidden, heads, kv, ffn, vocab, positions, published):
    # Llama 2 (Touvron et al. 2023) and Llama 3 (Meta 2024) HF configs: RMSNorm, SwiGLU, RoPE, untied.
    return TransformerConfig("llama", layers, hidden, heads, vocab, positions, ffn_hidden_size=ffn,
                             num_kv_heads=kv, tied_embeddings=False, activation="swiglu", norm="rmsnorm",
                             bias=False, learned_positions=False, dropout=False, published_params=published)


MODEL_CATALOG: dict[str, TransformerConfig] = {
    "gpt2-small": _gpt2(12, 768, 12, 124.4e6),
    "gpt2-medium": _gpt2(24, 1024, 16, 354.8e6),
    "gpt2-large": _gpt2(36, 1280, 20, 774.0e6),
    "gpt2-xl": _gpt2(48, 1600, 25, 1557.6e6),
    "gpt3-1.3b": _gpt2(24, 2048, 16, 1.3e9, positions=2048),
    "gpt3-2.7b": _gpt2(32, 2560, 32, 2.7e9, positions=2048),
    "gpt3-6.7b": _gpt2(32, 4096, 32, 6.7e9, positions=2048),
    # The paper lists d_model 5140; every implementation (Megatron, OPT-13B) uses 5120 = 40 x 128.
    "gpt3-13b": _gpt2(40, 5120, 40, 13.0e9, positions=2048),
    "gpt3-175b": _gpt2(96, 12288, 96, 174.6e9, positions=2048),
    "llama2-7b": _llama(32, 4096, 32, 32, 11008, 32000, 4096, 6.74e9),
    "llama2-13b": _llama(40, 5120, 40, 40, 13824, 32000, 4096, 13.02e9),
    "llama2-70b": _llama(80, 8192, 64, 8, 28672, 32000, 4096, 68.98e9),
    "llama3-8b": _llama(32, 4096, 32, 8, 14336, 128256, 8192, 8.03e9),
    "llama3-70b": _llama(80, 8192, 64, 8, 28672, 128256, 8192, 70.55e9),
    "llama3-405b": _llama(126, 16384, 128, 8, 53248, 128256, 8192, 405.85e9),
    # facebook/opt-350m config: post-LN, ReLU, 512-wide embeddings projected to 1024, 2 offset positions.
    "opt-350m": TransformerConfig("opt", 24, 1024, 16, 50272, 2048, ffn_hidden_size=4096, activation="relu",
                                  embed_dim=512, position_offset=2, final_norm=False, published_params=331.2e6),
    # bert-large-uncased (Devlin et al. 2019): 24 layers, 1024 wide, 16 heads, 30522 tokens, pretrained with
    # MLM + NSP: BertForPreTraining's heads (MLM head, pooler, NSP classifier), 336,226,108 in transformers. A
    # config.json of BertForMaskedLM (the checkpoint's own) counts the MLM head alone: 335,174,458.
    "bert-large": TransformerConfig("bert", 24, 1024, 16, 30522, 512, published_params=336.2e6, final_norm=False,
                                    pretraining_head=True),
}
