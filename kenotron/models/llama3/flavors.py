"""Named sizes of Llama 3 with the published dimensions.

`debug` is kenotron's own: small enough to train in a minute on two CPU cores, shaped like
the real ones (GQA, tied embeddings off) and sized to the built-in 4096-token vocabulary.
"""

from __future__ import annotations

from kenotron.models.common.rope_scaling import RopeScaling
from kenotron.models.llama3.args import Llama3Args

_LLAMA31_SCALING = RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_len=8192)
_LLAMA32_SCALING = RopeScaling(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_len=8192)

LLAMA3_FLAVORS: dict[str, Llama3Args] = {
    "debug": Llama3Args(
        dim=256, n_layers=4, n_heads=8, n_kv_heads=4, ffn_dim=768, vocab_size=4096,
        rope_theta=10000.0, rope_scaling=None,
    ),
    "1B": Llama3Args(
        dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, ffn_dim=8192, rope_scaling=_LLAMA32_SCALING,
        tie_embeddings=True,
    ),
    "3B": Llama3Args(
        dim=3072, n_layers=28, n_heads=24, n_kv_heads=8, ffn_dim=8192, rope_scaling=_LLAMA32_SCALING,
        tie_embeddings=True,
    ),
    "8B": Llama3Args(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim=14336, rope_scaling=_LLAMA31_SCALING),
    "70B": Llama3Args(dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn_dim=28672, rope_scaling=_LLAMA31_SCALING),
    "405B": Llama3Args(
        dim=16384, n_layers=126, n_heads=128, n_kv_heads=8, ffn_dim=53248, rope_scaling=_LLAMA31_SCALING,
    ),
}
