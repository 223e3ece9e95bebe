"""Rotary position embeddings (RoPE), with Llama 3.1's frequency scaling or YaRN's (DeepSeek-V3).

The rotation pairs dimension i with i + head_dim/2 ("rotate half"), the layout of the
Hugging Face checkpoints, so q/k weights convert between the two without permutation.
"""

from __future__ import annotations

import math

import torch

from kenotron.models.common.rope_scaling import RopeScaling, YarnScaling


def yarn_mscale(factor: float, coefficient: float = 1.0) -> float:
    """YaRN's attention temperature: 0.1 * coefficient * ln(factor) + 1 (1 without scaling)."""
    return 1.0 if factor <= 1 else 0.1 * coefficient * math.log(factor) + 1.0


def rope_attention_factor(scaling: RopeScaling | YarnScaling | None) -> float:
    """The factor on the cos and sin tables (YaRN's; 1 for the others)."""
    if not isinstance(scaling, YarnScaling):
        return 1.0
    if scaling.mscale and scaling.mscale_all_dim:
        return yarn_mscale(scaling.factor, scaling.mscale) / yarn_mscale(scaling.factor, scaling.mscale_all_dim)
    return yarn_mscale(scaling.factor)


def softmax_scale_factor(scaling: RopeScaling | YarnScaling | None) -> float:
    """DeepSeek's factor on the attention logits' 1/sqrt(head_dim) under YaRN (1 otherwise)."""
    if isinstance(scaling, YarnScaling) and scaling.mscale_all_dim:
        return yarn_mscale(scaling.factor, scaling.mscale_all_dim) ** 2
    return 1.0


def _yarn_inv_freq(inv_freq: torch.Tensor, head_dim: int, theta: float, s: YarnScaling) -> torch.Tensor:
    def correction_dim(rotations: float) -> float:
        return head_dim * math.log(s.original_max_len / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(correction_dim(s.beta_fast)), 0)
    high = min(math.ceil(correction_dim(s.beta_slow)), head_dim - 1)
    if low == high:
        high += 0.001  # as the reference does: no division by zero
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: extrapolate (keep the frequency), 0: interpolate (divide by factor)
    return inv_freq / s.factor * (1 - keep) + inv_freq * keep


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | YarnScaling | None = None) -> torch.Tensor:
    """Inverse frequencies (head_dim/2,) in fp32, scaled as Llama 3.1 or YaRN does when `scaling` is set."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    if scaling is None:
        return inv_freq.float()
    if isinstance(scaling, YarnScaling):
        return _yarn_inv_freq(inv_freq, head_dim, theta, scaling).float()
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
    head_dim: int, max_len: int, theta: float, scaling: RopeScaling | YarnScaling | None,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables of shape (max_len, head_dim) in fp32 (times YaRN's attention factor)."""
    inv_freq = rope_inv_freq(head_dim, theta, scaling).to(device)
    t = torch.arange(max_len, dtype=torch.float32, device=device)
    angles = torch.outer(t, inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    factor = rope_attention_factor(scaling)
    if factor != 1.0:
        return angles.cos() * factor, angles.sin() * factor
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
