"""Benchmark: run the real trainer on a few configurations, print one table row each.

    python scripts/bench.py --preset h200-1gpu                       # the reference shapes
    python scripts/bench.py --case "1B eager=--config llama3_1b" \\
                            --case "1B compiled=--config llama3_1b --compile.enable true"
    python scripts/bench.py --ngpu 4 --preset h200-4gpu --json results.json
    python scripts/bench.py --ngpu 4 --preset 4gpu-scaling --slow-link   # NCCL through host memory

Each case runs in its own process (kenotron/tools/bench_worker.py; torchrun for several GPUs) so compile caches, CUDA memory
statistics and allocator state never carry over. A case trains `--warmup` steps (excluded:
compilation, allocator growth), then `--steps` timed steps; the row reports medians over the
timed steps: tokens/s per device, TFLOP/s per device and MFU (formula in
kenotron/train/flops.py), and the peak memory of the timed steps (max allocated and max reserved
by the caching allocator, the largest over ranks).

Timing (`--timing`): "stream" (default) runs the timed steps back to back as the trainer does,
with no host synchronization between them, and times each step on the GPU's own timeline (a
CUDA event recorded as each step starts): while the host runs ahead, a step's time is the
device's time for it. "sync" synchronizes the device before and after each step and times it
on the host clock: it also counts the device's idle while the host launches the step's first
kernels, which training (that synchronizes only at logging steps) does not pay. On CPU both
time each step on the host clock.

`--slow-link` (2 GPUs or more) routes NCCL through host memory instead of NVLink (NCCL_P2P_DISABLE=1
in every rank's environment): a much slower link on one host, standing for nodes joined by a
slow network (issue 33's slow-link rows). The same call first times each collective alone over
those ranks (kenotron/tools/collectives.py) and prints the link's bus bandwidth above the table.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SYNTHETIC = ["--data.dataset", "synthetic", "--metrics.tensorboard", "false", "--metrics.log_freq", "1000000"]
_1B = ["--config", "llama3_1b", "--training.local_batch_size", "4", "--training.seq_len", "4096"]
_8B_WIDTH = [
    "--config", "llama3_8b", "--model.n_layers", "8", "--training.local_batch_size", "2",
    "--training.seq_len", "8192", "--activation_checkpoint.mode", "none",
]
_8B_FSDP = [
    "--config", "llama3_8b", "--training.local_batch_size", "2", "--training.seq_len", "8192",
    "--compile.enable", "true", "--activation_checkpoint.mode", "selective-op",
]
_MASTER_WEIGHTS = ["--tuning.mixed_precision", "master_weights"]
# Qwen3-30B-A3B's width with 4 layers (3.11 B parameters), the MoE reference shape.
_MOE_30B_4L = [
    "--config", "qwen3_moe_30b_a3b", "--model.n_layers", "4", "--training.local_batch_size", "4",
    "--training.seq_len", "4096", "--activation_checkpoint.mode", "none",
]
_MAMBA2_13B = [
    "--model.name", "mamba2", "--model.flavor", "1.3B", "--training.seq_len", "2048", "--training.local_batch_size", "8",
    "--training.param_dtype", "bfloat16",
]

# DeepSeek-V3 16B width, 6 layers (1 dense + 5 MoE), no MTP: torchtitan 0.2.2's deepseek_v3 16B
# flavor has none (scripts/bench_torchtitan.py --model deepseek_v3 --flavor 16B --n-layers 6).
_DS_16B_6L = [
    "--config", "deepseek_v3_16b", "--model.n_layers", "6", "--model.mtp_depth", "0", "--training.local_batch_size",
    "4", "--training.seq_len", "4096", "--activation_checkpoint.mode", "none",
]

# Named sets of cases: the shapes of the reference figures (see docs/performance.md).
PRESETS: dict[str, dict[str, list[str]]] = {
    "h200-1gpu": {
        "1B b4x4096 compiled": _1B + ["--compile.enable", "true"],
        "1B b4x4096 eager": _1B + ["--compile.enable", "false"],
        "8B-width 8L b2x8192 compiled": _8B_WIDTH + ["--compile.enable", "true"],
    },
    "h200-4gpu": {
        "1B b4x4096 FSDP4 compiled": _1B + ["--compile.enable", "true"],
        "8B b2x8192 FSDP4 compiled selective-AC": _8B_FSDP,
        "8B b2x8192 FSDP4 compiled selective-AC mm-every-2": _8B_FSDP + ["--tuning.ac_save_matmul_every", "2"],
        # Under the reference's 70.7 GiB, allocated and reserved (docs/performance.md).
        "8B b2x8192 FSDP4 compiled selective-AC offload-6": _8B_FSDP + ["--activation_checkpoint.offload_blocks", "6"],
    },
    # FlashAttention-4 (needs the flash-attn-4 package): the bf16 rows with the fastest attention kernel.
    "h200-4gpu-fa4": {
        "1B b4x4096 FSDP4 compiled FA4": _1B + ["--compile.enable", "true", "--model.attention_backend", "flash_attn"],
        "1B b4x4096 FSDP4 compiled FA4 bf16-reduce": _1B + [
            "--compile.enable", "true", "--model.attention_backend", "flash_attn",
            "--parallelism.fsdp_reduce_dtype", "bfloat16",
        ],
        "8B b2x8192 FSDP4 compiled selective-AC offload-6 FA4": _8B_FSDP + [
            "--activation_checkpoint.offload_blocks", "6", "--model.attention_backend", "flash_attn",
        ],
    },
    "h200-1gpu-fa4": {
        "1B b4x4096 compiled FA4": _1B + ["--compile.enable", "true", "--model.attention_backend", "flash_attn"],
        "1B b4x4096 eager FA4": _1B + ["--compile.enable", "false", "--model.attention_backend", "flash_attn"],
        "8B-width 8L b2x8192 compiled FA4": _8B_WIDTH + ["--compile.enable", "true", "--model.attention_backend",
                                                         "flash_attn"],
    },
    # bf16 parameters with fp32 masters in AdamW (tuning.mixed_precision = "master_weights").
    "h200-1gpu-master-weights": {
        "1B b4x4096 compiled MW": _1B + ["--compile.enable", "true", *_MASTER_WEIGHTS],
        "1B b4x4096 eager MW": _1B + ["--compile.enable", "false", *_MASTER_WEIGHTS],
        "8B-width 8L b2x8192 compiled MW": _8B_WIDTH + ["--compile.enable", "true", *_MASTER_WEIGHTS],
    },
    # float8 tensorwise (needs torchao): the rows that pass 1.10x the bf16 reference figures.
    "h200-1gpu-float8": {
        "1B b4x4096 compiled float8": _1B + ["--compile.enable", "true", "--float8.enable", "true"],
        "8B-width 8L b2x8192 compiled float8": _8B_WIDTH + ["--compile.enable", "true", "--float8.enable", "true"],
    },
    "h200-4gpu-float8": {
        "1B b4x4096 FSDP4 compiled float8": _1B + ["--compile.enable", "true", "--float8.enable", "true"],
        "8B b2x8192 FSDP4 compiled selective-AC mm-every-2 float8": _8B_FSDP + [
            "--tuning.ac_save_matmul_every", "2", "--float8.enable", "true",
        ],
    },
    # Mamba-2 1.3B against mamba_ssm's own model: scripts/bench_mamba2.py runs these beside it.
    "h200-1gpu-mamba2": {
        "1.3B b8x2048 compiled": _MAMBA2_13B + ["--compile.enable", "true"],
        "1.3B b8x2048 eager": _MAMBA2_13B + ["--compile.enable", "false"],
    },
    # The same 1B step fed from synthetic ids, a tokenized folder and raw JSON Lines (both written
    # from the built-in corpus before the cases run): the data path must cost nothing.
    "h200-1gpu-data": {
        "1B b4x4096 compiled synthetic": _1B + ["--compile.enable", "true"],
        "1B b4x4096 compiled tokenized": _1B + ["--compile.enable", "true", "--data.dataset", "tokenized",
                                                "--data.path", "{sample_data}/tokenized"],
        "1B b4x4096 compiled raw jsonl": _1B + ["--compile.enable", "true", "--data.dataset", "jsonl",
                                                "--data.path", "{sample_data}/corpus.jsonl"],
    },
    # MoE: against torchtitan 0.2.2 on the same machine (scripts/bench_torchtitan.py).
    "h200-1gpu-moe": {
        "Qwen3-30B-A3B width 4L b4x4096 compiled": _MOE_30B_4L + ["--compile.enable", "true"],
        "Qwen3-30B-A3B width 4L b4x4096 eager": _MOE_30B_4L + ["--compile.enable", "false"],
    },
    # Weak scaling (issues 33 and 36): the same per-GPU shapes as the 1-GPU rows, on 2 and 4 GPUs
    # over NCCL (`--ngpu 2` / `--ngpu 4`); "1gpu-scaling" gives the 1-GPU figures they divide by.
    "1gpu-scaling": {
        "1B b4x4096 compiled": _1B + ["--compile.enable", "true"],
        "Qwen3-30B-A3B width 4L b4x4096 compiled": _MOE_30B_4L + ["--compile.enable", "true"],
        "DeepSeek-V3 16B width 6L b4x4096 compiled": _DS_16B_6L + ["--compile.enable", "true"],
    },
    "2gpu-scaling": {
        "1B b4x4096 FSDP2 compiled": _1B + ["--compile.enable", "true"],
        "1B b4x4096 DDP2 compiled": _1B + ["--compile.enable", "true", "--parallelism.dp_replicate", "2",
                                           "--parallelism.dp_shard", "1"],
        "Qwen3-30B-A3B width 4L b4x4096 FSDP2 compiled": _MOE_30B_4L + ["--compile.enable", "true"],
        "Qwen3-30B-A3B width 4L b4x4096 EP2 compiled": _MOE_30B_4L + ["--compile.enable", "true",
                                                                      "--parallelism.ep", "2"],
        "DeepSeek-V3 16B width 6L b4x4096 EP2 compiled": _DS_16B_6L + ["--compile.enable", "true",
                                                                       "--parallelism.ep", "2"],
    },
    "4gpu-scaling": {
        "1B b4x4096 FSDP4 compiled": _1B + ["--compile.enable", "true"],
        "Qwen3-30B-A3B width 4L b4x4096 EP4 compiled": _MOE_30B_4L + ["--compile.enable", "true",
                                                                      "--parallelism.ep", "4"],
        "DeepSeek-V3 16B width 6L b4x4096 EP4 compiled": _DS_16B_6L + ["--compile.enable", "true",
                                                                       "--parallelism.ep", "4"],
    },
    # Tensor parallel (issue 33): TP 2 inside each pair of GPUs, FSDP over the pairs on 4 GPUs;
    # `--ngpu 2` runs TP 2 alone. torchtitan's side: scripts/bench_torchtitan.py --tp 2. The
    # default loss is the vocabulary-parallel fused one; "plain loss" is DTensor's loss_parallel().
    "4gpu-tp": {
        "8B-width 8L b2x8192 FSDP2xTP2 compiled": _8B_WIDTH + ["--compile.enable", "true", "--parallelism.tp", "2"],
        "8B-width 8L b2x8192 FSDP2xTP2 compiled plain loss": _8B_WIDTH + [
            "--compile.enable", "true", "--parallelism.tp", "2", "--tuning.loss", "plain",
        ],
        "8B-width 8L b2x8192 FSDP2xTP2 compiled async-TP": _8B_WIDTH + [
            "--compile.enable", "true", "--parallelism.tp", "2", "--parallelism.async_tp", "true",
        ],
    },
    # Muon beside AdamW (issue 37): run with --optimizer for the optimizer step's share; the
    # 8B width on 1 GPU, the 1B under FSDP over 2 GPUs (--ngpu 2).
    "muon-1gpu": {
        "8B-width 8L b2x8192 compiled AdamW": _8B_WIDTH + ["--compile.enable", "true"],
        "8B-width 8L b2x8192 compiled Muon": _8B_WIDTH + ["--compile.enable", "true", "--optimizer.name", "muon"],
    },
    "muon-2gpu": {
        "1B b4x4096 FSDP2 compiled AdamW": _1B + ["--compile.enable", "true"],
        "1B b4x4096 FSDP2 compiled Muon": _1B + ["--compile.enable", "true", "--optimizer.name", "muon"],
        "1B b4x4096 FSDP2 compiled Muon every-rank": _1B + ["--compile.enable", "true", "--optimizer.name", "muon",
                                                            "--tuning.muon_redistribution", "every_rank"],
    },
    # The same at pretraining batch sizes: gradient accumulation over 16 micro-batches (8B width:
    # 262k tokens per step on 1 GPU; 1B FSDP 2: 524k), where one optimizer step serves many.
    "muon-1gpu-accumulated": {
        "8B-width 8L b2x8192 x16 compiled AdamW": _8B_WIDTH + ["--compile.enable", "true",
                                                              "--training.global_batch_size", "32"],
        "8B-width 8L b2x8192 x16 compiled Muon": _8B_WIDTH + ["--compile.enable", "true",
                                                             "--training.global_batch_size", "32",
                                                             "--optimizer.name", "muon"],
    },
    "muon-2gpu-accumulated": {
        "1B b4x4096 x16 FSDP2 compiled AdamW": _1B + ["--compile.enable", "true", "--training.global_batch_size", "128"],
        "1B b4x4096 x16 FSDP2 compiled Muon": _1B + ["--compile.enable", "true", "--training.global_batch_size", "128",
                                                     "--optimizer.name", "muon"],
    },
    "cpu-smoke": {
        "debug fp32": ["--training.local_batch_size", "2", "--training.seq_len", "64"],
        "debug fp32 plain loss": ["--training.local_batch_size", "2", "--training.seq_len", "64", "--tuning.loss", "plain"],
    },
}


SLOW_LINK_ENV = {"NCCL_P2P_DISABLE": "1"}
"""What `--slow-link` sets for every process it starts: NCCL without peer-to-peer access between
the GPUs, so that its collectives go through host memory (docs/performance.md has both links' bandwidths)."""


def link_bandwidth(ngpu: int, env: dict[str, str], timeout: float, mib: float = 512) -> str:
    """The table of kenotron/tools/collectives.py over `ngpu` ranks started with `env` (one buffer
    of `mib` MiB a collective), or why it could not be measured."""
    cmd = ["torchrun", "--standalone", "--nproc-per-node", str(ngpu), "-m", "kenotron.tools.collectives",
           "--mib", str(mib), "--reps", "5"]
    returncode, output = _run_bounded(cmd, timeout, env)
    lines = output.strip().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("Collectives over")), None)
    if returncode != 0 or start is None:
        return "link not measured: " + (failure_tail(lines)[-1] if lines else f"exit code {returncode}")
    return "\n".join(line for line in lines[start:] if line.startswith(("Collectives over", "|")))


def run_case(
    name: str, overrides: list[str], ngpu: int, warmup: int, steps: int, timeout: float, profile: bool = False,
    timing: str = "stream", trace: bool = False, timeline: str | None = None, optimizer: bool = False,
    env: dict[str, str] | None = None,
) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        worker = ["-m", "kenotron.tools.bench_worker", "--out", out, "--warmup", str(warmup), "--steps", str(steps),
                  "--timing", timing]
        worker += ["--profile"] if profile else []
        worker += ["--trace"] if trace else []
        worker += ["--optimizer"] if optimizer else []
        if timeline:
            # One folder per case: the traces of every rank (bench's --timeline DIR).
            worker += ["--timeline", os.path.join(timeline, "".join(c if c.isalnum() else "_" for c in name))]
        # A benchmark keeps no run: its config, records and checkpoints go to the temporary folder
        # (the case's own overrides come after, so a case may still name a folder).
        worker += ["--", "--job.dump_folder", os.path.join(tmp, "run")]
        if ngpu > 1:
            cmd = ["torchrun", "--standalone", "--nproc-per-node", str(ngpu), *worker, *overrides]
        else:
            cmd = [sys.executable, *worker, *overrides]
        t0 = time.perf_counter()
        returncode, output = _run_bounded(cmd, timeout, env)
        wall = time.perf_counter() - t0
        if returncode != 0 or not os.path.exists(out):
            tail = failure_tail(output.strip().splitlines())
            if returncode is None:
                tail.append(f"timed out after {timeout:.0f} s (the case's --timeout)")
            return {"name": name, "error": "\n".join(tail), "wall_s": wall, "args": overrides}
        result = json.loads(Path(out).read_text())
    return {"name": name, **result, "wall_s": wall, "args": overrides}


def _run_bounded(cmd: list[str], timeout: float | None, env: dict[str, str] | None = None) -> tuple[int | None, str]:
    """(exit code, stdout + stderr) of a case; None past `timeout`, its whole process group killed.
    `env`: variables set for it on top of this process's environment.

    A timed-out case is a failed row, not the end of the table; torchrun's ranks are in the
    killed group too, so none is left holding a GPU for the next case."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, **env} if env else None)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
        return proc.returncode, stdout + stderr
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        return None, stdout + stderr


_EXCEPTION = re.compile(r"^(?:\[(?:default)?rank\d+\]:\s*)?(?:\w+\.)*(\w*Error|\w*Exception|Unsupported):")
"""A line that starts with an exception's name (a rank's output carries torchrun's `[rankN]:`);
Dynamo's graph-break refusal is `torch._dynamo.exc.Unsupported`."""


def _is_cause(line: str) -> bool:
    match = _EXCEPTION.match(line.strip())
    # torchrun's own summary names the failed child, not why it failed.
    return match is not None and match.group(1) != "ChildFailedError"


def failure_tail(lines: list[str]) -> list[str]:
    """The last lines of a failed case's output, its cause last (the table shows the last line).

    torchrun ends with its own failure summary, and torch.compile's errors with a hint about
    TORCHDYNAMO_VERBOSE; the cause (an out-of-memory error, a compiler's exception) is printed
    before them: its first such line goes last."""
    tail = lines[-15:]
    cause = next((ln for ln in lines if "out of memory" in ln.lower() or _is_cause(ln)), None)
    if cause is not None and (not tail or tail[-1] != cause):
        tail.append(cause.strip()[:300])
    return tail


def format_row(r: dict) -> str:
    if "error" in r:
        return f"| {r['name']} | failed: {r['error'].splitlines()[-1][:90]} | | | | |"
    mfu = f"{r['mfu']:.1f}%" if r["mfu"] is not None else "n/a"
    return (
        f"| {r['name']} | {r['tokens_per_sec']:,.0f} | {r['tflops']:.1f} | {mfu} | "
        f"{r['memory_allocated_gib']:.1f} / {r['memory_reserved_gib']:.1f} | {r['loss_last']:.3f} |"
    )


CPU_PRESETS = ("cpu-smoke",)
"""The presets that run on a CPU; the others need CUDA devices."""


def _cuda_visible() -> bool:
    # The parent only starts workers: it loads torch for a GPU preset's check alone.
    import torch

    return torch.cuda.is_available()


HEADER = "| case | tokens/s/device | TFLOP/s/device | MFU | peak GiB alloc / reserved | last loss |\n|---|---|---|---|---|---|"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="kenotron training benchmark (one table row per case)")
    parser.add_argument("--preset", choices=sorted(PRESETS), action="append", default=[])
    parser.add_argument("--case", action="append", default=[], help='"name=--section.key value ..."')
    parser.add_argument("--extra", default="", help="overrides appended to every case")
    parser.add_argument("--ngpu", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--json", help="write all rows to this file")
    parser.add_argument("--profile", action="store_true", help="print the top CUDA kernels of each case")
    parser.add_argument("--trace", action="store_true",
                        help="print per-block forward/backward times of one more step and the memory pools by stream")
    parser.add_argument("--timeline", metavar="DIR",
                        help="write every rank's trace of 3 more steps under DIR and print where the step's time goes: "
                             "compute, each collective and its exposed part (kenotron/tools/step_timeline.py)")
    parser.add_argument("--optimizer", action="store_true",
                        help="also time the optimizer step alone and print its share of the step")
    parser.add_argument("--timing", choices=["stream", "sync"], default="stream",
                        help="stream: steps back to back, timed by CUDA events; sync: synchronize around each step")
    parser.add_argument("--slow-link", action="store_true",
                        help="NCCL through host memory (NCCL_P2P_DISABLE=1) for every case, the link's bandwidth "
                             "measured first and printed above the table (2 GPUs or more)")
    args = parser.parse_known_args(argv)[0]
    if args.slow_link and args.ngpu < 2:
        parser.error(f"--slow-link slows the link between GPUs and --ngpu is {args.ngpu}; use --ngpu 2 or more")
    cases: dict[str, list[str]] = {}
    for preset in args.preset:
        cases.update(PRESETS[preset])
    for case in args.case:
        name, _, spec = case.partition("=")
        cases[name.strip()] = shlex.split(spec)
    if not cases:
        parser.error("give --preset or --case")
    gpu_presets = [p for p in args.preset if p not in CPU_PRESETS]
    if gpu_presets and not _cuda_visible():
        print(f"bench: --preset {gpu_presets[0]} measures GPU shapes and no CUDA device is visible here; run it on a "
              f"GPU machine, or use --preset {' / '.join(CPU_PRESETS)} on a CPU", file=sys.stderr)
        return 2
    extra = shlex.split(args.extra)
    if any("{sample_data}" in arg for overrides in cases.values() for arg in overrides):
        # The parent stays free of torch (kenotron.data imports it): loaded for data cases only.
        from kenotron.data.sample_data import write_sample_data

        folder = Path(tempfile.mkdtemp(prefix="kenotron-bench-data-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        write_sample_data(folder)
        cases = {name: [arg.replace("{sample_data}", str(folder)) for arg in overrides]
                 for name, overrides in cases.items()}
    env = SLOW_LINK_ENV if args.slow_link else None
    if args.slow_link:
        print(f"Slow link: {' '.join(f'{k}={v}' for k, v in SLOW_LINK_ENV.items())} for every rank", flush=True)
        print(link_bandwidth(args.ngpu, SLOW_LINK_ENV, args.timeout) + "\n", flush=True)
    print(HEADER, flush=True)
    rows = []
    for name, overrides in cases.items():
        row = run_case(name, overrides + extra, args.ngpu, args.warmup, args.steps, args.timeout, args.profile,
                       args.timing, args.trace, args.timeline, args.optimizer, env)
        row["slow_link"] = args.slow_link
        rows.append(row)
        print(format_row(row), flush=True)
        if "optimizer_ms" in row:
            print(f"  optimizer step: {row['optimizer_ms']:.1f} ms, {100 * row['optimizer_share']:.1f}% of the "
                  f"{1e3 * row['step_time_s']:.0f} ms step", flush=True)
        for text in ("profile", "trace", "timeline"):
            if row.get(text):
                print(row.pop(text), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
