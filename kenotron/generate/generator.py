"""Autoregressive generation for a batch of prompts, with or without a cache (keys and values of
attention layers, the recurrent state of Mamba layers: the model's `new_cache`).

Prompts of different lengths are left-padded to a common length, so every sequence's next
token sits in the same column and one forward call serves the whole batch; the padding is
masked out of attention (see models/common/kv_cache.py for why positions need no shift).
Without the cache each step re-runs the whole sequence: slow, and the reference the cached
path is tested against.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from kenotron.generate.sampling import SamplingConfig, sample_next_token
from kenotron.models.common.kv_cache import KVCache
from kenotron.models.common.recurrent_cache import RecurrentCache
from kenotron.progress import progress


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, token_mask), both (batch, longest prompt); shorter prompts padded on the left."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token (e.g. the tokenizer's BOS id)")
    width = max(len(p) for p in prompts)
    tokens = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.bool)
    for row, prompt in enumerate(prompts):
        tokens[row, width - len(prompt) :] = torch.tensor(list(prompt), dtype=torch.long)
        mask[row, width - len(prompt) :] = True
    return tokens.to(device), mask.to(device)


@torch.no_grad()
def generate(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    sampling: SamplingConfig | None = None,
    eos_id: int | None = None,
    pad_id: int = 0,
    use_cache: bool = True,
    generator: torch.Generator | None = None,
    on_tokens: Callable[[list[int]], None] | None = None,
) -> list[list[int]]:
    """The new tokens of each prompt (up to `max_new_tokens`, stopping after `eos_id`, which
    is not included); `sampling` None is greedy. `model` is a kenotron CausalLM whose RoPE tables (`args.max_seq_len`)
    cover the longest prompt plus `max_new_tokens`; its `new_cache` makes the cache.
    `on_tokens` gets each step's new token of every prompt as it is sampled (`pad_id` for a
    prompt that has finished), so that a caller can show them as they come."""
    args = model.args
    device = model.rope_cos.device
    tokens, token_mask = left_pad(prompts, pad_id, device)
    batch, prompt_len = tokens.shape
    total = prompt_len + max_new_tokens
    if total > args.max_seq_len:
        raise ValueError(
            f"prompt length {prompt_len} + max_new_tokens {max_new_tokens} = {total} exceeds the model's "
            f"max_seq_len {args.max_seq_len}; build the model with max_seq_len >= {total}"
        )
    padded = not bool(token_mask.all())
    mask_arg = token_mask if padded else None

    cache: KVCache | RecurrentCache | None = None
    if use_cache:
        dtype = next(model.parameters()).dtype
        cache = model.new_cache(batch, total, dtype=dtype, device=device)
        logits = model(tokens, kv_cache=cache, token_mask=mask_arg)[:, -1]
    else:
        logits = model(tokens, token_mask=mask_arg)[:, -1]

    new_tokens = torch.empty((batch, 0), dtype=torch.long, device=device)
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    for step in progress(range(max_new_tokens), total=max_new_tokens, desc="generating", unit="token"):
        next_token = sample_next_token(logits, sampling or SamplingConfig(), generator)
        next_token = torch.where(finished, torch.full_like(next_token, pad_id), next_token)
        new_tokens = torch.cat([new_tokens, next_token[:, None]], dim=1)
        if on_tokens is not None:
            on_tokens(next_token.tolist())
        if eos_id is not None:
            finished |= next_token == eos_id
            if bool(finished.all()):
                break
        if step == max_new_tokens - 1:
            break
        if cache is not None:
            logits = model(next_token[:, None], kv_cache=cache)[:, -1]
        else:
            tokens = torch.cat([tokens, next_token[:, None]], dim=1)
            if mask_arg is not None:
                mask_arg = torch.cat([mask_arg, torch.ones_like(mask_arg[:, :1])], dim=1)
            logits = model(tokens, token_mask=mask_arg)[:, -1]
    return [_until_eos(row, eos_id) for row in new_tokens.tolist()]


def cache_description(model: nn.Module) -> str:
    """What `generate`'s cache holds for `model`, in words: an attention KV cache, a Mamba model's
    recurrent state cache, or both for a hybrid (the model's `new_cache`, built on the meta device)."""
    return model.new_cache(1, 1, device="meta").description


def _until_eos(row: list[int], eos_id: int | None) -> list[int]:
    return row[: row.index(eos_id)] if eos_id is not None and eos_id in row else row
