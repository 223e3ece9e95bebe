"""FlexAttention (`torch.nn.attention.flex_attention`) for causal and block-causal attention.

A `BlockMask` says, per block of 128 queries x 128 keys, whether the block is empty, full or
partly masked, so the kernel skips empty blocks: attention restricted to each document of a
packed window costs what the documents cost, not what the window costs. The mask is built
once per batch (`document_block_mask`, from document ids) and handed to every layer.

Rules of the mask (`mask_mod`): query i sees key j iff j <= i, both lie in the same document,
and i - j < sliding_window when the model has a window (HF's convention: the window counts
the query itself). Which document a token belongs to comes from the caller;
`kenotron.data.packing.document_ids` derives it from EOS positions.

RoPE positions are not restarted per document: RoPE makes a score depend on i - j only, and
the mask keeps every attending pair inside one document, so restarting positions would change
the logits by rounding alone (tests/models/test_flex_attention.py checks that a packed second
document gives the logits it gives alone).

Speed needs compilation: on CUDA the kernel is `torch.compile(flex_attention)` (or
flex_attention itself inside an already-compiled block, where dynamo compiles it with the
block), and block masks are built by a compiled `create_block_mask`, which never
materializes the (batch, seq, seq) boolean mask. Off CUDA both run eagerly: torch's eager
flex_attention is a reference that materializes the scores, correct but slow.

Training on CPU: torch refuses flex_attention's backward there (2.13: "FlexAttention does not
support backward on CPU"). When gradients are needed on CPU (or MPS), `flex_attend` computes
the same mask densely from the block mask's `mask_mod` and runs SDPA with it; the rest of the
path (one block mask per batch, passed through every layer, FSDP, TP and compile) is the one
CUDA runs. Without gradients (evaluation) flex_attention itself runs on CPU.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import (
    BlockMask,
    create_block_mask,
    create_mask,
    flex_attention,
)

MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

# Devices where torch's flex_attention has no backward (see the module docstring).
_NO_FLEX_BACKWARD = ("cpu", "mps")


def causal_mask_mod(sliding_window: int | None = None) -> MaskMod:
    """mask_mod of causal attention, limited to `sliding_window` keys back when set."""

    def mask_mod(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        allowed = kv_idx <= q_idx
        if sliding_window is not None:
            allowed = allowed & (q_idx - kv_idx < sliding_window)
        return allowed

    return mask_mod


def document_mask_mod(document_ids: torch.Tensor, sliding_window: int | None = None) -> MaskMod:
    """mask_mod of block-causal attention: causal (and windowed) within each document.

    `document_ids` (batch, seq) gives each token's document; only equality matters.
    """
    causal = causal_mask_mod(sliding_window)

    def mask_mod(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        return causal(b, h, q_idx, kv_idx) & (document_ids[b, q_idx] == document_ids[b, kv_idx])

    return mask_mod


@functools.cache
def _compiled(fn: Callable) -> Callable:
    # One compiled wrapper per function for the process: torch caches its graphs per shape.
    return torch.compile(fn)


def build_block_mask(mask_mod: MaskMod, batch: int | None, q_len: int, kv_len: int, device: torch.device) -> BlockMask:
    """A BlockMask of `mask_mod` over q_len queries x kv_len keys, every head alike."""
    # Compiled on CUDA, as torch recommends for long sequences: the eager version evaluates
    # mask_mod on a dense (batch, seq, seq) grid. Eager elsewhere (compiling needs a compiler
    # toolchain on CPU and gains nothing at test sizes).
    build = _compiled(create_block_mask) if device.type == "cuda" else create_block_mask
    return build(mask_mod, batch, None, q_len, kv_len, device=device)


def _create_block_mask(mask_mod: MaskMod, batch: int | None, seq_len: int, device: torch.device) -> BlockMask:
    return build_block_mask(mask_mod, batch, seq_len, seq_len, device)


def causal_block_mask(seq_len: int, device: torch.device | str, sliding_window: int | None = None) -> BlockMask:
    """Causal (optionally windowed) BlockMask for every sequence of a batch and every head."""
    return _create_block_mask(causal_mask_mod(sliding_window), None, seq_len, torch.device(device))


def document_block_mask(document_ids: torch.Tensor, sliding_window: int | None = None) -> BlockMask:
    """Block-causal BlockMask of one batch: `document_ids` (batch, seq) on the model's device.

    Built once per batch and shared by every layer and head (heads are broadcast, so the same
    mask serves tensor-parallel ranks holding a subset of heads).
    """
    batch, seq_len = document_ids.shape
    return _create_block_mask(document_mask_mod(document_ids, sliding_window), batch, seq_len, document_ids.device)


def dense_mask(block_mask: BlockMask) -> torch.Tensor:
    """The boolean (batch or 1, 1, seq, seq) mask a BlockMask stands for (True = may attend)."""
    batch, _, q_len, kv_len = block_mask.shape
    return create_mask(block_mask.mask_mod, batch, 1, q_len, kv_len, device=block_mask.kv_num_blocks.device)


def flex_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask: BlockMask) -> torch.Tensor:
    """Attention over (batch, heads, seq, head_dim) under `block_mask`; k/v may have fewer heads."""
    gqa = k.shape[1] != q.shape[1]
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if needs_grad and q.device.type in _NO_FLEX_BACKWARD:
        # torch has no flex backward here: the same mask, dense, through SDPA.
        return F.scaled_dot_product_attention(q, k, v, attn_mask=dense_mask(block_mask), enable_gqa=gqa)
    if q.device.type == "cuda" and not torch.compiler.is_compiling():
        # Eager flex_attention materializes the scores; only the compiled kernel is fast.
        # Inside a compiled block dynamo compiles the plain call with the block.
        return _compiled(flex_attention)(q, k, v, block_mask=block_mask, enable_gqa=gqa)
    return flex_attention(q, k, v, block_mask=block_mask, enable_gqa=gqa)
