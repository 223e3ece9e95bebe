"""Pipeline parallel in the estimator: one rank class per pipeline rank, each stage's own
parameters, the schedule's microbatches in flight, the shortcuts (fewer microbatches, shallow
stages) equal to the full simulation, and bad configs failing as the trainer fails."""

from __future__ import annotations

import pytest
import torch

from kenotron.config import ConfigError, load_config
from kenotron.degrees import ParallelConfigError
from kenotron.estimate import estimate_memory
from kenotron.estimate.breakdown import allocated_bytes
from kenotron.estimate.pipeline_order import max_in_flight, rank_actions
from kenotron.parallel.pipeline import stage_module
from kenotron.planner import estimate_with_closed_form
from kenotron.train.resolve import resolve_run

DEBUG = "debug"
# Llama 3.2 1B's widths with 4 blocks (tied embeddings on the first and last stage).
ONE_B = ["--model.flavor", "1B", "--model.n_layers", "4", "--training.seq_len", "512",
         "--training.param_dtype", "bfloat16", "--compile.enable", "false"]


def estimate(ngpu: int, *overrides: str, config: str = DEBUG, full_depth: bool = False):
    return estimate_with_closed_form(load_config(config, list(overrides)), ngpu, gpu_memory_gib=80, full_depth=full_depth)


@pytest.fixture(scope="module")
def shared_estimate():
    """`estimate`, made once per arguments in this module for the tests that only read the report:
    PP 2, PP 2 with 8 microbatches and PP 4 with one block a stage are each priced by two tests
    (1-3 s each). A test that patches the estimator calls `estimate` while the patch holds."""
    made = {}

    def once(ngpu: int, *overrides: str, config: str = DEBUG):
        key = (ngpu, overrides, config)
        if key not in made:
            made[key] = estimate(ngpu, *overrides, config=config)
        return made[key]

    return once


def stage_static_bytes(ngpu: int, pp_rank: int, overrides: list[str], config: str = DEBUG, copies: bool = True) -> int:
    """Parameters (this rank's shard, from the plan's own table) + buffers of the rank's stages, built on meta
    (`copies`: with the units a stage holds a copy of)."""
    run = resolve_run(load_config(config, overrides), ngpu)
    split = run.plan.pipeline
    with torch.device("meta"):
        model = run.spec.build(run.model_args)
    mesh_shape = {k: v for k, v in run.dims.degrees().items() if k != "pp"}
    total = 0
    for s in split.local_stages(pp_rank):
        part = stage_module(model, split.units_of(s) if copies else split.stages[s], run.plan.layout.blocks)
        total += sum(allocated_bytes(r["bytes"]) for r in run.plan.describe(part, mesh_shape))
        total += sum(allocated_bytes(b.numel() * b.element_size()) for b in part.buffers())
    return total


@pytest.mark.parametrize(
    "ngpu,overrides,config",
    [
        (2, ["--parallelism.pp", "2"], DEBUG),
        (4, ["--parallelism.pp", "4", "--training.local_batch_size", "8"] + ONE_B, DEBUG),
        (4, ["--parallelism.pp", "2", "--parallelism.pp_schedule", "Interleaved1F1B"], DEBUG),
    ],
    ids=["pp2", "pp4-1B-shaped", "pp2-interleaved-fsdp2"],
)
def test_one_rank_class_per_pipeline_rank_holding_its_stages_parameters(ngpu, overrides, config, shared_estimate):
    report = shared_estimate(ngpu, *overrides, config=config)
    run = resolve_run(load_config(config, overrides), ngpu)
    assert len(report.ranks) == run.dims.pp
    for pp_rank, rank in enumerate(report.ranks):
        stages = run.plan.pipeline.local_stages(pp_rank)
        assert rank.ranks.startswith(f"pipeline rank {pp_rank}, stage")
        assert all(str(s) in rank.ranks for s in stages)
        assert rank.peak.parameters == stage_static_bytes(ngpu, pp_rank, overrides, config)
        assert rank.peak.total == sum(rank.peak.as_dict().values())
        assert rank.analytic is not None and rank.analytic.parameters == rank.peak.parameters  # every schedule
    assert report.to_dict()["ranks"][0]["peak_bytes"] == report.ranks[0].peak.total


def test_the_mtp_modules_stage_is_priced_with_its_copy_of_the_embedding():
    overrides = ["--parallelism.pp", "2", "--model.name", "deepseek_v3", "--model.mtp_depth", "1"]
    first, last = estimate(2, *overrides).ranks
    # Both ranks are off the static table by the same few router statistics; the last holds 4096 x 256 fp32 more.
    offset = first.peak.parameters - stage_static_bytes(2, 0, overrides)
    assert last.peak.parameters - stage_static_bytes(2, 1, overrides, copies=False) == offset + 4096 * 256 * 4


def test_under_a_v_schedule_rank_0_is_priced_with_the_mtp_stage_and_its_copy_of_the_embedding():
    # ZBVZeroBubble: rank 0 runs stage 0 (the embedding) and stage 3 (the MTP module, the head, the copy).
    overrides = ["--parallelism.pp", "2", "--parallelism.pp_schedule", "ZBVZeroBubble", "--model.name", "deepseek_v3",
                 "--model.mtp_depth", "1", "--training.local_batch_size", "2", "--training.seq_len", "64"]
    first, second = estimate(2, *overrides).ranks
    assert "stages 0 and 3" in first.ranks
    offset = second.peak.parameters - stage_static_bytes(2, 1, overrides)  # the router statistics, as above
    assert first.peak.parameters - stage_static_bytes(2, 0, overrides, copies=False) == offset + 4096 * 256 * 4


def test_fsdp_shards_each_stage_over_data_parallel(shared_estimate):
    alone = shared_estimate(2, "--parallelism.pp", "2")
    sharded = estimate(4, "--parallelism.pp", "2", "--parallelism.dp_shard", "2")
    for a, b in zip(alone.ranks, sharded.ranks):
        assert b.peak.parameters < 0.6 * a.peak.parameters
        assert b.peak.optimizer_state < 0.6 * a.peak.optimizer_state
    assert sharded.ranks[1].peak.parameters == stage_static_bytes(
        4, 1, ["--parallelism.pp", "2", "--parallelism.dp_shard", "2"])


def test_1f1b_keeps_more_microbatches_in_flight_on_the_first_stage(shared_estimate):
    split = resolve_run(load_config(DEBUG, ["--parallelism.pp", "4", "--training.local_batch_size", "8"]), 4).plan.pipeline
    assert [max_in_flight(rank_actions(split, r))[r] for r in range(4)] == [4, 3, 2, 1]
    # One block per stage: the in-flight microbatches make the difference.
    report = shared_estimate(4, "--parallelism.pp", "4", "--training.local_batch_size", "8",
                      "--parallelism.pp_layers_per_stage", "[1, 1, 1, 1]")
    kept = [r.peak.activations for r in report.ranks]
    assert kept[0] > kept[1] > kept[2] > 0 and kept[0] > kept[3] > 0  # the last stage: one microbatch and its logits
    assert "4 in flight" in report.ranks[0].peak_at
    assert any("stage 0: 4, stage 1: 3, stage 2: 2, stage 3: 1" in note for note in report.notes)


def test_context_parallel_inside_stages_halves_each_stages_activations_and_shards_it(shared_estimate):
    """PP 2 x CP 2 against PP 2: every pipeline rank holds half of each sequence (the replay feeds
    it its shard, the stages' attention is the CP ring) and FSDP shards its stage over cp."""
    args = ("--parallelism.pp", "2", "--training.local_batch_size", "8")
    alone = shared_estimate(2, *args)
    cp = estimate(4, *args, "--parallelism.cp", "2")
    for pp_rank, (a, b) in enumerate(zip(alone.ranks, cp.ranks)):
        assert 0.4 < b.peak.activations / a.peak.activations < 0.6, (a.peak, b.peak)
        assert b.peak.parameters == stage_static_bytes(4, pp_rank, [*args, "--parallelism.cp", "2"])
        assert b.peak.parameters < 0.6 * a.peak.parameters
    assert any("128 tokens per rank" in n for n in cp.notes)
    assert any("8 microbatches of 1 x 256 (128 tokens of each sequence per cp rank)" in n for n in cp.notes)


@pytest.mark.parametrize(
    "overrides",
    [
        ("--training.local_batch_size", "8"),
        ("--training.local_batch_size", "8", "--parallelism.pp_schedule", "GPipe"),
        # 8 blocks a stage: the shortest that extrapolates (2 shallow runs of 4 and 5 blocks cost less)
        ("--model.n_layers", "16", "--training.local_batch_size", "4", "--parallelism.dp_shard", "2"),
    ],
    ids=["1f1b", "gpipe", "deep-stages-fsdp"],
)
def test_shortcuts_equal_the_full_simulation(overrides, shared_estimate):
    # Fewer microbatches (and shallow stages for the deep case) against every microbatch and block.
    ngpu = 4 if "--parallelism.dp_shard" in overrides else 2
    quick = shared_estimate(ngpu, "--parallelism.pp", "2", *overrides)
    full = estimate(ngpu, "--parallelism.pp", "2", *overrides, full_depth=True)
    assert "extended" in quick.method and "every block" in full.method
    if "16" in overrides:
        assert "extrapolated" in quick.method
    for q, f in zip(quick.ranks, full.ranks):
        assert q.peak.as_dict() == pytest.approx(f.peak.as_dict(), rel=1e-3, abs=65536)


@pytest.mark.parametrize("schedule", ["LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"])
def test_multi_stage_schedules_run_each_ranks_stages(schedule):
    report = estimate(2, "--parallelism.pp", "2", "--parallelism.pp_schedule", schedule)
    v = schedule in ("ZBVZeroBubble", "DualPipeV")
    assert [r.ranks.split(" (")[0] for r in report.ranks] == (
        ["pipeline rank 0, stages 0 and 3", "pipeline rank 1, stages 1 and 2"] if v
        else ["pipeline rank 0, stages 0 and 2", "pipeline rank 1, stages 1 and 3"])
    assert all(r.peak.activations > 0 and r.phase_peaks["optimizer"].gradients > 0 for r in report.ranks)


@pytest.mark.parametrize(
    "overrides,error",
    [
        (("--parallelism.pp", "8"), ParallelConfigError),  # 8 stages, 4 layers
        (("--parallelism.pp", "2", "--parallelism.pp_microbatches", "3"), ParallelConfigError),
        (("--parallelism.pp", "4", "--training.local_batch_size", "2"), ParallelConfigError),  # 1F1B: >= pp
        (("--parallelism.pp", "2", "--tuning.loss", "fused"), ConfigError),
    ],
    ids=["too-few-layers", "microbatches-divide", "1f1b-microbatches", "fused-loss"],
)
def test_bad_pipeline_configs_raise_the_trainers_own_errors(overrides, error):
    cfg = load_config(DEBUG, list(overrides))
    ngpu = int(overrides[1])
    with pytest.raises(error) as from_trainer:
        resolve_run(cfg, ngpu)
    with pytest.raises(error) as from_estimator:
        estimate_memory(cfg, ngpu)
    assert str(from_estimator.value) == str(from_trainer.value)


def test_last_stage_keeps_every_microbatchs_logits_only_when_step_returns_outputs(monkeypatch, shared_estimate):
    """The trainer passes return_outputs=False; torch's default True keeps the 8 microbatches'
    logits (8 x 256 x 4096 fp32) on the last stage until the step ends, and merges them."""
    args = ("--parallelism.pp", "4", "--training.local_batch_size", "8", "--parallelism.pp_layers_per_stage",
            "[1, 1, 1, 1]")
    without = shared_estimate(4, *args).ranks[3].peak  # before the patch: test_1f1b_... reads the same report
    monkeypatch.setattr("kenotron.estimate.pipeline_replay.RETURN_OUTPUTS", True)
    kept = estimate(4, *args).ranks[3].peak
    logits = 8 * allocated_bytes(256 * 4096 * 4)
    assert kept.total - without.total >= logits
