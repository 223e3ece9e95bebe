"""Convert between Hugging Face transformers folders and kenotron checkpoints.

    # HF -> a DCP model-only checkpoint, then train from it under any plan:
    python scripts/convert_hf.py to-kenotron meta-llama/Llama-3.2-1B-local ckpt --dtype bfloat16
    ./run_train.sh --checkpoint.enable true --checkpoint.initial_load_path ckpt/step-000000

    # a trainer checkpoint (full or model-only) -> a folder transformers loads:
    python scripts/convert_hf.py to-hf outputs/debug/checkpoints/step-000250 hf_out --dtype bfloat16

The model family and its dimensions come from config.json (to-kenotron) or from the checkpoint's
completion marker (to-hf). One process; no GPU needed.
"""

from __future__ import annotations

import argparse
import sys

import torch

DTYPES = {"keep": None, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="direction", required=True)
    to_ken = sub.add_parser("to-kenotron", help="HF folder -> kenotron DCP checkpoint (model only)")
    to_ken.add_argument("hf_dir", help="folder with config.json and *.safetensors")
    to_ken.add_argument("out_folder", help="checkpoint folder; the step folder is created inside it")
    to_ken.add_argument("--step", type=int, default=0, help="step number of the written checkpoint (default 0)")
    to_ken.add_argument("--max-seq-len", type=int, default=0,
                        help="RoPE table length recorded for the model (default: max_position_embeddings)")
    to_hf = sub.add_parser("to-hf", help="kenotron checkpoint step folder -> HF folder")
    to_hf.add_argument("checkpoint_dir", help="a step folder, e.g. outputs/debug/checkpoints/step-000250")
    to_hf.add_argument("out_dir", help="folder to write config.json and *.safetensors into")
    to_hf.add_argument("--max-shard-gb", type=float, default=5.0, help="largest safetensors file (default 5 GB)")
    for p in (to_ken, to_hf):
        p.add_argument("--dtype", choices=list(DTYPES), default="keep", help="weight dtype written (default: as stored)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from kenotron.checkpoint import CheckpointError
    from kenotron.checkpoint.hf import checkpoint_to_hf, hf_to_checkpoint
    from kenotron.models.hf_adapter import HFConversionError

    try:
        if args.direction == "to-kenotron":
            out = hf_to_checkpoint(args.hf_dir, args.out_folder, step=args.step, dtype=DTYPES[args.dtype],
                                   max_seq_len=args.max_seq_len)
            print(f"wrote {out}; train from it with --checkpoint.initial_load_path {out}")
        else:
            out = checkpoint_to_hf(args.checkpoint_dir, args.out_dir, dtype=DTYPES[args.dtype],
                                   max_shard_bytes=int(args.max_shard_gb * 2**30))
            print(f"wrote {out}; load it with transformers.AutoModelForCausalLM.from_pretrained({str(out)!r})")
    except (CheckpointError, HFConversionError) as exc:
        print(f"convert_hf: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
