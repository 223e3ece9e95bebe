"""`bench.py --trace`: the per-block timer finds the block that waits, counts every block's
forward and backward, and leaves no hooks behind; a bench case prints it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from kenotron.models.llama3.args import Llama3Args
from kenotron.models.llama3.model import Llama3
from kenotron.tools.bench import run_case
from kenotron.tools.block_trace import BlockTimer, format_trace, stream_pools
from tests.ahead import Lane

ARGS = Llama3Args(dim=32, n_layers=5, n_heads=4, n_kv_heads=2, ffn_dim=64, vocab_size=64)


def _step(model: Llama3) -> None:
    tokens = torch.randint(0, ARGS.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    model(tokens).float().square().mean().backward()


def test_the_timer_finds_the_block_that_waits_and_times_every_block_both_ways():
    model = Llama3(ARGS)
    model.init_weights(seed=0)
    blocks = list(model.layers.values())
    blocks[2].register_forward_hook(lambda *_: time.sleep(0.05))  # block 2's forward waits 50 ms
    timer = BlockTimer(blocks, torch.device("cpu"))
    _step(model)
    forward, tail, backward = timer.times()
    assert len(forward) == len(backward) == len(blocks) - 1 and tail > 0
    assert max(range(len(forward)), key=forward.__getitem__) == 2 and forward[2] >= 50
    assert all(t >= 0 for t in forward + backward)
    text = format_trace(forward, tail, backward, stream_pools(torch.device("cpu")))
    assert "max " + f"{forward[2]:.1f} (block 2)" in text and "blocks 4..1" in text
    timer.close()
    _step(model)
    assert len(timer.passes) == 1  # closed: the second step left no stamps


def traced_row(folder: Path, lane: Lane) -> dict:
    """A traced bench case: a process of its own (seconds), run ahead of the test (tests/ahead.py)."""
    tiny = ["--training.device", "cpu", "--training.seq_len", "32", "--training.local_batch_size", "2"]
    return run_case("tiny", tiny, ngpu=1, warmup=1, steps=1, timeout=300, trace=True)


@pytest.mark.run_ahead(job=traced_row)
def test_a_traced_bench_case_prints_the_per_block_times(ran_ahead):
    row = ran_ahead
    assert "error" not in row, row.get("error")
    assert row["trace"].startswith("Per-block times on the compute stream")
    assert "forward ms: median" in row["trace"] and "backward ms: median" in row["trace"]
