"""Which loss runs: tuning.loss auto takes the fused chunked loss under tensor parallel too (its
vocabulary-parallel form), "fused" is accepted there, and pipeline parallel keeps the plain one."""

from __future__ import annotations

import pytest

from kenotron.config import ConfigError, load_config
from kenotron.train.resolve import resolve_run
from kenotron.train.vocab_parallel_loss import TORCH_STEP, loss_chunk_step_for


def _fused(ngpu: int, *overrides: str) -> bool:
    return resolve_run(load_config("debug", list(overrides)), ngpu).choices.fused_loss


@pytest.mark.parametrize("loss", ["auto", "fused"])
def test_tensor_parallel_runs_the_fused_loss(loss):
    assert _fused(2, "--parallelism.tp", "2", "--tuning.loss", loss)
    assert _fused(4, "--parallelism.tp", "2", "--tuning.loss", loss, "--parallelism.sequence_parallel", "false")


def test_auto_keeps_the_plain_loss_where_asked_or_pipelined():
    assert not _fused(2, "--parallelism.tp", "2", "--tuning.loss_parallel", "false")
    assert not _fused(2, "--parallelism.tp", "2", "--tuning.loss", "plain")
    assert not _fused(2, "--parallelism.pp", "2")


def test_fused_loss_under_pipeline_parallel_is_refused_with_the_fix():
    with pytest.raises(ConfigError, match="tuning.loss='fused' does not combine with pipeline parallel; use 'auto'"):
        _fused(2, "--parallelism.pp", "2", "--tuning.loss", "fused")


def test_tensor_parallel_chunk_step_is_the_vocabulary_parallel_one():
    assert loss_chunk_step_for("torch", vocab_parallel=True) is TORCH_STEP
    assert loss_chunk_step_for("torch", vocab_parallel=False) is None
