"""DeepSeek-V3's args and their checks, importing no torch: the launcher checks a config's model
shape with them before torch is imported (models/spec.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kenotron.errors import ConfigError
from kenotron.models.args import check_decoder_args
from kenotron.models.common.moe_args import MoEArgs
from kenotron.models.common.rope_scaling import YarnScaling


def _v3_moe() -> MoEArgs:
    return MoEArgs(n_experts=256, top_k=8, ffn_dim=2048, score_func="sigmoid", norm_topk=True, route_scale=2.5,
                   shared_ffn_dim=2048, n_groups=8, topk_groups=4)


@dataclass(frozen=True)
class DeepSeekV3Args:
    """Dimensions of a DeepSeek-V3-class model (HF names in brackets)."""

    dim: int = 7168
    """Width of the residual stream (hidden_size)."""
    n_layers: int = 61
    """Transformer blocks (num_hidden_layers), the dense ones included."""
    n_heads: int = 128
    """Attention heads (num_attention_heads)."""
    q_rank: int = 1536
    """Rank of the query's low-rank projection (q_lora_rank); 0: a full-rank query projection."""
    kv_rank: int = 512
    """Rank of the key/value latent (kv_lora_rank), what the generation cache holds per token."""
    nope_dim: int = 128
    """Per-head query/key size without RoPE (qk_nope_head_dim)."""
    rope_dim: int = 64
    """Per-head query/key size with RoPE (qk_rope_head_dim); the key's part is shared by the heads."""
    v_dim: int = 128
    """Per-head value size (v_head_dim)."""
    ffn_dim: int = 18432
    """Hidden width of the dense blocks' SwiGLU (intermediate_size)."""
    n_dense_layers: int = 3
    """Leading blocks with a dense SwiGLU instead of experts (first_k_dense_replace)."""
    moe: MoEArgs = field(default_factory=_v3_moe)
    """The MoE blocks' experts and routing (n_routed_experts, num_experts_per_tok, moe_intermediate_size,
    routed_scaling_factor, n_group, topk_group; shared_ffn_dim = n_shared_experts x moe_intermediate_size)."""
    vocab_size: int = 129280
    """Embedding rows (vocab_size)."""
    norm_eps: float = 1e-6
    """Epsilon of every RMSNorm, the latent norms included (rms_norm_eps)."""
    rope_theta: float = 10000.0
    """RoPE base (rope_theta)."""
    rope_scaling: YarnScaling | None = None
    """YaRN scaling of the RoPE frequencies and of the softmax (rope_scaling with type yarn); None: plain."""
    rope_interleave: bool = True
    """Whether the HF checkpoint's RoPE rows are interleaved pairs (rope_interleave); kenotron
    computes in halves either way and reorders those rows on conversion."""
    tie_embeddings: bool = False
    """Share the input embedding with the output projection (tie_word_embeddings)."""
    max_seq_len: int = 4096
    """Length of the RoPE tables; the trainer sets it to training.seq_len."""
    mtp_depth: int = 0
    """Multi-token-prediction modules (num_nextn_predict_layers): module k predicts token t+k+1; 0: off."""
    mtp_loss_weight: float = 0.3
    """λ of the MTP loss: the step's loss adds λ / mtp_depth x the modules' summed mean losses (kenotron's; not in config.json)."""

    @property
    def head_dim(self) -> int:
        """The RoPE tables' width: the rotated part of each head."""
        return self.rope_dim

    @property
    def n_kv_heads(self) -> int:
        """Every head has its own keys and values (expanded from the shared latent)."""
        return self.n_heads

    @property
    def qk_dim(self) -> int:
        """Per-head query/key width: the part without RoPE and the rotated part."""
        return self.nope_dim + self.rope_dim


def deepseek_v3_tp_divisors(args: DeepSeekV3Args) -> dict[str, int]:
    """Tensor parallel splits the heads, the dense blocks' MLP and the vocabulary."""
    return {"n_heads": args.n_heads, "ffn_dim": args.ffn_dim, "vocab_size": args.vocab_size}


def latent_mixing_flops(args: DeepSeekV3Args, seq_len: int) -> float:
    """6·L·H·(qk + v)·T: the scores (qk wide) and the values (v wide), forward and backward, causal."""
    return 6.0 * args.n_layers * args.n_heads * (args.nope_dim + args.rope_dim + args.v_dim) * seq_len


def check_deepseek_v3_args(args: Any) -> None:
    """Every shape check of the family, each naming the `model.` key and the fix."""
    check_decoder_args(args)
    if not 0 <= args.n_dense_layers <= args.n_layers:
        raise ConfigError(f"model.n_dense_layers={args.n_dense_layers} must lie in [0, model.n_layers={args.n_layers}]")
    if args.rope_dim % 2 or args.rope_dim <= 0:
        raise ConfigError(f"model.rope_dim={args.rope_dim} must be a positive even number (RoPE rotates pairs)")
    yarn = args.rope_scaling
    if yarn is not None and not (yarn.factor >= 1 and yarn.original_max_len > 0 and yarn.beta_fast > 0
                                 and yarn.beta_slow > 0 and yarn.mscale >= 0 and yarn.mscale_all_dim >= 0):
        raise ConfigError(f"model.rope_scaling={yarn} needs factor >= 1, original_max_len, beta_fast and beta_slow > 0, "
                          f"mscale and mscale_all_dim >= 0")
    if args.mtp_depth < 0:
        raise ConfigError(f"model.mtp_depth={args.mtp_depth} must be >= 0 (0 turns multi-token prediction off)")
