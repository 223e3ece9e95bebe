"""Context parallel inside pipeline stages and with ZeRO-1, against the 1-rank run on CPU/gloo.

The trainer's own path (tests/parallel/parity.py), fp32, SGD, 2 steps: losses and gradient
norms within 1e-6, first-step gradients of every stage within 1e-5. PP 2 x CP 2 under one
pipeline schedule of each kind (and with torch's ring, the CUDA path, in a V schedule) and ZeRO-1 2 x CP 2
on 4 ranks; DP 2 x TP 2 x CP 2 x PP 2 on 16 ranks, 2 blocks, 2 steps (the pool holds them: about
15 s on 2 cores). Then bad input, refused before any process group; a checkpoint saved under PP 2 x
CP 2 resumed under FSDP 2; and the trainer on 8 ranks under PP 2 x CP 2 x TP 2 logging the
1-rank run's losses.
"""

from __future__ import annotations

import pytest

from tests.distributed.pool import close_pool, run_on_ranks
from tests.parallel.parity import assert_parity, run_steps

N_LAYERS = ["--model.n_layers", "4"]  # looped and V schedules run 4 stages of one block on pp 2
PP2_CP2 = ["--parallelism.pp", "2", "--parallelism.cp", "2", "--training.local_batch_size", "8"]
LOSS_TOL, GRAD_TOL = 1e-6, 1e-5


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return run_steps(N_LAYERS, str(tmp_path_factory.mktemp("ref")))


# One schedule of each way a stage's work meets the ring attention: one stage a rank (1F1B), looped
# stages (Interleaved1F1B), and a V whose backward is split into input and weight parts and overlaps
# one micro-batch's forward with another's backward (DualPipeV: both of ZBVZeroBubble's I and W
# actions and the overlapped F/B). The other four differ from these only in the order of the same
# actions, which test_pipeline_parity.py's test_schedule_matches_one_rank checks for every schedule:
# GPipe (1F1B's), LoopedBFS (the looped stages'), InterleavedZeroBubble (the split backward on looped
# stages) and ZBVZeroBubble (the split backward on a V, which also runs under CP 2 below, with
# torch's ring).
CP_SCHEDULES = ["1F1B", "Interleaved1F1B", "DualPipeV"]


@pytest.mark.parametrize("schedule", CP_SCHEDULES)
def test_pp2_cp2_matches_one_rank_under_each_kind_of_schedule(schedule, reference, tmp_path):
    over = N_LAYERS + PP2_CP2 + ["--parallelism.pp_schedule", schedule]
    results = run_on_ranks(4, run_steps, over, str(tmp_path))
    worst = assert_parity(reference, results, LOSS_TOL, GRAD_TOL)
    print(f"pp2 cp2 {schedule}: largest differences {worst}")
    # FSDP shards each stage over cp (wq is 256 x 256); the pp ranks hold different stages.
    first_stage = next(r for r in results if 0 in r["stage_ids"])
    assert first_stage["local_shapes"]["layers.0.attention.wq.weight"] == (128, 256)
    assert {tuple(r["stage_ids"]) for r in results} == ({(0,), (1,)} if schedule in ("GPipe", "1F1B")
                                                        else {(0, 3), (1, 2)} if "V" in schedule else {(0, 2), (1, 3)})


def _use_torch_ring(plan) -> None:
    plan.settings.cp_attention = "torch"  # resolve_run keeps it for CUDA; a plan edit reaches CPU


def _steps_with_torch_ring(overrides: list[str], folder: str) -> dict:
    """run_steps with torch's context-parallel SDPA (kenotron's CUDA path) in every stage, its
    ring routed to the CPU flash kernel as tests/parallel/test_context_torch_ring.py does."""
    from torch.distributed.tensor import DTensor

    from kenotron.parallel.context.torch_ring import configure_torch_context_parallel, torch_cp_api
    from tests.parallel.test_context_torch_ring import CPU_FLASH, CPU_FLASH_BACKWARD, _cpu_backward, _cpu_forward

    calls = [0]

    def ring_forward(*args):
        calls[0] += 1
        return _cpu_forward(*args)

    dispatcher = DTensor._op_dispatcher
    handlers = dispatcher._custom_op_handlers
    try:
        dispatcher._custom_op_handlers = {**handlers, CPU_FLASH: ring_forward, CPU_FLASH_BACKWARD: _cpu_backward}
        return {**run_steps(overrides, folder, edit_plan=_use_torch_ring), "torch_ring_calls": calls[0]}
    finally:  # torch keeps all of this process-wide; the worker runs other tests next
        torch_cp_api()._disable_context_parallel_dispatcher()
        dispatcher._custom_op_handlers = handlers
        configure_torch_context_parallel(True, "allgather")
        torch_cp_api()._disable_context_parallel_dispatcher()


def test_pp2_cp2_with_torchs_ring_in_a_v_schedule_matches_one_rank(reference, tmp_path):
    # ZBVZeroBubble: two stages per rank, backward split into input and weight passes, DTensor
    # q/k/v inside the stages (torch's _ContextParallel style).
    over = N_LAYERS + PP2_CP2 + ["--parallelism.pp_schedule", "ZBVZeroBubble"]
    results = run_on_ranks(4, _steps_with_torch_ring, over, str(tmp_path))
    worst = assert_parity(reference, results, LOSS_TOL, GRAD_TOL)
    print(f"pp2 cp2 ZBVZeroBubble, torch's ring: largest differences {worst}")
    assert all(r["torch_ring_calls"] > 0 for r in results)  # torch's ring ran, not kenotron's


def test_zero1_2_cp2_matches_one_rank_and_shares_optimizer_state_over_dp_and_cp(reference, tmp_path):
    over = N_LAYERS + ["--parallelism.dp_shard", "2", "--parallelism.cp", "2", "--parallelism.dp_mode", "zero1",
                       "--training.local_batch_size", "2"]  # 2 micro-steps per step
    results = run_on_ranks(4, run_steps, over, str(tmp_path))
    worst = assert_parity(reference, results, LOSS_TOL, GRAD_TOL)
    print(f"zero1 2 x cp 2: largest differences {worst}")
    assert results[0]["local_shapes"]["layers.0.attention.wq.weight"] == (256, 256)  # parameters whole
    # The four ranks (2 dp x 2 cp) each step a disjoint quarter-ish of the parameters, together all.
    owned = [set(r["optimizer_params"]) for r in results]
    everything = set(results[0]["local_shapes"])
    assert set().union(*owned) == everything and sum(map(len, owned)) == len(everything)
    assert all(0 < len(o) < len(everything) for o in owned)


def test_dp2_tp2_cp2_pp2_on_sixteen_ranks_matches_one_rank(tmp_path):
    # Two blocks, one a stage: each block costs 16 ranks their share of 2 cores (4 blocks: ~8 s more),
    # and the composition is the same. 2 steps: the second already starts from the first's update.
    # 2 micro-batches of 2 sequences, not 4 of one: the pipeline still has one in flight per stage,
    # with half the stage-to-stage sends and TP/CP collectives.
    two_blocks = ["--model.n_layers", "2"]
    reference = run_steps(two_blocks, str(tmp_path / "ref"), 2)
    over = two_blocks + ["--parallelism.dp_shard", "2", "--parallelism.tp", "2", "--parallelism.cp", "2",
                         "--parallelism.pp", "2", "--training.local_batch_size", "4",
                         "--parallelism.pp_microbatches", "2"]
    try:
        results = run_on_ranks(16, run_steps, over, str(tmp_path / "run"), 2, timeout=600)
    finally:
        close_pool(16)  # 16 idle processes would cost the rest of the suite memory
    assert {tuple(r["stage_ids"]) for r in results} == {(0,), (1,)}
    worst = assert_parity(reference, results, LOSS_TOL, GRAD_TOL)
    print(f"dp2 tp2 cp2 pp2: largest differences {worst}")
    # wq (256 x 256): TP splits rows by 2, FSDP the rest over dp_shard x cp = 4.
    assert results[0]["local_shapes"]["layers.0.attention.wq.weight"] == (32, 256)


# -- bad input: refused before any process group exists -------------------------------------------


@pytest.mark.parametrize(
    "world, args, message",
    [
        (4, PP2_CP2 + ["--training.seq_len", "34"],
         r"training.seq_len=34 is not divisible by tp x 2 x cp = 1 x 2 x 2 = 4\b.*; use a multiple of 4"),
        (8, PP2_CP2 + ["--parallelism.tp", "2", "--training.seq_len", "36"],
         r"training.seq_len=36 is not divisible by tp x 2 x cp = 2 x 2 x 2 = 8\b.*; use a multiple of 8"),
        (4, PP2_CP2 + ["--parallelism.pp_microbatches", "3"],
         r"parallelism.pp_microbatches=3 does not divide training.local_batch_size=8 .*; use one of \[1, 2, 4, 8\]"),
        (4, PP2_CP2 + ["--training.local_batch_size", "2", "--parallelism.pp_schedule", "DualPipeV"],
         r"DualPipeV needs at least 4 microbatches"),
        (2, ["--parallelism.tp", "2", "--parallelism.dp_mode", "zero1"],
         r"dp_mode='zero1' needs ranks to share optimizer state over: dp_shard, dp_replicate or cp > 1"),
    ],
    ids=["seq-not-multiple-of-2cp", "seq-not-multiple-of-2cp-tp", "microbatches-do-not-split-the-batch",
         "too-few-microbatches-for-the-schedule", "zero1-alone"],
)
def test_bad_cp_with_pp_or_zero1_configs_are_refused_before_any_process_group(world, args, message):
    import torch.distributed as dist

    from kenotron.config import load_config
    from kenotron.train.resolve import resolve_run

    with pytest.raises(Exception, match=message):
        resolve_run(load_config(None, N_LAYERS + args), world_size=world)
    assert not dist.is_initialized()


# -- checkpoints: saved under PP x CP, resumed under another layout ----------------------------------


def test_checkpoint_saved_under_pp2_cp2_resumes_under_fsdp2(tmp_path):
    """A PP 2 x CP 2 run (4 ranks, AdamW) stops after step 2 with a checkpoint; FSDP 2 (2 ranks,
    no pipeline, whole sequences) resumes it. Every logged loss equals the uninterrupted 1-rank
    run's within 1e-5 (measured: one fp32 ulp at step 1, equal after; resuming without the
    optimizer state is off by 1.2e-2 at step 4)."""
    from tests.checkpoint.test_trainer_resume import STEPS, STOP_AFTER, losses_by_step, train

    train(str(tmp_path / "one"), [])
    saved = ["--parallelism.pp", "2", "--parallelism.cp", "2", "--training.local_batch_size", "4",
             "--checkpoint.enable", "true"]
    run_on_ranks(4, train, str(tmp_path / "run"), saved, STOP_AFTER)
    assert list(losses_by_step(tmp_path / "run")) == list(range(1, STOP_AFTER + 1))
    resumed = ["--parallelism.dp_shard", "2", "--checkpoint.enable", "true"]
    run_on_ranks(2, train, str(tmp_path / "run"), resumed)
    one, run = losses_by_step(tmp_path / "one"), losses_by_step(tmp_path / "run")
    assert list(run) == list(range(1, STEPS + 1))
    for step in one:
        assert abs(run[step] - one[step]) <= 1e-5, (step, run[step], one[step])


# -- the trainer on 8 ranks: metrics.jsonl --------------------------------------------------------


def test_trainer_on_eight_ranks_under_pp2_cp2_tp2_logs_the_one_rank_losses_and_token_counts(tmp_path):
    """The trainer (run_training, AdamW) on 8 ranks of the pool with PP 2 x CP 2 x TP 2 (sequence
    parallel, loss parallel, the ring inside both stages): metrics.jsonl has the 1-rank run's
    losses, gradient norms and token counts. (`./run_train.sh` starting several ranks through
    torchrun is tests/launch/test_two_nodes.py's; 8 fresh processes here cost ~30 s of imports.)
    Two steps, each logged: the second starts from the first AdamW update and carries its state,
    and the token count adds up over steps; steps 3-6 of the short run would repeat that."""
    from tests.train.short_run import read_records, train_short_run

    args = ["--training.local_batch_size", "8", "--training.steps", "2", "--metrics.log_freq", "1"]
    train_short_run(2, args, str(tmp_path / "one"))
    layout = ["--parallelism.pp", "2", "--parallelism.cp", "2", "--parallelism.tp", "2",
              "--parallelism.pp_microbatches", "2"]
    run_on_ranks(8, train_short_run, 2, [*args, *layout], str(tmp_path / "eight"))
    one, eight = read_records(tmp_path / "one"), read_records(tmp_path / "eight")
    assert [r["step"] for r in eight] == [r["step"] for r in one] == [1, 2]
    for a, b in zip(one, eight):
        assert abs(a["loss"] - b["loss"]) < 1e-4 and abs(a["grad_norm"] - b["grad_norm"]) < 1e-4, (a, b)
        assert b["tokens_seen"] == a["tokens_seen"]  # each sequence counted once, not per cp, tp or pp rank
