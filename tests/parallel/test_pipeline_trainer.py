"""Pipeline parallel through the whole trainer: metrics.jsonl equal to the 1-rank run's, and a
stopped run resumed from its checkpoint logging bit-identical losses."""

from __future__ import annotations

import pytest

from tests.checkpoint.test_trainer_resume import STOP_AFTER, losses_by_step, train
from tests.distributed.pool import run_on_ranks
from tests.train.short_run import read_records, train_short_run

N_LAYERS = 4
# 4 of the short run's 6 steps: records at 1, 2 and 4, the last averaging steps 3 and 4 (loss_avg).
FOUR_STEPS = ["--training.steps", "4"]


@pytest.fixture(scope="module")
def one_rank_records(tmp_path_factory):
    folder = tmp_path_factory.mktemp("one")
    train_short_run(N_LAYERS, ["--training.local_batch_size", "8", *FOUR_STEPS], str(folder))
    return read_records(folder)


@pytest.mark.parametrize(
    "layout",
    [
        ["--parallelism.pp", "2", "--parallelism.dp_shard", "2", "--training.local_batch_size", "2"],
        ["--parallelism.pp", "4", "--training.local_batch_size", "8"],
    ],
    ids=["pp2_fsdp2_accum2", "pp4_1f1b"],
)
def test_pipeline_metrics_match_one_rank(layout, one_rank_records, tmp_path):
    run_on_ranks(4, train_short_run, N_LAYERS, layout + FOUR_STEPS, str(tmp_path))
    records = read_records(tmp_path)  # written by rank 0: a first stage, which computes no loss itself
    assert [r["step"] for r in records] == [r["step"] for r in one_rank_records] == [1, 2, 4]
    for ours, ref in zip(records, one_rank_records):
        # AdamW amplifies 1e-9 reduction-order noise in gradients; losses still agree closely.
        assert abs(ours["loss"] - ref["loss"]) < 1e-4, (ours, ref)
        assert abs(ours["loss_avg"] - ref["loss_avg"]) < 1e-4, (ours, ref)
        assert abs(ours["grad_norm"] - ref["grad_norm"]) < 1e-4 * max(1.0, ref["grad_norm"]), (ours, ref)
        assert ours["tokens_seen"] == ref["tokens_seen"]  # counted once, not once per stage


RESUME_LAYOUTS = {
    "pp2_1f1b-sync": (2, ["--parallelism.pp", "2", "--checkpoint.async_mode", "disabled"]),
    "pp2_fsdp2_zbv-async": (
        4, ["--parallelism.pp", "2", "--parallelism.pp_schedule", "ZBVZeroBubble", "--checkpoint.async_mode", "async",
            "--training.local_batch_size", "1", "--parallelism.pp_microbatches", "1"],
    ),
}


@pytest.mark.parametrize("layout", list(RESUME_LAYOUTS))
def test_pipeline_run_resumes_bitwise(layout, tmp_path):
    world, overrides = RESUME_LAYOUTS[layout]
    # 3 steps, not test_trainer_resume's 4: 2 before the stop, and the third already runs wholly
    # from the loaded model, optimizer, loader and schedule state.
    overrides = ["--model.n_layers", "4", "--training.steps", str(STOP_AFTER + 1)] + overrides
    run_on_ranks(world, train, str(tmp_path / "full"), overrides)
    run_on_ranks(world, train, str(tmp_path / "resumed"), overrides + ["--checkpoint.enable", "true"], STOP_AFTER)
    assert list(losses_by_step(tmp_path / "resumed")) == list(range(1, STOP_AFTER + 1))
    run_on_ranks(world, train, str(tmp_path / "resumed"), overrides + ["--checkpoint.enable", "true"])
    full, resumed = losses_by_step(tmp_path / "full"), losses_by_step(tmp_path / "resumed")
    assert resumed == full
