"""The step-time model: the data-parallel term follows the gradient reduction's dtype; pipeline and
context-parallel terms follow what each rank sends; deepseek_v3's MTP heads are priced as output
projections with their losses."""

from __future__ import annotations

import pytest

from kenotron.config import load_config
from kenotron.planner import AnalyticModel, Hardware, step_time
from kenotron.planner.step_compute import kernel_seconds, rates
from kenotron.planner.throughput import recompute
from kenotron.train.resolve import resolve_run

DEBUG = "debug"


def _dp_seconds(ngpu: int, *overrides: str) -> tuple[float, int, int]:
    """(data-parallel seconds, a rank's fp32 bytes, the whole model's fp32 bytes)."""
    run = resolve_run(load_config(DEBUG, ["--training.param_dtype", "bfloat16", *overrides]), ngpu)
    model = AnalyticModel(run)
    params = model.parameters(run)
    whole = (params.root_gathered + run.model_args.n_layers * params.block_gathered) * 2  # bf16 -> fp32 bytes
    return step_time(run, model, hw=Hardware()).data_parallel, params.local, whole


def test_plain_fsdp_sends_bf16_gradients_as_bf16_whatever_dtype_sums_them():
    # parallel/fsdp_wire.py: fp32 sums of bf16 gradients travel as bf16 under plain FSDP.
    fp32, _, _ = _dp_seconds(4, "--parallelism.dp_shard", "4")
    bf16, _, _ = _dp_seconds(4, "--parallelism.dp_shard", "4", "--parallelism.fsdp_reduce_dtype", "bfloat16")
    assert fp32 == bf16


def test_bf16_gradient_reduction_halves_the_reduced_bytes_of_hsdp():
    # HSDP keeps FSDP's own reduce-scatter and all-reduce: fp32 sums move fp32 bytes.
    layout = ["--parallelism.dp_shard", "2", "--parallelism.dp_replicate", "2"]
    fp32, _, _ = _dp_seconds(4, *layout)
    bf16, _, _ = _dp_seconds(4, *layout, "--parallelism.fsdp_reduce_dtype", "bfloat16")
    assert bf16 < fp32


def test_ddp_alone_all_reduces_the_gradients_in_their_own_dtype():
    # Gradient hooks (parallel/gradient_all_reduce.py): bf16 gradients under master weights, fp32
    # under autocast; fsdp_reduce_dtype does not apply. All-reduce: 2 (n-1)/n of the bytes.
    ddp = ["--parallelism.dp_shard", "1", "--parallelism.dp_replicate", "4", "--compile.enable", "true"]
    autocast, local, _ = _dp_seconds(4, *ddp, "--tuning.mixed_precision", "autocast")
    master, _, _ = _dp_seconds(4, *ddp, "--tuning.mixed_precision", "master_weights", "--training.local_batch_size",
                               "8", "--training.global_batch_size", "32")
    named_bf16, _, _ = _dp_seconds(4, *ddp, "--tuning.mixed_precision", "autocast", "--parallelism.fsdp_reduce_dtype",
                                   "bfloat16")
    assert named_bf16 == autocast
    assert autocast - master == pytest.approx(0.5 * 2 * 3 / 4 * local / Hardware().nvlink_bytes_per_s, rel=1e-6)


def _step(ngpu: int, *overrides: str):
    run = resolve_run(load_config(DEBUG, ["--training.param_dtype", "bfloat16", *overrides]), ngpu)
    return step_time(run, AnalyticModel(run), hw=Hardware())


def test_context_parallel_inside_pipelines_halves_the_stage_messages_and_each_rank_runs_its_blocks_rings():
    # Same microbatches (8 of one sequence), same bandwidths: a stage sends half of each sequence
    # under cp 2, and a pp rank runs the CP ring in half of the blocks.
    pp = _step(4, "--parallelism.pp", "2", "--parallelism.dp_shard", "2", "--training.local_batch_size", "8")
    pp_cp = _step(4, "--parallelism.pp", "2", "--parallelism.cp", "2", "--training.local_batch_size", "8")
    cp = _step(2, "--parallelism.cp", "2", "--training.local_batch_size", "8")
    assert pp_cp.pipeline_p2p == pytest.approx(pp.pipeline_p2p / 2, rel=1e-9)
    assert pp_cp.context_parallel == pytest.approx(cp.context_parallel / 2, rel=1e-9)


def test_document_masking_prices_the_attention_the_documents_leave_and_the_prediction_says_so():
    plain = resolve_run(load_config(DEBUG, ["--training.param_dtype", "bfloat16", "--parallelism.cp", "2",
                                            "--training.seq_len", "4096"]), 2)
    run = resolve_run(load_config(DEBUG, ["--training.param_dtype", "bfloat16", "--parallelism.cp", "2",
                                          "--data.document_masking", "true", "--training.seq_len", "4096"]), 2)
    model = AnalyticModel(run)
    full, masked = step_time(plain, model, Hardware()), step_time(run, model, Hardware(), document_tokens=512)
    assert masked.compute < full.compute and masked.context_parallel == full.context_parallel
    assert full.documents is None and masked.documents.lengths.mean_tokens == 512
    longer = step_time(run, model, Hardware(), document_tokens=2048)
    assert masked.compute < longer.compute < full.compute
    from kenotron.planner.prediction import predict

    line = predict(run, document_tokens=512).splitlines()[-1]
    assert line == f"  {masked.documents.describe()}"
    assert line.startswith("  document masking: exponential documents of mean 512 tokens (--document-tokens), "
                           "attention work 0.")
    assert "ring busiest rank 1." in line and "x the mean (2 ranks)" in line
    assert "(default; --document-tokens N states the data's)" in predict(run)
    assert "document masking" not in predict(plain)


def test_ulysses_sends_q_k_v_and_the_output_twice_and_its_traffic_shrinks_with_cp():
    # debug: 8 heads, 4 kv heads of 32, 2 layers; 8 sequences of 512 tokens per micro-step, bf16.
    seq = ["--training.seq_len", "512", "--training.local_batch_size", "8", "--model.n_layers", "2"]
    hw = Hardware()
    for cp, kv_sent in ((2, 4), (4, 4), (8, 8)):  # at cp 8 each of the 4 kv heads is repeated twice
        ulysses = _step(cp, *seq, "--parallelism.cp", str(cp), "--parallelism.cp_scheme", "ulysses")
        shard = 8 * 512 // cp * 32 * 2 * (2 * 8 + 2 * kv_sent)
        assert ulysses.context_parallel == pytest.approx(2 * 2 * (cp - 1) / cp * shard / hw.nvlink_bytes_per_s)
    ring = {cp: _step(cp, *seq, "--parallelism.cp", str(cp)).context_parallel for cp in (2, 4)}
    ulysses = {cp: _step(cp, *seq, "--parallelism.cp", str(cp), "--parallelism.cp_scheme", "ulysses").context_parallel
               for cp in (2, 4)}
    # The ring passes (cp-1) blocks of keys and values around; the all-to-all sends a shrinking shard.
    assert ring[4] > ring[2] and ulysses[4] < ulysses[2]


def test_each_mtp_head_is_priced_as_one_more_output_projection_and_its_loss():
    run = resolve_run(load_config("deepseek_v3_debug", ["--model.mtp_depth", "2"]), 1)
    model = AnalyticModel(run)
    units = model.units(run)
    output, mtp = (next(u for u in units if u.name == name) for name in ("output", "mtp"))
    assert output.output and not mtp.output and mtp.head_calls == 2 and mtp.matmul_params == 2 * output.matmul_params
    hw = Hardware()
    r = rates(run, units, model.kind, recompute(run), hw)
    # One GPU: the main head's loss and the MTP heads' are both the fused chunked one.
    assert kernel_seconds(run, [output, mtp], r, 1024, hw) == pytest.approx(3 * kernel_seconds(run, [output], r, 1024, hw))


def test_fsdp_traffic_of_deepseek_v3_counts_its_moe_blocks_not_only_its_leading_dense_one():
    # deepseek_v3_16b leads with one dense block; the MoE blocks' parameters (64 routed experts
    # each) are ~8x a dense block's. FSDP gathers and reduces every parameter, so the data-parallel
    # time grows as the parameters do (the model priced every block as the first, dense one: 1.56
    # of the parameters' 3.16 between 2 and 6 layers). Reshard `never`: one all-gather of every
    # parameter (by default backward gathers again all but the root and the last block).
    ds = ("--model.mtp_depth 0 --training.local_batch_size 4 --training.seq_len 4096 --activation_checkpoint.mode none"
          " --parallelism.fsdp_reshard_after_forward never")
    dp, params = {}, {}
    for n_layers in (2, 6):
        run = resolve_run(load_config("deepseek_v3_16b", f"{ds} --model.n_layers {n_layers}".split()), 2, check_data=False)
        model = AnalyticModel(run)
        dp[n_layers], params[n_layers] = step_time(run, model).data_parallel, model.parameter_count
    assert dp[6] / dp[2] == pytest.approx(params[6] / params[2], rel=0.02)


def test_fsdp_traffic_gathers_again_in_backward_only_what_forward_resharded():
    # data_parallel.py: the root, the head unit and, under the default policy, the last block stay
    # gathered after forward. Between 2 and 6 blocks of the 1B the default adds four blocks
    # gathered twice; `never` gathers each once, `always` twice but the root.
    b1 = "--training.seq_len 4096 --training.local_batch_size 4"
    dp = {}
    for policy in ("never", "default", "always"):
        for n_layers in (2, 6):
            run = resolve_run(load_config("llama3_1b", f"{b1} --model.n_layers {n_layers} "
                                          f"--parallelism.fsdp_reshard_after_forward {policy}".split()), 2,
                              check_data=False)
            dp[policy, n_layers] = step_time(run, AnalyticModel(run)).data_parallel
    # Four blocks more: gathered once and reduced in fp32 (never), gathered twice (default, always).
    per_block = {p: (dp[p, 6] - dp[p, 2]) / 4 for p in ("never", "default", "always")}
    assert per_block["default"] == pytest.approx(per_block["always"], rel=1e-9)
    assert per_block["default"] > per_block["never"]
    # At 2 blocks the default regathers one block, `always` two, `never` none.
    one_gather = per_block["default"] - per_block["never"]
    assert dp["default", 2] - dp["never", 2] == pytest.approx(one_gather, rel=1e-6)
    assert dp["always", 2] - dp["never", 2] == pytest.approx(2 * one_gather, rel=1e-6)
