"""Longest sequence that trains under context parallel, per model shape and cp degree.

    python scripts/cp_sweep.py                                   # 1B and 8B, cp 1 2 4, on 4 GPUs
    python scripts/cp_sweep.py --shapes 1B --cp 2 4 --rotate alltoall --json cp_1b.json
    python scripts/cp_sweep.py --shapes 1B --cp 2 4 --scheme ulysses          # the all-to-all instead of the ring
    python scripts/cp_sweep.py --shapes debug --ngpu 2 --cp 1 2 --start 256 --max 1024 --extra "--training.device cpu"

Every (shape, cp) runs on the same `--ngpu` ranks, with FSDP over the rest (dp_shard =
ngpu / cp) and one sequence per data-parallel rank, so parameters, gradients and optimizer
state take the same memory at every cp and only the per-sequence activations differ. For each
pair the sequence length doubles from `--start` until a run fails, then bisects between the
last length that trained and the first that did not, down to `--resolution` of it. A run is
one process group of the real trainer (kenotron.tools.bench.run_case: warm-up steps, timed
steps, medians); a failure that is not an out-of-memory error stops that pair and is reported.

The table has one row per (shape, cp): the longest length that trained with its tokens/s per
device, TFLOP/s, MFU and peak memory, and the first length that failed. `--json` keeps every
run. Lengths are multiples of `--unit` (default 1024, which covers 2 x cp x tp for any cp <= 512).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kenotron.tools.bench import run_case
from kenotron.tools.cp_bench import add_run_arguments, cp_case_overrides

SHAPES: dict[str, list[str]] = {
    "1B": ["--config", "llama3_1b"],
    "8B": ["--config", "llama3_8b"],
    "8B-width-8L": ["--config", "llama3_8b", "--model.n_layers", "8"],
    "debug": [],
}

HEADER = (
    "| shape | cp x dp_shard | longest seq trained | tokens/s/device | TFLOP/s/device | MFU | peak GiB alloc / reserved "
    "| first failing seq |\n|---|---|---|---|---|---|---|---|"
)


def _is_oom(row: dict) -> bool:
    text = row.get("error", "").lower()
    return "out of memory" in text or "outofmemoryerror" in text


def _overrides(shape: str, cp: int, seq_len: int, args: argparse.Namespace) -> list[str]:
    return cp_case_overrides(SHAPES[shape], cp, seq_len, args, [
        "--tuning.cp_load_balance", "true" if args.load_balance else "false",
        "--tuning.cp_rotate_method", args.rotate, "--parallelism.cp_scheme", args.scheme,
    ])


def sweep_one(shape: str, cp: int, args: argparse.Namespace, log: list[dict]) -> dict:
    """Double, then bisect; returns the summary of this (shape, cp)."""

    def attempt(seq_len: int) -> dict:
        name = f"{shape} cp{cp} seq{seq_len}"
        row = run_case(name, _overrides(shape, cp, seq_len, args), args.ngpu, args.warmup, args.steps, args.timeout)
        row.update(shape=shape, cp=cp, seq_len=seq_len)
        log.append(row)
        status = "ok" if "error" not in row else ("out of memory" if _is_oom(row) else "FAILED")
        print(f"  {name}: {status}" + (f" ({row['tokens_per_sec']:,.0f} tok/s/device)" if status == "ok" else ""),
              file=sys.stderr, flush=True)
        return row

    best, first_bad, stopped = None, None, None
    seq_len = args.start
    while seq_len <= args.max:
        row = attempt(seq_len)
        if "error" in row:
            first_bad, stopped = row, None if _is_oom(row) else row
            break
        best, seq_len = row, seq_len * 2
    if best is not None and first_bad is not None and stopped is None:
        low, high = best["seq_len"], first_bad["seq_len"]
        step = max(args.unit, int(low * args.resolution) // args.unit * args.unit)
        while high - low > step:
            mid = (low + high) // 2 // args.unit * args.unit
            if mid in (low, high):
                break
            row = attempt(mid)
            if "error" in row and not _is_oom(row):
                stopped = row
                break
            if "error" in row:
                high, first_bad = mid, row
            else:
                low, best = mid, row
    return {"shape": shape, "cp": cp, "best": best, "first_bad": first_bad, "stopped": stopped}


def format_summary(summary: dict, ngpu: int) -> str:
    best, bad = summary["best"], summary["first_bad"]
    layout = f"{summary['cp']} x {ngpu // summary['cp']}"
    if best is None:
        reason = (bad or {}).get("error", "no run").strip().splitlines()[-1][:80] if bad else "no run"
        return f"| {summary['shape']} | {layout} | none | | | | | {bad['seq_len'] if bad else ''} ({reason}) |"
    mfu = f"{best['mfu']:.1f}%" if best.get("mfu") is not None else "n/a"
    if bad is None:
        failing = "none up to --max"
    else:
        failing = f"{bad['seq_len']:,} ({'OOM' if _is_oom(bad) else bad['error'].strip().splitlines()[-1][:60]})"
    return (
        f"| {summary['shape']} | {layout} | {best['seq_len']:,} | {best['tokens_per_sec']:,.0f} | {best['tflops']:.1f} "
        f"| {mfu} | {best['memory_allocated_gib']:.1f} / {best['memory_reserved_gib']:.1f} | {failing} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="longest trainable sequence per model shape and cp degree")
    parser.add_argument("--shapes", nargs="+", default=["1B", "8B"], choices=sorted(SHAPES))
    parser.add_argument("--cp", nargs="+", type=int, default=[1, 2, 4])
    parser.add_argument("--ngpu", type=int, default=4, help="ranks of every run (cp must divide it)")
    parser.add_argument("--start", type=int, default=8192, help="first sequence length tried")
    parser.add_argument("--max", type=int, default=1 << 20, help="longest sequence length tried")
    parser.add_argument("--unit", type=int, default=1024, help="lengths are multiples of this")
    parser.add_argument("--resolution", type=float, default=0.125, help="bisect until the gap is this share of the best")
    parser.add_argument("--rotate", choices=["allgather", "alltoall"], default="allgather")
    parser.add_argument("--scheme", choices=["ring", "ulysses"], default="ring", help="parallelism.cp_scheme")
    parser.add_argument("--no-load-balance", dest="load_balance", action="store_false")
    add_run_arguments(parser, json_help="write every run and the summaries to this file")
    args = parser.parse_args(argv)
    for cp in args.cp:
        if args.ngpu % cp != 0:
            parser.error(f"--cp {cp} does not divide --ngpu {args.ngpu}; use degrees that divide it")
    if args.start % args.unit != 0:
        parser.error(f"--start {args.start} is not a multiple of --unit {args.unit}")

    log: list[dict] = []
    summaries = []
    print(HEADER, flush=True)
    for shape in args.shapes:
        for cp in args.cp:
            summary = sweep_one(shape, cp, args, log)
            summaries.append(summary)
            print(format_summary(summary, args.ngpu), flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps({"summaries": summaries, "runs": log}, indent=2, default=str))
    return 0 if all(s["stopped"] is None for s in summaries) else 1


if __name__ == "__main__":
    sys.exit(main())
