"""Named sizes of StarCoder2 with the published dimensions (config.json on the Hub).

All have a 4096-token sliding window, LayerNorm eps 1e-5 and vocabulary 49152. The 3B and
7B tie the embeddings, the 15B does not (its published total, 15.96B, counts both).
`debug` is kenotron's own: the built-in 4096-token vocabulary and a 128-token window.
"""

from __future__ import annotations

from kenotron.models.starcoder2.args import StarCoder2Args

STARCODER2_FLAVORS: dict[str, StarCoder2Args] = {
    "debug": StarCoder2Args(
        dim=256, n_layers=4, n_heads=8, n_kv_heads=2, ffn_dim=1024, vocab_size=4096, rope_theta=100_000.0,
        sliding_window=128,
    ),
    "3B": StarCoder2Args(),
    "7B": StarCoder2Args(dim=4608, n_layers=32, n_heads=36, n_kv_heads=4, ffn_dim=18432, rope_theta=1_000_000.0),
    "15B": StarCoder2Args(
        dim=6144, n_layers=40, n_heads=48, n_kv_heads=4, ffn_dim=24576, rope_theta=100_000.0,
        tie_embeddings=False,
    ),
}
