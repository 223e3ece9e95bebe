"""Feed-forward blocks."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SwiGLU(nn.Module):
    """w2(silu(w1 x) * w3 x): the gated MLP of Llama, Qwen and Mistral."""

    def __init__(self, dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))

    def init_weights(self, init_std: float, out_std: float) -> None:
        nn.init.trunc_normal_(self.w1.weight, std=init_std, a=-3 * init_std, b=3 * init_std)
        nn.init.trunc_normal_(self.w3.weight, std=init_std, a=-3 * init_std, b=3 * init_std)
        nn.init.trunc_normal_(self.w2.weight, std=out_std, a=-3 * out_std, b=3 * out_std)
