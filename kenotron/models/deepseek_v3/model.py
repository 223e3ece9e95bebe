"""DeepSeek-V3 (and Moonlight, Kimi K2): multi-head latent attention, a few dense blocks first, then
mixture-of-experts blocks with shared experts and sigmoid, group-limited routing (block.py), and
optional multi-token-prediction modules after the main blocks (mtp.py).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.attention.flex_attention import BlockMask

from kenotron.models.common.decoder import CausalLM
from kenotron.models.common.kv_cache import KVCache
from kenotron.models.common.latent_attention import LatentCache
from kenotron.models.common.norms import RMSNorm
from kenotron.models.common.router import attach_loss
from kenotron.models.deepseek_v3.args import DeepSeekV3Args
from kenotron.models.deepseek_v3.block import DeepSeekV3Block
from kenotron.models.deepseek_v3.mtp import MTPBlock, MTPLoss


def _block(layer_id: int, args: DeepSeekV3Args) -> DeepSeekV3Block:
    return MTPBlock(layer_id, args) if layer_id >= args.n_layers else DeepSeekV3Block(layer_id, args)


class DeepSeekV3(CausalLM):
    """tokens (batch, seq) -> logits (batch, seq, vocab); see CausalLM. `layers` holds the
    n_layers main blocks, then the mtp_depth MTP modules, which run in training only."""

    def __init__(self, args: DeepSeekV3Args) -> None:
        super().__init__(args, _block, RMSNorm(args.dim, args.norm_eps), rope_scaling=args.rope_scaling)
        for k in range(args.mtp_depth):
            self.layers[str(args.n_layers + k)] = _block(args.n_layers + k, args)
        self.mtp = MTPLoss(args.mtp_depth) if args.mtp_depth else None

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor | None = None,
        *,
        kv_cache: KVCache | None = None,
        token_mask: torch.Tensor | None = None,
        block_mask: BlockMask | None = None,
        logits: bool = True,
    ) -> torch.Tensor:
        """As CausalLM.forward; in training (grad enabled) the MTP modules this model (or pipeline
        stage) holds add their loss to backward through the output."""
        cos, sin, attn_mask = self._prepare(tokens, positions, kv_cache, token_mask, block_mask)
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        mtp_blocks = []  # blocks n_layers.. (a plan may have wrapped them: told by their index)
        for name, layer in self.layers.items():
            if int(name) >= self.args.n_layers:
                mtp_blocks.append(layer)
            else:
                h = self._attention_layer(layer, int(name), h, cos, sin, attn_mask, kv_cache, block_mask)
        if mtp_blocks and self.training and torch.is_grad_enabled() and kv_cache is None:
            # Attached to the hidden states, a plain tensor (the logits may be a DTensor under loss parallel).
            h = attach_loss(h, self._mtp_term(mtp_blocks, tokens, h, cos, sin, block_mask))
        return self._finish(h, kv_cache, tokens.shape[1], logits)

    def _mtp_term(self, blocks: list[nn.Module], tokens: torch.Tensor, h: torch.Tensor, cos: torch.Tensor,
                  sin: torch.Tensor, block_mask: BlockMask | None) -> torch.Tensor:
        """The MTP modules' weighted losses (mtp.py), from the main blocks' last hidden states `h`."""
        if self.tok_embeddings is None or self.output is None or tokens.is_floating_point():
            raise RuntimeError("the MTP modules need the token ids, the embedding and the output head on their "
                               "pipeline stage; they run on a model or stage holding all three")
        attention = {"block_mask": block_mask} if block_mask is not None else {}
        total = h.new_zeros((), dtype=torch.float32)
        for k, block in enumerate(blocks, start=1):
            h, normed = block(self.tok_embeddings(torch.roll(tokens, -k, dims=1)), h, cos, sin, **attention)
            total = total + self.mtp.term(k, self.output(normed), tokens)
        return total

    def init_buffers(self, device: torch.device | str | None = None) -> None:
        """CausalLM's, and the MTP statistics zeroed."""
        super().init_buffers(device)
        if self.mtp is not None:
            self.mtp.reset()

    def new_cache(self, batch: int, max_len: int, *, dtype: torch.dtype = torch.float32,
                  device: torch.device | str | None = None) -> LatentCache:
        """An empty generation cache holding each token's latent and RoPE key per main block."""
        args = self.args
        return LatentCache(args.n_layers, batch, max_len, args.kv_rank, args.rope_dim, dtype=dtype, device=device)
