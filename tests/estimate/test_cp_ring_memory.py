"""The estimator under context parallel: a CP rank is simulated with torch's own ring on fake
tensors (kenotron/estimate/cp_ring_memory.py), FSDP shards over dp_shard x cp, activations follow the
local sequence, and bad CP configs fail as the trainer fails."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import DTensor

from kenotron.config import load_config
from kenotron.estimate.breakdown import allocated_bytes
from kenotron.estimate.memory import track_step
from kenotron.estimate.static_memory import STEP_COUNTER
from kenotron.parallel.context.torch_ring import torch_cp_api
from kenotron.planner import AnalyticModel, Hardware, estimate_with_closed_form
from kenotron.planner.search import enumerate_candidates, target_global_batch
from kenotron.train.resolve import resolve_run

DEBUG = "debug"
# bf16 as the GPU runs are, one sequence per rank, long enough that activations dominate.
LONG = ["--training.param_dtype", "bfloat16", "--training.local_batch_size", "1", "--training.seq_len", "2048"]


def estimate(ngpu: int, *overrides: str, full_depth: bool = False):
    return estimate_with_closed_form(load_config(DEBUG, list(overrides)), ngpu, gpu_memory_gib=80, full_depth=full_depth)


@pytest.fixture(scope="module")
def shared_estimate():
    """`estimate`, made once per arguments in this module for the tests that only read the report:
    three tests price the same CP 2 and CP 4 layouts (1-2 s each). A test that patches the
    estimator calls `estimate`."""
    made = {}

    def once(ngpu: int, *overrides: str):
        if (ngpu, overrides) not in made:
            made[ngpu, overrides] = estimate(ngpu, *overrides)
        return made[ngpu, overrides]

    return once


@pytest.mark.parametrize("cp", [2, 4])
def test_cp_estimates_run_and_report_per_rank_figures(cp, shared_estimate):
    report = shared_estimate(4, *LONG, "--parallelism.cp", str(cp))
    assert report.layout["cp"] == cp and report.layout["dp_shard"] == 4 // cp
    rank = report.ranks[0]
    assert rank.simulated_rank == 0 and rank.peak.total == report.peak_bytes > 0
    assert sum(rank.peak.as_dict().values()) == rank.peak.total
    assert rank.peak.activations > 0 and rank.analytic is not None
    assert any("context parallel" in note for note in report.notes)
    assert f"cp {cp}" in report.format()


@pytest.mark.parametrize("cp,dp_shard", [(2, 2), (4, 1), (2, 1)])
def test_parameter_and_optimizer_bytes_follow_fsdp_over_dp_shard_times_cp(cp, dp_shard, shared_estimate):
    ngpu = cp * dp_shard
    overrides = [*LONG, "--parallelism.cp", str(cp)]
    report = shared_estimate(ngpu, *overrides)
    run = resolve_run(load_config(DEBUG, overrides), ngpu)
    model = AnalyticModel(run)
    peak = report.ranks[0].peak
    assert peak.parameters == report.ranks[0].analytic.parameters
    assert peak.optimizer_state == model.optimizer_state(run) == report.ranks[0].analytic.optimizer_state
    # The same bytes as FSDP over cp x dp_shard ranks without context parallel.
    rows = run.plan.describe(model.model, {"dp_shard": ngpu})
    params = sum(allocated_bytes(r["bytes"]) for r in rows)
    assert peak.optimizer_state == 2 * params + STEP_COUNTER * len(rows)


def test_activations_shrink_with_cp_at_fixed_sequence_length(shared_estimate):
    saved = {
        cp: shared_estimate(4, *LONG, "--parallelism.cp", str(cp)).ranks[0].phase_peaks["forward"].activations
        for cp in (1, 2, 4)
    }
    assert saved[1] / saved[2] == pytest.approx(2, rel=0.15)
    assert saved[1] / saved[4] == pytest.approx(4, rel=0.25)


def test_the_simulated_attention_is_torchs_ring_and_torchs_state_is_restored(monkeypatch):
    api = torch_cp_api()
    handlers = dict(DTensor._op_dispatcher._custom_op_handlers)
    options = (api._cp_options.enable_load_balance, api._cp_options.rotate_method)
    calls = {"forward": 0, "backward": 0}
    forward, backward = api._templated_ring_attention, api._templated_ring_attention_backward

    def count(kind, fn):
        def wrapped(*args, **kwargs):
            calls[kind] += 1
            return fn(*args, **kwargs)

        return wrapped

    monkeypatch.setattr(api, "_templated_ring_attention", count("forward", forward))
    monkeypatch.setattr(api, "_templated_ring_attention_backward", count("backward", backward))
    estimate(2, "--parallelism.cp", "2", "--tuning.cp_rotate_method", "alltoall", full_depth=True)
    # 4 blocks, a warm-up and a tracked step.
    assert calls == {"forward": 8, "backward": 8}
    assert DTensor._op_dispatcher._custom_op_handlers == handlers
    assert (api._cp_options.enable_load_balance, api._cp_options.rotate_method) == options


def test_rank_0_keeps_one_more_attention_output_per_block_than_the_last_cp_rank():
    # torch's load-balanced ring rebuilds rank r's output with chunk + cat at every step after r:
    # contiguous in (batch, heads, seq, dim), so the output projection keeps its own copy.
    # Two blocks: one copy per block, whatever the depth.
    run = resolve_run(load_config(DEBUG, [*LONG, "--parallelism.cp", "2", "--model.n_layers", "2"]), 2)
    first, last = (track_step(run, None, rank).peak[1] for rank in (0, 1))
    a = run.model_args
    copy = allocated_bytes(2048 // 2 * a.n_heads * a.head_dim * 2)
    assert first.activations - last.activations == a.n_layers * copy


def test_depth_extrapolation_equals_the_full_depth_run_under_cp():
    overrides = ("--model.n_layers", "6", "--parallelism.cp", "2")
    shallow = estimate(4, *overrides)
    assert "extrapolated" in shallow.method
    whole = estimate(4, *overrides, full_depth=True)
    assert shallow.ranks[0].peak.as_dict() == whole.ranks[0].peak.as_dict()


def test_the_planner_enumerates_cp():
    cfg = load_config(DEBUG, ["--training.global_batch_size", "8", "--training.local_batch_size", "1"])
    base = resolve_run(cfg, 8)
    model = AnalyticModel(base)
    candidates = enumerate_candidates(base, model, 8, target_global_batch(cfg, 8), Hardware(), 80)
    by_cp = {c.degrees["cp"] for c in candidates}
    assert by_cp == {1, 2, 4, 8}
    assert [c for c in candidates if c.degrees["cp"] > 1 and c.dp_mode == "zero1"]  # ZeRO-1 over dp x cp
    cp2 = next(c for c in candidates if c.degrees["cp"] == 2)
    assert "--parallelism.cp 2" in cp2.overrides()
    assert cp2.step.context_parallel > 0
    # Same tokens per step at every cp: each sequence is split, not repeated.
    assert all(c.local_batch * c.micro_steps * c.degrees["dp_replicate"] * c.degrees["dp_shard"] == 8
               for c in candidates)
    assert torch.distributed.is_initialized() is False


def test_the_ulysses_estimate_runs_its_all_to_all_on_the_fake_group_and_matches_the_closed_form():
    report = estimate(2, *LONG, "--parallelism.cp", "2", "--parallelism.cp_scheme", "ulysses")
    assert any("all-to-all of heads (ulysses)" in note for note in report.notes), report.notes
    rank = report.ranks[0]
    # The closed form prices the attention output's copy as for kenotron's ring (attention_output_copy).
    assert rank.peak.activations == pytest.approx(rank.analytic.activations, rel=0.02)
    assert torch.distributed.is_initialized() is False  # the fake process group only


@pytest.mark.parametrize("scheme,ac,compiled,note", [
    ("ulysses", "full", "true", "2.50 GiB over 16 blocks, not simulated here"),
    ("ulysses", "full", "false", None), ("ulysses", "selective-op", "true", None), ("ring", "full", "true", None),
], ids=["ulysses-compiled-full-ac", "ulysses-eager", "ulysses-selective-op", "ring"])
def test_the_estimate_names_what_compiled_ulysses_blocks_keep_beyond_the_eager_simulation(scheme, ac, compiled, note):
    from kenotron.estimate.cp_ring_memory import context_notes

    # The 1B at cp 2, 32k tokens, as measured on 2 x H100: +2.5 GiB over the ring (docs/parallelism.md).
    run = resolve_run(load_config("llama3_1b", [
        "--parallelism.cp", "2", "--parallelism.cp_scheme", scheme, "--training.seq_len", "32768",
        "--training.local_batch_size", "1", "--activation_checkpoint.mode", ac, "--compile.enable", compiled]), 2,
        check_data=False)
    [text] = context_notes(run)
    assert (note in text) if note else "not simulated here" not in text, text


def test_ulysses_with_heads_over_part_of_cp_is_estimated_with_the_ring_inside():
    from kenotron.planner.throughput import cp_block_seconds, unsplit_attention_gain

    # 2 heads at cp 4: the all-to-all over 2 ranks, torch's ring (the CUDA job's) over the other 2.
    heads = ["--model.n_heads", "2", "--model.n_kv_heads", "1", "--parallelism.cp", "4"]
    report = estimate(4, "--training.seq_len", "256", "--parallelism.cp_scheme", "ulysses", *heads)
    assert any("ulysses) over 2 ranks around torch's ring over the other 2" in n for n in report.notes), report.notes
    assert torch.distributed.is_initialized() is False
    hw = Hardware()
    composed = resolve_run(load_config(DEBUG, ["--parallelism.cp_scheme", "ulysses", *heads]), 4)
    whole = resolve_run(load_config(DEBUG, ["--parallelism.cp_scheme", "ulysses", "--parallelism.cp", "4"]), 4)
    assert composed.plan.settings.cp_ulysses_degree == 2 and whole.plan.settings.cp_ulysses_degree == 4
    # The attention runs split (the ring's), so without Ulysses' unsplit-kernel gain.
    assert unsplit_attention_gain(composed, hw) == 1.0 < unsplit_attention_gain(whole, hw)
    # The traffic: Ulysses at cp 2 on the pair's tokens (half the micro-step's), then the ring at
    # cp 2 on the whole micro-step with the one kv head each rank holds after the all-to-all.
    pair = ["--model.n_heads", "2", "--model.n_kv_heads", "1", "--parallelism.cp", "2"]
    ulysses2 = resolve_run(load_config(DEBUG, ["--parallelism.cp_scheme", "ulysses", *pair]), 2)
    ring2 = resolve_run(load_config(DEBUG, ["--parallelism.cp_scheme", "ring", *pair]), 2)
    tokens = 4096
    assert cp_block_seconds(composed, tokens, 2, hw) == pytest.approx(
        cp_block_seconds(ulysses2, tokens // 2, 2, hw) + cp_block_seconds(ring2, tokens, 2, hw), rel=1e-12)
