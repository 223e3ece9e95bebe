"""Choosing the next token from logits: greedy, temperature, top-k and top-p (nucleus)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingConfig:
    """How the next token is drawn from the model's distribution."""

    temperature: float = 0.0
    """Divides the logits before sampling; 0 means greedy (the most likely token, no randomness)."""
    top_k: int = 0
    """Sample only among the k most likely tokens; 0 keeps them all."""
    top_p: float = 1.0
    """Sample only among the most likely tokens whose probabilities sum to top_p; 1 keeps them all."""

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature} is negative; use 0 (greedy) or a positive value")
        if self.top_k < 0:
            raise ValueError(f"top_k={self.top_k} is negative; use 0 (all tokens) or a positive count")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p} is outside (0, 1]; use 1 to keep every token")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def sample_next_token(
    logits: torch.Tensor, config: SamplingConfig, generator: torch.Generator | None = None
) -> torch.Tensor:
    """logits (batch, vocab) -> token ids (batch,)."""
    if config.greedy:
        return logits.argmax(dim=-1)
    logits = logits.float() / config.temperature
    if config.top_k:
        kth_best = torch.topk(logits, min(config.top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth_best, float("-inf"))
    if config.top_p < 1:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        # Drop a token when the more likely ones already reach top_p; the best always stays.
        drop_sorted = probs.cumsum(dim=-1) - probs >= config.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
