"""Named sizes of Qwen2-MoE with the published dimensions (Qwen2-57B-A14B's config.json).

64 experts, 8 per token with the weights not renormalized, and a gated shared expert of
width 20480. `debug` is kenotron's own, sized to the built-in 4096-token vocabulary.
"""

from __future__ import annotations

from kenotron.models.common.moe_args import MoEArgs
from kenotron.models.qwen2_moe.args import Qwen2MoEArgs

QWEN2_MOE_FLAVORS: dict[str, Qwen2MoEArgs] = {
    "debug": Qwen2MoEArgs(
        dim=256, n_layers=4, n_heads=8, n_kv_heads=2, vocab_size=4096,
        moe=MoEArgs(n_experts=8, top_k=2, ffn_dim=128, norm_topk=False, shared_ffn_dim=256, shared_gate=True),
    ),
    "57B-A14B": Qwen2MoEArgs(),
}
