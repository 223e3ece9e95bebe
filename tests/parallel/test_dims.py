"""Parallel degrees: validation before any process group, with errors that name the fix."""

from __future__ import annotations

import pytest

from kenotron.config import load_config
from kenotron.degrees import ParallelConfigError, ParallelDims
from kenotron.train.resolve import resolve_run


def test_dp_shard_minus_one_fills_the_rest():
    dims = ParallelDims.from_degrees(16, dp_replicate=2, tp=2)
    assert (dims.dp_replicate, dims.dp_shard, dims.tp, dims.dp) == (2, 4, 2, 8)
    assert dims.mesh_shape() == (("dp_replicate", "dp_shard", "tp"), (2, 4, 2))


def test_degrees_that_do_not_multiply_to_the_world_size_are_rejected():
    with pytest.raises(ParallelConfigError, match=r"multiply to 8 .* but the world size is 4; set parallelism.dp_shard=-1"):
        ParallelDims.from_degrees(4, dp_shard=4, tp=2)


def test_dp_shard_minus_one_without_room_is_rejected():
    with pytest.raises(ParallelConfigError, match=r"dp_shard=-1 has no room: .* = 3 does not divide the world size 4"):
        ParallelDims.from_degrees(4, tp=3)


def test_non_positive_degrees_are_rejected():
    with pytest.raises(ParallelConfigError, match=r"parallelism.tp=0 must be >= 1"):
        ParallelDims.from_degrees(4, tp=0)
    with pytest.raises(ParallelConfigError, match=r"parallelism.dp_shard=-2"):
        ParallelDims.from_degrees(4, dp_shard=-2)


def test_tp_must_divide_heads_kv_heads_ffn_and_vocab():
    dims = ParallelDims.from_degrees(3, tp=3)
    with pytest.raises(ParallelConfigError, match=r"tp=3 does not divide n_heads=32; use one of \[1, 2, 4, 8, 16, 32\]"):
        dims.check_model({"n_heads": 32, "n_kv_heads": 8, "ffn_dim": 14336, "vocab_size": 128256}, n_layers=32)
    dims = ParallelDims.from_degrees(16, tp=16)
    with pytest.raises(ParallelConfigError, match=r"tp=16 does not divide n_kv_heads=8; use one of \[1, 2, 4, 8\]"):
        dims.check_model({"n_heads": 32, "n_kv_heads": 8, "ffn_dim": 14336, "vocab_size": 128256}, n_layers=32)


def test_seq_len_must_split_over_tp_and_cp():
    with pytest.raises(ParallelConfigError, match=r"seq_len=30 is not divisible by tp=4 \(sequence parallel splits "
                                                  r"each sequence over the ranks\); use a multiple of 4$"):
        ParallelDims.from_degrees(4, tp=4).check_seq_len(30)
    ParallelDims.from_degrees(4, tp=4).check_seq_len(30, sequence_parallel=False)
    with pytest.raises(ParallelConfigError, match=r"tp x 2 x cp = 2 x 2 x 2 = 8"):
        ParallelDims.from_degrees(4, tp=2, cp=2).check_seq_len(36)


def test_global_batch_must_divide_into_local_batch_times_dp():
    dims = ParallelDims.from_degrees(4)
    assert dims.grad_accum_steps(16, 2) == 2
    with pytest.raises(ParallelConfigError, match=r"global_batch_size=10 is not divisible by local_batch_size x dp = 2 x 4"):
        dims.grad_accum_steps(10, 2)


@pytest.mark.parametrize(
    "world, args, message",
    [
        (4, ["--parallelism.tp", "3"], r"dp_shard=-1 has no room"),
        (8, ["--parallelism.tp", "8"], r"tp=8 does not divide n_kv_heads=4"),
        (4, ["--parallelism.dp_shard", "3"], r"multiply to 3"),
        (4, ["--training.global_batch_size", "6"], r"global_batch_size=6 is not divisible"),
        (4, ["--parallelism.pp", "4", "--model.n_layers", "2"], r"pp=4 stages but the model has only 2 layers"),
    ],
)
def test_trainer_rejects_bad_layouts_before_any_process_group(world, args, message):
    import torch.distributed as dist

    with pytest.raises(Exception, match=message):
        resolve_run(load_config(None, args), world_size=world)
    assert not dist.is_initialized()
