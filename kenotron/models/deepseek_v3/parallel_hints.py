"""How DeepSeek-V3 splits under tensor and expert parallelism, as plain data.

MLA splits its heads: the query projection (wq, or wq_b after the replicated low-rank wq_a and
q_norm) and wkv_b colwise, wo rowwise; wkv_a and kv_norm, which make the latent every head reads,
stay replicated. The attention module's "latent_attention" style is "block_input" plus the sum
over tp of the shared RoPE key's gradient (models/common/latent_attention.py). The dense blocks'
`mlp` splits as Llama's MLP; the MoE blocks' `feed_forward` is the MoE families' (qwen3_moe).
"""

from __future__ import annotations

from kenotron.models.qwen3_moe.parallel_hints import EXPERTS, MOE_MODULES

DEEPSEEK_V3_TP_STYLES: dict[str, str] = {
    "tok_embeddings": "embedding",
    "layers.*.attention_norm": "norm",
    "layers.*.attention": "latent_attention",
    "layers.*.attention.wq": "colwise",
    "layers.*.attention.wq_b": "colwise",
    "layers.*.attention.wkv_b": "colwise",
    "layers.*.attention.wo": "rowwise",
    "layers.*.ffn_norm": "norm",
    "layers.*.mlp": "block_input",
    "layers.*.mlp.w1": "colwise",
    "layers.*.mlp.w3": "colwise",
    "layers.*.mlp.w2": "rowwise",
    "norm": "norm",
    "output": "output",
}

__all__ = ["DEEPSEEK_V3_TP_STYLES", "EXPERTS", "MOE_MODULES"]
