"""All-to-all (Ulysses) context parallel through the trainer on CPU/gloo, against the 1-rank run.

The trainer's own path (tests/parallel/parity.py), fp32, SGD, 2 steps of the 2-layer debug
model (8 heads, 4 kv heads): losses and gradient norms within 1e-6, first-step gradients within
1e-5, for cp 2 and 4 (head-tail layout; the contiguous one and repeated kv heads are checked at
the attention level, test_context_ulysses.py), under selective activation checkpointing, with
FSDP, with TP, and inside pipeline stages.
Then bad input, refused before any process group.
"""

from __future__ import annotations

import pytest

from kenotron.config import load_config
from tests.distributed.pool import run_on_ranks
from tests.parallel.parity import assert_parity, run_steps

STEPS = 2
ULYSSES = ["--parallelism.cp_scheme", "ulysses", "--training.local_batch_size", "8"]
LAYOUTS = {
    "cp2": (2, ULYSSES + ["--parallelism.cp", "2"]),
    "cp4": (4, ULYSSES + ["--parallelism.cp", "4"]),
    # The all-to-all's outputs are saved, the chunk gathers around it recomputed.
    "cp2_selective_ac": (2, ULYSSES + ["--parallelism.cp", "2", "--activation_checkpoint.mode", "selective-op"]),
    # 2 micro-steps a step (4 sequences a dp rank, 2 at a time): gradients accumulate under FSDP x CP.
    "cp2_fsdp2": (4, ULYSSES[:2] + ["--parallelism.cp", "2", "--parallelism.dp_shard", "2",
                                    "--training.local_batch_size", "2"]),
    "cp2_tp2": (4, ULYSSES + ["--parallelism.cp", "2", "--parallelism.tp", "2"]),
    "pp2_cp2": (4, ULYSSES + ["--parallelism.cp", "2", "--parallelism.pp", "2"]),
}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return run_steps([], str(tmp_path_factory.mktemp("ref")), STEPS)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_ulysses_context_parallel_matches_one_rank(layout, reference, tmp_path):
    world, overrides = LAYOUTS[layout]
    results = run_on_ranks(world, run_steps, overrides, str(tmp_path), STEPS)
    assert_parity(reference, results, loss_tol=1e-6, grad_tol=1e-5)


def _attention_fns(overrides: list[str], folder: str) -> list[str]:
    from kenotron.train.trainer import Trainer

    trainer = Trainer(load_config(None, ["--model.n_layers", "2", "--job.dump_folder", folder] + overrides))
    names = sorted({type(m.attention_fn).__name__ for part in trainer.job.model_parts for m in part.modules()
                    if hasattr(m, "attention_fn")})
    trainer.close()
    return names


def test_cp_scheme_ulysses_puts_the_all_to_all_in_every_attention(tmp_path):
    # Without this the parity above could be the ring's (auto's choice on CPU) under another name.
    got = run_on_ranks(2, _attention_fns, ULYSSES + ["--parallelism.cp", "2"], str(tmp_path))
    assert got == [["UlyssesAttention"], ["UlyssesAttention"]]


@pytest.mark.parametrize(
    "world, args, message",
    [
        (4, ["--parallelism.cp", "4", "--model.n_heads", "3", "--model.n_kv_heads", "3", "--model.dim", "96"],
         (r"cp_scheme='ulysses' scatters attention heads .* with tp=1 3 query heads per tensor-parallel rank do not "
          r"divide by cp=4, and they split over no divisor > 1 of cp=4; use a cp divisible by one of \[3\] \(the "
          r"all-to-all spans the largest such divisor, a ring the rest\), or use parallelism.cp_scheme='ring'")),
        (8, ["--parallelism.cp", "4", "--parallelism.tp", "2", "--model.n_heads", "6", "--model.n_kv_heads", "6",
             "--model.dim", "192"],
         r"with tp=2 3 query heads per tensor-parallel rank do not divide by cp=4, and they split over no divisor"),
        (4, ["--parallelism.cp", "2", "--parallelism.tp", "2", "--model.n_heads", "12", "--model.n_kv_heads", "6",
             "--model.dim", "384"],
         r"3 key/value heads per tensor-parallel rank neither divide by cp=2 nor divide it"),
        (2, ["--parallelism.cp", "2", "--model.name", "mamba2"], r"parallelism.cp=2 is not supported by model.name='mamba2'"),
        # Heads over part of cp: the ring inside runs, so its settings are checked.
        (4, ["--parallelism.cp", "4", "--model.n_heads", "2", "--model.n_kv_heads", "2", "--training.device", "cpu",
             "--tuning.cp_attention", "torch"], r"tuning.cp_attention='torch' needs CUDA"),
    ],
    ids=["heads", "heads_after_tp", "kv_heads", "mamba", "ring_inside_settings"],
)
def test_bad_ulysses_configs_are_refused_before_any_process_group(world, args, message):
    import torch.distributed as dist

    from kenotron.train.resolve import resolve_run

    with pytest.raises(Exception, match=message):
        resolve_run(load_config(None, ULYSSES + ["--training.seq_len", "64"] + args), world_size=world)
    assert not dist.is_initialized()


def test_unknown_cp_scheme_is_refused_with_the_choices():
    with pytest.raises(Exception, match=r"parallelism.cp_scheme='zigzag' is not one of 'auto', 'ring', 'ulysses'"):
        load_config(None, ["--parallelism.cp_scheme", "zigzag"])
