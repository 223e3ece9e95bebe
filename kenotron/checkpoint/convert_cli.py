"""`kenotron convert` (scripts/convert_hf.py): between Hugging Face folders and kenotron checkpoints.

    # a training run (its latest checkpoint) -> a folder transformers and `kenotron generate --hf` load:
    kenotron convert to-hf outputs/debug hf_out --dtype bfloat16
    # HF -> a DCP model-only checkpoint, then train from it under any plan:
    kenotron convert to-kenotron Llama-3.2-1B ckpt --dtype bfloat16
    ./run_train.sh --checkpoint.enable true --checkpoint.initial_load_path ckpt/step-000000

to-kenotron streams: each kenotron tensor is built from the HF tensors it needs, read one at a
time, and written to the checkpoint before the next, so the host memory it needs is about the
largest tensor (its source and copy with --dtype), not the model. to-hf takes a run folder, its checkpoints/ folder or one step
folder, and writes the weights (streamed one safetensors file at a time), config.json, the
tokenizer the run trained with (tokenizer.json, tokenizer.model) and generation_config.json
(BOS/EOS). The model family and its dimensions come from the checkpoint's completion marker
(to-hf) or config.json (to-kenotron). One process; no GPU needed.
"""

from __future__ import annotations

import argparse
import sys

import torch

from kenotron.checkpoint import CheckpointError
from kenotron.checkpoint.hf import checkpoint_to_hf, hf_to_checkpoint
from kenotron.checkpoint.locate import find_checkpoint
from kenotron.data import build_tokenizer
from kenotron.models.hf_adapter import HFConversionError

DTYPES = ("keep", "float32", "bfloat16", "float16")


def parse_args(argv: list[str] | None, prog: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="direction", required=True)
    to_ken = sub.add_parser("to-kenotron", help="HF folder -> kenotron DCP checkpoint (model only)")
    to_ken.add_argument("hf_dir", help="folder with config.json and *.safetensors")
    to_ken.add_argument("out_folder", help="checkpoint folder; the step folder is created inside it")
    to_ken.add_argument("--step", type=int, default=0, help="step number of the written checkpoint (default 0)")
    to_ken.add_argument("--max-seq-len", type=int, default=0,
                        help="RoPE table length recorded for the model (default: max_position_embeddings)")
    to_hf = sub.add_parser("to-hf", help="kenotron run or checkpoint -> HF folder")
    to_hf.add_argument("checkpoint", help="a run folder (its latest checkpoint), its checkpoints/ folder, or a step folder")
    to_hf.add_argument("out_dir", help="folder to write config.json, *.safetensors and the tokenizer into")
    to_hf.add_argument("--max-shard-gb", type=float, default=5.0, help="largest safetensors file (default 5 GB)")
    to_hf.add_argument("--tokenizer", default=None,
                       help="tiktoken file to write ('' = kenotron's built-in); default: the run's tokenizer.path")
    to_hf.add_argument("--no-tokenizer", action="store_true", help="write the weights and config.json only")
    for p in (to_ken, to_hf):
        p.add_argument("--dtype", choices=DTYPES, default="keep", help="weight dtype written (default: as stored)")
    return parser.parse_args(argv)


def _tokenizer_for(args: argparse.Namespace, located: object) -> object:
    if args.no_tokenizer:
        return None
    path = args.tokenizer if args.tokenizer is not None else located.tokenizer_path()  # type: ignore[attr-defined]
    if path is None:
        print(f"kenotron: {located.step_folder} is not inside a run folder (no config.toml), so its tokenizer "  # type: ignore[attr-defined]
              f"is unknown: no tokenizer written (pass --tokenizer FILE, or --tokenizer '' for the built-in one)",
              file=sys.stderr)
        return None
    return build_tokenizer(path)


def main(argv: list[str] | None = None, prog: str = "kenotron convert") -> int:
    args = parse_args(argv, prog)
    dtype = None if args.dtype == "keep" else getattr(torch, args.dtype)
    try:
        if args.direction == "to-kenotron":
            out = hf_to_checkpoint(args.hf_dir, args.out_folder, step=args.step, dtype=dtype,
                                   max_seq_len=args.max_seq_len)
            print(f"wrote {out}; train from it with --checkpoint.initial_load_path {out}")
            return 0
        located = find_checkpoint(args.checkpoint)
        tokenizer = _tokenizer_for(args, located)
        out = checkpoint_to_hf(located.step_folder, args.out_dir, dtype=dtype,
                               max_shard_bytes=int(args.max_shard_gb * 2**30), tokenizer=tokenizer)
        print(f"wrote {out} from {located.step_folder}; sample from it with: kenotron generate --hf {out} "
              f"--prompt 'def fib(n):'")
    except (CheckpointError, HFConversionError, FileNotFoundError, ValueError) as exc:
        print(f"kenotron convert: {exc}", file=sys.stderr)
        return 2
    return 0
