"""RopeScaling: Llama 3.1's frequency scaling as plain data (no torch), so that a family's args
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
