"""DDP by gradient hooks (tuning.ddp_engine "gradient_hooks") against one rank and FSDP, on
CPU/gloo: what a step copies and reduces, and checkpoints across the layouts. (Its losses and
gradients with accumulation and clipping: the ddp2_hooks row of test_parity.py.)"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kenotron.config import load_config
from kenotron.degrees import ParallelDims
from kenotron.kernel_choice.config_checks import settle_precision
from kenotron.kernel_choice.target import Target
from kenotron.parallel.model_layout import PlanError
from kenotron.parallel.parallel_settings import ParallelSettings
from tests.checkpoint.test_trainer_resume import COMMON, losses_by_step
from tests.distributed.pool import run_on_ranks
from tests.parallel.ddp_traffic import step_traffic
from tests.train.short_run import train_until

DDP2 = ["--parallelism.dp_replicate", "2", "--parallelism.dp_shard", "1"]
HOOKS = ["--tuning.ddp_engine", "gradient_hooks"]
BF16_MASTER = ["--training.param_dtype", "bfloat16", "--tuning.mixed_precision", "master_weights",
               "--optimizer.name", "adamw"]


def test_ddp_by_hooks_copies_what_one_rank_copies_and_all_reduces_each_gradient_once_per_step(tmp_path):
    # Two micro-steps per rank in both: 1 rank with half the global batch.
    one = step_traffic(["--training.global_batch_size", "4"], str(tmp_path / "one"))
    ddp = run_on_ranks(2, step_traffic, DDP2 + HOOKS, str(tmp_path / "ddp"))[0]
    # replicate_with_fsdp copies 4 x the fp32 gradients' bytes more per step than one rank does
    # (docs/parallelism.md, "DDP engines"); the hooks reduce the gradients where they lie.
    assert ddp["copied_bytes"] == one["copied_bytes"], (ddp, one)
    assert ddp["reduced_bytes"] == ddp["param_fp32_bytes"], ddp  # fp32 gradients, each once
    # Under bf16 master weights the gradients, and so the all-reduces, are bf16: half the bytes.
    master = run_on_ranks(2, step_traffic, DDP2 + HOOKS + BF16_MASTER + ["--training.global_batch_size", "4"],
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
    run_on_ranks(2, _train, _resume_from(tmp_path / "ddp", tmp_path / "fsdp", 2), DDP2 + HOOKS + save, 4)
    run_on_ranks(2, _train, _resume_from(tmp_path / "back", tmp_path / "ddp", 4), save)
    ddp, back = losses_by_step(tmp_path / "ddp"), losses_by_step(tmp_path / "back")
    assert sorted(ddp) == [3, 4] and sorted(back) == [5, 6], (ddp, back)
    assert ddp | back == pytest.approx({s: reference[s] for s in range(3, 7)}, abs=1e-5)


def test_hooks_refuse_a_layout_with_more_than_ddp():
    settings = ParallelSettings(ddp_engine="gradient_hooks")
    settings.check(2, {"dp_replicate": 2})
    settings.check(2, {"dp_shard": 2})  # no DDP: the engine has nothing to run
    with pytest.raises(PlanError, match="tuning.ddp_engine='gradient_hooks' runs DDP alone"):
        settings.check(2, {"dp_replicate": 2, "tp": 2})


@pytest.mark.parametrize(("engine", "global_batch", "precision"), [
    ("gradient_hooks", "8", "master_weights"),  # one micro-step: as one GPU trains
    ("gradient_hooks", "16", "autocast"),  # accumulation: fp32 gradients
    ("replicate_with_fsdp", "8", "fsdp"),
])
def test_ddp_on_gpus_takes_the_one_gpu_precision_only_by_hooks(engine, global_batch, precision):
    cfg = load_config(None, ["--training.param_dtype", "bfloat16", "--optimizer.name", "adamw", "--compile.enable",
                             "true", "--training.local_batch_size", "4", "--training.global_batch_size", global_batch,
                             "--tuning.ddp_engine", engine])
    dims = ParallelDims.from_degrees(2, dp_replicate=2, dp_shard=1)
    accum = int(global_batch) // 8
    assert settle_precision(cfg, dims, Target("cuda", 9, True), accum) == precision
