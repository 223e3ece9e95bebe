"""Named sizes of Mamba-2 with the published dimensions (state-spaces/mamba2-*: GPT-NeoX's
vocabulary padded to 50288, state 128, heads of 64, one B/C group, chunks of 256, tied
embeddings), kenotron's CPU-sized `debug` (four B/C groups, so tensor parallel has groups to
split) and two hybrids of kenotron's own: Mamba blocks with Llama attention + SwiGLU blocks at
`attention_layers` (the Jamba / Nemotron-H / Zamba idea)."""

from __future__ import annotations

from kenotron.models.mamba2.args import Mamba2Args

_DEBUG = {"dim": 256, "n_layers": 4, "vocab_size": 4096, "ssm_state": 32, "ssm_head_dim": 32, "ssm_groups": 4,
          "chunk_size": 32}

MAMBA2_FLAVORS: dict[str, Mamba2Args] = {
    "debug": Mamba2Args(**_DEBUG),
    "debug-hybrid": Mamba2Args(**_DEBUG, attention_layers=(2,), n_heads=8, n_kv_heads=4, head_dim=32, ffn_dim=768),
    "130M": Mamba2Args(dim=768, n_layers=24),
    "370M": Mamba2Args(dim=1024, n_layers=48),
    "780M": Mamba2Args(dim=1536, n_layers=48),
    "1.3B": Mamba2Args(dim=2048, n_layers=48),
    "2.7B": Mamba2Args(dim=2560, n_layers=64),
    # One attention block in every twelve layers, as in Nemotron-H's ratio.
    "hybrid-1.3B": Mamba2Args(dim=2048, n_layers=48, attention_layers=(5, 17, 29, 41), n_heads=16, n_kv_heads=8,
                              head_dim=128, ffn_dim=5632),
}
