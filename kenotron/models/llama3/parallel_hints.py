"""How Llama 3 splits under tensor parallelism, as plain data for kenotron.parallel.

Keys are module FQN patterns (`*` matches one name component, e.g. a block index); values
are style names that kenotron.parallel.plan understands:

- "embedding":   vocabulary-sharded embedding (rows split over tp)
- "colwise":     Linear with output features split over tp
- "rowwise":     Linear with input features split over tp (partial sums reduced after)
- "norm":        sequence-parallel norm (replicated weight, activations split along the sequence)
- "block_input": the input of a sub-block, gathered from sequence shards before the colwise projections
- "output":      the output projection, vocabulary-sharded (feeds the vocab-parallel loss)
- "head_norm":   a norm applied per attention head to the tp-sharded heads (replicated weight,
                 gradient summed over tp)
- "token_linear": a Linear applied token by token to the sequence shards (replicated weight,
                 gradient summed over tp; DeepSeek-V3's MTP projection)

This file says nothing about meshes or torch.distributed: it is data the plan reads.
"""

from __future__ import annotations

LLAMA3_TP_STYLES: dict[str, str] = {
    "tok_embeddings": "embedding",
    "layers.*.attention_norm": "norm",
    "layers.*.attention": "block_input",
    "layers.*.attention.wq": "colwise",
    "layers.*.attention.wk": "colwise",
    "layers.*.attention.wv": "colwise",
    "layers.*.attention.wo": "rowwise",
    "layers.*.ffn_norm": "norm",
    "layers.*.feed_forward": "block_input",
    "layers.*.feed_forward.w1": "colwise",
    "layers.*.feed_forward.w3": "colwise",
    "layers.*.feed_forward.w2": "rowwise",
    "norm": "norm",
    "output": "output",
}

# The repeated unit: FSDP wraps, checkpoints and compiles each of these.
LLAMA3_BLOCKS = "layers.*"


def tp_styles_without(*patterns: str) -> dict[str, str]:
    """LLAMA3_TP_STYLES minus some patterns, for families with the same names but fewer modules."""
    return {k: v for k, v in LLAMA3_TP_STYLES.items() if k not in patterns}
