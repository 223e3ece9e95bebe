"""Generation state of a model with Mamba layers (and, in hybrids, attention layers).

A Mamba layer carries a fixed-size state instead of a growing key/value cache: the causal
convolution's last K - 1 inputs and the scan's state (heads x head_dim x N, fp32). Attention
layers of a hybrid keep their keys and values in a `KVCache`, which also tracks positions and
the left padding of the batch (`valid`) for the whole model, so `RecurrentCache` has the
KVCache's interface (`length`, `valid`, `has_padding`, `append`, `advance`, `layer`).
"""

from __future__ import annotations

import torch

from kenotron.models.common.kv_cache import KVCache, LayerKVCache
from kenotron.models.common.mamba import SSMLayerState


class RecurrentCache:
    """State of every layer for `batch` sequences of up to `max_len` tokens."""

    def __init__(
        self, ssm_layers: dict[int, tuple[int, int, int, int, int]], attention_layers: list[int], batch: int,
        max_len: int, n_kv_heads: int, head_dim: int, *, dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        """`ssm_layers`: {layer index: (conv kernel, conv channels, heads, head_dim, state)} of
        this rank's Mamba layers; `attention_layers`: the indices of the attention layers."""
        self.kv = KVCache(len(attention_layers), batch, max_len, n_kv_heads, head_dim, dtype=dtype, device=device)
        self._kv_index = {layer: i for i, layer in enumerate(attention_layers)}
        self.states = {
            layer: SSMLayerState(
                conv=torch.zeros(batch, kernel - 1, channels, dtype=dtype, device=device),
                ssm=torch.zeros(batch, heads, ssm_head_dim, state, dtype=torch.float32, device=device),
            )
            for layer, (kernel, channels, heads, ssm_head_dim, state) in ssm_layers.items()
        }

    @property
    def description(self) -> str:
        """What the cache holds, in words (for messages): a hybrid's attention layers add a KV cache."""
        return "recurrent state cache" + (" + attention KV cache" if self._kv_index else "")

    @property
    def length(self) -> int:
        """Tokens fed so far (the position of the next one)."""
        return self.kv.length

    @property
    def valid(self) -> torch.Tensor:
        return self.kv.valid

    @property
    def has_padding(self) -> bool:
        return self.kv.has_padding

    @property
    def max_len(self) -> int:
        return self.kv.max_len

    def layer(self, index: int) -> LayerKVCache | SSMLayerState:
        """An attention layer's view of the key/value cache, or a Mamba layer's state."""
        if index in self.states:
            return self.states[index]
        return self.kv.layer(self._kv_index[index])

    def append(self, seqlen: int, token_mask: torch.Tensor | None) -> None:
        self.kv.append(seqlen, token_mask)

    def advance(self, seqlen: int) -> None:
        self.kv.advance(seqlen)
