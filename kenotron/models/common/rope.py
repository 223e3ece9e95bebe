"""Rotary position embeddings (RoPE), with Llama 3.1's frequency scaling.

The rotation pairs dimension i with i + head_dim/2 ("rotate half"), the layout of the
Hugging Face checkpoints, so q/k weights convert between the two without permutation.
"""

from __future__ import annotations

import math

import torch

from kenotron.models.common.rope_scaling import RopeScaling


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None = None) -> torch.Tensor:
    """Inverse frequencies (head_dim/2,) in fp32, scaled as Llama 3.1 does when `scaling` is set."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    if scaling is None:
        return inv_freq.float()
    low_wavelen = scaling.original_max_len / scaling.low_freq_factor
    high_wavelen = scaling.original_max_len / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    # Between the two bands, interpolate smoothly between scaled and unscaled frequencies.
    smooth = (scaling.original_max_len / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    mid = (1 - smooth) * inv_freq / scaling.factor + smooth * inv_freq
    out = torch.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    out = torch.where((wavelen <= low_wavelen) & (wavelen >= high_wavelen), mid, out)
    return out.float()


def rope_cos_sin(
    head_dim: int, max_len: int, theta: float, scaling: RopeScaling | None, device: torch.device | str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables of shape (max_len, head_dim) in fp32."""
    inv_freq = rope_inv_freq(head_dim, theta, scaling).to(device)
    t = torch.arange(max_len, dtype=torch.float32, device=device)
    angles = torch.outer(t, inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (batch, seq, heads, head_dim) by cos/sin (seq, head_dim), in x's dtype.

    The tables are kept in fp32 and cast to x's dtype here, as Hugging Face's models do;
    computing in bf16 avoids an fp32 round trip of q and k in eager mode.
    """
    half = x.shape[-1] // 2
    cos = cos[None, :, None, :].to(x.dtype)
    # rotate_half(x) * sin == roll(x, half) * [-sin_lo, sin_hi]: one roll instead of neg + cat.
    sin = torch.cat([-sin[:, :half], sin[:, half:]], dim=-1)[None, :, None, :].to(x.dtype)
    return torch.addcmul(x * cos, torch.roll(x, half, dims=-1), sin)
