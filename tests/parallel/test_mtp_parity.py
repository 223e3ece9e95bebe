"""Multi-token prediction (deepseek_v3's MTP modules) under pipeline and context parallel against
one rank: fp32, SGD, 2 steps of the debug model (2 main blocks, a dense one and an MoE one) with
2 MTP modules; the step losses, every module's loss, the gradient norms and the first step's
gradients agree within 1e-5.

Pipeline parallel puts the MTP modules on the last stage with a copy of the embedding (tied to
stage 0's through pipeline_tied.py) and hands that stage the tokens ahead of each position;
context parallel cuts those tokens from the whole sequence, as it cuts the token ids. The
zero-bubble schedules split that stage's backward into an input pass and per-parameter weight
passes (models/deepseek_v3/mtp.py's _JoinEmbeddings says what that asks of the graph); under the
V schedules the last stage is rank 0's second one, beside stage 0's embedding (the copies summed
on the rank). Their split puts the embedding alone on stage 0 so the 2 main blocks fill 4 stages."""

from __future__ import annotations

import pytest

from tests.distributed.pool import run_on_ranks
from tests.parallel.parity import assert_parity, run_steps

MODEL = ["--model.name", "deepseek_v3", "--model.mtp_depth", "2", "--moe.aux_loss_coef", "0"]
TOL = 1e-5
STEPS = 2
# 4 stages of 2 main blocks and the MTP modules (layers.2-3, with the head and the statistics).
STAGES = "tok_embeddings, layers.0, layers.1, layers.2 layers.3 norm output mtp"
ZERO_BUBBLE = ["--parallelism.pp", "2", "--training.local_batch_size", "8", "--parallelism.pp_stage_modules", STAGES]

LAYOUTS = {
    "cp2": (2, ["--parallelism.cp", "2", "--training.local_batch_size", "8"]),
    # 1F1B over 2 microbatches; the last stage holds block 1 and both MTP modules.
    "pp2": (2, ["--parallelism.pp", "2", "--training.local_batch_size", "8", "--parallelism.pp_microbatches", "2"]),
    "zbv": (2, ZERO_BUBBLE + ["--parallelism.pp_schedule", "ZBVZeroBubble", "--parallelism.pp_microbatches", "2"]),
    "interleaved_zb": (2, ZERO_BUBBLE + ["--parallelism.pp_schedule", "InterleavedZeroBubble",
                                         "--parallelism.pp_microbatches", "2"]),
    "dualpipev": (2, ZERO_BUBBLE + ["--parallelism.pp_schedule", "DualPipeV", "--parallelism.pp_microbatches", "4"]),
}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return run_steps(MODEL + ["--training.local_batch_size", "8"], str(tmp_path_factory.mktemp("ref")), STEPS)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_mtp_layout_matches_one_rank_in_losses_per_module_and_gradients(layout, reference, tmp_path):
    world, overrides = LAYOUTS[layout]
    results = run_on_ranks(world, run_steps, MODEL + overrides, str(tmp_path), STEPS)
    for res in results:
        for ref, got in zip(reference["mtp_losses"], res["mtp_losses"], strict=True):
            assert ref.keys() == got.keys() == {"mtp_loss/1", "mtp_loss/2"}
            assert all(abs(ref[k] - got[k]) <= TOL for k in ref), (ref, got)
    if layout in ("zbv", "dualpipev"):  # the V: rank 0 holds the first and the last (MTP) stage
        assert [res["stage_ids"] for res in results] == [[0, 3], [1, 2]]
    assert_parity(reference, results, TOL, TOL)

