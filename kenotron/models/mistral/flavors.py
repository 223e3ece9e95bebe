"""Named sizes of Mistral with the published dimensions (config.json on the Hub).

- `7B-v0.1`: Mistral-7B-v0.1, sliding window 4096, vocabulary 32000, rope theta 1e4.
- `7B-v0.3`: Mistral-7B-v0.3, no window, vocabulary 32768, rope theta 1e6 (v0.2 has the
  same settings with vocabulary 32000: `--model.vocab_size 32000`).

`debug` is kenotron's own: the built-in 4096-token vocabulary and a 128-token window, so
training at seq_len 256 exercises the window.
"""

from __future__ import annotations

from kenotron.models.mistral.args import MistralArgs

MISTRAL_FLAVORS: dict[str, MistralArgs] = {
    "debug": MistralArgs(
        dim=256, n_layers=4, n_heads=8, n_kv_heads=4, ffn_dim=768, vocab_size=4096, sliding_window=128,
    ),
    "7B-v0.1": MistralArgs(),
    "7B-v0.3": MistralArgs(vocab_size=32768, rope_theta=1_000_000.0, sliding_window=None),
}
