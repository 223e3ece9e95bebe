"""DeepSeek-V3 family (also Moonlight and Kimi K2): model, flavors, HF adapter and spec."""

from __future__ import annotations

from typing import Any

from kenotron.errors import ConfigError
from kenotron.models.args import check_decoder_args
from kenotron.models.deepseek_v3.block import DeepSeekV3Args
from kenotron.models.deepseek_v3.flavors import DEEPSEEK_V3_FLAVORS
from kenotron.models.deepseek_v3.hf import DEEPSEEK_V3_HF_ADAPTER
from kenotron.models.deepseek_v3.model import DeepSeekV3
from kenotron.models.deepseek_v3.parallel_hints import (
    DEEPSEEK_V3_TP_STYLES,
    EXPERTS,
    MOE_MODULES,
    deepseek_v3_tp_styles,
)
from kenotron.models.spec import ModelSpec


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


DEEPSEEK_V3_SPEC = ModelSpec(
    name="deepseek_v3",
    model_cls=DeepSeekV3,
    flavors=DEEPSEEK_V3_FLAVORS,
    hf_adapter=DEEPSEEK_V3_HF_ADAPTER,
    tp_styles=DEEPSEEK_V3_TP_STYLES,
    tp_styles_for=deepseek_v3_tp_styles,
    moe_modules=MOE_MODULES,
    experts=EXPERTS,
    tp_divisors=deepseek_v3_tp_divisors,
    mixing_flops=latent_mixing_flops,
    check_args=check_deepseek_v3_args,
)

__all__ = ["DEEPSEEK_V3_FLAVORS", "DEEPSEEK_V3_HF_ADAPTER", "DEEPSEEK_V3_SPEC", "DeepSeekV3", "DeepSeekV3Args"]
