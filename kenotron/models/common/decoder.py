"""The pre-norm decoder every family here shares: embedding -> blocks -> norm -> output.

A family says which attention, norm and MLP its blocks use; `CausalLM` does the rest: tied
embeddings, RoPE tables, the attention mask (none on the fast causal path; or a FlexAttention
block mask the caller builds once per batch and every layer shares), the KV cache and the
per-parameter init. Parameter names follow Llama's (`tok_embeddings`,
`layers.N.attention.wq`, `layers.N.feed_forward.w1`, `norm`, `output`, ...), so parallel
plans written against those names apply to every family.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch
from torch import nn
from torch.nn.attention.flex_attention import BlockMask

from kenotron.models.common.attention import build_attention_mask
from kenotron.models.common.init import (
    InitSpec,
    init_parameters,
    normal,
    prefixed,
    trunc_normal,
)
from kenotron.models.common.kv_cache import KVCache, LayerKVCache
from kenotron.models.common.parametrization import Fans, spectral_init_specs
from kenotron.models.common.rope import rope_cos_sin
from kenotron.models.common.rope_scaling import RopeScaling, YarnScaling
from kenotron.models.common.router import TopKRouter


class DecoderArgs(Protocol):
    """What `CausalLM` reads from a family's args dataclass."""

    dim: int
    n_layers: int
    vocab_size: int
    rope_theta: float
    tie_embeddings: bool
    max_seq_len: int

    @property
    def head_dim(self) -> int: ...


class DecoderBlock(nn.Module):
    """x + attention(attention_norm(x)), then h + feed_forward(ffn_norm(h))."""

    def __init__(
        self, layer_id: int, attention_norm: nn.Module, attention: nn.Module, ffn_norm: nn.Module,
        feed_forward: nn.Module, *, ffn_name: str = "feed_forward",
    ) -> None:
        """`ffn_name`: the feed-forward's attribute (and parameter names): DeepSeek-V3's dense blocks
        call theirs `mlp`, keeping `feed_forward` for the MoE layers every MoE plan matches."""
        super().__init__()
        self.layer_id = layer_id
        self.attention_norm = attention_norm
        self.attention = attention
        self.ffn_norm = ffn_norm
        self.ffn_name = ffn_name
        setattr(self, ffn_name, feed_forward)
        # Output projections shrink with depth so the residual stream's variance stays bounded.
        self.out_std = 0.02 / math.sqrt(2 * (layer_id + 1))

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, attn_mask: torch.Tensor | None = None,
        kv_cache: LayerKVCache | None = None, block_mask: BlockMask | None = None,
    ) -> torch.Tensor:
        # attention gets (x, cos, sin) positionally and the rest by keyword: tensor-parallel
        # input hooks (PrepareModuleInput) count positional inputs.
        if block_mask is not None:
            h = x + self.attention(self.attention_norm(x), cos, sin, block_mask=block_mask)
        elif attn_mask is None and kv_cache is None:
            h = x + self.attention(self.attention_norm(x), cos, sin)
        else:
            h = x + self.attention(self.attention_norm(x), cos, sin, attn_mask=attn_mask, kv_cache=kv_cache)
        return h + self.ffn(self.ffn_norm(h))

    @property
    def ffn(self) -> nn.Module:
        """The feed-forward, whatever its name."""
        return getattr(self, self.ffn_name)

    def param_init_specs(self) -> dict[str, InitSpec]:
        return {
            **prefixed("attention_norm", self.attention_norm.param_init_specs()),
            **prefixed("ffn_norm", self.ffn_norm.param_init_specs()),
            **prefixed("attention", self.attention.param_init_specs(0.02, self.out_std)),
            **prefixed(self.ffn_name, self.ffn.param_init_specs(0.02, self.out_std)),
        }


class CausalLM(nn.Module):
    """tokens (batch, seq) -> logits (batch, seq, vocab).

    Blocks live in a ModuleDict keyed "0", "1", ... so a pipeline stage that keeps only some
    blocks (and drops the embedding, norm or output, set to None) keeps the same parameter
    names as the whole model.
    """

    def __init__(
        self,
        args: DecoderArgs,
        block: type[nn.Module],
        norm: nn.Module,
        *,
        rope_scaling: RopeScaling | YarnScaling | None = None,
        sliding_window: int | None = None,
    ) -> None:
        """`block(layer_id, args)` builds block i; `norm` is the final norm; `sliding_window`
        limits how far back each token attends (None: the whole causal prefix)."""
        super().__init__()
        self.args = args
        self.rope_scaling = rope_scaling
        self.sliding_window = sliding_window
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleDict({str(i): block(i, args) for i in range(args.n_layers)})
        self.norm: nn.Module | None = norm
        self.output: nn.Linear | None = nn.Linear(args.dim, args.vocab_size, bias=False)
        self.tie_weights()
        cos, sin = rope_cos_sin(args.head_dim, args.max_seq_len, args.rope_theta, rope_scaling)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def tie_weights(self) -> None:
        """Make the output projection the embedding tensor itself (when tie_embeddings)."""
        if self.args.tie_embeddings and self.output is not None and self.tok_embeddings is not None:
            self.output.weight = self.tok_embeddings.weight

    def _apply(self, fn, recurse=True):  # type: ignore[override]
        # to_empty()/to() give each module its own new tensor, which would untie the
        # embedding and the output projection: tie them again afterwards.
        out = super()._apply(fn, recurse)
        self.tie_weights()
        return out

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
        """`tokens` are ids (or hidden states on a later pipeline stage); `positions` (seq,)
        overrides 0..seq-1, e.g. for a context-parallel shard of the sequence.

        `logits=False` stops at the final norm and returns its hidden states: the fused loss
        (train/fused_loss.py) applies the output weight itself, chunk by chunk.

        Training with FlexAttention: `block_mask` (common/flex_attention.py) is handed to every
        layer in place of any other mask; it must include the model's `sliding_window`, if any.

        Generation: with `kv_cache` the tokens continue the cached ones (positions follow
        `kv_cache.length`); `token_mask` (batch, seq) marks real tokens, False for the left
        padding of shorter prompts."""
        cos, sin, attn_mask = self._prepare(tokens, positions, kv_cache, token_mask, block_mask)
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for name, layer in self.layers.items():
            h = self._attention_layer(layer, int(name), h, cos, sin, attn_mask, kv_cache, block_mask)
        return self._finish(h, kv_cache, tokens.shape[1], logits)

    def _prepare(
        self, tokens: torch.Tensor, positions: torch.Tensor | None, kv_cache: KVCache | None,
        token_mask: torch.Tensor | None, block_mask: BlockMask | None, *, attention: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(cos, sin, attention mask) of this call, and the cache's slots reserved for its tokens.
        `attention=False` (a model without attention layers) skips the mask."""
        if block_mask is not None and (kv_cache is not None or token_mask is not None):
            raise ValueError("block_mask is for training: it does not combine with kv_cache or token_mask")
        # The sequence length comes from the token ids, never from a hidden state that
        # sequence parallel may have sharded along the sequence.
        seqlen = tokens.shape[1]
        start = kv_cache.length if kv_cache is not None else 0
        if positions is None and start == 0:
            cos, sin = self.rope_cos[:seqlen], self.rope_sin[:seqlen]
        else:
            if positions is None:
                positions = torch.arange(start, start + seqlen, device=tokens.device)
            cos, sin = self.rope_cos[positions], self.rope_sin[positions]
        if kv_cache is not None:
            kv_cache.append(seqlen, token_mask)
        attn_mask = None
        if block_mask is None and attention:
            attn_mask = self._attention_mask(seqlen, positions, kv_cache, token_mask, tokens.device)
        return cos, sin, attn_mask

    @staticmethod
    def _attention_layer(
        layer: nn.Module, index: int, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
        attn_mask: torch.Tensor | None, kv_cache: KVCache | None, block_mask: BlockMask | None,
    ) -> torch.Tensor:
        """One decoder block, given only the arguments its path needs (the fast path takes none)."""
        if block_mask is not None:
            return layer(h, cos, sin, block_mask=block_mask)
        if attn_mask is None and kv_cache is None:
            return layer(h, cos, sin)
        layer_cache = kv_cache.layer(index) if kv_cache is not None else None
        return layer(h, cos, sin, attn_mask=attn_mask, kv_cache=layer_cache)

    def _finish(self, h: torch.Tensor, kv_cache: KVCache | None, seqlen: int, logits: bool = True) -> torch.Tensor:
        """Mark the cache's reserved slots filled; the final norm and (with `logits`) the output projection."""
        if kv_cache is not None:
            kv_cache.advance(seqlen)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None and logits else h

    def new_cache(self, batch: int, max_len: int, *, dtype: torch.dtype = torch.float32,
                  device: torch.device | str | None = None) -> KVCache:
        """An empty generation cache for `batch` sequences of up to `max_len` tokens."""
        args = self.args
        return KVCache(len(self.layers), batch, max_len, args.n_kv_heads, args.head_dim, dtype=dtype, device=device)

    def _attention_mask(
        self, seqlen: int, positions: torch.Tensor | None, kv_cache: KVCache | None,
        token_mask: torch.Tensor | None, device: torch.device,
    ) -> torch.Tensor | None:
        """None where plain causal attention is exact (the fast path), else a boolean mask."""
        window = self.sliding_window
        if kv_cache is None:
            if token_mask is None and (window is None or seqlen <= window):
                return None
            q_pos = positions if positions is not None else torch.arange(seqlen, device=device)
            return build_attention_mask(q_pos, q_pos, window, token_mask)
        start, end = kv_cache.length, kv_cache.length + seqlen
        if not kv_cache.has_padding and (window is None or end <= window) and (start == 0 or seqlen == 1):
            return None
        q_pos = torch.arange(start, end, device=device)
        k_pos = torch.arange(end, device=device)
        key_valid = kv_cache.valid[:, :end] if kv_cache.has_padding else None
        return build_attention_mask(q_pos, k_pos, window, key_valid)

    def param_init_specs(self) -> dict[str, InitSpec]:
        """How each parameter this model (or pipeline stage) holds is initialized."""
        args = self.args
        specs: dict[str, InitSpec] = {}
        # Untied: unit-variance embedding rows (the first norm rescales them). Tied: the
        # shared matrix must also give unit-scale logits, hence dim^-0.5.
        if self.tok_embeddings is not None:
            specs["tok_embeddings.weight"] = normal(args.dim**-0.5 if args.tie_embeddings else 1.0)
        for name, layer in self.layers.items():
            specs.update(prefixed(f"layers.{name}", layer.param_init_specs()))
        if self.norm is not None:
            specs.update(prefixed("norm", self.norm.param_init_specs()))
        if self.output is not None:
            specs["output.weight"] = trunc_normal(args.dim**-0.5)
        return specs

    def param_fans(self) -> dict[str, Fans]:
        """The output layer's fans for spectral µP: its classes (the vocabulary) are not a width,
        so its fan-out counts as 1 (common/parametrization.py)."""
        return {"output.weight": Fans(self.args.dim, 1)} if self.output is not None else {}

    def init_buffers(self, device: torch.device | str | None = None) -> None:
        """Compute the RoPE tables on `device` (they are not in the state dict) and start every
        MoE router afresh (no expert bias, no statistics)."""
        args = self.args
        self.rope_cos, self.rope_sin = rope_cos_sin(
            args.head_dim, args.max_seq_len, args.rope_theta, self.rope_scaling, device=device
        )
        for module in self.modules():
            if isinstance(module, TopKRouter):
                module.init_buffers()

    @torch.no_grad()
    def init_weights(self, buffer_device: torch.device | str | None = None, seed: int = 0,
                     parametrization: str = "standard") -> None:
        """Compute the RoPE tables and initialize every parameter from `seed`.

        Each parameter has its own generator (seeded by `seed` and its name), so the
        weights are the same under any sharding or pipeline split (see common/init.py).
        `parametrization="spectral_mup"` draws the weight matrices at the spectral scale of
        their global fans (common/parametrization.py).
        """
        self.init_buffers(buffer_device if buffer_device is not None else self.rope_cos.device)
        specs = self.param_init_specs()
        if parametrization == "spectral_mup":
            specs = spectral_init_specs(self, specs)
        elif parametrization != "standard":
            raise ValueError(f"unknown parametrization {parametrization!r}; use 'standard' or 'spectral_mup'")
        if self.args.tie_embeddings and "tok_embeddings.weight" in specs:
            # One tensor, two names: named_parameters() reports it as the embedding.
            specs.pop("output.weight", None)
        init_parameters(self, specs, seed)
