"""DeepSeek-V3 (and Moonlight, Kimi K2): multi-head latent attention, a few dense blocks first, then
mixture-of-experts blocks with shared experts and sigmoid, group-limited routing (block.py), and
optional multi-token-prediction modules after the main blocks (mtp.py).
"""

from __future__ import annotations

import torch
from torch.nn.attention.flex_attention import BlockMask

from kenotron.models.common.decoder import CausalLM
from kenotron.models.common.future_tokens import future_tokens
from kenotron.models.common.kv_cache import KVCache
from kenotron.models.common.latent_attention import LatentCache
from kenotron.models.common.norms import RMSNorm
from kenotron.models.deepseek_v3.args import DeepSeekV3Args
from kenotron.models.deepseek_v3.block import DeepSeekV3Block
from kenotron.models.deepseek_v3.mtp import MTPBlock, MTPLoss, attach_to_output, mtp_stage_copies


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

    @property
    def pipeline_tail_blocks(self) -> int:
        """Under pipeline parallel the MTP modules run on the last stage, beside the output head (pipeline.py)."""
        return self.args.mtp_depth

    def pipeline_copies(self, units: list[str]) -> list[str]:
        """What a pipeline stage holding `units` needs besides them (pipeline.py; mtp.py's mtp_stage_copies)."""
        return mtp_stage_copies(self.args, units)

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor | None = None,
        *,
        kv_cache: KVCache | None = None,
        token_mask: torch.Tensor | None = None,
        block_mask: BlockMask | None = None,
        logits: bool = True,
        future: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """As CausalLM.forward; in training (grad enabled) the MTP modules this model (or pipeline
        stage) holds add their loss to backward through the output. `future`: mtp.py's
        future_tokens of this call's positions, made from `tokens` when None."""
        cos, sin, attn_mask = self._prepare(tokens, positions, kv_cache, token_mask, block_mask)
        ids = not tokens.is_floating_point()  # a later stage gets hidden states (and may hold a copy of the embedding)
        h = self.tok_embeddings(tokens) if ids and self.tok_embeddings is not None else tokens
        mtp_blocks = []  # blocks n_layers.. (a plan may have wrapped them: told by their index)
        for name, layer in self.layers.items():
            if int(name) >= self.args.n_layers:
                mtp_blocks.append(layer)
            else:
                h = self._attention_layer(layer, int(name), h, cos, sin, attn_mask, kv_cache, block_mask)
        term = None
        # Meta inputs: torch 2.11's pipeline stages infer shapes on them (no loss to compute).
        if mtp_blocks and self.training and torch.is_grad_enabled() and kv_cache is None and not h.is_meta:
            if future is None:
                future = future_tokens(tokens, self.args.mtp_depth)  # the whole sequence's ids, or refused there
            term = self.mtp.loss(mtp_blocks, self.tok_embeddings, self.output, future, h, cos, sin, block_mask)
        out = self._finish(h, kv_cache, tokens.shape[1], logits)
        return out if term is None else attach_to_output(out, term)  # after the head (mtp.py says why)

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
