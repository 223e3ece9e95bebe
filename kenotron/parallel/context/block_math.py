"""Attention of one query chunk against one key/value chunk, in fp32, with its log-sum-exp.

These are the pieces ring attention is assembled from (kenotron/parallel/context/ring.py):
the forward of a chunk pair returns the softmax-normalized output *and* the log-sum-exp of
its scores, so outputs over disjoint key sets merge exactly (`merge_partial`); the backward
recomputes the probabilities from the final log-sum-exp, as flash attention does, so nothing
of size queries x keys is kept between forward and backward.

Shapes use grouped heads: queries (batch, kv_heads, group, q_len, head_dim), keys and values
(batch, kv_heads, 1, k_len, head_dim); query head h uses kv head h // group, the convention of
`scaled_dot_product_attention(enable_gqa=True)`. Chunks of a causal sequence are equal-length
and either wholly before the query chunk (every key visible), the same chunk (causal
triangle) or wholly after it (skipped by the caller).

With document masking (documents.py) a pair also takes a boolean `mask` (True = may attend)
that broadcasts over the scores. A query row may then see no key of a pair: its log-sum-exp is
-inf and its output 0, and merging such a partial result leaves the other one unchanged (the
merge weights are computed against a finite stand-in where the total is -inf, never NaN).
Every query sees itself, so the final log-sum-exp the backward reads is finite.
"""

from __future__ import annotations

import torch


def group_heads(x: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """(batch, heads, seq, dim) -> (batch, kv_heads, heads // kv_heads, seq, dim), in fp32."""
    b, h, s, d = x.shape
    return x.float().reshape(b, kv_heads, h // kv_heads, s, d)


def ungroup_heads(x: torch.Tensor) -> torch.Tensor:
    """(batch, kv_heads, group, seq, dim) -> (batch, kv_heads * group, seq, dim)."""
    b, hk, g, s, d = x.shape
    return x.reshape(b, hk * g, s, d)


def _finite(lse: torch.Tensor) -> torch.Tensor:
    """`lse` with -inf (rows that saw no key) replaced by 0, to subtract without NaN."""
    return torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)


def _scores(q: torch.Tensor, k: torch.Tensor, causal: bool, scale: float, mask: torch.Tensor | None) -> torch.Tensor:
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if mask is not None:
        # The document mask of a pair already holds the causal triangle where it applies.
        return scores.masked_fill(~mask, float("-inf"))
    if causal:
        # Same chunk: query i sees keys 0..i of it (the chunk's positions are aligned).
        n_q, n_k = scores.shape[-2:]
        future = torch.ones(n_q, n_k, dtype=torch.bool, device=scores.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    return scores


def pair_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float, mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, log-sum-exp) of queries against one key/value chunk; out (..., q_len, dim), lse (..., q_len).
    A row that `mask` hides from every key gets output 0 and log-sum-exp -inf."""
    scores = _scores(q, k, causal, scale, mask)
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.matmul(torch.exp(scores - _finite(lse).unsqueeze(-1)), v)
    return out, lse


def merge_partial(
    out: torch.Tensor | None, lse: torch.Tensor | None, block_out: torch.Tensor, block_lse: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine attention over two disjoint key sets: weights exp(lse_i - lse_total), all fp32."""
    if out is None or lse is None:
        return block_out, block_lse
    total = torch.logaddexp(lse, block_lse)
    # Where both sides saw no key, total is -inf: against 0 both weights are exp(-inf) = 0.
    safe = _finite(total)
    merged = out * torch.exp(lse - safe).unsqueeze(-1) + block_out * torch.exp(block_lse - safe).unsqueeze(-1)
    return merged, total


def pair_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    grad_out: torch.Tensor,
    lse: torch.Tensor,
    delta: torch.Tensor,
    causal: bool,
    scale: float,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """This chunk pair's share of (dq, dk, dv), given the *final* log-sum-exp of the queries and
    delta = rowsum(grad_out * out) of the final output (the softmax backward's correction)."""
    probs = torch.exp(_scores(q, k, causal, scale, mask) - lse.unsqueeze(-1))
    grad_v = torch.matmul(probs.transpose(-1, -2), grad_out).sum(dim=2, keepdim=True)
    grad_probs = torch.matmul(grad_out, v.transpose(-1, -2))
    grad_scores = probs * (grad_probs - delta.unsqueeze(-1)) * scale
    grad_q = torch.matmul(grad_scores, k)
    grad_k = torch.matmul(grad_scores.transpose(-1, -2), q).sum(dim=2, keepdim=True)
    return grad_q, grad_k, grad_v
