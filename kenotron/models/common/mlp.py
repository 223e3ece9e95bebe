"""Feed-forward blocks."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from kenotron.models.common.init import ZEROS, InitSpec, trunc_normal


def silu_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """silu(a) * b, SwiGLU's gate, in PyTorch ops."""
    return F.silu(a) * b


class SwiGLU(nn.Module):
    """w2(silu(w1 x) * w3 x): the gated MLP of Llama, Qwen and Mistral.

    The gate runs through `silu_mul`, which a fused kernel may replace
    (models/common/eager_kernels.py); the model never does.
    """

    def __init__(self, dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)
        self.silu_mul: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = silu_mul

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(self.silu_mul(self.w1(x), self.w3(x)))

    def param_init_specs(self, init_std: float, out_std: float) -> dict[str, InitSpec]:
        """Input projections at init_std; the output projection at out_std (depth-scaled)."""
        return {
            "w1.weight": trunc_normal(init_std),
            "w3.weight": trunc_normal(init_std),
            "w2.weight": trunc_normal(out_std),
        }


class GeluMLP(nn.Module):
    """w2(gelu_tanh(w1 x + b1)) + b2: StarCoder2's MLP (HF's c_fc = w1, c_proj = w2).

    Named like SwiGLU's up and down projections (there is no gate, so no w3) so that a
    Llama tensor-parallel plan (w1 colwise, w2 rowwise) applies unchanged.
    """

    def __init__(self, dim: int, hidden_dim: int, bias: bool = True) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=bias)
        self.w2 = nn.Linear(hidden_dim, dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.gelu(self.w1(x), approximate="tanh"))

    def param_init_specs(self, init_std: float, out_std: float) -> dict[str, InitSpec]:
        """Input projection at init_std; the output projection at out_std (depth-scaled); biases zero."""
        specs = {"w1.weight": trunc_normal(init_std), "w2.weight": trunc_normal(out_std)}
        for name in ("w1", "w2"):
            if getattr(self, name).bias is not None:
                specs[f"{name}.bias"] = ZEROS
        return specs
