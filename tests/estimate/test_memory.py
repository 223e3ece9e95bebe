"""The memory estimator on CPU: breakdowns add up, static bytes equal the plan's own table,
activation checkpointing lowers activations, depth extrapolation equals the full run, and bad
configs fail exactly as the trainer fails."""

from __future__ import annotations

import pytest
import torch

from kenotron.config import ConfigError, load_config
from kenotron.degrees import ParallelConfigError
from kenotron.estimate import estimate_memory
from kenotron.estimate.breakdown import CATEGORIES, allocated_bytes
from kenotron.estimate.static_memory import STEP_COUNTER
from kenotron.models import UnknownModelError
from kenotron.planner import AnalyticModel, estimate_with_closed_form
from kenotron.train.resolve import resolve_run

DEBUG = "debug"


def estimate(ngpu: int, *overrides: str, full_depth: bool = False):
    return estimate_with_closed_form(load_config(DEBUG, list(overrides)), ngpu, gpu_memory_gib=80, full_depth=full_depth)


@pytest.fixture(scope="module")
def shared_estimate():
    """`estimate`, made once per resolved config in this module for the tests that only read the
    report: FSDP 4 with the debug defaults is priced by three tests (the plan's table, AC "none",
    the fused gate's "auto"). Keyed by the loaded config, so spelled-out defaults share it.
    test_estimates_of_different_layouts_follow_each_other_in_one_process calls `estimate`: it
    checks that estimates made one after the other agree."""
    made = {}

    def once(ngpu: int, *overrides: str, full_depth: bool = False):
        key = (ngpu, repr(load_config(DEBUG, list(overrides))), full_depth)
        if key not in made:
            made[key] = estimate(ngpu, *overrides, full_depth=full_depth)
        return made[key]

    return once


def static_bytes(ngpu: int, mesh_shape: dict[str, int], *overrides: str) -> tuple[int, int]:
    """(parameters + buffers, AdamW state) per rank from plan.describe's per-parameter table."""
    run = resolve_run(load_config(DEBUG, list(overrides)), ngpu)
    with torch.device("meta"):
        model = run.spec.build(run.model_args)
    rows = run.plan.describe(model, mesh_shape)
    params = sum(allocated_bytes(r["bytes"]) for r in rows)
    buffers = sum(allocated_bytes(b.numel() * b.element_size()) for b in model.buffers())
    return params + buffers, 2 * params + STEP_COUNTER * len(rows)


def test_breakdown_sums_to_the_total_everywhere():
    report = estimate(4, "--training.global_batch_size", "32")  # FSDP 4, two micro-steps
    rank = report.ranks[0]
    assert sum(rank.peak.as_dict().values()) == rank.peak.total == report.peak_bytes
    assert max(b.total for b in rank.phase_peaks.values()) == rank.peak.total
    as_json = report.to_dict()["ranks"][0]
    assert sum(as_json["breakdown_bytes"].values()) == as_json["peak_bytes"]
    assert set(as_json["breakdown_bytes"]) == set(CATEGORIES)
    text = report.format()
    assert "verdict: fits" in text and "activations kept for backward" in text


@pytest.mark.parametrize(
    "ngpu,mesh_shape,overrides",
    [
        (4, {"dp_shard": 4}, ()),
        (2, {"tp": 2}, ("--parallelism.tp", "2")),
        (4, {"dp_shard": 2, "tp": 2}, ("--parallelism.tp", "2")),
    ],
    ids=["fsdp4", "tp2", "fsdp2xtp2"],
)
def test_parameter_and_optimizer_bytes_equal_the_plans_table(ngpu, mesh_shape, overrides, shared_estimate):
    report = shared_estimate(ngpu, *overrides)
    params, optimizer = static_bytes(ngpu, mesh_shape, *overrides)
    peak = report.ranks[0].peak
    assert peak.parameters == params
    assert peak.optimizer_state == optimizer


def test_activation_checkpointing_lowers_activation_memory(shared_estimate):
    by_mode = {
        mode: shared_estimate(4, "--activation_checkpoint.mode", mode).ranks[0]
        for mode in ("none", "selective-op", "full")
    }
    by_mode["selective-op/2"] = estimate(
        4, "--activation_checkpoint.mode", "selective-op", "--tuning.ac_save_matmul_every", "2"
    ).ranks[0]
    saved = {mode: r.phase_peaks["forward"].activations for mode, r in by_mode.items()}
    assert saved["none"] > saved["selective-op"] > saved["selective-op/2"] > saved["full"] > 0
    assert by_mode["full"].peak.total < by_mode["none"].peak.total


def test_offloaded_blocks_leave_the_device_and_lower_the_peak():
    ranks = {k: estimate(1, "--model.n_layers", "6", "--activation_checkpoint.offload_blocks", str(k)).ranks[0]
             for k in (0, 2, 4)}
    saved = {k: r.phase_peaks["forward"].activations for k, r in ranks.items()}
    # Two more blocks offloaded take two blocks' activations off the device each time.
    assert saved[0] - saved[2] > 0 and saved[2] - saved[4] == pytest.approx(saved[0] - saved[2], rel=0.01)
    assert ranks[0].peak.total > ranks[2].peak.total > ranks[4].peak.total


@pytest.mark.parametrize(
    "overrides",
    # Plain FSDP without AC extrapolates as under CP (FSDP over dp_shard x cp, no AC), which
    # tests/estimate/test_cp_ring_memory.py::test_depth_extrapolation_equals_the_full_depth_run_under_cp
    # checks bit for bit; the cases here add what it lacks: DDP with accumulation, TP, each AC mode.
    [
        ("--model.n_layers", "6", "--parallelism.dp_replicate", "2", "--parallelism.dp_shard", "1",
         "--training.global_batch_size", "16", "--activation_checkpoint.mode", "full"),
        ("--model.n_layers", "6", "--parallelism.tp", "2", "--activation_checkpoint.mode", "selective-op"),
        ("--model.n_layers", "12", "--activation_checkpoint.mode", "every-n-layers"),
    ],
    ids=["ddp-accumulation-full-ac", "fsdp-tp-selective", "every-2-layers"],
)
def test_depth_extrapolation_equals_the_full_depth_run(overrides):
    shallow = estimate(2, *overrides)
    assert "extrapolated" in shallow.method
    whole = estimate(2, *overrides, full_depth=True)
    assert "all" in whole.method
    assert shallow.ranks[0].peak.as_dict() == pytest.approx(whole.ranks[0].peak.as_dict(), rel=1e-3, abs=4096)


def test_zero1_reports_the_fullest_ranks_optimizer_state():
    cfg = load_config(DEBUG, ["--parallelism.dp_mode", "zero1", "--model.n_layers", "8"])
    report = estimate_memory(cfg, 4, gpu_memory_gib=80)
    run = resolve_run(cfg, 4)
    assert report.ranks[0].peak.optimizer_state == AnalyticModel(run).optimizer_state(run)
    assert any("zero1" in note for note in report.notes)


@pytest.mark.parametrize(
    "ngpu,overrides,error",
    [
        (4, ("--parallelism.tp", "3"), ParallelConfigError),
        (4, ("--parallelism.dp_shard", "3"), ParallelConfigError),
        (4, ("--model.flavor", "9B"), UnknownModelError),
        (4, ("--training.global_batch_size", "6"), ParallelConfigError),
        (4, ("--parallelism.cp", "4", "--training.seq_len", "100"), ParallelConfigError),
        (4, ("--parallelism.cp", "2", "--parallelism.tp", "2", "--training.seq_len", "260"), ParallelConfigError),
        (4, ("--parallelism.cp", "2", "--parallelism.pp", "2", "--training.seq_len", "258"), ParallelConfigError),
        (4, ("--parallelism.tp", "4", "--parallelism.dp_mode", "zero1"), ConfigError),
        (4, ("--parallelism.cp", "3"), ParallelConfigError),
    ],
    ids=["tp-heads", "degrees", "flavor", "global-batch", "cp-seq-not-multiple-of-2cp", "cp-seq-not-multiple-of-2cp-tp",
         "cp-pp-seq-not-multiple-of-2cp", "zero1-nothing-to-share-over", "cp-degrees"],
)
def test_bad_configs_raise_the_trainers_own_errors(ngpu, overrides, error):
    cfg = load_config(DEBUG, list(overrides))
    with pytest.raises(error) as from_trainer:
        resolve_run(cfg, ngpu)
    with pytest.raises(error) as from_estimator:
        estimate_memory(cfg, ngpu)
    assert str(from_estimator.value) == str(from_trainer.value)


def test_pipeline_and_context_parallel_are_no_longer_refused():
    report = estimate_memory(load_config(DEBUG, ["--parallelism.pp", "2"]), 2)
    assert len(report.ranks) == 2  # one rank class per pipeline rank (tests/estimate/test_pipeline_memory.py)
    # Context parallel is simulated (tests/estimate/test_cp_ring_memory.py).


def test_estimates_of_different_layouts_follow_each_other_in_one_process():
    # DTensor caches sharding decisions by mesh shape; the estimator clears them between fake
    # process groups, or the second layout would reach for the first one's destroyed groups.
    base = ["--model.n_layers", "2", "--parallelism.tp", "4"]
    first = estimate(16, *base, "--parallelism.dp_replicate", "2")
    second = estimate(16, *base)
    again = estimate(16, *base, "--parallelism.dp_replicate", "2")
    assert first.peak_bytes == again.peak_bytes != second.peak_bytes


def test_fused_swiglu_gate_of_eager_cuda_runs_keeps_one_ffn_activation_less_per_block(shared_estimate):
    """Eager CUDA runs use the fused Triton gate (tuning.eager_kernels auto), which keeps no silu(a)."""
    fused, plain = (shared_estimate(4, "--tuning.eager_kernels", k).ranks[0] for k in ("auto", "torch"))
    cfg = load_config(DEBUG, [])
    run = resolve_run(cfg, 4)
    a, t = run.model_args, cfg.training
    silu_bytes = a.n_layers * allocated_bytes(t.local_batch_size * t.seq_len * a.ffn_dim * 4)  # debug runs in fp32
    saved = plain.phase_peaks["forward"].activations - fused.phase_peaks["forward"].activations
    assert saved == silu_bytes
    assert plain.analytic.total - fused.analytic.total == pytest.approx(silu_bytes, rel=0.02)
    compiled = [estimate(4, "--tuning.eager_kernels", k, "--compile.enable", "true").ranks[0] for k in ("auto", "torch")]
    assert compiled[0].peak.total == compiled[1].peak.total  # compiled blocks keep PyTorch's ops
