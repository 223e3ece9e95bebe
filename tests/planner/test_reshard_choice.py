"""`fsdp_reshard_after_forward = "default"` settled by memory (planner/reshard_choice.py): "never"
where its closed-form peak fits the GPU with the estimator's headroom, else the per-unit policy,
and the fake-tensor estimate of the chosen policy agrees with the closed form it was chosen by."""

from __future__ import annotations

import pytest

from kenotron.config import load_config
from kenotron.estimate.memory import estimate_run
from kenotron.estimate.report import GIB, RESERVED_FRACTION
from kenotron.planner.analytic_model import AnalyticModel
from kenotron.planner.reshard_choice import choose_reshard_after_forward, settle_reshard_after_forward, with_settings
from kenotron.train.resolve import resolve_run
from tests.planner.test_analytic import SHAPE, TOLERANCE


def _run(config: str, ngpu: int, overrides: list[str]):
    return resolve_run(load_config(config, overrides), ngpu, check_data=False)


def test_a_small_model_keeps_every_unit_gathered_and_the_estimator_agrees_on_its_peak():
    run = _run("debug", 4, SHAPE)
    choice = settle_reshard_after_forward(run, 80)
    assert choice.policy == run.plan.settings.reshard_after_forward == "never", choice
    report = estimate_run(run, 80)  # the fake-tensor step of the settled plan
    assert report.settings["reshard after forward"] == "never"
    assert choice.peak_never == pytest.approx(report.peak_bytes, rel=TOLERANCE)
    # "never" keeps more gathered than the per-unit policy: the choice was not free.
    default_peak = AnalyticModel(run).peak(with_settings(run, reshard_after_forward="default")).total
    assert choice.peak_never > default_peak


def test_a_gpu_too_small_for_never_keeps_the_per_unit_policy_and_its_estimate_fits():
    run = _run("debug", 4, SHAPE)
    model = AnalyticModel(run)
    never = model.peak(with_settings(run, reshard_after_forward="never")).total
    default = model.peak(run).total
    # A GPU whose usable memory lies between the two peaks.
    gpu_gib = (never + default) / 2 / (1 - RESERVED_FRACTION) / GIB
    choice = settle_reshard_after_forward(run, gpu_gib, model)
    assert choice.policy == run.plan.settings.reshard_after_forward == "default", choice
    assert "exceeds" in choice.why
    report = estimate_run(run, gpu_gib)
    assert report.peak_bytes == pytest.approx(default, rel=TOLERANCE)
    assert report.peak_bytes < never


def test_the_full_30b_moe_on_8_gpus_of_80_gib_reshards_and_on_a_smaller_model_does_not():
    big = _run("qwen3_moe_30b_a3b", 8, ["--activation_checkpoint.mode", "full", "--training.local_batch_size", "1"])
    choice = choose_reshard_after_forward(big, 80)
    # 30.5 B parameters gathered in bf16 (61 GB) do not fit beside the rest.
    assert choice.policy == "default" and choice.peak_never > 0.9 * 80 * GIB, choice
    shallow = _run("qwen3_moe_30b_a3b", 8, ["--activation_checkpoint.mode", "full", "--training.local_batch_size", "1",
                                             "--model.n_layers", "4"])
    assert choose_reshard_after_forward(shallow, 80).policy == "never"


@pytest.mark.parametrize("overrides,why", [
    (["--parallelism.fsdp_reshard_after_forward", "always"], "in the config"),
    (["--parallelism.dp_replicate", "4", "--parallelism.dp_shard", "1"], "no FSDP sharding"),
    (["--parallelism.pp", "2", "--model.n_layers", "4"], "pipeline parallel"),
], ids=["set-in-the-config", "ddp", "pipeline"])
def test_runs_without_a_memory_choice_keep_their_policy(overrides, why):
    run = _run("debug", 4, ["--training.local_batch_size", "2", "--training.global_batch_size", "8"] + overrides)
    before = run.plan.settings.reshard_after_forward
    choice = settle_reshard_after_forward(run, 80)
    assert choice.policy == before == run.plan.settings.reshard_after_forward
    assert why in choice.why and choice.peak_never is None
