"""Feed-forward blocks."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kenotron.models.common.init import InitSpec, trunc_normal


class SwiGLU(nn.Module):
    """w2(silu(w1 x) * w3 x): the gated MLP of Llama, Qwen and Mistral."""

    def __init__(self, dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))

    def param_init_specs(self, init_std: float, out_std: float) -> dict[str, InitSpec]:
        """Input projections at init_std; the output projection at out_std (depth-scaled)."""
        return {
            "w1.weight": trunc_normal(init_std),
            "w3.weight": trunc_normal(init_std),
            "w2.weight": trunc_normal(out_std),
        }
