"""Named sizes of Qwen3 (dense) with the published dimensions (config.json on the Hub).

All use head_dim 128, 8 key/value heads, vocabulary 151936 and rope theta 1e6; sizes up to
4B tie the embeddings. `debug` is kenotron's own, sized to the built-in 4096-token
vocabulary, with the head size decoupled from the width as in the real ones.
"""

from __future__ import annotations

from kenotron.models.qwen3.args import Qwen3Args

QWEN3_FLAVORS: dict[str, Qwen3Args] = {
    "debug": Qwen3Args(
        dim=256, n_layers=4, n_heads=8, n_kv_heads=4, head_dim=64, ffn_dim=768, vocab_size=4096,
        tie_embeddings=True,
    ),
    "0.6B": Qwen3Args(dim=1024, n_layers=28, n_heads=16, ffn_dim=3072, tie_embeddings=True),
    "1.7B": Qwen3Args(dim=2048, n_layers=28, n_heads=16, ffn_dim=6144, tie_embeddings=True),
    "4B": Qwen3Args(dim=2560, n_layers=36, n_heads=32, ffn_dim=9728, tie_embeddings=True),
    "8B": Qwen3Args(dim=4096, n_layers=36, n_heads=32, ffn_dim=12288),
    "14B": Qwen3Args(dim=5120, n_layers=40, n_heads=40, ffn_dim=17408),
    "32B": Qwen3Args(dim=5120, n_layers=64, n_heads=64, ffn_dim=25600),
}
