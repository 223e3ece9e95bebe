"""The throughput model against every tokens/s row measured on H200s (and the H100 rows at the
end, priced with the H100's memory bandwidth): each row's modelled
tokens/s per GPU stays within its tolerance of the measured figure (docs/estimation.md,
Throughput model, holds the same table with the ratios)."""

from __future__ import annotations

import contextlib
import dataclasses
from unittest import mock

import pytest

from kenotron.config import load_config
from kenotron.parallel.expert_even_split import static_rows
from kenotron.planner import AnalyticModel, Hardware, analytic_moe, step_time, throughput
from kenotron.planner.hardware import for_gpu
from kenotron.train.resolve import resolve_run

TOLERANCE = 0.15

B1 = "--training.seq_len 4096 --training.local_batch_size 4 --compile.enable true"
W8 = ("--model.n_layers 8 --training.local_batch_size 2 --training.seq_len 8192 --activation_checkpoint.mode none "
      "--compile.enable true")
F8 = "--training.local_batch_size 2 --training.seq_len 8192 --activation_checkpoint.mode selective-op --compile.enable true"
MOE = "--model.n_layers 4 --training.local_batch_size 4 --training.seq_len 4096 --activation_checkpoint.mode none"
# The 1B config's reshard `never` came on 2026-11-22: rows measured before it ran with `default`.
OLD_1B = " --parallelism.fsdp_reshard_after_forward default"
DS = ("--model.n_layers 6 --model.mtp_depth 0 --training.local_batch_size 4 --training.seq_len 4096 "
      "--activation_checkpoint.mode none --compile.enable true")
PP16 = " --training.local_batch_size 16 --parallelism.pp 4 --parallelism.pp_schedule"
PP_EAGER = ("--training.seq_len 4096 --training.local_batch_size 16 --parallelism.pp 4 --compile.enable false "
            "--activation_checkpoint.mode none --parallelism.pp_schedule ")
PERF, PAR = "docs/performance.md", "docs/parallelism.md"
DDP2 = " --parallelism.dp_replicate 2 --parallelism.dp_shard 1"
NEVER = " --parallelism.fsdp_reshard_after_forward never"
# fsdp_reduce_dtype auto (bf16 for the routed experts) came on 2026-11-27: MoE rows measured before ran in fp32.
FP32 = " --parallelism.fsdp_reduce_dtype float32"
BF16 = " --parallelism.fsdp_reduce_dtype bfloat16"
# The vocabulary-parallel fused loss became tensor parallel's default on 2026-11-27: TP rows measured
# before ran DTensor's loss_parallel() over whole local logits.
PLAIN_TP = " --parallelism.tp 2 --tuning.loss plain"


def _cp(seq: int, cp: int) -> str:
    """scripts/cp_sweep.py's runs: one sequence per data-parallel rank, FSDP over what cp leaves, eager."""
    return (f"--training.seq_len {seq} --training.local_batch_size 1 --parallelism.cp {cp} --parallelism.dp_shard "
            f"{4 // cp} --activation_checkpoint.mode none --compile.enable false")


# (row, GPUs, config, overrides, measured tokens/s per GPU, where it is recorded, tolerance)
ROWS = [
    ("1B b4x4096 compiled", 1, "llama3_1b", B1, 64_431, f"{PERF}, 2026-11-25 side by side", TOLERANCE),
    ("1B b4x4096 eager", 1, "llama3_1b", B1 + " --compile.enable false", 63_871, f"{PERF}, 2026-11-25", TOLERANCE),
    ("8B width 8L b2x8192 compiled", 1, "llama3_8b", W8, 37_427, f"{PERF}, 2026-11-25", TOLERANCE),
    ("8B width 8L selective-op", 1, "llama3_8b", W8 + " --activation_checkpoint.mode selective-op", 37_224,
     f"{PERF}, run 42", TOLERANCE),
    ("8B width 16L selective-op", 1, "llama3_8b",
     W8 + " --model.n_layers 16 --activation_checkpoint.mode selective-op", 20_640, f"{PERF}, run 44", TOLERANCE),
    ("Qwen3-30B-A3B width 4L compiled", 1, "qwen3_moe_30b_a3b", MOE + " --compile.enable true", 116_125,
     f"{PERF}, MoE side by side", TOLERANCE),
    ("Qwen3-30B-A3B width 4L eager", 1, "qwen3_moe_30b_a3b", MOE + " --compile.enable false", 114_174,
     f"{PERF}, MoE side by side", TOLERANCE),
    ("Mamba2-1.3B b8x2048 compiled", 1, "mamba2_1.3b", "--compile.enable true", 41_488,
     f"{PERF}, Mamba-2 side by side (2026-11-25)", TOLERANCE),
    ("Mamba2-1.3B b8x2048 eager", 1, "mamba2_1.3b", "--compile.enable false", 41_248,
     f"{PERF}, Mamba-2 side by side (2026-11-25)", TOLERANCE),
    ("1B FSDP 2", 2, "llama3_1b", B1, 59_045, "issue 27 (2 x H200, 2026-11-25)", TOLERANCE),
    ("1B FSDP 4", 4, "llama3_1b", B1, 61_501, f"{PERF}, run 36", TOLERANCE),
    ("1B HSDP 2x2", 4, "llama3_1b", B1 + OLD_1B + " --parallelism.dp_replicate 2 --parallelism.dp_shard 2", 58_657,
     f"{PAR}, On GPUs", TOLERANCE),
    ("1B ZeRO-1 x4", 4, "llama3_1b", B1 + OLD_1B + " --parallelism.dp_mode zero1", 55_245, f"{PERF}, run 21",
     TOLERANCE),
    # Measured before 2026-11-27's TP backward fix (5 all-reduces of a block's activations per
    # backward, 2.5x the modelled bytes): hence its wider tolerance. The rows after the fix are below.
    ("1B FSDP 2 x TP 2", 4, "llama3_1b", B1 + OLD_1B + PLAIN_TP, 41_523, f"{PERF}, run 21", 0.20),
    ("1B PP 4 1F1B b16", 4, "llama3_1b", B1 + PP16 + " 1F1B", 32_691, f"{PAR}, return_outputs=False", TOLERANCE),
    ("1B PP 4 Interleaved1F1B b16", 4, "llama3_1b", B1 + PP16 + " Interleaved1F1B", 28_994,
     f"{PAR}, return_outputs=False", TOLERANCE),
    ("8B FSDP 4 selective-op", 4, "llama3_8b", F8, 10_219, f"{PERF}, run 53", TOLERANCE),
    ("8B FSDP 4 selective-op offload 6", 4, "llama3_8b", F8 + " --activation_checkpoint.offload_blocks 6", 10_411,
     f"{PERF}, run 60", TOLERANCE),
    ("8B FSDP 4 selective-op save_matmul_every 2", 4, "llama3_8b", F8 + " --tuning.ac_save_matmul_every 2", 9_532,
     f"{PERF}, run 17", TOLERANCE),
    ("8B FSDP 2 selective-op", 2, "llama3_8b", F8, 10_297, f"{PERF}, run 52", TOLERANCE),
    # Tensor parallel after the backward fix (docs/performance.md, "Tensor parallel's backward").
    ("8B width 8L TP 2", 2, "llama3_8b", W8 + PLAIN_TP, 29_538, f"{PERF}, run 110", TOLERANCE),
    ("8B width 8L FSDP 2 x TP 2", 4, "llama3_8b", W8 + PLAIN_TP, 30_021, f"{PERF}, run 111", TOLERANCE),
    # The vocabulary-parallel fused loss, now the default under TP (docs/performance.md, runs 122 and 126).
    ("8B width 8L TP 2 fused loss", 2, "llama3_8b", W8 + " --parallelism.tp 2", 31_367, f"{PERF}, run 126", TOLERANCE),
    ("8B width 8L FSDP 2 x TP 2 fused loss", 4, "llama3_8b", W8 + " --parallelism.tp 2", 31_989, f"{PERF}, run 122",
     TOLERANCE),
    # Weak scaling on 2 x H200 (docs/performance.md, runs 70-74).
    ("1B FSDP 2 (run 70)", 2, "llama3_1b", B1, 61_684, f"{PERF}, run 70", TOLERANCE),
    ("1B DDP 2", 2, "llama3_1b", B1 + DDP2, 60_181, f"{PERF}, run 70", TOLERANCE),
    ("MoE 4L FSDP 2", 2, "qwen3_moe_30b_a3b", MOE + " --compile.enable true" + FP32, 95_762, f"{PERF}, run 70", TOLERANCE),
    ("MoE 4L FSDP 2 reshard never", 2, "qwen3_moe_30b_a3b", MOE + " --compile.enable true" + NEVER + FP32, 97_468,
     f"{PERF}, run 72", TOLERANCE),
    ("MoE 4L FSDP 2 reshard never bf16 reduction", 2, "qwen3_moe_30b_a3b",
     MOE + " --compile.enable true" + NEVER + " --parallelism.fsdp_reduce_dtype bfloat16", 100_795, f"{PERF}, run 72",
     TOLERANCE),
    # Measured on the host-read exchange; ep 2 now runs the even split (parallel/expert_even_split.py).
    ("MoE 4L EP 2", 2, "qwen3_moe_30b_a3b", MOE + " --compile.enable true --parallelism.ep 2" + FP32, 98_662,
     f"{PERF}, run 74", TOLERANCE),
    # DeepSeek-V3 16B width, 6 layers, no MTP (docs/performance.md, run 106: one GPU, and EP 2 by the
    # even split keeping the received rows).
    ("DeepSeek-V3 16B width 6L, 1 GPU", 1, "deepseek_v3_16b", DS, 91_440, f"{PERF}, run 106", TOLERANCE),
    ("DeepSeek-V3 16B width 6L EP 2", 2, "deepseek_v3_16b", DS + " --parallelism.ep 2", 80_002, f"{PERF}, run 106",
     TOLERANCE),
    # Weak scaling on 4 x H200, 2026-11-27 (docs/performance.md, runs 75-78).
    ("1B FSDP 4 (run 75)", 4, "llama3_1b", B1, 61_718, f"{PERF}, run 75", TOLERANCE),
    ("MoE 4L EP 4", 4, "qwen3_moe_30b_a3b", MOE + " --compile.enable true --parallelism.ep 4" + FP32, 96_365,
     f"{PERF}, run 75", TOLERANCE),
    ("8B FSDP 4 selective-op (run 78)", 4, "llama3_8b", F8, 10_404, f"{PERF}, run 78", TOLERANCE),
] + [
    (f"{shape} cp {cp} seq {seq}", 4, config, _cp(seq, cp) + (OLD_1B if shape == "1B" else ""), measured,
     f"{PAR}, Longest sequence on 4 x H200", TOLERANCE)
    for shape, config, cp, seq, measured in [
        ("1B", "llama3_1b", 1, 65_536, 19_899), ("1B", "llama3_1b", 1, 32_768, 30_196),
        ("1B", "llama3_1b", 2, 131_072, 11_569), ("1B", "llama3_1b", 2, 65_536, 19_116),
        ("1B", "llama3_1b", 4, 262_144, 6_473), ("1B", "llama3_1b", 4, 131_072, 11_288),
        ("8B", "llama3_8b", 1, 16_384, 8_605), ("8B", "llama3_8b", 1, 8_192, 9_216),
        ("8B", "llama3_8b", 2, 32_768, 6_558), ("8B", "llama3_8b", 2, 16_384, 7_609),
        ("8B", "llama3_8b", 4, 65_536, 4_617), ("8B", "llama3_8b", 4, 32_768, 5_974),
    ]
]


SLOW_LINK = Hardware(nvlink_bytes_per_s=24e9)
"""GPUs of one host talking through host memory (NCCL_P2P_DISABLE=1): 24 GB/s bus bandwidth
against NVLink's 210, measured with a collective micro-benchmark (issue 33; 22-24 GB/s on four
GPUs, scripts/bench_collectives.py, run 76)."""
SLOW_LINK_ROWS = [
    ("1B FSDP 2, slow link", 2, "llama3_1b", B1, 51_926, "issue 33's table (2 x H200)"),
    ("MoE 4L FSDP 2, slow link", 2, "qwen3_moe_30b_a3b", MOE + " --compile.enable true" + FP32, 31_240,
     "issue 33's table (2 x H200)"),
    ("MoE 4L EP 2, slow link", 2, "qwen3_moe_30b_a3b", MOE + " --compile.enable true --parallelism.ep 2" + FP32, 59_797,
     f"{PERF}, run 74"),
    # The same link with the defaults of the fifth session (MoE: experts reduced in bf16; EP 2: the even
    # split), 2 x H200, run 95 (23-28 GB/s bus measured in the same call).
    ("1B FSDP 2, slow link, run 95", 2, "llama3_1b", B1, 53_757, f"{PERF}, run 95"),
    ("1B DDP 2, slow link, run 95", 2, "llama3_1b", B1 + DDP2, 51_177, f"{PERF}, run 95"),
    ("MoE 4L FSDP 2, slow link, run 95", 2, "qwen3_moe_30b_a3b", MOE + " --compile.enable true", 43_647,
     f"{PERF}, run 95"),
    ("MoE 4L EP 2, slow link, run 95", 2, "qwen3_moe_30b_a3b", MOE + " --compile.enable true --parallelism.ep 2",
     60_208, f"{PERF}, run 95"),
    # Four GPUs through host memory: 22-24 GB/s bus for all-gather, reduce-scatter and all-reduce (run 76).
    ("1B FSDP 4, slow link", 4, "llama3_1b", B1, 49_853, f"{PERF}, run 76"),
    ("MoE 4L EP 4, slow link", 4, "qwen3_moe_30b_a3b", MOE + " --compile.enable true --parallelism.ep 4" + FP32, 44_969,
     f"{PERF}, run 77"),
]


H100 = for_gpu("h100")
"""One H100 SXM: the H200's peak FLOP/s and NVLink, 3.35 TB/s of HBM against the H200's 4.8 (the
streaming kernels keep the same share of it)."""


def _schemes(seq: int, scheme: str) -> str:
    """scripts/bench_cp_schemes.py --ngpu 2: the 1B, cp 2 over 2 GPUs, one sequence per step, full AC, compiled."""
    return (f"--training.seq_len {seq} --training.local_batch_size 1 --parallelism.cp 2 --parallelism.dp_shard -1 "
            f"--activation_checkpoint.mode full --compile.enable true --parallelism.cp_scheme {scheme}")


# Ring against all-to-all on 2 x H100 of a 4-GPU host, torch 2.11, 2026-11-27 (docs/parallelism.md,
# "Ring or all-to-all"): the pair that fits Hardware.ulysses_attention_gain.
H100_CP_ROWS = [
    (f"1B cp 2 seq {seq} {scheme}", 2, "llama3_1b", _schemes(seq, scheme), measured,
     f"{PAR}, Ring or all-to-all (2 x H100)")
    for seq, scheme, measured in [(32768, "ring", 22_371), (32768, "ulysses", 24_424),
                                  (65536, "ring", 14_647), (65536, "ulysses", 16_032)]
]

DOCUMENTS = " --data.loader scripts/packed_documents.py:build --data.path 4096 --data.document_masking true"
"""scripts/packed_documents.py's windows: exponential documents of mean 4,096 tokens, document-masked."""

# Document-masked CP 2 (flex), the 1B, one sequence per step, full AC, compiled: (row, GPUs, config,
# overrides, measured tokens/s per GPU, the cluster, where it is recorded). The ring's on 2 x H100
# (run 82, scripts/bench_cp_documents.py; its plain causal rows are H100_CP_ROWS' ring rows), both
# schemes on 2 x H200 (run 99).
DOCUMENT_ROWS = [
    ("1B cp 2 seq 32768 ring documents, 2 x H100", 2, "llama3_1b", _schemes(32768, "ring") + DOCUMENTS, 33_699, H100,
     f"{PAR}, Document masking under CP (run 82)"),
    ("1B cp 2 seq 65536 ring documents, 2 x H100", 2, "llama3_1b", _schemes(65536, "ring") + DOCUMENTS, 32_423, H100,
     f"{PAR}, Document masking under CP (run 82)"),
    ("1B cp 2 seq 65536 ring documents, 2 x H200", 2, "llama3_1b", _schemes(65536, "ring") + DOCUMENTS, 33_494, None,
     f"{PERF}, run 99"),
    ("1B cp 2 seq 65536 ulysses documents, 2 x H200", 2, "llama3_1b", _schemes(65536, "ulysses") + DOCUMENTS, 36_052,
     None, f"{PERF}, run 99"),
]

# Issue 33's rows on 2 x H100 of a 4-GPU host with the defaults of 2026-11-27 (MoE FSDP 2: reshard
# by memory, the head unit, experts reduced in bf16; EP 2: the even split), torch 2.11
# (docs/performance.md, runs 81-86).
H100_SCALING_ROWS = [
    ("1B b4x4096 compiled, 1 GPU", 1, "llama3_1b", B1, 63_029),
    ("Qwen3-30B-A3B width 4L compiled, 1 GPU", 1, "qwen3_moe_30b_a3b", MOE + " --compile.enable true", 108_702),
    ("1B FSDP 2", 2, "llama3_1b", B1, 59_914),
    ("1B DDP 2", 2, "llama3_1b", B1 + DDP2, 57_015),
    ("MoE FSDP 2", 2, "qwen3_moe_30b_a3b", MOE + " --compile.enable true", 95_245),
    ("MoE EP 2", 2, "qwen3_moe_30b_a3b", MOE + " --compile.enable true --parallelism.ep 2", 93_036),
    # Run 120-121 (4 x H100, 2026-11-27): EP 4 by the host read; the 1B's TP after the backward fix.
    ("MoE EP 4", 4, "qwen3_moe_30b_a3b", MOE + " --compile.enable true --parallelism.ep 4", 92_099),
    ("1B FSDP 2 x TP 2", 4, "llama3_1b", B1 + " --parallelism.tp 2 --tuning.loss plain", 41_193),
    # Runs 130 and 132 (one 4 x H100 host, 2026-11-28): the dense rows with their gradients reduced in
    # bf16 beside the default's fp32, and the MoE rows on today's code.
    ("1B 1 GPU (run 132)", 1, "llama3_1b", B1, 63_095),
    ("1B FSDP 2 (run 132)", 2, "llama3_1b", B1, 59_173),
    ("1B FSDP 2 bf16 reduction", 2, "llama3_1b", B1 + BF16, 59_685),
    ("1B FSDP 4", 4, "llama3_1b", B1, 59_502),
    ("1B FSDP 4 bf16 reduction", 4, "llama3_1b", B1 + BF16, 59_872),
    ("MoE FSDP 2 (run 132)", 2, "qwen3_moe_30b_a3b", MOE + " --compile.enable true", 94_278),
    ("MoE EP 4 (run 130)", 4, "qwen3_moe_30b_a3b", MOE + " --compile.enable true --parallelism.ep 4", 91_524),
    # DeepSeek-V3 on H100: one GPU (run 82) and EP 4 by the host read (run 136).
    ("DeepSeek-V3 16B width 6L, 1 GPU (run 82)", 1, "deepseek_v3_16b", DS, 85_309),
    ("DeepSeek-V3 16B width 6L EP 4", 4, "deepseek_v3_16b", DS + " --parallelism.ep 4", 75_544),
    # Run 135 (another 4 x H100 host, 2026-11-28): every pipeline schedule's timeline, eager, no AC.
] + [
    (f"1B PP 4 {schedule} b16 eager", 4, "llama3_1b", PP_EAGER + schedule, measured)
    for schedule, measured in [("1F1B", 28_626), ("InterleavedZeroBubble", 25_738), ("ZBVZeroBubble", 29_160),
                               ("DualPipeV", 30_014)]
]


def _even_split_rows_before_the_bound(run, local_tokens: int, c: int, memory_bytes_per_s: float) -> float:
    """The even split's row work as it ran before 2026-11-28's bounded gathers and gate
    (models/common/grouped_tail.py): every row of the worst-case buffer, gathered, gated and, with
    the grouped GEMM, gathered again in backward."""
    moe, ep, dim = run.model_args.moe, run.dims.ep, run.model_args.dim
    buffer = static_rows(ep * local_tokens, moe.top_k, moe.n_experts // ep, 1)
    seconds = (buffer - local_tokens * moe.top_k) * (2 * dim + 8 * moe.ffn_dim) * c / memory_bytes_per_s
    if run.choices.expert_kernel == "grouped_mm":
        seconds += buffer * 2 * dim * c / memory_bytes_per_s
    return seconds


def modelled_tokens_per_s(ngpu: int, config: str, overrides: str, hw: Hardware | None = None,
                          bf16_wire: bool = False, bounded_rows: bool = False, experts_outside: bool = False,
                          masters: bool = False, narrow_values: bool = False, triton_gate: bool = False) -> float:
    """The model's tokens/s per GPU, priced as the code ran when the row was measured. `bf16_wire`
    False (every row measured before 2026-11-28): FSDP sent gradients summed in fp32 as fp32 then
    (parallel/fsdp_wire.py came after). `bounded_rows` False (every row before the eleventh
    session): the even split's gathers and gate passed over its whole worst-case buffer.
    `experts_outside` False (every row before the twelfth session): the routed experts were FSDP
    units also where their FSDP mesh is one rank. `masters` False (every row before the thirteenth
    session): those experts outside FSDP were fp32 weights cast for each forward. `narrow_values`
    False (every row before the seventeenth session): MLA's values went to the attention padded.
    `triton_gate` False (the same rows): compiled blocks ran the experts' gate as Inductor fused it."""
    run = resolve_run(load_config(config, overrides.split()), ngpu, check_data=False)
    then = {} if narrow_values else {"narrow_values": False}
    if not triton_gate:
        then["expert_gate"] = "torch"
    run = dataclasses.replace(run, choices=dataclasses.replace(run.choices, **then))
    with contextlib.ExitStack() as stack:
        if not masters:
            stack.enter_context(mock.patch.object(throughput, "experts_with_masters", lambda run: False))
        if not experts_outside:
            stack.enter_context(mock.patch.object(throughput, "experts_outside_fsdp", lambda run: False))
        if not bf16_wire:
            stack.enter_context(mock.patch.object(throughput, "wire_dtype", lambda sum_dtype, *_: sum_dtype))
        if not bounded_rows:
            stack.enter_context(mock.patch.object(analytic_moe, "even_split_row_seconds",
                                                  _even_split_rows_before_the_bound))
        return step_time(run, AnalyticModel(run), hw).tokens_per_s_per_gpu


@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_modelled_tokens_per_s_is_within_tolerance_of_the_measured_row(row):
    name, ngpu, config, overrides, measured, source, tolerance = row
    ratio = modelled_tokens_per_s(ngpu, config, overrides) / measured
    assert abs(ratio - 1) <= tolerance, f"{name} ({source}): modelled / measured = {ratio:.3f}"


# FlashAttention-4 against cuDNN, the same machine: (row, GPUs, config, overrides, FA4 tok/s, cuDNN tok/s,
# where): the pairs that fit Hardware.flash_attention_gain.
ULYSSES_2 = " --parallelism.cp 2 --parallelism.dp_shard -1 --training.local_batch_size 1 --parallelism.cp_scheme ulysses"
FLASH_PAIRS = [
    ("1B", 1, "llama3_1b", B1, 66_389, 64_100, f"{PERF}, runs 109 and 112"),
    ("8B width 8L", 1, "llama3_8b", W8, 37_769, 37_267, f"{PERF}, run 35"),
    ("8B FSDP 4 offload 6 (H100)", 4, "llama3_8b", F8 + " --activation_checkpoint.offload_blocks 6", 10_392, 10_172,
     f"{PERF}, runs 116 and 119"),
    ("1B cp 2 ulysses 32k", 2, "llama3_1b", B1 + ULYSSES_2 + " --training.seq_len 32768 --activation_checkpoint.mode none",
     33_943, 30_341, f"{PERF}, runs 100 and 104"),
    ("1B cp 2 ulysses 64k", 2, "llama3_1b", B1 + ULYSSES_2 + " --training.seq_len 65536 --activation_checkpoint.mode none",
     23_063, 20_206, f"{PERF}, runs 100 and 104"),
]


@pytest.mark.parametrize("pair", FLASH_PAIRS, ids=[p[0] for p in FLASH_PAIRS])
def test_flash_attention_over_cudnn_is_modelled_within_2_percent_of_the_measured_speed_up(pair):
    name, ngpu, config, overrides, flash, cudnn, source = pair
    modelled = (modelled_tokens_per_s(ngpu, config, overrides + " --model.attention_backend flash_attn")
                / modelled_tokens_per_s(ngpu, config, overrides))
    assert modelled == pytest.approx(flash / cudnn, abs=0.02), f"{name} ({source})"


@pytest.mark.parametrize("row", SLOW_LINK_ROWS, ids=[r[0] for r in SLOW_LINK_ROWS])
def test_modelled_tokens_per_s_on_a_slow_link_is_within_tolerance_of_the_measured_row(row):
    name, ngpu, config, overrides, measured, source = row
    ratio = modelled_tokens_per_s(ngpu, config, overrides, SLOW_LINK) / measured
    assert abs(ratio - 1) <= TOLERANCE, f"{name} ({source}): modelled / measured = {ratio:.3f}"


def test_the_last_pipeline_stage_sets_the_pace_of_pp4_and_interleaving_does_not_pay():
    # The output layer and the loss make the last stage the slowest (3 blocks + 3.4 blocks' worth of
    # output matmuls, against 5 blocks in the middle ones): the measured 1F1B row is 32,691, not the
    # ~50k of equal stages; Interleaved1F1B puts 4 blocks beside the output on the last rank (28,994).
    one_f_one_b = modelled_tokens_per_s(4, "llama3_1b", B1 + PP16 + " 1F1B")
    interleaved = modelled_tokens_per_s(4, "llama3_1b", B1 + PP16 + " Interleaved1F1B")
    assert interleaved < one_f_one_b < 0.7 * modelled_tokens_per_s(4, "llama3_1b", B1)


@pytest.mark.parametrize("row", H100_CP_ROWS, ids=[r[0] for r in H100_CP_ROWS])
def test_modelled_tokens_per_s_of_both_cp_schemes_on_h100_is_within_tolerance_of_the_measured_row(row):
    name, ngpu, config, overrides, measured, source = row
    ratio = modelled_tokens_per_s(ngpu, config, overrides, H100) / measured
    assert abs(ratio - 1) <= TOLERANCE, f"{name} ({source}): modelled / measured = {ratio:.3f}"


@pytest.mark.parametrize("seq,measured", [(32768, 24_424 / 22_371), (65536, 16_032 / 14_647)])
def test_the_model_puts_ulysses_ahead_of_the_ring_by_the_measured_margin(seq, measured):
    # Priced alike before the unsplit attention's gain (1.00x): the search could not rank them.
    ring, ulysses = (modelled_tokens_per_s(2, "llama3_1b", _schemes(seq, s), H100) for s in ("ring", "ulysses"))
    assert ulysses / ring == pytest.approx(measured, abs=0.03), f"modelled ulysses / ring = {ulysses / ring:.3f}"


@pytest.mark.parametrize("row", H100_SCALING_ROWS, ids=[r[0] for r in H100_SCALING_ROWS])
def test_modelled_tokens_per_s_of_the_h100_scaling_rows_is_within_tolerance(row):
    name, ngpu, config, overrides, measured = row
    ratio = modelled_tokens_per_s(ngpu, config, overrides, H100) / measured
    assert abs(ratio - 1) <= TOLERANCE, f"{name} (docs/performance.md, runs 81-86 and 120-121): modelled / measured = {ratio:.3f}"


# Runs 142-143 (one 4 x H100 host, 2026-11-28): FSDP's gradients summed in fp32 sent as bf16
# (parallel/fsdp_wire.py), the defaults otherwise; the slow link at 24 GB/s (NCCL_P2P_DISABLE=1).
H100_WIRE_ROWS = [
    ("1B FSDP 2", 2, "llama3_1b", B1, 59_611, H100),
    ("1B FSDP 4", 4, "llama3_1b", B1, 60_368, H100),
    ("MoE FSDP 2 fp32 sums", 2, "qwen3_moe_30b_a3b", MOE + " --compile.enable true" + FP32, 92_749, H100),
    ("MoE FSDP 2", 2, "qwen3_moe_30b_a3b", MOE + " --compile.enable true", 94_416, H100),
    ("1B FSDP 2, slow link", 2, "llama3_1b", B1, 55_471, dataclasses.replace(H100, nvlink_bytes_per_s=24e9)),
]


@pytest.mark.parametrize("row", H100_WIRE_ROWS, ids=[r[0] for r in H100_WIRE_ROWS])
def test_modelled_tokens_per_s_with_the_bf16_wire_is_within_tolerance_of_the_measured_row(row):
    name, ngpu, config, overrides, measured, hw = row
    ratio = modelled_tokens_per_s(ngpu, config, overrides, hw, bf16_wire=True) / measured
    assert abs(ratio - 1) <= TOLERANCE, f"{name} (docs/performance.md, runs 142-143): modelled / measured = {ratio:.3f}"


@pytest.mark.parametrize("row", DOCUMENT_ROWS, ids=[r[0] for r in DOCUMENT_ROWS])
def test_modelled_tokens_per_s_of_document_masked_cp_is_within_tolerance_of_the_measured_row(row):
    name, ngpu, config, overrides, measured, hw, source = row
    ratio = modelled_tokens_per_s(ngpu, config, overrides, hw) / measured
    assert abs(ratio - 1) <= TOLERANCE, f"{name} ({source}): modelled / measured = {ratio:.3f}"


@pytest.mark.parametrize("seq,measured", [(32768, 33_699 / 22_514), (65536, 32_423 / 14_640)])
def test_document_masking_speeds_the_ring_up_over_plain_causal_by_the_measured_factor(seq, measured):
    # Run 82 on 2 x H100: the masked ring against the plain causal ring of the same lease, 1.50x and 2.22x.
    plain = modelled_tokens_per_s(2, "llama3_1b", _schemes(seq, "ring"), H100)
    masked = modelled_tokens_per_s(2, "llama3_1b", _schemes(seq, "ring") + DOCUMENTS, H100)
    assert masked / plain == pytest.approx(measured, rel=0.1), f"modelled masked / plain = {masked / plain:.3f}"


def test_with_documents_the_model_puts_ulysses_ahead_of_the_ring_as_run_99_measured():
    # 36,052 / 33,494 = 1.076 on 2 x H200: the ring waits for its busiest rank, Ulysses' ranks are
    # even. Priced before as fixed-length documents with even ranks: 0.997, the ring ahead.
    ring, ulysses = (modelled_tokens_per_s(2, "llama3_1b", _schemes(65536, s) + DOCUMENTS) for s in ("ring", "ulysses"))
    assert ulysses / ring == pytest.approx(36_052 / 33_494, abs=0.04), f"modelled ulysses / ring = {ulysses / ring:.3f}"
