"""Parameter counts from a family's args alone, without building the model (`--list-models`).

Each function mirrors what its family's modules allocate (attention.py, mlp.py, moe.py,
mamba.py, norms.py); tests/models/test_param_count.py holds every flavor of every family to the
count of a meta-device build, so a change to a module that the count misses fails there.
"""

from __future__ import annotations

from typing import Any

from kenotron.models.common.moe_args import MoEArgs


def linear(fan_in: int, fan_out: int, bias: bool = False) -> int:
    return fan_in * fan_out + (fan_out if bias else 0)


def attention(args: Any, *, bias: bool = False, out_bias: bool = False, qk_norm: bool = False) -> int:
    """GQAttention: q, k, v and the output projection (biases where given), per-head q/k RMSNorm."""
    q, kv = args.n_heads * args.head_dim, args.n_kv_heads * args.head_dim
    return (linear(args.dim, q, bias) + 2 * linear(args.dim, kv, bias) + linear(q, args.dim, out_bias)
            + (2 * args.head_dim if qk_norm else 0))


def swiglu(dim: int, ffn_dim: int) -> int:
    return 3 * dim * ffn_dim


def gelu_mlp(dim: int, ffn_dim: int, bias: bool) -> int:
    return linear(dim, ffn_dim, bias) + linear(ffn_dim, dim, bias)


def moe(dim: int, args: MoEArgs) -> int:
    """The router's gate, the routed experts (w13 and w2), the shared expert and its gate."""
    shared = swiglu(dim, args.shared_ffn_dim) if args.shared_ffn_dim else 0
    return (dim * args.n_experts + args.n_experts * 3 * dim * args.ffn_dim + shared
            + (dim if args.shared_gate else 0))


def decoder(args: Any, blocks: int, norm: int) -> int:
    """CausalLM: the embedding, `blocks` (every block's parameters), the final norm (`norm`
    parameters) and the output projection, which a tied embedding does not add."""
    embedding = args.vocab_size * args.dim
    return embedding * (1 if args.tie_embeddings else 2) + blocks + norm


def rms_decoder(args: Any, block: int) -> int:
    """A decoder of `args.n_layers` blocks of `block` parameters each, with RMSNorm before each half
    of a block and at the end."""
    return decoder(args, args.n_layers * (block + 2 * args.dim), args.dim)


def llama3(args: Any) -> int:
    """Llama 3 and Mistral: plain GQA, SwiGLU."""
    return rms_decoder(args, attention(args) + swiglu(args.dim, args.ffn_dim))


def qwen2(args: Any) -> int:
    """Qwen2: biases on q, k, v."""
    return rms_decoder(args, attention(args, bias=True) + swiglu(args.dim, args.ffn_dim))


def qwen3(args: Any) -> int:
    """Qwen3: per-head q/k RMSNorm."""
    return rms_decoder(args, attention(args, qk_norm=True) + swiglu(args.dim, args.ffn_dim))


def starcoder2(args: Any) -> int:
    """StarCoder2: LayerNorm (weight and bias), biases everywhere (args.bias), a GELU MLP."""
    block = attention(args, bias=args.bias, out_bias=args.bias) + gelu_mlp(args.dim, args.ffn_dim, args.bias)
    return decoder(args, args.n_layers * (block + 4 * args.dim), 2 * args.dim)


def mixtral(args: Any) -> int:
    return rms_decoder(args, attention(args) + moe(args.dim, args.moe))


def qwen2_moe(args: Any) -> int:
    return rms_decoder(args, attention(args, bias=True) + moe(args.dim, args.moe))


def qwen3_moe(args: Any) -> int:
    return rms_decoder(args, attention(args, qk_norm=True) + moe(args.dim, args.moe))


def mamba2(args: Any) -> int:
    """Mamba-2 blocks (RMSNorm + mixer), Llama attention blocks at a hybrid's attention_layers."""
    inner, heads, groups, state = args.expand * args.dim, args.ssm_heads, args.ssm_groups, args.ssm_state
    conv_channels = inner + 2 * groups * state
    mixer = (linear(args.dim, 2 * inner + 2 * groups * state + heads, args.proj_bias)
             + conv_channels * args.conv_kernel + (conv_channels if args.conv_bias else 0)
             + 3 * heads  # A_log, D, dt_bias
             + inner  # the gated RMSNorm's weight
             + linear(inner, args.dim, args.proj_bias))
    n_attention = len(set(args.attention_layers))
    attention_block = attention(args) + swiglu(args.dim, args.ffn_dim) + 2 * args.dim
    mamba_block = mixer + args.dim
    return decoder(args, n_attention * attention_block + (args.n_layers - n_attention) * mamba_block, args.dim)


def latent_attention(args: Any) -> int:
    """MLA (latent_attention.py): the query's low-rank pair and its norm (or one full-rank wq), the
    key/value latent with the shared RoPE key, its norm, the latent's expansion, the output."""
    qk = args.nope_dim + args.rope_dim
    query = (linear(args.dim, args.q_rank) + args.q_rank + linear(args.q_rank, args.n_heads * qk) if args.q_rank
             else linear(args.dim, args.n_heads * qk))
    return (query + linear(args.dim, args.kv_rank + args.rope_dim) + args.kv_rank
            + linear(args.kv_rank, args.n_heads * (args.nope_dim + args.v_dim)) + linear(args.n_heads * args.v_dim, args.dim))


def deepseek_v3(args: Any) -> int:
    """DeepSeek-V3: MLA blocks, dense SwiGLU below n_dense_layers, experts above; each MTP module
    is an expert block (dense when the model has no expert block) with two input norms, the
    projection of their concatenation and its output norm."""
    norms = 2 * args.dim
    dense = latent_attention(args) + swiglu(args.dim, args.ffn_dim) + norms
    expert = latent_attention(args) + moe(args.dim, args.moe) + norms
    n_dense = min(args.n_dense_layers, args.n_layers)
    mtp_block = (expert if n_dense < args.n_layers else dense) + 3 * args.dim + linear(2 * args.dim, args.dim)
    return decoder(args, n_dense * dense + (args.n_layers - n_dense) * expert + args.mtp_depth * mtp_block, args.dim)
