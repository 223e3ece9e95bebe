"""Normalization layers shared by the model families."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kenotron.models.common.init import ONES, ZEROS, InitSpec


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned scale.

    `F.rms_norm` accumulates in fp32 for bf16/fp16 inputs itself, so the input is not upcast
    here (an explicit upcast costs two extra passes over the activations in eager mode). It
    is fused by torch.compile and sharded along the sequence by DTensor under sequence
    parallel. Under autocast the weight (fp32) is cast to the input's dtype.
    """

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.dim = dim
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (self.dim,), self.weight.to(x.dtype), self.eps)

    def param_init_specs(self) -> dict[str, InitSpec]:
        return {"weight": ONES}

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}"


class LayerNorm(nn.Module):
    """Layer norm with a learned scale and bias (StarCoder2), computed in fp32 for stability."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.dim = dim
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim))
        self.bias = nn.Parameter(torch.empty(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x.float(), (self.dim,), self.weight.float(), self.bias.float(), self.eps).type_as(x)

    def param_init_specs(self) -> dict[str, InitSpec]:
        return {"weight": ONES, "bias": ZEROS}

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}"
