"""Expert parallelism on CPU/gloo against one rank: ep 2 (the even split) and 4 (the deduplicated
exchange), EP x FSDP, EP x TP (dense parts), EP x PP, EP x CP, EP under activation checkpointing. fp32,
SGD, 2 steps of qwen3_moe's debug model with the auxiliary loss, the z-loss and the bias updates
on: losses and gradient norms within 1e-5, first-step gradients within 1e-5.
deepseek_v3 (a dense first block, MLA, shared experts, grouped sigmoid routing) under EP x TP
with its MTP module, EP x CP with it, and EP x PP with full activation checkpointing.

Every layout here takes the whole global batch in one micro-step (one pipeline microbatch under
PP), as the reference does: the auxiliary loss is computed over each micro-batch of all
data-parallel ranks, so the layouts must group the same sequences into micro-batches.
"""

from __future__ import annotations

import pytest

from tests.distributed.pool import run_on_ranks
from tests.parallel.parity import assert_parity, run_steps

MOE = ["--model.name", "qwen3_moe", "--moe.aux_loss_coef", "0.01", "--moe.z_loss_coef", "0.001",
       "--moe.bias_update_rate", "0.01"]
TOL = 1e-5
STEPS = 2  # the second step runs on the first's updated weights and expert biases

LAYOUTS = {
    "ep2": (2, ["--parallelism.ep", "2", "--training.local_batch_size", "4"]),
    "ep4": (4, ["--parallelism.ep", "4", "--training.local_batch_size", "2"]),
    "ep2_fsdp4": (4, ["--parallelism.ep", "2", "--training.local_batch_size", "2"]),
    "ep2_tp2": (4, ["--parallelism.ep", "2", "--parallelism.tp", "2", "--training.local_batch_size", "4"]),
    "ep2_pp2": (4, ["--parallelism.ep", "2", "--parallelism.pp", "2", "--parallelism.pp_schedule", "GPipe",
                    "--parallelism.pp_microbatches", "1", "--training.local_batch_size", "4"]),
    # Recomputation around the experts (selective: the profiler ranges FSDP opens).
    "ep2_selective_ac": (2, ["--parallelism.ep", "2", "--training.local_batch_size", "4",
                             "--activation_checkpoint.mode", "selective-op"]),
    "ep2_full_ac": (2, ["--parallelism.ep", "2", "--training.local_batch_size", "4",
                        "--activation_checkpoint.mode", "full"]),
    # The same around experts that are FSDP units of their own (efsdp 2).
    "ep2_fsdp4_selective_ac": (4, ["--parallelism.ep", "2", "--training.local_batch_size", "2",
                                   "--activation_checkpoint.mode", "selective-op"]),
    # ep taken from cp: the sequence's halves route to experts on either rank (ep = cp, experts
    # outside FSDP), and with dp_shard 2 beside cp 2 the experts are FSDP units over efsdp 2.
    "ep2_cp2": (2, ["--parallelism.ep", "2", "--parallelism.cp", "2", "--training.local_batch_size", "8"]),
    "ep2_cp2_fsdp4": (4, ["--parallelism.ep", "2", "--parallelism.cp", "2", "--training.local_batch_size", "4"]),
}
# Local shape of layer 0's w13 (8 experts x 512 x 256) on rank 0: experts split over ep, then
# FSDP over what ep leaves.
EXPECTED_W13 = {"ep2": (4, 512, 256), "ep4": (2, 512, 256), "ep2_fsdp4": (2, 512, 256), "ep2_tp2": (4, 512, 256),
                "ep2_pp2": (4, 512, 256), "ep2_selective_ac": (4, 512, 256), "ep2_full_ac": (4, 512, 256),
                "ep2_fsdp4_selective_ac": (2, 512, 256), "ep2_cp2": (4, 512, 256), "ep2_cp2_fsdp4": (2, 512, 256)}


# Where ep = dp_shard x cp (efsdp is one rank, no dp_replicate) and no PP the experts stay outside
# FSDP: no unit of their own, none of the block's; ep 2 x FSDP 4 keeps them units over efsdp 2, and
# PP keeps them units over efsdp 1 (gathered once a step, not cast per microbatch).
EXPERTS_IN_FSDP = {"ep2_fsdp4", "ep2_fsdp4_selective_ac", "ep2_cp2_fsdp4", "ep2_pp2"}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return run_steps(MOE + ["--training.local_batch_size", "8"], str(tmp_path_factory.mktemp("ref")), STEPS)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_expert_parallel_layout_matches_one_rank(layout, reference, tmp_path):
    world, overrides = LAYOUTS[layout]
    results = run_on_ranks(world, run_steps, MOE + overrides, str(tmp_path), STEPS)
    shape = results[0]["local_shapes"]["layers.0.feed_forward.experts.w13"]
    assert shape == EXPECTED_W13[layout], shape
    # Top-2 of 8 experts: the even split (no host read) at ep 2, the deduplicated exchange at ep 4.
    expected = "UnevenSplitDispatcher" if layout == "ep4" else "EvenSplitDispatcher"
    assert results[0]["dispatchers"] == [expected], results[0]["dispatchers"]
    for res in results:
        expert_units = [u for u in res["fsdp_units"] if u.endswith("experts")]
        expert_params = {n for n in res["local_shapes"] if ".experts." in n}
        managed = expert_params & set(res["fsdp_params"])
        if layout in EXPERTS_IN_FSDP:
            assert expert_units and managed == expert_params, (expert_units, managed)
        else:
            assert not expert_units and not managed, (expert_units, managed)
            assert res["fsdp_units"] and set(res["fsdp_params"]) == set(res["local_shapes"]) - expert_params
    worst = assert_parity(reference, results, TOL, TOL)
    print(layout, worst)


DEEPSEEK = ["--model.name", "deepseek_v3", "--moe.aux_loss_coef", "0.01", "--moe.bias_update_rate", "0.01",
            "--model.n_layers", "3"]
DEEPSEEK_LAYOUTS = {
    "ep2_tp2_mtp": (4, ["--model.mtp_depth", "1", "--parallelism.ep", "2", "--parallelism.tp", "2",
                        "--training.local_batch_size", "4"]),
    "ep2_pp2_full_ac": (4, ["--parallelism.ep", "2", "--parallelism.pp", "2", "--parallelism.pp_schedule", "GPipe",
                            "--parallelism.pp_microbatches", "1", "--training.local_batch_size", "4",
                            "--activation_checkpoint.mode", "full"]),
    # MLA's attention over cp, the sequence-wise auxiliary loss over both halves, MTP on each.
    "ep2_cp2_mtp": (2, ["--model.mtp_depth", "1", "--parallelism.ep", "2", "--parallelism.cp", "2",
                        "--training.local_batch_size", "8"]),
}


@pytest.mark.parametrize("layout", list(DEEPSEEK_LAYOUTS))
def test_deepseek_v3_expert_parallel_layout_matches_one_rank(layout, tmp_path):
    world, overrides = DEEPSEEK_LAYOUTS[layout]
    mtp = [o for o in overrides[:2] if layout.endswith("_mtp")]
    reference = run_steps(DEEPSEEK + mtp + ["--training.local_batch_size", "8"], str(tmp_path / "ref"), STEPS)
    results = run_on_ranks(world, run_steps, DEEPSEEK + overrides, str(tmp_path), STEPS)
    shapes = {name: shape for r in results for name, shape in r["local_shapes"].items()}  # every stage's
    # efsdp is one rank: outside FSDP, but under PP (FSDP units over one rank, gathered once a step)
    expert_units = any(u.endswith("experts") for r in results for u in r["fsdp_units"])
    assert expert_units == ("pp2" in layout)
    assert shapes["layers.2.feed_forward.experts.w13"] == (4, 256, 256)  # 8 experts of 128 split over ep 2
    assert_parity(reference, results, TOL, TOL)
