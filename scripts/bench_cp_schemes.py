"""Ring against all-to-all (Ulysses) context parallel: tokens/s and memory at the same lengths.

    python scripts/bench_cp_schemes.py --ngpu 2 4 --lengths 32768 65536 131072      # 1B, cp = ngpu
    python scripts/bench_cp_schemes.py --shapes debug --ngpu 2 --lengths 512 --warmup 1 --steps 1 \\
        --extra "--training.device cpu"                                              # the harness on CPU

Every case runs the real trainer on `ngpu` ranks with cp = ngpu (one sequence per step, no data
parallel, so the two schemes share every other cost), through kenotron.tools.bench.run_case
(warm-up steps, timed steps, medians). The ring is the trainer's default on the device
(`tuning.cp_attention = auto`: torch's ring over the fused SDPA kernels on CUDA); Ulysses is
`parallelism.cp_scheme = 'ulysses'` around the same kernel. One table row per (shape, GPUs,
length): both schemes' tokens/s per device, their ratio and their peak memory; a failed case
(out of memory included) shows its last error line. `--json` keeps every run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kenotron.tools.bench import run_case
from kenotron.tools.cp_bench import add_run_arguments, cp_case_overrides, table_cell

SHAPES: dict[str, list[str]] = {
    "1B": ["--config", "llama3_1b"],
    "8B-width-8L": ["--config", "llama3_8b", "--model.n_layers", "8"],
    "debug": [],
}
SCHEMES = ("ring", "ulysses")
HEADER = (
    "| shape | GPUs = cp | seq | ring tok/s/device | ulysses tok/s/device | ulysses / ring "
    "| ring peak GiB | ulysses peak GiB |\n|---|---|---|---|---|---|---|---|"
)


def case_overrides(shape: str, ngpu: int, seq_len: int, scheme: str, args: argparse.Namespace) -> list[str]:
    """The trainer overrides of one case: cp over every rank, one sequence per step."""
    return cp_case_overrides(SHAPES[shape], ngpu, seq_len, args, ["--parallelism.cp_scheme", scheme])


def format_row(shape: str, ngpu: int, seq_len: int, rows: dict[str, dict]) -> str:
    ring, ulysses = rows["ring"], rows["ulysses"]
    ratio = ("" if "error" in ring or "error" in ulysses
             else f"{ulysses['tokens_per_sec'] / ring['tokens_per_sec']:.3f}")
    return (f"| {shape} | {ngpu} | {seq_len:,} | {table_cell(ring, 'tokens_per_sec', ',.0f')} "
            f"| {table_cell(ulysses, 'tokens_per_sec', ',.0f')} | {ratio} | {table_cell(ring, 'memory_allocated_gib', '.1f')} "
            f"| {table_cell(ulysses, 'memory_allocated_gib', '.1f')} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="ring vs all-to-all context parallel at the same lengths")
    parser.add_argument("--shapes", nargs="+", default=["1B"], choices=sorted(SHAPES))
    parser.add_argument("--ngpu", nargs="+", type=int, default=[2, 4], help="ranks of each run; cp = ngpu")
    parser.add_argument("--lengths", nargs="+", type=int, default=[32768, 65536, 131072])
    add_run_arguments(parser)
    args = parser.parse_args(argv)
    for seq_len in args.lengths:
        bad = [n for n in args.ngpu if seq_len % (2 * n)]
        if bad:
            parser.error(f"--lengths {seq_len} is not a multiple of 2 x cp for --ngpu {bad}; use multiples of 1024")

    log: list[dict] = []
    print(HEADER, flush=True)
    for shape in args.shapes:
        for ngpu in args.ngpu:
            for seq_len in args.lengths:
                rows = {}
                for scheme in SCHEMES:
                    name = f"{shape} cp{ngpu} seq{seq_len} {scheme}"
                    rows[scheme] = run_case(name, case_overrides(shape, ngpu, seq_len, scheme, args), ngpu,
                                            args.warmup, args.steps, args.timeout)
                    rows[scheme].update(shape=shape, cp=ngpu, seq_len=seq_len, scheme=scheme)
                    log.append(rows[scheme])
                    print(f"  {name}: {'failed' if 'error' in rows[scheme] else 'ok'}", file=sys.stderr, flush=True)
                print(format_row(shape, ngpu, seq_len, rows), flush=True)
                if args.json:
                    Path(args.json).write_text(json.dumps(log, indent=2, default=str))
    return 0 if all("error" not in row for row in log) else 1


if __name__ == "__main__":
    sys.exit(main())
