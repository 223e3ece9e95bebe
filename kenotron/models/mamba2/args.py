"""Mamba-2's dimensions as plain data (no torch): flavors.py names sizes with it, the launcher
checks a config's model shape with it before torch is imported, model.py builds from it."""

from __future__ import annotations

from dataclasses import dataclass

from kenotron.errors import ConfigError
from kenotron.models.args import check_decoder_args


@dataclass(frozen=True)
class Mamba2Args:
    """Dimensions of a Mamba-2 model (transformers' Mamba2Config names in brackets)."""

    dim: int = 2048
    """Width of the residual stream (hidden_size)."""
    n_layers: int = 48
    """Blocks (num_hidden_layers)."""
    vocab_size: int = 50288
    """Embedding rows (vocab_size); the published models pad GPT-NeoX's 50277 to a multiple of 16."""
    ssm_state: int = 128
    """State size N of every head (state_size)."""
    ssm_head_dim: int = 64
    """Channels per SSM head (head_dim); heads = expand * dim / ssm_head_dim."""
    expand: int = 2
    """Inner width of the mixer over the model's width (expand)."""
    ssm_groups: int = 1
    """Groups of heads sharing one B and one C (n_groups); tensor parallel splits whole groups."""
    conv_kernel: int = 4
    """Width of the causal depthwise convolution (conv_kernel)."""
    chunk_size: int = 256
    """Positions per chunk of the chunked scan (chunk_size)."""
    conv_bias: bool = True
    """Bias on the convolution (use_conv_bias)."""
    proj_bias: bool = False
    """Biases on the in- and out-projections (use_bias)."""
    norm_eps: float = 1e-5
    """Epsilon of every RMSNorm, the gated one included (layer_norm_epsilon)."""
    a_init_range: tuple[float, float] = (1.0, 16.0)
    """A = -exp(A_log) starts uniform on minus this range (mamba_ssm's A_init_range)."""
    dt_init_range: tuple[float, float] = (0.001, 0.1)
    """softplus(dt_bias) starts log-uniform on this range (time_step_min, time_step_max)."""
    dt_init_floor: float = 1e-4
    """...and at least this (time_step_floor)."""
    tie_embeddings: bool = True
    """Share the input embedding with the output projection (tie_word_embeddings)."""
    max_seq_len: int = 4096
    """Length of the RoPE tables of the attention layers; the trainer sets it to training.seq_len."""
    attention_layers: tuple[int, ...] = ()
    """Indices of the layers that are attention + SwiGLU blocks instead of Mamba blocks (hybrids)."""
    n_heads: int = 16
    """Query heads of the attention layers."""
    n_kv_heads: int = 8
    """Key/value heads of the attention layers."""
    head_dim: int = 128
    """Size of each attention head."""
    ffn_dim: int = 0
    """Hidden width of the attention layers' SwiGLU MLP (needed when attention_layers is set)."""
    rope_theta: float = 10000.0
    """RoPE base of the attention layers."""

    def __post_init__(self) -> None:
        inner = self.expand * self.dim
        if inner % self.ssm_head_dim or (inner // self.ssm_head_dim) % self.ssm_groups:
            raise ConfigError(
                f"mamba2: expand * dim = {inner} must split into heads of ssm_head_dim={self.ssm_head_dim} whose "
                f"count divides into ssm_groups={self.ssm_groups}; change ssm_head_dim or ssm_groups"
            )
        outside = [i for i in self.attention_layers if not 0 <= i < self.n_layers]
        if outside:
            raise ConfigError(
                f"mamba2: attention_layers={list(self.attention_layers)} names layer {outside[0]}, but the model has "
                f"{self.n_layers} layers (model.n_layers); use indices 0..{self.n_layers - 1}"
            )
        if self.attention_layers and self.ffn_dim <= 0:
            raise ConfigError("mamba2: a hybrid (attention_layers set) needs ffn_dim > 0 for its attention blocks' MLP")

    @property
    def ssm_heads(self) -> int:
        return self.expand * self.dim // self.ssm_head_dim


def check_mamba2_args(args: Mamba2Args) -> None:
    """The shape checks of the config's `model.<field>` values (Mamba2Args checks the rest when
    built); a hybrid's attention blocks get the decoder families' checks too."""
    for name in ("dim", "n_layers", "vocab_size", "ssm_state", "ssm_head_dim", "expand", "ssm_groups", "conv_kernel",
                 "chunk_size", "norm_eps", "max_seq_len"):
        if not getattr(args, name) > 0:
            raise ConfigError(f"model.{name}={getattr(args, name)} must be positive")
    if args.attention_layers:
        check_decoder_args(args)
