"""Run under Triton's CPU interpreter (tests/parallel/test_sum_of_squares.py): the Triton sum of
squares against a float64 reference, over bf16 and fp32 tensors whose sizes are not multiples
of the kernel's block, an empty one included."""

from __future__ import annotations

import torch

from kenotron.kernels.sum_of_squares import BLOCK, sum_of_squares


def check_sum_of_squares_matches_float64() -> None:
    g = torch.Generator().manual_seed(0)
    tensors = [
        torch.randn(2 * BLOCK + 37, generator=g).bfloat16(),
        torch.randn(3, 1000, generator=g) * 100,
        torch.empty(0, dtype=torch.bfloat16),
        torch.randn(17, generator=g).bfloat16(),
    ]
    got = sum_of_squares(tensors)
    want = sum(t.double().pow(2).sum() for t in tensors)
    assert got.dtype == torch.float32 and got.dim() == 0
    assert abs(got.item() - want.item()) <= 1e-6 * want.item(), (got.item(), want.item())
    assert torch.equal(got, sum_of_squares(tensors)), "the same partition gives the same sum"
    try:
        sum_of_squares([torch.randn(4, 6).t()])
    except ValueError as e:
        assert "contiguous" in str(e)
    else:
        raise AssertionError("a transposed tensor was accepted")


if __name__ == "__main__":
    check_sum_of_squares_matches_float64()
    print("ok")
