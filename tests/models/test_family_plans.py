"""Every family's tensor-parallel plan: FSDP 2 x TP 2 (with SP) matches the family's 1-rank run."""

from __future__ import annotations

import pytest

from tests.distributed.pool import run_on_ranks
from tests.parallel.parity import assert_parity, run_steps

FAMILIES = ["qwen2", "qwen3", "mistral", "starcoder2"]


@pytest.mark.parametrize("family", FAMILIES)
def test_fsdp_x_tp_matches_one_rank(family, tmp_path):
    model = ["--model.name", family]
    reference = run_steps(model, str(tmp_path / "ref"))
    results = run_on_ranks(4, run_steps, model + ["--parallelism.tp", "2"], str(tmp_path))
    # The plan really shards: the query projection holds half its rows per tp rank, halved again by FSDP.
    full_rows = reference["local_shapes"]["layers.0.attention.wq.weight"][0]
    assert results[0]["local_shapes"]["layers.0.attention.wq.weight"][0] == full_rows // 4
    assert_parity(reference, results, loss_tol=1e-6, grad_tol=1e-6)


def test_mistral_sliding_window_under_tp_matches_one_rank(tmp_path):
    # seq_len 160 > the debug window (128), so the windowed mask is exercised on the
    # full-sequence q/k that sequence parallel gathers before attention.
    from kenotron.models import get_model_spec

    assert get_model_spec("mistral").model_args("debug").sliding_window < 160
    model = ["--model.name", "mistral", "--training.seq_len", "160"]
    reference = run_steps(model, str(tmp_path / "ref"))
    results = run_on_ranks(2, run_steps, model + ["--parallelism.tp", "2", "--training.local_batch_size", "8"], str(tmp_path))
    assert_parity(reference, results, loss_tol=1e-6, grad_tol=1e-6)
