"""DDP alone, by gradient hooks (parallel/gradient_all_reduce.py), against one rank and FSDP, on
CPU/gloo: what a step copies and reduces, and checkpoints across the layouts. (Its losses and
gradients with accumulation and clipping: the ddp2 row of test_parity.py; DDP beside pipeline
parallel, by FSDP's replicate: pp2_ddp2 of test_pipeline_parity.py.)"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kenotron.config import load_config
from kenotron.degrees import ParallelDims
from kenotron.kernel_choice.config_checks import settle_precision
from kenotron.kernel_choice.target import Target
from tests.checkpoint.test_trainer_resume import COMMON, losses_by_step
from tests.distributed.pool import run_on_ranks
from tests.parallel.ddp_traffic import step_traffic
from tests.train.short_run import train_until

DDP2 = ["--parallelism.dp_replicate", "2", "--parallelism.dp_shard", "1"]
BF16_MASTER = ["--training.param_dtype", "bfloat16", "--tuning.mixed_precision", "master_weights",
               "--optimizer.name", "adamw"]


def test_ddp_by_hooks_copies_what_one_rank_copies_and_all_reduces_each_gradient_once_per_step(tmp_path):
    # Two micro-steps per rank in both: 1 rank with half the global batch.
    one = step_traffic(["--training.global_batch_size", "4"], str(tmp_path / "one"))
    ddp = run_on_ranks(2, step_traffic, DDP2, str(tmp_path / "ddp"))[0]
    # replicate_with_fsdp copies 4 x the fp32 gradients' bytes more per step than one rank does
    # (docs/parallelism.md, "DDP engines"); the hooks reduce the gradients where they lie.
    assert ddp["copied_bytes"] == one["copied_bytes"], (ddp, one)
    assert ddp["reduced_bytes"] == ddp["param_fp32_bytes"], ddp  # fp32 gradients, each once
    # Under bf16 master weights the gradients, and so the all-reduces, are bf16: half the bytes.
    master = run_on_ranks(2, step_traffic, DDP2 + BF16_MASTER + ["--training.global_batch_size", "4"],
                          str(tmp_path / "master"))[0]
    assert master["all_reduces"] == ddp["all_reduces"] > 0
    assert master["reduced_bytes"] * 2 == master["param_fp32_bytes"], master


def _train(folder: str, overrides: list[str], stop_after: int = 0) -> None:
    train_until(load_config(None, COMMON + ["--job.dump_folder", folder, "--training.steps", "6"] + overrides),
                stop_after)


def _resume_from(folder: Path, source: Path, step: int) -> str:
    """A fresh run folder holding only `source`'s checkpoint of `step`."""
    name = f"checkpoints/step-{step:06d}"
    shutil.copytree(source / name, folder / name)
    return str(folder)


def test_checkpoints_pass_from_fsdp_to_ddp_by_hooks_and_back_with_fsdp_losses(tmp_path):
    save = ["--checkpoint.enable", "true"]
    run_on_ranks(2, _train, str(tmp_path / "fsdp"), save)  # saves at steps 2, 4 and 6
    reference = losses_by_step(tmp_path / "fsdp")
    run_on_ranks(2, _train, _resume_from(tmp_path / "ddp", tmp_path / "fsdp", 2), DDP2 + save, 4)
    run_on_ranks(2, _train, _resume_from(tmp_path / "back", tmp_path / "ddp", 4), save)
    ddp, back = losses_by_step(tmp_path / "ddp"), losses_by_step(tmp_path / "back")
    assert sorted(ddp) == [3, 4] and sorted(back) == [5, 6], (ddp, back)
    assert ddp | back == pytest.approx({s: reference[s] for s in range(3, 7)}, abs=1e-5)


@pytest.mark.parametrize(("degrees", "global_batch", "precision"), [
    ({"dp_replicate": 2, "dp_shard": 1}, "8", "master_weights"),  # DDP alone, one micro-step: as one GPU trains
    ({"dp_replicate": 2, "dp_shard": 1}, "16", "autocast"),  # accumulation: fp32 gradients
    ({"dp_replicate": 2, "dp_shard": 1, "tp": 2}, "8", "fsdp"),  # DDP beside tp: FSDP's replicate casts
])
def test_ddp_on_gpus_takes_the_one_gpu_precision_where_it_runs_alone(degrees, global_batch, precision):
    cfg = load_config(None, ["--training.param_dtype", "bfloat16", "--optimizer.name", "adamw", "--compile.enable",
                             "true", "--training.local_batch_size", "4", "--training.global_batch_size", global_batch])
    dims = ParallelDims.from_degrees(2 * degrees.get("tp", 1), **degrees)
    accum = int(global_batch) // 8
    assert settle_precision(cfg, dims, Target("cuda", 9, True), accum) == precision
