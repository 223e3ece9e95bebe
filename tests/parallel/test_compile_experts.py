"""Compiled blocks whose routed experts are FSDP units of their own (fsdp_reduce_dtype auto with
bf16 compute, or expert parallel): Dynamo must break the block's graph around the experts' FSDP
hooks. A full graph failed there on the first GPU run of the auto default (2026-11-27:
"Attempted to call function marked as skipped", from FSDP's hook wrapper)."""

from __future__ import annotations

import torch

from tests.distributed.pool import run_on_ranks
from tests.parallel.parity import run_steps

# 2 experts, not the debug flavor's 8: Dynamo traces the CPU's expert loop once per expert, and the
# graph breaks under test are around the experts' FSDP units whatever their count (8 -> 4 experts:
# 13.7 -> 11.0 s); 2 still split over ep 2, one a rank.
MOE_BF16 = ["--model.name", "qwen3_moe", "--model.flavor", "debug", "--model.n_layers", "1", "--model.moe.n_experts", "2",
            "--training.param_dtype", "bfloat16", "--compile.enable", "true"]


def _steps_with_dynamo_only(overrides: list[str], folder: str) -> dict:
    """The trainer's steps with each block compiled by Dynamo and the eager backend: the graph
    breaks (or a full graph's refusal) are Dynamo's alone, and inductor on two CPU cores would
    take minutes per graph."""
    original = torch.nn.Module.compile

    def compile_eager(self, *args, **kwargs):
        return original(self, *args, **{**kwargs, "backend": "eager"})

    torch.nn.Module.compile = compile_eager
    try:
        return run_steps(overrides, folder, 1)
    finally:
        torch.nn.Module.compile = original


def test_compiled_blocks_train_when_experts_reduce_in_bf16_as_their_own_fsdp_units(tmp_path):
    results = run_on_ranks(2, _steps_with_dynamo_only, MOE_BF16, str(tmp_path), timeout=300)
    for r in results:
        assert len(r["losses"]) == 1 and all(torch.isfinite(torch.tensor(r["losses"])))



def test_compiled_blocks_train_at_ep2_with_bf16_compute_on_fp32_experts_outside_fsdp(tmp_path):
    # ep 2 on 2 ranks: the experts' FSDP mesh would be one rank, so they are no FSDP unit (no hooks
    # inside the block) and keep fp32 weights that compute casts to bf16, the block's FSDP dtype.
    overrides = [*MOE_BF16, "--parallelism.ep", "2", "--training.local_batch_size", "4"]
    results = run_on_ranks(2, _steps_with_dynamo_only, overrides, str(tmp_path), timeout=300)
    for r in results:
        assert len(r["losses"]) == 1 and all(torch.isfinite(torch.tensor(r["losses"])))
        assert not any(u.endswith("experts") for u in r["fsdp_units"])
        assert r["local_shapes"]["layers.0.feed_forward.experts.w13"][0] == 1  # 2 experts over ep 2
    assert results[0]["losses"] == results[1]["losses"]
