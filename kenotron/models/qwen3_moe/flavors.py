"""Named sizes of Qwen3-MoE with the published dimensions (config.json on the Hub).

Both use 128 experts with 8 routed per token and renormalized weights, head_dim 128, 4
key/value heads, vocabulary 151936 and rope theta 1e6. `debug` is kenotron's own, sized to
the built-in 4096-token vocabulary, small enough to train on a CPU in a minute.
"""

from __future__ import annotations

from kenotron.models.common.moe_args import MoEArgs
from kenotron.models.qwen3_moe.args import Qwen3MoEArgs

QWEN3_MOE_FLAVORS: dict[str, Qwen3MoEArgs] = {
    "debug": Qwen3MoEArgs(
        dim=256, n_layers=4, n_heads=8, n_kv_heads=4, head_dim=64, vocab_size=4096,
        moe=MoEArgs(n_experts=8, top_k=2, ffn_dim=256),
    ),
    "30B-A3B": Qwen3MoEArgs(
        dim=2048, n_layers=48, n_heads=32, n_kv_heads=4, moe=MoEArgs(n_experts=128, top_k=8, ffn_dim=768),
    ),
    "235B-A22B": Qwen3MoEArgs(
        dim=4096, n_layers=94, n_heads=64, n_kv_heads=4, moe=MoEArgs(n_experts=128, top_k=8, ffn_dim=1536),
    ),
}
