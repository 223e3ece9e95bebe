"""RopeScaling and YarnScaling: Llama 3.1's and YaRN's frequency scaling as plain data (no torch), so that a family's args
and the launcher's shape checks import it without the model; rope.py applies it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3.1 long-context scaling of the rotary frequencies (`rope_type="llama3"` in HF)."""

    factor: float = 8.0
    """Wavelengths longer than original_max_len / low_freq_factor are divided by this."""
    low_freq_factor: float = 1.0
    """Bound of the band of long wavelengths that get the full factor."""
    high_freq_factor: float = 4.0
    """Bound of the band of short wavelengths that stay unscaled."""
    original_max_len: int = 8192
    """Context length the model was first trained at."""


@dataclass(frozen=True)
class YarnScaling:
    """YaRN's scaling of the rotary frequencies (`rope_type="yarn"` in HF), as DeepSeek-V3 and
    Kimi K2 publish it: long wavelengths interpolated by `factor`, short ones kept, a linear
    ramp between; cos and sin scaled by mscale(factor, mscale) / mscale(factor, mscale_all_dim)."""

    factor: float = 40.0
    """Ratio of the extended context to the original one."""
    original_max_len: int = 4096
    """Context length the model was first trained at (original_max_position_embeddings)."""
    beta_fast: float = 32.0
    """Rotations over the original context above which a dimension is kept (extrapolated)."""
    beta_slow: float = 1.0
    """Rotations below which a dimension is fully interpolated."""
    mscale: float = 1.0
    """Numerator's coefficient of the cos/sin factor (0: the plain YaRN factor)."""
    mscale_all_dim: float = 0.0
    """Denominator's coefficient of the cos/sin factor; DeepSeek also scales the attention's
    softmax by mscale(factor, mscale_all_dim)^2 (`softmax_scale_factor`)."""

