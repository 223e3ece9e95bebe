"""Embeddings tied across the first and last pipeline stage (qwen2 debug ties them).

The two stages hold separate copies; their gradients are summed, so the copies stay
bit-identical step after step, and training matches the 1-rank model where they are one tensor.
"""

from __future__ import annotations

import pytest
import torch

from kenotron.config import load_config
from kenotron.train.trainer import Trainer
from tests.distributed.pool import run_on_ranks
from tests.parallel.parity import BASE, assert_parity, full, run_steps

QWEN = ["--model.name", "qwen2", "--model.n_layers", "4", "--training.local_batch_size", "4"]
# The tied weight's gradient is summed in another order than 1-rank autograd sums it (per stage
# over the microbatches, then across the stages): gradients agree within 1.2e-7, and after an
# SGD step the losses (about 10, where one fp32 ulp is 9.5e-7) within 2 ulps.
LOSS_TOL, GRAD_TOL = 4e-6, 1e-6
LAYOUTS = {
    "1f1b_pp2": (2, ["--parallelism.pp", "2"]),  # copies on two ranks
    "zbv_pp2": (2, ["--parallelism.pp", "2", "--parallelism.pp_schedule", "ZBVZeroBubble"]),  # both on rank 0
    "1f1b_pp2_fsdp2": (4, ["--parallelism.pp", "2", "--parallelism.dp_shard", "2", "--training.local_batch_size", "2"]),
    "1f1b_pp2_cp2": (4, ["--parallelism.pp", "2", "--parallelism.cp", "2"]),  # one pair of copies per cp rank
}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return run_steps(QWEN, str(tmp_path_factory.mktemp("ref")), 2)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_tied_model_matches_one_rank(layout, reference, tmp_path):
    world, over = LAYOUTS[layout]
    results = run_on_ranks(world, run_steps, QWEN + over, str(tmp_path), 2)
    print(layout, assert_parity(reference, results, LOSS_TOL, GRAD_TOL))


def _tied_copies_after_steps(overrides: list[str], folder: str, steps: int) -> dict[str, torch.Tensor]:
    """Run `steps` optimizer steps (AdamW: it amplifies any gradient difference); return the full
    values of this rank's embedding and output weights. Two steps: the second steps the copies
    from AdamW's state of the first, so copies whose gradients or optimizer state differ at all
    part there; more steps would repeat that."""

    adamw = ["--optimizer.name", "adamw", "--optimizer.lr", "1e-3"]
    cfg = load_config(
        None, BASE + QWEN + overrides + adamw + ["--job.dump_folder", folder, "--training.steps", str(steps)]
    )
    trainer = Trainer(cfg)
    for _ in range(steps):
        trainer.run_step(trainer.loader.next_step())
    weights = {}
    for part in trainer.job.model_parts:
        for name in ("tok_embeddings", "output"):
            module = getattr(part, name)
            if module is not None:
                weights[name] = full(module.weight)
    trainer.close()
    return weights


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_tied_copies_stay_bit_identical(layout, tmp_path):
    world, over = LAYOUTS[layout]
    if "zbv" not in layout:  # one block a stage: the copies are the first and last stage's, blocks aside
        over = over + ["--model.n_layers", "2"]
    results = run_on_ranks(world, _tied_copies_after_steps, over, str(tmp_path), 2)
    embeddings = [r["tok_embeddings"] for r in results if "tok_embeddings" in r]
    outputs = [r["output"] for r in results if "output" in r]
    assert embeddings and outputs
    for copy in embeddings + outputs:
        assert torch.equal(copy, embeddings[0]), (copy - embeddings[0]).abs().max()
