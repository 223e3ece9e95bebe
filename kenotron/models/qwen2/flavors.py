"""Named sizes of Qwen2 / Qwen2.5 with the published dimensions (config.json on the Hub).

Qwen2 and Qwen2.5 share the shapes where both have a size (0.5B, 1.5B, 7B, 72B); 3B, 14B
and 32B exist only as Qwen2.5. Sizes up to 3B tie the embeddings. `debug` is kenotron's own,
sized to the built-in 4096-token vocabulary.
"""

from __future__ import annotations

from kenotron.models.qwen2.args import Qwen2Args

QWEN2_FLAVORS: dict[str, Qwen2Args] = {
    "debug": Qwen2Args(
        dim=256, n_layers=4, n_heads=8, n_kv_heads=2, ffn_dim=768, vocab_size=4096, tie_embeddings=True,
    ),
    "0.5B": Qwen2Args(
        dim=896, n_layers=24, n_heads=14, n_kv_heads=2, ffn_dim=4864, vocab_size=151936, tie_embeddings=True,
    ),
    "1.5B": Qwen2Args(
        dim=1536, n_layers=28, n_heads=12, n_kv_heads=2, ffn_dim=8960, vocab_size=151936, tie_embeddings=True,
    ),
    "3B": Qwen2Args(
        dim=2048, n_layers=36, n_heads=16, n_kv_heads=2, ffn_dim=11008, vocab_size=151936, tie_embeddings=True,
    ),
    "7B": Qwen2Args(dim=3584, n_layers=28, n_heads=28, n_kv_heads=4, ffn_dim=18944, vocab_size=152064),
    "14B": Qwen2Args(
        dim=5120, n_layers=48, n_heads=40, n_kv_heads=8, ffn_dim=13824, vocab_size=152064, norm_eps=1e-5,
    ),
    "32B": Qwen2Args(
        dim=5120, n_layers=64, n_heads=40, n_kv_heads=8, ffn_dim=27648, vocab_size=152064, norm_eps=1e-5,
    ),
    "72B": Qwen2Args(
        dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn_dim=29568, vocab_size=152064, norm_eps=1e-5,
    ),
}
