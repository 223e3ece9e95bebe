"""How DeepSeek-V3 splits under tensor and expert parallelism, as plain data.

MLA splits its heads: the query projection (wq, or wq_b after the replicated low-rank wq_a and
q_norm) and wkv_b colwise, wo rowwise; wkv_a and kv_norm, which make the latent every head reads,
stay replicated. The MTP modules' projections and norms (MTP_PARTS) are per-token maps. The attention module's "latent_attention" style is "block_input" plus the sum
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
    "layers.*.enorm": "norm",
    "layers.*.hnorm": "norm",
    "layers.*.eh_proj": "token_linear",
    "layers.*.head_norm": "norm",
    "norm": "norm",
    "output": "output",
}
MTP_PARTS = ("layers.*.enorm", "layers.*.hnorm", "layers.*.eh_proj", "layers.*.head_norm")
"""The MTP modules' own parts: per-token maps on the residual stream, so under sequence parallel they
run on the sequence shards with replicated weights, gradients summed over tp: the norms' style, and
"token_linear" for eh_proj, a Linear (parallel/tensor.py's LinearOnSequenceShards: its product on
local tensors, which torch 2.11 refuses on a sequence-sharded DTensor)."""



def deepseek_v3_tp_styles(args) -> dict[str, str]:
    """The styles of the modules `args` builds: wq or wq_b (with or without the query's low rank),
    the dense MLP's only when there are dense blocks."""
    absent = {"layers.*.attention.wq" if args.q_rank else "layers.*.attention.wq_b"}
    if not args.mtp_depth:
        absent |= set(MTP_PARTS)
    if args.n_dense_layers == 0:
        absent |= {k for k in DEEPSEEK_V3_TP_STYLES if k.startswith("layers.*.mlp")}
    return {k: v for k, v in DEEPSEEK_V3_TP_STYLES.items() if k not in absent}


__all__ = ["DEEPSEEK_V3_TP_STYLES", "EXPERTS", "MOE_MODULES", "deepseek_v3_tp_styles"]
