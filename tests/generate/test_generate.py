"""Generation: the KV cache changes nothing (greedy, token for token), left-padded batches equal
one prompt at a time, sliding windows shorter than the text, and the sampling filters."""

from __future__ import annotations

import pytest
import torch

from kenotron.generate import (
    SamplingConfig,
    build_kenotron_model,
    generate,
    left_pad,
    sample_next_token,
)

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [1, 2, 3], [100] * 12]


def tiny(family: str, window: int | None = None) -> torch.nn.Module:
    model = build_kenotron_model(family, "debug", max_seq_len=48, seed=1)
    if window is not None:
        model.sliding_window = window
    return model


@pytest.mark.parametrize(
    ("family", "window"), [("llama3", None), ("qwen3", None), ("mistral", 8), ("starcoder2", 8)]
)
def test_greedy_with_the_cache_equals_greedy_without_it(family, window):
    model = tiny(family, window)
    cached = generate(model, PROMPTS, max_new_tokens=16)
    uncached = generate(model, PROMPTS, max_new_tokens=16, use_cache=False)
    assert cached == uncached
    assert all(len(row) == 16 for row in cached)


def test_a_left_padded_batch_equals_each_prompt_alone():
    model = tiny("qwen2")
    batched = generate(model, PROMPTS, max_new_tokens=12)
    assert batched == [generate(model, [prompt], max_new_tokens=12)[0] for prompt in PROMPTS]


def test_generation_stops_at_eos_and_drops_it():
    model = tiny("llama3")
    free = generate(model, [PROMPTS[0]], max_new_tokens=10)[0]
    stopped = generate(model, [PROMPTS[0]], max_new_tokens=10, eos_id=free[3])[0]
    assert stopped == free[: free.index(free[3])]


def test_too_long_a_request_names_the_fix():
    with pytest.raises(ValueError, match="build the model with max_seq_len >= 60"):
        generate(tiny("llama3"), [[1] * 20], max_new_tokens=40)


def test_left_pad_masks_the_padding():
    tokens, mask = left_pad([[7, 8], [9]], pad_id=0, device=torch.device("cpu"))
    assert tokens.tolist() == [[7, 8], [0, 9]] and mask.tolist() == [[True, True], [False, True]]


def test_sampling_filters_keep_only_the_allowed_tokens():
    logits = torch.tensor([[0.0, 3.0, 2.0, 1.0, -1.0]]).repeat(400, 1)
    gen = torch.Generator().manual_seed(0)
    assert sample_next_token(logits, SamplingConfig(), gen).unique().tolist() == [1]
    top2 = sample_next_token(logits, SamplingConfig(temperature=1.0, top_k=2), gen)
    assert set(top2.unique().tolist()) == {1, 2}
    # probabilities of tokens 1, 2, 3: 0.64, 0.23, 0.09: top_p 0.8 keeps tokens 1 and 2.
    nucleus = sample_next_token(logits, SamplingConfig(temperature=1.0, top_p=0.8), gen)
    assert set(nucleus.unique().tolist()) == {1, 2}
    everything = sample_next_token(logits, SamplingConfig(temperature=1.0), gen)
    assert set(everything.unique().tolist()) == {0, 1, 2, 3, 4}


def test_sampling_is_reproducible_from_the_generator():
    model = tiny("llama3")
    config = SamplingConfig(temperature=1.0, top_k=50, top_p=0.95)
    runs = [
        generate(model, PROMPTS, max_new_tokens=8, sampling=config, generator=torch.Generator().manual_seed(3))
        for _ in range(2)
    ]
    assert runs[0] == runs[1]


def test_invalid_sampling_settings_name_the_value():
    with pytest.raises(ValueError, match="top_p=1.5"):
        SamplingConfig(top_p=1.5)
    with pytest.raises(ValueError, match="temperature=-1"):
        SamplingConfig(temperature=-1)
