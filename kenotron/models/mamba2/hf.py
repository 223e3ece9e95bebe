"""Mamba-2 <-> transformers `Mamba2ForCausalLM`: key names, config.json, and the row order of
the in-projection and the convolution (kenotron stores them group by group, see
models/common/mamba.py; with one group both orders are the same and nothing is copied).
Hybrids (attention_layers) have no transformers class: they convert to and from kenotron
checkpoints only."""

from __future__ import annotations

import math
from typing import Any

import torch

from kenotron.models.hf_adapter import HFAdapter, HFConversionError, require
from kenotron.models.mamba2.args import Mamba2Args
from kenotron.models.mamba2.model import mixer_shape

MAMBA2_TOP_KEYS = {
    "tok_embeddings.weight": "backbone.embeddings.weight",
    "norm.weight": "backbone.norm_f.weight",
    "output.weight": "lm_head.weight",
}
MAMBA2_LAYER_KEYS = {
    "norm.weight": "norm.weight",
    "mixer.in_proj.weight": "mixer.in_proj.weight",
    "mixer.in_proj.bias": "mixer.in_proj.bias",
    "mixer.conv1d.weight": "mixer.conv1d.weight",
    "mixer.conv1d.bias": "mixer.conv1d.bias",
    "mixer.ssm.A_log": "mixer.A_log",
    "mixer.ssm.D": "mixer.D",
    "mixer.ssm.dt_bias": "mixer.dt_bias",
    "mixer.norm.weight": "mixer.norm.weight",
    "mixer.out_proj.weight": "mixer.out_proj.weight",
    "mixer.out_proj.bias": "mixer.out_proj.bias",
}


def regroup(t: torch.Tensor, groups: int, segments: list[int], to_hf: bool) -> torch.Tensor:
    """Rows [seg0 of group 0, seg1 of group 0, ..., seg0 of group 1, ...] (kenotron) <-> [seg0 of
    every group, seg1 of every group, ...] (HF); `segments` are one group's segment sizes."""
    if groups == 1:
        return t
    rest = t.shape[1:]
    if to_hf:
        parts = t.reshape(groups, sum(segments), *rest).split(segments, dim=1)
        return torch.cat([p.reshape(-1, *rest) for p in parts])
    parts = t.split([groups * s for s in segments])
    return torch.cat([p.reshape(groups, s, *rest) for p, s in zip(parts, segments)], dim=1).reshape(-1, *rest)


def _in_proj_order(t: torch.Tensor, args: Mamba2Args, to_hf: bool) -> torch.Tensor:
    s = mixer_shape(args)
    heads = s.heads // s.groups
    return regroup(t, s.groups, [heads * s.head_dim, heads * s.head_dim, s.state, s.state, heads], to_hf)


def _conv_order(t: torch.Tensor, args: Mamba2Args, to_hf: bool) -> torch.Tensor:
    s = mixer_shape(args)
    return regroup(t, s.groups, [s.heads // s.groups * s.head_dim, s.state, s.state], to_hf)


def _as_float(value: Any) -> float:
    """A float of config.json, where transformers writes infinity as {"__float__": "Infinity"}."""
    return float(value["__float__"]) if isinstance(value, dict) else float(value)


def mamba2_args_from_hf_config(config: dict[str, Any]) -> Mamba2Args:
    require(config, "hidden_act", "silu", "the convolution's activation is SiLU")
    limit = config.get("time_step_limit", (0.0, math.inf))
    if tuple(_as_float(v) for v in limit) != (0.0, math.inf):
        raise HFConversionError(f"config.json has time_step_limit={limit!r}; kenotron's Mamba-2 does not clamp dt "
                                f"(it needs [0.0, inf])")
    dim, expand = config["hidden_size"], config.get("expand", 2)
    head_dim = config.get("head_dim", 64)
    if config.get("num_heads", expand * dim // head_dim) * head_dim != expand * dim:
        raise HFConversionError(f"config.json has num_heads={config['num_heads']} x head_dim={head_dim} != expand x "
                                f"hidden_size = {expand * dim}; the checkpoint is inconsistent")
    return Mamba2Args(
        dim=dim, n_layers=config["num_hidden_layers"], vocab_size=config["vocab_size"],
        ssm_state=config.get("state_size", 128), ssm_head_dim=head_dim, expand=expand,
        ssm_groups=config.get("n_groups", 8), conv_kernel=config.get("conv_kernel", 4),
        chunk_size=config.get("chunk_size", 256), conv_bias=config.get("use_conv_bias", True),
        proj_bias=config.get("use_bias", False), norm_eps=config.get("layer_norm_epsilon", 1e-5),
        dt_init_range=(config.get("time_step_min", 0.001), config.get("time_step_max", 0.1)),
        dt_init_floor=config.get("time_step_floor", 1e-4), tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        max_seq_len=config.get("max_position_embeddings", 4096),
        **_hybrid_fields_from_config(config),
    )


# A hybrid's attention layers, recorded in kenotron checkpoints' model description (transformers
# has no Mamba-2 hybrid class, so these keys never reach an HF folder: `check_export` refuses).
_HYBRID_KEYS = ("attention_layers", "n_heads", "n_kv_heads", "head_dim", "ffn_dim", "rope_theta")


def _hybrid_fields_from_config(config: dict[str, Any]) -> dict[str, Any]:
    hybrid = config.get("kenotron_hybrid")
    if not hybrid:
        return {}
    fields = {k: hybrid[k] for k in _HYBRID_KEYS}
    return {**fields, "attention_layers": tuple(fields["attention_layers"])}


def hf_config_from_mamba2_args(args: Mamba2Args) -> dict[str, Any]:
    config: dict[str, Any] = {
        "hidden_size": args.dim, "num_hidden_layers": args.n_layers, "vocab_size": args.vocab_size,
        "state_size": args.ssm_state, "head_dim": args.ssm_head_dim, "num_heads": args.ssm_heads,
        "expand": args.expand, "n_groups": args.ssm_groups, "conv_kernel": args.conv_kernel,
        "chunk_size": args.chunk_size, "use_conv_bias": args.conv_bias, "use_bias": args.proj_bias,
        "layer_norm_epsilon": args.norm_eps, "time_step_min": args.dt_init_range[0],
        "time_step_max": args.dt_init_range[1], "time_step_floor": args.dt_init_floor,
        # time_step_limit is left at transformers' default, (0, inf): JSON has no infinity.
        "hidden_act": "silu", "tie_word_embeddings": args.tie_embeddings,
        "residual_in_fp32": True,
        "max_position_embeddings": args.max_seq_len,  # not read by transformers; the RoPE length of hybrids
    }
    if args.attention_layers:
        config["kenotron_hybrid"] = {k: getattr(args, k) for k in _HYBRID_KEYS}
        config["kenotron_hybrid"]["attention_layers"] = list(args.attention_layers)
    return config


def _check_export(args: Mamba2Args) -> None:
    if args.attention_layers:
        raise HFConversionError(
            f"a Mamba-2 hybrid (attention_layers={list(args.attention_layers)}) has no transformers class; keep it "
            f"as a kenotron checkpoint, or export a flavor without attention layers"
        )


MAMBA2_HF_ADAPTER = HFAdapter(
    architecture="Mamba2ForCausalLM",
    model_type="mamba2",
    top_keys=MAMBA2_TOP_KEYS,
    layer_keys=MAMBA2_LAYER_KEYS,
    args_from_config=mamba2_args_from_hf_config,
    config_from_args=hf_config_from_mamba2_args,
    hf_layer_prefix="backbone.layers",
    reorder={"mixer.in_proj.weight": _in_proj_order, "mixer.in_proj.bias": _in_proj_order,
             "mixer.conv1d.weight": _conv_order, "mixer.conv1d.bias": _conv_order},
    check_export=_check_export,
)
