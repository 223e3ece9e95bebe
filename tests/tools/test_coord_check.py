"""A small coordinate check: under spectral µP every probed activation keeps its size as the
width grows (init and after training steps); under the standard parametrization the blocks'
outputs grow with it. The numbers are the width exponents (slope of log2 RMS on log2 width)."""

from __future__ import annotations

import pytest

from kenotron.tools.coord_check import coord_check, width_exponents

WIDTHS = [64, 128, 256]
STEPS = 3
SMALL = ["--model.n_layers", "1", "--training.seq_len", "32", "--training.local_batch_size", "4",
         "--optimizer.lr", "3e-3", "--lr_scheduler.warmup_steps", "0", "--lr_scheduler.decay", "constant",
         "--optimizer.weight_decay", "0"]
BLOCK_OUTPUTS = ("layers.0.attention", "layers.0.feed_forward")


@pytest.fixture(scope="module")
def checks():
    return {p: coord_check(WIDTHS, p, STEPS, SMALL) for p in ("spectral_mup", "standard")}


def test_spectral_mup_activations_are_flat_in_width(checks):
    check = checks["spectral_mup"]
    for step in range(STEPS + 1):
        exps = width_exponents(WIDTHS, check.at_step(step))
        for name in ("embedding", *BLOCK_OUTPUTS):
            assert abs(exps[name]) < 0.15, (step, name, exps)
    # The output layer starts at std 1/width (the paper's output layer): logits ~ width^-1/2 at
    # init, then the width-independent updates take over.
    assert width_exponents(WIDTHS, check.at_step(0))["logits"] == pytest.approx(-0.5, abs=0.05)
    assert abs(width_exponents(WIDTHS, check.at_step(STEPS))["logits"]) < 0.2


def test_standard_parametrization_activations_grow_with_width(checks):
    check = checks["standard"]
    previous = dict.fromkeys(BLOCK_OUTPUTS, 0.0)
    for step in range(STEPS + 1):
        exps = width_exponents(WIDTHS, check.at_step(step))
        for name in BLOCK_OUTPUTS:
            assert exps[name] > 0.8, (step, name, exps)
            assert exps[name] >= previous[name] - 0.05  # training makes it worse, not better
            previous[name] = exps[name]
