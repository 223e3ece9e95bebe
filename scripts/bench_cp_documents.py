"""Document-masked context parallel against plain causal context parallel, at the same length.

    python scripts/bench_cp_documents.py                      # 1B and 8B width (4 layers), 32k-128k, cp 2 and 4
    python scripts/bench_cp_documents.py --shapes 1B --seq 32768 --cp 2 --ngpu 2
    python scripts/bench_cp_documents.py --shapes debug --seq 1024 --cp 2 --ngpu 2 --mean-doc 128 \\
        --extra "--training.device cpu" --no-compile          # the CPU smoke run

Each (shape, seq_len, cp) trains twice on the same `--ngpu` ranks (FSDP over what cp leaves, one
sequence per data-parallel rank) on the same packed synthetic documents of mean length
`--mean-doc` tokens (scripts/packed_documents.py): once with plain causal attention over the
whole window (`cp_attention` auto: torch's ring on CUDA) and once with `data.document_masking`
(auto: FlexAttention against the gathered keys/values on CUDA, kenotron's ring elsewhere).
A run is one process group of the real trainer (kenotron.tools.bench.run_case: warm-up steps,
timed steps, medians).

The table has one row per (shape, seq_len, cp): both tokens/s per device, their ratio, the
share of causal attention's 128 x 128 tiles the mask leaves on the first batch (documents.py's
masked_work: what the fused kernel still computes), and both peak memories.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from kenotron.parallel.context.documents import masked_work
from kenotron.parallel.context.layout import SequenceLayout
from kenotron.tools.bench import run_case
from kenotron.tools.cp_bench import add_run_arguments, cp_case_overrides, table_cell

# The loader is a sibling script (data.loader loads it by path), not a package module.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from packed_documents import packed_window

LOADER = str(Path(__file__).resolve().parent / "packed_documents.py") + ":build"
SHAPES: dict[str, list[str]] = {
    "1B": ["--config", "llama3_1b"],
    "8B-width-4L": ["--config", "llama3_8b", "--model.n_layers", "4"],
    "debug": [],
}
HEADER = (
    "| shape | seq_len | cp x dp_shard | causal tok/s/device | doc-masked tok/s/device | masked / causal "
    "| attention tiles kept | peak GiB causal / masked |\n|---|---|---|---|---|---|---|---|"
)


def _overrides(shape: str, seq_len: int, cp: int, masked: bool, args: argparse.Namespace) -> list[str]:
    return cp_case_overrides(SHAPES[shape], cp, seq_len, args, [
        "--data.loader", LOADER, "--data.path", str(args.mean_doc),
        "--data.document_masking", "true" if masked else "false",
        "--parallelism.cp_scheme", "ring",  # the ring both ways: "auto" takes Ulysses for the plain run on GPUs
    ])


def kept_share(seq_len: int, mean_doc: float) -> float:
    """Share of causal tiles the mask leaves on a window of the loader (the vocabulary and EOS
    do not change the borders' places, only the seed does)."""
    window = packed_window(seq_len + 1, mean_doc, vocab_size=2, eos_id=1, seed=0)[:-1]
    ids = (torch.cumsum(window == 1, 0) - (window == 1).long())[None]
    return masked_work(ids, SequenceLayout(seq_len, 1, load_balance=False)).kept_fraction


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="document-masked vs plain causal context parallel")
    parser.add_argument("--shapes", nargs="+", default=["1B", "8B-width-4L"], choices=sorted(SHAPES))
    parser.add_argument("--seq", nargs="+", type=int, default=[32768, 65536, 131072])
    parser.add_argument("--cp", nargs="+", type=int, default=[2, 4])
    parser.add_argument("--ngpu", type=int, default=0, help="ranks of every run (default: the largest --cp)")
    parser.add_argument("--mean-doc", type=float, default=4096, help="mean document length in tokens")
    add_run_arguments(parser)
    args = parser.parse_args(argv)
    ngpu = args.ngpu or max(args.cp)
    for cp in args.cp:
        if ngpu % cp != 0:
            parser.error(f"--cp {cp} does not divide --ngpu {ngpu}; use degrees that divide it")

    log: list[dict] = []
    print(HEADER, flush=True)
    for shape in args.shapes:
        for seq_len in args.seq:
            share = kept_share(seq_len, args.mean_doc)
            for cp in args.cp:
                rows = {}
                for masked in (False, True):
                    name = f"{shape} seq{seq_len} cp{cp} {'documents' if masked else 'causal'}"
                    row = run_case(name, _overrides(shape, seq_len, cp, masked, args), ngpu, args.warmup, args.steps,
                                   args.timeout)
                    row.update(shape=shape, seq_len=seq_len, cp=cp, document_masking=masked)
                    rows[masked] = row
                    log.append(row)
                causal, docs = rows[False], rows[True]
                ratio = (f"{docs['tokens_per_sec'] / causal['tokens_per_sec']:.3f}"
                         if "error" not in causal and "error" not in docs else "")
                memory = " / ".join(table_cell(r, "memory_allocated_gib", ".1f") for r in (causal, docs))
                print(f"| {shape} | {seq_len:,} | {cp} x {ngpu // cp} | {table_cell(causal, 'tokens_per_sec', ',.0f')} "
                      f"| {table_cell(docs, 'tokens_per_sec', ',.0f')} | {ratio} | {share:.3f} | {memory} |", flush=True)
                if args.json:
                    Path(args.json).write_text(json.dumps(log, indent=2, default=str))
    return 0 if all("error" not in r for r in log) else 1


if __name__ == "__main__":
    sys.exit(main())
