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


def test_modelled_tokens_per_s_of_deepseek_v3_with_its_values_unpadded_is_within_tolerance():
    """One H200, 2026-11-29 (docs/performance.md, run 194): MLA's values at their own width through
    cuDNN, the means of two runs alternating with the tree before (96,977 against 92,293)."""
    ratio = modelled_tokens_per_s(1, "deepseek_v3_16b", DS, H200, bf16_wire=True, bounded_rows=True,
                                  experts_outside=True, masters=True, narrow_values=True) / 96_977
    assert abs(ratio - 1) <= TOLERANCE, f"modelled / measured = {ratio:.3f}"
