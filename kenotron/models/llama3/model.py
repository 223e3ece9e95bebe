"""Llama 3 (3, 3.1, 3.2): pre-norm decoder with RMSNorm, RoPE, grouped-query attention, SwiGLU.

A plain nn.Module: nothing here knows about parallelism. Build it on the meta device, then
`to_empty(device=...)` and `init_weights()`; the RoPE tables are buffers recomputed by
`init_weights` so they are right after materialization.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from kenotron.models.common.attention import GQAttention
from kenotron.models.common.init import InitSpec, init_parameters, normal, prefixed, trunc_normal
from kenotron.models.common.mlp import SwiGLU
from kenotron.models.common.norms import RMSNorm
from kenotron.models.common.rope import RopeScaling, rope_cos_sin


@dataclass(frozen=True)
class Llama3Args:
    """Dimensions of a Llama 3 model (names follow the paper; HF names in comments)."""

    dim: int = 4096
    """Width of the residual stream (hidden_size)."""
    n_layers: int = 32
    """Transformer blocks (num_hidden_layers)."""
    n_heads: int = 32
    """Query heads (num_attention_heads)."""
    n_kv_heads: int = 8
    """Key/value heads shared by groups of query heads (num_key_value_heads)."""
    ffn_dim: int = 14336
    """Hidden width of the SwiGLU MLP (intermediate_size)."""
    vocab_size: int = 128256
    """Embedding rows."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon (rms_norm_eps)."""
    rope_theta: float = 500000.0
    """RoPE base."""
    rope_scaling: RopeScaling | None = field(default_factory=RopeScaling)
    """Llama 3.1 frequency scaling; None for plain RoPE."""
    tie_embeddings: bool = False
    """Share the input embedding with the output projection (Llama 3.2 1B/3B)."""
    max_seq_len: int = 8192
    """Length of the RoPE tables; the trainer sets it to training.seq_len."""

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


class TransformerBlock(nn.Module):
    def __init__(self, layer_id: int, args: Llama3Args) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = GQAttention(args.dim, args.n_heads, args.n_kv_heads, args.head_dim)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.feed_forward = SwiGLU(args.dim, args.ffn_dim)
        # Output projections shrink with depth so the residual stream's variance stays bounded.
        self.out_std = 0.02 / math.sqrt(2 * (layer_id + 1))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))

    def param_init_specs(self) -> dict[str, InitSpec]:
        return {
            **prefixed("attention_norm", self.attention_norm.param_init_specs()),
            **prefixed("ffn_norm", self.ffn_norm.param_init_specs()),
            **prefixed("attention", self.attention.param_init_specs(0.02, self.out_std)),
            **prefixed("feed_forward", self.feed_forward.param_init_specs(0.02, self.out_std)),
        }


class Llama3(nn.Module):
    """tokens (batch, seq) -> logits (batch, seq, vocab).

    Blocks live in a ModuleDict keyed "0", "1", ... so a pipeline stage that keeps only some
    blocks (and drops the embedding, norm or output, set to None) keeps the same parameter
    names as the whole model.
    """

    def __init__(self, args: Llama3Args) -> None:
        super().__init__()
        self.args = args
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(i, args) for i in range(args.n_layers)})
        self.norm: RMSNorm | None = RMSNorm(args.dim, args.norm_eps)
        self.output: nn.Linear | None = nn.Linear(args.dim, args.vocab_size, bias=False)
        self._tie_weights()
        cos, sin = rope_cos_sin(args.head_dim, args.max_seq_len, args.rope_theta, args.rope_scaling)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def _tie_weights(self) -> None:
        if self.args.tie_embeddings and self.output is not None and self.tok_embeddings is not None:
            self.output.weight = self.tok_embeddings.weight

    def _apply(self, fn, recurse=True):  # type: ignore[override]
        # to_empty()/to() give each module its own new tensor, which would untie the
        # embedding and the output projection: tie them again afterwards.
        out = super()._apply(fn, recurse)
        self._tie_weights()
        return out

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """`tokens` are ids (or hidden states on a later pipeline stage); `positions`
        (seq,) overrides 0..seq-1, e.g. for a context-parallel shard of the sequence."""
        # The sequence length comes from the token ids, never from a hidden state that
        # sequence parallel may have sharded along the sequence.
        seqlen = tokens.shape[1]
        if positions is None:
            cos, sin = self.rope_cos[:seqlen], self.rope_sin[:seqlen]
        else:
            cos, sin = self.rope_cos[positions], self.rope_sin[positions]
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for layer in self.layers.values():
            h = layer(h, cos, sin)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h

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

    @torch.no_grad()
    def init_weights(self, buffer_device: torch.device | str | None = None, seed: int = 0) -> None:
        """Compute the RoPE tables and initialize every parameter from `seed`.

        Each parameter has its own generator (seeded by `seed` and its name), so the
        weights are the same under any sharding or pipeline split (see common/init.py).
        """
        args = self.args
        device = buffer_device if buffer_device is not None else self.rope_cos.device
        self.rope_cos, self.rope_sin = rope_cos_sin(
            args.head_dim, args.max_seq_len, args.rope_theta, args.rope_scaling, device=device
        )
        specs = self.param_init_specs()
        if args.tie_embeddings and "tok_embeddings.weight" in specs:
            # One tensor, two names: named_parameters() reports it as the embedding.
            specs.pop("output.weight", None)
        init_parameters(self, specs, seed)
