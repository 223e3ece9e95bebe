"""Newton–Schulz orthogonalization, Muon's one piece of linear algebra, batched over matrices.

Muon replaces a matrix's update G = U S V^T by (approximately) U V^T: every singular value moved
to ~1, so the update has the same strength in every direction. Five steps of Keller Jordan's
quintic iteration X <- a X + (b A + c A^2) X, A = X X^T, get there without an SVD; its
coefficients push the small singular values up as fast as possible and leave the result with
singular values in ~(0.7, 1.2), which trains as well as the exact U V^T (the reference:
torch.optim.Muon, KellerJordan/Muon). Only matrix products: fast in bf16 on a GPU.

Properties the distributed step relies on (train/muon.py): the result of a matrix depends on that
matrix only (a batch is many independent problems), and permuting its rows or columns permutes
the result the same way (a shard layout that reorders rows, as tensor parallel's fused
gate/up projection does, needs no undoing).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
"""(a, b, c) of the quintic iteration: torch.optim.Muon's and Keller Jordan's."""

NS_EPS = 1e-7
"""Floor of the Frobenius norm each matrix is divided by first (a zero update stays zero)."""


def newton_schulz(x: torch.Tensor, steps: int, dtype: torch.dtype) -> torch.Tensor:
    """The orthogonalized form of every matrix of `x` (..., m, n), computed and returned in `dtype`.

    Each matrix is first divided by its Frobenius norm (which bounds its spectral norm by 1, where
    the iteration converges); the iteration runs on the wide orientation (m <= n), whose Gram
    matrix A = X X^T is the smaller one.
    """
    a, b, c = NS_COEFFICIENTS
    shape = x.shape
    y = x.to(dtype).reshape(-1, *shape[-2:])
    tall = x.size(-2) > x.size(-1)
    if tall:
        y = y.mT
    y = y / y.norm(dim=(-2, -1), keepdim=True).clamp(min=NS_EPS)
    for _ in range(steps):
        # torch.optim.Muon's fused multiply-adds (one rounding each in bf16), batched.
        gram = y @ y.mT
        poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)
        y = torch.baddbmm(y, poly, y, beta=a)
    return (y.mT if tall else y).reshape(shape)


def newton_schulz_fn(compiled: bool) -> Callable[[torch.Tensor, int, torch.dtype], torch.Tensor]:
    """`newton_schulz`, or its torch.compile'd form (one fused graph per shape; dynamic batch
    sizes), which a GPU optimizer step uses: the eager form launches ~6 kernels per step."""
    if not compiled:
        return newton_schulz
    return torch.compile(newton_schulz, dynamic=True, fullgraph=True)
