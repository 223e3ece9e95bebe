"""Generation with Mamba-2's recurrent state cache (the convolution's last inputs and the scan's
state per layer; a hybrid's attention layers keep keys and values): cached greedy equals
uncached greedy token for token, left padding changes nothing, a prompt fed in pieces carries
its state, and greedy equals transformers' Mamba2ForCausalLM on the same random weights."""

from __future__ import annotations

import pytest
import torch

from kenotron.generate import build_kenotron_model, generate
from kenotron.generate.cli import main as generate_cli
from kenotron.models import get_model_spec
from kenotron.models.mamba2 import Mamba2Args
from tests.models.hf_parity import hf_model, needs_grouped_mamba2_norm, random_kenotron_model

# Longer than two chunks (32) so the prefill's chunked scan hands over between chunks.
PROMPTS = [list(range(5, 75)), [1, 2, 3], [100] * 12]


@pytest.mark.parametrize("flavor", ["debug", "debug-hybrid"])
def test_greedy_with_the_cache_equals_greedy_without_it(flavor):
    model = build_kenotron_model("mamba2", flavor, max_seq_len=96, seed=1)
    cached = generate(model, PROMPTS, max_new_tokens=8)
    assert cached == generate(model, PROMPTS, max_new_tokens=8, use_cache=False)
    assert cached == [generate(model, [prompt], max_new_tokens=8)[0] for prompt in PROMPTS]


def test_a_prompt_fed_in_pieces_carries_the_state():
    model = build_kenotron_model("mamba2", "debug-hybrid", max_seq_len=96, seed=2)
    tokens = torch.randint(0, 4096, (2, 90), generator=torch.Generator().manual_seed(0))
    cache = model.new_cache(2, 90)
    with torch.no_grad():
        whole = model(tokens)
        first = model(tokens[:, :70], kv_cache=cache)  # 70: two chunks and a part
        second = model(tokens[:, 70:89], kv_cache=cache)
        last = model(tokens[:, 89:], kv_cache=cache)  # one token: the recurrence
    torch.testing.assert_close(torch.cat([first, second, last], dim=1), whole, rtol=1e-4, atol=1e-4)
    assert cache.length == 90


@needs_grouped_mamba2_norm
def test_greedy_equals_transformers_generate():
    pytest.importorskip("transformers")
    spec = get_model_spec("mamba2")
    args = Mamba2Args(dim=64, n_layers=2, vocab_size=128, ssm_state=16, ssm_head_dim=16, ssm_groups=2, chunk_size=16,
                      max_seq_len=64)
    ours = random_kenotron_model(spec, args)
    theirs = hf_model(spec, args)
    theirs.load_state_dict(spec.hf_adapter.to_hf(ours.state_dict(), args), strict=False)
    prompt = list(range(3, 23))
    expected = theirs.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False, min_new_tokens=16,
                               eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
    assert generate(ours, [prompt], max_new_tokens=16) == [expected]
    assert len(set(expected)) > 2  # the weights give a varied continuation, not one repeated token


@pytest.mark.parametrize(("model", "flavor", "cache"), [
    ("mamba2", "debug", "recurrent state cache)"),
    ("mamba2", "debug-hybrid", "recurrent state cache + attention KV cache)"),
    ("llama3", "debug", "attention KV cache)"),
])
def test_generate_names_the_cache_of_the_family(model, flavor, cache, capsys):
    generate_cli(["--model", model, "--flavor", flavor, "--prompt-ids", "1 2 3", "--max-new-tokens", "2",
                  "--device", "cpu"])
    summary = capsys.readouterr().err.strip().splitlines()[-1]
    assert summary.endswith(f"batch 1, cpu, {cache}"), summary
