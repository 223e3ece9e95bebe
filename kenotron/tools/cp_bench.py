"""What the context-parallel benchmark scripts share (scripts/cp_sweep.py, bench_cp_schemes.py,
bench_cp_documents.py): the options of every run and the overrides of one case, one sequence per
step with cp over the ranks and FSDP over what cp leaves."""

from __future__ import annotations

import argparse
import shlex


def add_run_arguments(parser: argparse.ArgumentParser, json_help: str = "write every run to this file") -> None:
    """--ac, --no-compile, --warmup, --steps, --timeout, --extra and --json."""
    parser.add_argument("--ac", default="full", help="activation_checkpoint.mode of every run")
    parser.add_argument("--no-compile", dest="compile", action="store_false")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=900, help="seconds per run")
    parser.add_argument("--extra", default="", help="overrides appended to every run")
    parser.add_argument("--json", help=json_help)


def cp_case_overrides(shape: list[str], cp: int, seq_len: int, args: argparse.Namespace,
                      settings: list[str]) -> list[str]:
    """The trainer overrides of one case: the shape's, `settings` (the script's own), cp and one
    sequence of `seq_len` per step, the run options of `add_run_arguments`, then --extra."""
    return shape + settings + [
        "--parallelism.cp", str(cp), "--parallelism.dp_shard", "-1",
        "--training.seq_len", str(seq_len), "--training.local_batch_size", "1", "--training.global_batch_size", "-1",
        "--activation_checkpoint.mode", args.ac, "--compile.enable", "true" if args.compile else "false",
    ] + shlex.split(args.extra)


def table_cell(row: dict, key: str, fmt: str) -> str:
    """One run's figure for a table cell, or why it has none: OOM, or the failure's last line."""
    if "error" in row:
        lines = row["error"].strip().splitlines() or ["failed"]
        return "OOM" if "out of memory" in row["error"].lower() else f"failed: {lines[-1][:60]}"
    return format(row[key], fmt)
