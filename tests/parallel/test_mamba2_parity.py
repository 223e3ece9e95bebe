"""Mamba-2 under every kind of parallelism it supports, against its 1-rank run on CPU/gloo (fp32,
SGD, the trainer's own path): FSDP 2, TP 2 (heads, groups, the convolution and the gated norm
split), FSDP x TP 4, PP 2, the hybrid under FSDP x TP, and activation checkpointing on one rank.
Losses and norms of 2 steps and the first step's gradients within 1e-6. Sequences of 64 positions: two chunks of the debug flavor's 32."""

from __future__ import annotations

import pytest

from tests.distributed.pool import run_on_ranks
from tests.parallel.parity import assert_parity, run_steps

TOL = 1e-6
STEPS = 2
MODEL = ["--model.name", "mamba2", "--training.seq_len", "64"]
LAYOUTS = {
    "fsdp2": (2, []),
    "tp2": (2, ["--parallelism.tp", "2", "--training.local_batch_size", "8"]),
    "fsdp2_tp2": (4, ["--parallelism.tp", "2"]),
    "pp2": (2, ["--parallelism.pp", "2", "--training.local_batch_size", "4", "--parallelism.pp_microbatches", "2"]),
}
# Rank 0's share of layer 0's in-projection (4 groups x 324 rows = 1296 x 256) and convolution
# (4 groups x 192 channels).
EXPECTED = {
    "fsdp2": {"in_proj": (648, 256), "conv": (384, 1, 4)},
    "tp2": {"in_proj": (648, 256), "conv": (384, 1, 4)},
    "fsdp2_tp2": {"in_proj": (324, 256), "conv": (192, 1, 4)},
    "pp2": {"in_proj": (1296, 256), "conv": (768, 1, 4)},
}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return run_steps(MODEL, str(tmp_path_factory.mktemp("ref")), STEPS)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layout_matches_one_rank(layout, reference, tmp_path):
    world, overrides = LAYOUTS[layout]
    results = run_on_ranks(world, run_steps, MODEL + overrides, str(tmp_path), STEPS)
    shapes = results[0]["local_shapes"]
    assert shapes["layers.0.mixer.in_proj.weight"] == EXPECTED[layout]["in_proj"]
    assert shapes["layers.0.mixer.conv1d.weight"] == EXPECTED[layout]["conv"]
    assert_parity(reference, results, loss_tol=TOL, grad_tol=TOL)


def test_hybrid_under_fsdp_x_tp_matches_one_rank(tmp_path):
    hybrid = MODEL + ["--model.flavor", "debug-hybrid", "--model.n_layers", "3"]  # layers: mamba, mamba, attention
    reference = run_steps(hybrid, str(tmp_path / "ref"), STEPS)
    results = run_on_ranks(4, run_steps, hybrid + ["--parallelism.tp", "2"], str(tmp_path), STEPS)
    assert results[0]["local_shapes"]["layers.2.attention.wq.weight"] == (64, 256)
    assert_parity(reference, results, loss_tol=TOL, grad_tol=TOL)


@pytest.mark.parametrize("mode", ["full", "selective-op"])
def test_activation_checkpointing_changes_nothing(mode, reference, tmp_path):
    # The convolution and the gated norm are autograd functions that recompute inside their own
    # backward: checkpointing recomputes them once more, with the same result.
    result = run_steps(MODEL + ["--activation_checkpoint.mode", mode], str(tmp_path), STEPS)
    assert_parity(reference, [result], loss_tol=TOL, grad_tol=TOL)
