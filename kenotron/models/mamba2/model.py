"""Mamba-2 (and hybrids): embedding -> Mamba blocks (and, at `attention_layers`, Llama's
attention + SwiGLU block) -> RMSNorm -> output. The mixer is models/common/mamba.py; the
decoder around it (tied embeddings, init, pipeline-friendly names) is common/decoder.py's."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn.attention.flex_attention import BlockMask

from kenotron.models.common.attention import GQAttention
from kenotron.models.common.decoder import CausalLM, DecoderBlock
from kenotron.models.common.init import InitSpec, normal
from kenotron.models.common.mamba import Mamba2Mixer, MambaBlock, MixerShape
from kenotron.models.common.mlp import SwiGLU
from kenotron.models.common.norms import RMSNorm
from kenotron.models.common.recurrent_cache import RecurrentCache
from kenotron.models.mamba2.args import Mamba2Args


def mixer_shape(args: Mamba2Args) -> MixerShape:
    """The dimensions of one Mamba-2 mixer of the model `args` builds."""
    return MixerShape(args.dim, args.ssm_heads, args.ssm_head_dim, args.ssm_groups, args.ssm_state, args.conv_kernel,
                      args.chunk_size)


def mamba2_block(layer_id: int, args: Mamba2Args) -> nn.Module:
    """Layer `layer_id`: Llama's attention block at the hybrid's attention indices, else a Mamba block."""
    if layer_id in args.attention_layers:
        return DecoderBlock(
            layer_id,
            attention_norm=RMSNorm(args.dim, args.norm_eps),
            attention=GQAttention(args.dim, args.n_heads, args.n_kv_heads, args.head_dim),
            ffn_norm=RMSNorm(args.dim, args.norm_eps),
            feed_forward=SwiGLU(args.dim, args.ffn_dim),
        )
    mixer = Mamba2Mixer(
        mixer_shape(args), norm_eps=args.norm_eps, conv_bias=args.conv_bias, proj_bias=args.proj_bias,
        a_init=args.a_init_range, dt_init=(*args.dt_init_range, args.dt_init_floor),
        out_std_divisor=math.sqrt(args.n_layers),
    )
    return MambaBlock(layer_id, args.dim, args.norm_eps, mixer)


class Mamba2(CausalLM):
    """tokens (batch, seq) -> logits (batch, seq, vocab); see CausalLM."""

    def __init__(self, args: Mamba2Args) -> None:
        super().__init__(args, mamba2_block, RMSNorm(args.dim, args.norm_eps))

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None, *, kv_cache: RecurrentCache | None = None,
                token_mask: torch.Tensor | None = None, block_mask: BlockMask | None = None,
                logits: bool = True) -> torch.Tensor:
        """As CausalLM.forward; `kv_cache` is a RecurrentCache (`new_cache`), `token_mask` marks left padding."""
        cos, sin, attn_mask = self._prepare(tokens, positions, kv_cache, token_mask, block_mask,
                                            attention=bool(self.args.attention_layers))
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for name, layer in self.layers.items():
            if isinstance(layer, MambaBlock):
                state = kv_cache.layer(int(name)) if kv_cache is not None else None
                h = layer(h, state=state, token_mask=token_mask)
            else:
                h = self._attention_layer(layer, int(name), h, cos, sin, attn_mask, kv_cache, block_mask)
        return self._finish(h, kv_cache, tokens.shape[1], logits)

    def new_cache(self, batch: int, max_len: int, *, dtype: torch.dtype = torch.float32,
                  device: torch.device | str | None = None) -> RecurrentCache:
        a = self.args
        s = mixer_shape(a)
        ssm = {int(name): (s.conv_kernel, s.conv_channels, s.heads, s.head_dim, s.state)
               for name, layer in self.layers.items() if isinstance(layer, MambaBlock)}
        return RecurrentCache(ssm, sorted(a.attention_layers), batch, max_len, a.n_kv_heads, a.head_dim, dtype=dtype,
                              device=device)

    def param_init_specs(self) -> dict[str, InitSpec]:
        specs = super().param_init_specs()
        if self.tok_embeddings is not None:  # mamba_ssm's initializer_range
            specs["tok_embeddings.weight"] = normal(0.02)
        return specs
