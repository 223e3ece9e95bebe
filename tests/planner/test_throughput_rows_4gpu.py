"""The throughput model against the rows of one 4 x H200 host (2026-11-28, fifteenth session,
runs 183-186, docs/performance.md "Issues 33 and 36: four GPUs"): the defaults of that day (FSDP's
bf16 wire, the bounded gathers and gate, routed experts outside FSDP in bf16 with fp32 masters
where their FSDP mesh is one rank, the even split up to ep 4 where it sends few empty rows)."""

from __future__ import annotations

import dataclasses

import pytest

from kenotron.planner.hardware import for_gpu
from tests.planner.test_throughput_rows import B1, DS, MOE, TOLERANCE, modelled_tokens_per_s

H200 = for_gpu("h200")
SLOW = dataclasses.replace(H200, nvlink_bytes_per_s=24e9)
"""NCCL_P2P_DISABLE=1: 22-23 GB/s bus for all-gather, reduce-scatter and all-reduce on the four
GPUs, 28-30 GB/s for all-to-all (scripts/bench_collectives.py in the same call, run 185)."""
MOE_C = MOE + " --compile.enable true"
# (row, GPUs, config, overrides, tok/s/GPU, hardware, run)
ROWS = [
    ("1B one GPU", 1, "llama3_1b", B1, 64_214, H200, "183"),
    ("Qwen3-30B-A3B width 4L one GPU", 1, "qwen3_moe_30b_a3b", MOE_C, 119_234, H200, "183"),
    ("DeepSeek-V3 16B width 6L one GPU", 1, "deepseek_v3_16b", DS, 91_986, H200, "183"),
    ("1B FSDP 4", 4, "llama3_1b", B1, 62_516, H200, "183"),
    ("Qwen3-30B-A3B width 4L EP 4, even split", 4, "qwen3_moe_30b_a3b", MOE_C + " --parallelism.ep 4", 105_085,
     H200, "184"),
    ("DeepSeek-V3 16B width 6L EP 4", 4, "deepseek_v3_16b", DS + " --parallelism.ep 4", 86_600, H200, "183"),
    ("1B FSDP 4, slow link", 4, "llama3_1b", B1, 55_689, SLOW, "185"),
    ("Qwen3-30B-A3B width 4L FSDP 4, slow link", 4, "qwen3_moe_30b_a3b", MOE_C, 35_167, SLOW, "185"),
    ("Qwen3-30B-A3B width 4L EP 4, slow link", 4, "qwen3_moe_30b_a3b", MOE_C + " --parallelism.ep 4", 53_342,
     SLOW, "186"),
]


@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_modelled_tokens_per_s_of_the_4_gpu_rows_is_within_tolerance(row):
    name, ngpu, config, overrides, measured, hw, run = row
    ratio = modelled_tokens_per_s(ngpu, config, overrides, hw, bf16_wire=True, bounded_rows=True,
                                  experts_outside=True, masters=True) / measured
    assert abs(ratio - 1) <= TOLERANCE, f"{name} (docs/performance.md, run {run}): modelled / measured = {ratio:.3f}"


# One H200, 2026-11-29 (docs/performance.md): MLA's values at their own width through cuDNN (run 194,
# the means of two runs alternating with the tree before), then the experts' Triton gate in compiled
# blocks too (runs 202-203, the means of two).
ONE_GPU_ROWS = [
    ("DeepSeek-V3 16B width 6L, values unpadded", "deepseek_v3_16b", DS, 96_977, False),
    ("DeepSeek-V3 16B width 6L, and the Triton gate", "deepseek_v3_16b", DS, 100_382, True),
    ("Qwen3-30B-A3B width 4L, the Triton gate", "qwen3_moe_30b_a3b", MOE_C, 121_257, True),
    # The eighteenth session (runs 206-212): the gather inside the first product on one rank, the
    # groups counted by binary search (means of run 212's two rows each).
    ("DeepSeek-V3 16B width 6L, run 212", "deepseek_v3_16b", DS, 99_245, True),
    ("Qwen3-30B-A3B width 4L, run 212", "qwen3_moe_30b_a3b", MOE_C, 121_445, True),
]


@pytest.mark.parametrize("row", ONE_GPU_ROWS, ids=[r[0] for r in ONE_GPU_ROWS])
def test_modelled_tokens_per_s_of_this_sessions_one_gpu_rows_is_within_tolerance(row):
    name, config, overrides, measured, triton_gate = row
    ratio = modelled_tokens_per_s(1, config, overrides, H200, bf16_wire=True, bounded_rows=True, experts_outside=True,
                                  masters=True, narrow_values=True, triton_gate=triton_gate) / measured
    assert abs(ratio - 1) <= TOLERANCE, f"{name}: modelled / measured = {ratio:.3f}"
