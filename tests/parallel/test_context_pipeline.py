"""Context parallel inside pipeline stages and with ZeRO-1, against the 1-rank run on CPU/gloo.

The trainer's own path (tests/parallel/parity.py), fp32, SGD, 3 steps: losses and gradient
norms within 1e-6, first-step gradients of every stage within 1e-5. PP 2 x CP 2 under every
pipeline schedule and ZeRO-1 2 x CP 2 on 4 ranks; DP 2 x TP 2 x CP 2 x PP 2 on 16 ranks (the
pool holds them: about 40 s on 2 cores). Then bad input, refused before any process group.
"""

from __future__ import annotations

import pytest

from kenotron.parallel.pipeline import PP_SCHEDULES
from tests.distributed.pool import close_pool, run_on_ranks
from tests.parallel.parity import assert_parity, run_steps

N_LAYERS = ["--model.n_layers", "4"]  # looped and V schedules run 4 stages of one block on pp 2
PP2_CP2 = ["--parallelism.pp", "2", "--parallelism.cp", "2", "--training.local_batch_size", "8"]
LOSS_TOL, GRAD_TOL = 1e-6, 1e-5


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return run_steps(N_LAYERS, str(tmp_path_factory.mktemp("ref")))


@pytest.mark.parametrize("schedule", PP_SCHEDULES)
def test_pp2_cp2_matches_one_rank_under_every_schedule(schedule, reference, tmp_path):
    over = N_LAYERS + PP2_CP2 + ["--parallelism.pp_schedule", schedule]
    results = run_on_ranks(4, run_steps, over, str(tmp_path))
    worst = assert_parity(reference, results, LOSS_TOL, GRAD_TOL)
    print(f"pp2 cp2 {schedule}: largest differences {worst}")
    # FSDP shards each stage over cp (wq is 256 x 256); the pp ranks hold different stages.
    first_stage = next(r for r in results if 0 in r["stage_ids"])
    assert first_stage["local_shapes"]["layers.0.attention.wq.weight"] == (128, 256)
    assert {tuple(r["stage_ids"]) for r in results} == ({(0,), (1,)} if schedule in ("GPipe", "1F1B")
                                                        else {(0, 3), (1, 2)} if "V" in schedule else {(0, 2), (1, 3)})


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


def test_dp2_tp2_cp2_pp2_on_sixteen_ranks_matches_one_rank(reference, tmp_path):
    over = N_LAYERS + ["--parallelism.dp_shard", "2", "--parallelism.tp", "2", "--parallelism.cp", "2",
                       "--parallelism.pp", "2", "--training.local_batch_size", "4"]
    try:
        results = run_on_ranks(16, run_steps, over, str(tmp_path), timeout=600)
    finally:
        close_pool(16)  # 16 idle processes would cost the rest of the suite memory
    worst = assert_parity(reference, results, LOSS_TOL, GRAD_TOL)
    print(f"dp2 tp2 cp2 pp2: largest differences {worst}")
    # wq (256 x 256): TP splits rows by 2, FSDP the rest over dp_shard x cp = 4.
    assert results[0]["local_shapes"]["layers.0.attention.wq.weight"] == (32, 256)
