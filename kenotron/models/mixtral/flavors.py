"""Named sizes of Mixtral with the published dimensions (config.json of the v0.1 base models).

Both: 8 experts, 2 per token, 8 key/value heads, rope theta 1e6, no sliding window. `debug` is
kenotron's own, sized to the built-in 4096-token vocabulary.
"""

from __future__ import annotations

from kenotron.models.common.moe_args import MoEArgs
from kenotron.models.mixtral.args import MixtralArgs

MIXTRAL_FLAVORS: dict[str, MixtralArgs] = {
    "debug": MixtralArgs(
        dim=256, n_layers=4, n_heads=8, n_kv_heads=4, vocab_size=4096, moe=MoEArgs(n_experts=8, top_k=2, ffn_dim=256),
    ),
    "8x7B": MixtralArgs(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, moe=MoEArgs(n_experts=8, top_k=2, ffn_dim=14336)),
    "8x22B": MixtralArgs(dim=6144, n_layers=56, n_heads=48, n_kv_heads=8, moe=MoEArgs(n_experts=8, top_k=2, ffn_dim=16384)),
}
