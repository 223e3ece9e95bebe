"""What tensor parallel sends per block, counted on CPU/gloo with DTensor's CommDebugMode: a
block's sub-blocks (attention, MLP) reduce their input's gradient once each, as a reduce-scatter
under sequence parallel and an all-reduce without, however many colwise projections read the
input (attention's q, k and v, the MLP's w1 and w3). Losses and gradients equal one rank's in
test_parity.py's TP rows."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor.debug import CommDebugMode

from kenotron.config import load_config
from kenotron.data import build_text_loader
from kenotron.train import Target, build_job, build_meshes, resolve_run, train_step
from tests.distributed.pool import run_on_ranks


def block_collectives(overrides: list[str]) -> dict[str, dict[str, int]]:
    """After a warm-up step, the collectives of the second step in the first block, by name
    (all_reduce, reduce_scatter_tensor, all_gather_into_tensor), forward and backward."""
    cfg = load_config(None, ["--training.seq_len", "64", "--training.local_batch_size", "2", "--parallelism.tp", "2",
                             "--model.n_layers", "2"] + overrides)
    run = resolve_run(cfg, world_size=2, target=Target("cpu"))
    job = build_job(run, torch.device("cpu"), build_meshes(run, "cpu"))
    loader = build_text_loader(run.tokenizer, "builtin", "", seq_len=64, global_batch_size=2, local_batch_size=2)
    train_step(job, loader.next_step())
    mode = CommDebugMode()
    with mode:
        train_step(job, loader.next_step())
    block = next(counts for fqn, counts in mode.comm_module_counts.items() if fqn.endswith(".layers.0"))
    return {phase: {op.__name__.split(".")[-1]: n for op, n in block.get(phase, {}).items()}
            for phase in ("forward", "backward")}


@pytest.mark.parametrize(("sequence_parallel", "backward"), [
    ("true", {"all_gather_into_tensor": 2, "reduce_scatter_tensor": 2}),  # wo's and w2's gathers; the inputs' sums
    ("false", {"all_reduce": 2}),  # the attention's and the MLP's input gradients, one each
])
def test_tp_block_reduces_each_sub_block_input_gradient_once_not_once_per_projection(sequence_parallel, backward):
    counts = run_on_ranks(2, block_collectives, ["--parallelism.sequence_parallel", sequence_parallel])[0]
    # Before: every colwise projection all-reduced its own input gradient, 3 + 2 all-reduces of
    # the block's activations per backward (2.5x the bytes of the two reduce-scatters under SP).
    assert counts["backward"] == backward, counts
