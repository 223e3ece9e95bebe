"""Generation on CUDA: the KV cache changes nothing there either (fp32), windows included,
and bf16 generation runs. Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch

from kenotron.generate import build_kenotron_model, generate

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [1, 2, 3], [100] * 12]


@pytest.mark.parametrize("family", ["llama3", "qwen2", "qwen3", "mistral", "starcoder2"])
def test_greedy_with_the_cache_equals_greedy_without_it_on_cuda(family):
    torch.backends.cuda.matmul.allow_tf32 = False
    model = build_kenotron_model(family, "debug", device="cuda", max_seq_len=64, seed=1)
    if model.sliding_window is not None:
        model.sliding_window = 8
    cached = generate(model, PROMPTS, max_new_tokens=24)
    assert cached == generate(model, PROMPTS, max_new_tokens=24, use_cache=False)


def test_bf16_generation_with_the_cache_runs_on_cuda():
    model = build_kenotron_model("qwen3", "debug", device="cuda", dtype=torch.bfloat16, max_seq_len=64, seed=1)
    out = generate(model, PROMPTS, max_new_tokens=16)
    assert [len(row) for row in out] == [16, 16, 16]
