"""Multi-token prediction (deepseek_v3's MTP modules) under pipeline and context parallel against
one rank: fp32, SGD, 2 steps of the debug model (2 main blocks, a dense one and an MoE one) with
2 MTP modules; the step losses, every module's loss, the gradient norms and the first step's
gradients agree within 1e-5.

Pipeline parallel puts the MTP modules on the last stage with a copy of the embedding (tied to
stage 0's through pipeline_tied.py) and hands that stage the tokens ahead of each position;
context parallel cuts those tokens from the whole sequence, as it cuts the token ids."""

from __future__ import annotations

import pytest

from tests.distributed.pool import run_on_ranks
from tests.parallel.parity import assert_parity, run_steps

MODEL = ["--model.name", "deepseek_v3", "--model.mtp_depth", "2", "--moe.aux_loss_coef", "0"]
TOL = 1e-5
STEPS = 2

LAYOUTS = {
    # 1F1B over 2 microbatches; the last stage holds block 1 and both MTP modules.
    "cp2": (2, ["--parallelism.cp", "2", "--training.local_batch_size", "8"]),
    "pp2": (2, ["--parallelism.pp", "2", "--training.local_batch_size", "8", "--parallelism.pp_microbatches", "2"]),
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
    assert_parity(reference, results, TOL, TOL)

