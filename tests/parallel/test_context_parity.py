"""Context parallel through the real trainer on CPU/gloo, against the 1-rank reference.

Same model, seed and global batches (tests/parallel/parity.py): fp32 losses over 2 SGD steps
within 1e-6 and first-step gradients within 1e-5, for cp 2 and 4 with the head-tail layout and
the contiguous one, both ways of rotating keys/values, and CP combined with FSDP and with TP on
4 ranks. Then the trainer end to end: metrics.jsonl of a cp run equals the 1-rank run's, with
tokens counted once.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kenotron.config import load_config
from kenotron.train.trainer import run_training
from tests.distributed.pool import run_on_ranks
from tests.parallel.parity import assert_parity, run_steps

# One micro-step per optimizer step (dp is 1), except cp2_fsdp2, which accumulates over 2 (a third
# or fourth micro-step adds to the same gradients the same way).
CP2 = ["--parallelism.cp", "2", "--training.local_batch_size", "8"]
CP4 = ["--parallelism.cp", "4", "--training.local_batch_size", "8"]
CONTIGUOUS = ["--tuning.cp_load_balance", "false"]
LAYOUTS = {
    "cp2": (2, CP2),
    "cp2_contiguous": (2, CP2 + CONTIGUOUS),
    "cp2_alltoall": (2, CP2 + ["--tuning.cp_rotate_method", "alltoall"]),
    "cp4": (4, CP4),
    "cp4_contiguous": (4, CP4 + CONTIGUOUS),
    "cp4_alltoall_contiguous": (4, CP4 + CONTIGUOUS + ["--tuning.cp_rotate_method", "alltoall"]),
    "cp2_full_ac": (2, CP2 + ["--activation_checkpoint.mode", "full"]),
    "cp2_fsdp2": (4, CP2 + ["--parallelism.dp_shard", "2", "--training.local_batch_size", "2"]),
    "cp2_tp2": (4, CP2 + ["--parallelism.tp", "2"]),
    "cp2_tp2_no_sp": (4, CP2 + ["--parallelism.tp", "2", "--parallelism.sequence_parallel", "false"]),
}
# FSDP shards over dp_shard x cp: wq (256 x 256) of the 2-layer debug model on rank 0.
EXPECTED_WQ = {"cp2": (128, 256), "cp4": (64, 256), "cp2_fsdp2": (64, 256), "cp2_tp2": (64, 256)}


@pytest.fixture(scope="module")
def reference_fp32(tmp_path_factory):
    return run_steps([], str(tmp_path_factory.mktemp("ref")))


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_context_parallel_matches_one_rank_fp32(layout, reference_fp32, tmp_path):
    world, overrides = LAYOUTS[layout]
    results = run_on_ranks(world, run_steps, overrides, str(tmp_path))
    if layout in EXPECTED_WQ:
        assert results[0]["local_shapes"]["layers.0.attention.wq.weight"] == EXPECTED_WQ[layout]
    assert_parity(reference_fp32, results, loss_tol=1e-6, grad_tol=1e-5)


def test_context_parallel_with_latent_attention_matches_one_rank(tmp_path):
    # MLA's keys are wider than its values: the ring attends them with the values zero-padded. The
    # sequence-wise balance loss sums each sequence's statistics over the cp ranks (each rank's half
    # alone: the router's gradient differs by 6e-5). (The micro-batch-wise loss is left out: with it
    # the router's gradient differs by 1.4e-5 under cp 2, for qwen3_moe too.)
    model = ["--model.name", "deepseek_v3", "--model.n_layers", "2", "--moe.aux_loss_coef", "0.01",
             "--model.moe.aux_per_sequence", "true"]
    reference = run_steps(model, str(tmp_path / "ref"))
    results = run_on_ranks(2, run_steps, model + CP2, str(tmp_path))
    assert_parity(reference, results, loss_tol=1e-6, grad_tol=1e-5)


# -- the trainer end to end -----------------------------------------------------------------------

COMMON = [
    "--model.n_layers", "2", "--training.seq_len", "32", "--training.global_batch_size", "4",
    "--training.local_batch_size", "2", "--training.steps", "4", "--metrics.log_freq", "2",
    "--lr_scheduler.warmup_steps", "2", "--metrics.tensorboard", "false",
]


def _train(overrides: list[str], folder: str) -> None:
    run_training(load_config(None, COMMON + ["--job.dump_folder", folder] + overrides))


def _records(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def test_trainer_metrics_under_context_parallel_match_one_rank(tmp_path):
    _train([], str(tmp_path / "one"))
    run_on_ranks(2, _train, ["--parallelism.cp", "2"], str(tmp_path / "cp2"))  # 2 micro-steps per step
    one, cp = _records(tmp_path / "one"), _records(tmp_path / "cp2")
    assert [r["step"] for r in cp] == [r["step"] for r in one] == [1, 2, 4]
    for a, b in zip(one, cp):
        # AdamW turns 1e-9 reduction-order noise into small parameter differences; losses agree closely.
        assert abs(a["loss"] - b["loss"]) < 1e-4 and abs(a["grad_norm"] - b["grad_norm"]) < 1e-4, (a, b)
        # Each sequence counts once although two ranks hold halves of it.
        assert b["tokens_seen"] == a["tokens_seen"] == b["step"] * 4 * 32


# -- bad input: refused before any process group exists -------------------------------------------


@pytest.mark.parametrize(
    "world, args, message",
    [
        (2, CP2 + ["--training.seq_len", "34"], r"seq_len=34 is not divisible by tp x 2 x cp = 1 x 2 x 2 = 4"),
        (4, CP2 + ["--parallelism.tp", "2", "--training.seq_len", "36"], r"tp x 2 x cp = 2 x 2 x 2 = 8"),
        (2, CP2 + ["--model.name", "mistral", "--training.seq_len", "256"],
         r"128-token sliding window, shorter than training.seq_len=256; use training.seq_len <= 128"),
        (2, CP2 + ["--model.name", "starcoder2", "--training.seq_len", "256"], r"sliding window"),
        (2, CP2 + ["--tuning.cp_attention", "torch", "--training.device", "cpu"],
         r"cp_attention='torch' needs CUDA"),
        (2, CP2 + ["--tuning.cp_rotate_method", "ring"], r"cp_rotate_method"),
    ],
)
def test_bad_context_parallel_configs_are_refused_before_any_process_group(world, args, message):
    import torch.distributed as dist

    from kenotron.train.resolve import resolve_run

    with pytest.raises(Exception, match=message):
        resolve_run(load_config(None, args), world_size=world)
    assert not dist.is_initialized()


def test_a_window_as_long_as_the_sequence_is_plain_causal_attention_and_allowed():
    from kenotron.train.resolve import resolve_run

    run = resolve_run(load_config(None, CP2 + ["--model.name", "mistral", "--training.seq_len", "128"]), world_size=2)
    st = run.plan.settings
    # resolve_run plans for a CUDA machine, which runs torch's ring.
    assert (st.cp_load_balance, st.cp_rotate_method, st.cp_attention) == (True, "allgather", "torch")
    assert "context parallel (when cp > 1): attention torch" in str(run.plan)


# -- the plan's CP step on a model ----------------------------------------------------------------


def _applied_attention_rank():
    from kenotron.degrees import ParallelDims
    from kenotron.models import get_model_spec
    from kenotron.parallel.context import RingAttention
    from kenotron.parallel.dims import build_device_meshes
    from kenotron.parallel.plan import plan_for

    spec = get_model_spec("llama3")
    with torch.device("meta"):
        model = spec.build(spec.model_args("debug", n_layers=2, max_seq_len=64))
    meshes = build_device_meshes(ParallelDims.from_degrees(2, cp=2), "cpu")
    applied = plan_for(spec, cp_rotate_method="alltoall").apply(model, meshes)
    fns = [block.attention.attention_fn for block in model.layers.values()]
    assert all(isinstance(fn, RingAttention) and fn.rotate_method == "alltoall" for fn in fns), fns
    assert sum(1 for _ in model.parameters()) == sum(1 for _ in spec.build(spec.model_args("debug", n_layers=2)).parameters())
    sharder = applied.sequence_sharder
    part = sharder.shard(torch.arange(8)[None], torch.arange(1, 9)[None])
    return sharder.rank, part.inputs.tolist(), part.positions.tolist()


def test_plan_apply_swaps_attention_and_returns_the_batch_slicer():
    results = run_on_ranks(2, _applied_attention_rank)
    assert results == [(0, [[0, 1, 6, 7]], [0, 1, 6, 7]), (1, [[2, 3, 4, 5]], [2, 3, 4, 5])]
