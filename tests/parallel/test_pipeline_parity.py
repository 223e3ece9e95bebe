"""Pipeline parallel against the 1-rank reference on CPU/gloo: fp32, SGD, the trainer's own path.

Every schedule on 2 and 4 pipeline ranks, then PP composed with FSDP, HSDP/DDP and TP on 4
ranks and PP x FSDP x TP on 8: losses and gradient norms of 2 steps within 1e-6, first-step
gradients (gathered from every stage) within 1e-6. Looped and V schedules run 2 stages per
rank, so 4 ranks need 8 layers; the other layouts use 4 layers, or 2 (one block a stage) where
the schedule runs one stage a rank and a second block a stage checks nothing more.
"""

from __future__ import annotations

import pytest

from kenotron.parallel.pipeline import PP_SCHEDULES
from tests.distributed.pool import run_on_ranks
from tests.parallel.parity import assert_parity, run_steps

TOL = 1e-6
STEPS = 2  # the second step's loss checks the first update; a third adds time, not coverage


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """1-rank runs by layer count, made on first use."""
    cache: dict[int, dict] = {}

    def get(n_layers: int) -> dict:
        if n_layers not in cache:
            folder = tmp_path_factory.mktemp(f"ref{n_layers}")
            cache[n_layers] = run_steps(["--model.n_layers", str(n_layers)], str(folder), STEPS)
        return cache[n_layers]

    return get


def check(references, world: int, n_layers: int, overrides: list[str], folder) -> list[dict]:
    layers = ["--model.n_layers", str(n_layers)]
    results = run_on_ranks(world, run_steps, layers + overrides, str(folder), STEPS)
    worst = assert_parity(references(n_layers), results, TOL, TOL)
    print(f"{overrides}: largest differences {worst}")
    return results


@pytest.mark.parametrize("pp", [2, 4])
@pytest.mark.parametrize("schedule", PP_SCHEDULES)
def test_schedule_matches_one_rank(schedule, pp, references, tmp_path):
    # DualPipeV needs as many microbatches as stages (2 pp): one sequence per microbatch.
    local = str(2 * pp)
    n_layers = 8 if pp == 4 else 4
    over = ["--parallelism.pp", str(pp), "--parallelism.pp_schedule", schedule, "--training.local_batch_size", local]
    results = check(references, pp, n_layers, over, tmp_path)
    per_rank = 1 if schedule in ("GPipe", "1F1B") else 2
    assert [len(r["stage_ids"]) for r in results] == [per_rank] * pp


# (world, n_layers, overrides). One block a stage where the schedule runs one stage a rank, except
# pp2_fsdp2_1f1b, whose two blocks a stage are two FSDP units (prefetch between them in a stage);
# looped and V schedules run 4 stages of one block.
COMPOSED = {
    "pp2_fsdp2_1f1b": (4, 4, ["--parallelism.dp_shard", "2"]),
    "pp2_fsdp2_interleaved": (4, 4, ["--parallelism.dp_shard", "2", "--parallelism.pp_schedule", "Interleaved1F1B"]),
    "pp2_ddp2": (4, 2, ["--parallelism.dp_replicate", "2", "--parallelism.dp_shard", "1"]),
    "pp2_zero1": (4, 2, ["--parallelism.dp_mode", "zero1"]),
    "pp2_tp2_1f1b": (4, 2, ["--parallelism.tp", "2", "--training.local_batch_size", "4", "--parallelism.pp_microbatches", "2"]),
    "pp2_tp2_dualpipev": (
        4, 4, ["--parallelism.tp", "2", "--training.local_batch_size", "8", "--parallelism.pp_microbatches", "4",
               "--parallelism.pp_schedule", "DualPipeV"],
    ),
}
# Local shape of layers.0's wq (256 x 256) on rank 0: proof that the layout shards.
EXPECTED_WQ = {
    "pp2_fsdp2_1f1b": (128, 256), "pp2_fsdp2_interleaved": (128, 256), "pp2_ddp2": (256, 256), "pp2_zero1": (256, 256),
    "pp2_tp2_1f1b": (128, 256), "pp2_tp2_dualpipev": (128, 256),
}


@pytest.mark.parametrize("layout", list(COMPOSED))
def test_pipeline_composed_with_data_and_tensor_parallel(layout, references, tmp_path):
    world, n_layers, over = COMPOSED[layout]
    results = check(references, world, n_layers, ["--parallelism.pp", "2"] + over, tmp_path)
    assert results[0]["local_shapes"]["layers.0.attention.wq.weight"] == EXPECTED_WQ[layout]


def test_pp2_fsdp2_tp2_on_eight_ranks(references, tmp_path):
    # One block a stage and one micro-step a step (4 sequences a dp rank): every rank's share of 2
    # cores is the cost here; two FSDP units a stage and accumulation over micro-steps under PP x
    # FSDP are test_pipeline_composed_with_data_and_tensor_parallel[pp2_fsdp2_1f1b]'s.
    over = ["--parallelism.pp", "2", "--parallelism.dp_shard", "2", "--parallelism.tp", "2",
            "--training.local_batch_size", "4"]
    results = check(references, 8, 2, over, tmp_path)
    assert results[0]["local_shapes"]["layers.0.attention.wq.weight"] == (64, 256)
