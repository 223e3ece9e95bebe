"""Normalization layers shared by the model families."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kenotron.models.common.init import ONES, InitSpec


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned scale, computed in fp32 for stability.

    Uses `F.rms_norm`, which torch.compile fuses and which DTensor shards along the
    sequence under sequence parallel.
    """

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.dim = dim
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x.float(), (self.dim,), self.weight.float(), self.eps).type_as(x)

    def param_init_specs(self) -> dict[str, InitSpec]:
        return {"weight": ONES}

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}"
