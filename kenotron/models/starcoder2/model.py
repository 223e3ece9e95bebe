"""StarCoder2: a pre-norm decoder with LayerNorm (with bias), biases on every attention and MLP
projection, a GELU(tanh) MLP without gate, RoPE, grouped-query attention and a 4096-token
sliding window.

Parameter names follow Llama's; the MLP is `feed_forward.{w1, w2}` (HF's c_fc, c_proj: no
w3), and the norms and projections carry a `.bias` next to their `.weight`.
"""

from __future__ import annotations

from kenotron.models.common.attention import GQAttention
from kenotron.models.common.decoder import CausalLM, DecoderBlock
from kenotron.models.common.mlp import GeluMLP
from kenotron.models.common.norms import LayerNorm
from kenotron.models.starcoder2.args import StarCoder2Args


class StarCoder2Block(DecoderBlock):
    """LayerNorm -> grouped-query attention (all projections biased), LayerNorm -> GELU MLP."""

    def __init__(self, layer_id: int, args: StarCoder2Args) -> None:
        super().__init__(
            layer_id,
            attention_norm=LayerNorm(args.dim, args.norm_eps),
            attention=GQAttention(
                args.dim, args.n_heads, args.n_kv_heads, args.head_dim, bias=args.bias, out_bias=args.bias
            ),
            ffn_norm=LayerNorm(args.dim, args.norm_eps),
            feed_forward=GeluMLP(args.dim, args.ffn_dim, bias=args.bias),
        )


class StarCoder2(CausalLM):
    """tokens (batch, seq) -> logits (batch, seq, vocab); see CausalLM."""

    def __init__(self, args: StarCoder2Args) -> None:
        super().__init__(
            args, StarCoder2Block, LayerNorm(args.dim, args.norm_eps), sliding_window=args.sliding_window
        )
