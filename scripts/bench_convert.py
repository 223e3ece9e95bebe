"""Host memory of `kenotron convert to-kenotron`: peak RSS converting a random HF folder, one table.

    python scripts/bench_convert.py                 # a 1.4 GB Llama and a 2.8 GB Qwen3-MoE (fp32), keep and bfloat16
    python scripts/bench_convert.py --cases llama3 --dtypes keep

Each case writes a random-weight transformers folder once (sharded at 512 MiB, under
`--data-dir`, default a temporary folder), then converts it in a fresh process per dtype and
reports that process's peak RSS (Linux's VmHWM) beside its RSS once kenotron is imported (the floor), the
folder's size and its largest tensor: the conversion streams, so peak - floor follows the
largest tensor, not the folder.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
from pathlib import Path

# Wide enough that the folder is far larger than its largest tensor (the 32,000-token embedding).
CASES = {
    "llama3": {"dim": 1024, "n_layers": 24, "n_heads": 16, "n_kv_heads": 8, "ffn_dim": 2816, "vocab_size": 32000},
    "qwen3_moe": {"dim": 1024, "n_layers": 12, "n_heads": 16, "n_kv_heads": 8, "head_dim": 64, "vocab_size": 32000,
                  "moe": {"n_experts": 32, "top_k": 4, "ffn_dim": 512}},
}

# VmHWM: this process image's own peak RSS (ru_maxrss would carry the parent's over fork and exec).
CONVERT = """
import json, sys, torch
from kenotron.checkpoint.hf import hf_to_checkpoint
def hwm():
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
floor = hwm()
dtype = None if sys.argv[3] == "keep" else getattr(torch, sys.argv[3])
hf_to_checkpoint(sys.argv[1], sys.argv[2], dtype=dtype, max_seq_len=64)
print(json.dumps({"floor": floor, "peak": hwm()}))
"""


def write_folder(family: str, out: Path) -> tuple[int, int]:
    """A random fp32 folder of the case (once); returns (bytes, largest tensor's bytes)."""
    import torch

    from kenotron.checkpoint.hf import save_hf
    from kenotron.models import get_model_spec
    from kenotron.models.common.moe_args import MoEArgs

    spec = get_model_spec(family)
    fields = dict(CASES[family], max_seq_len=64)
    if "moe" in fields:
        fields["moe"] = MoEArgs(**fields["moe"])
    args = dataclasses.replace(spec.flavors["debug"], **fields)
    with torch.device("meta"):
        model = spec.build(args)
    model.to_empty(device="cpu")
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            tensor.zero_() if name.endswith("expert_bias") else tensor.normal_(0.0, 0.02)
    sizes = [t.nbytes for t in model.state_dict().values()]
    if not (out / "config.json").is_file():
        save_hf(model, out, spec=spec, args=args, max_shard_bytes=512 * 2**20)
    return sum(sizes), max(sizes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", choices=sorted(CASES), default=sorted(CASES))
    parser.add_argument("--dtypes", nargs="+", choices=["keep", "bfloat16", "float32"], default=["keep", "bfloat16"])
    parser.add_argument("--data-dir", default=None, help="where the HF folders are written (default: a temporary one)")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(opts.data_dir or tmp)
        print("| model | folder (fp32) | largest tensor | --dtype | peak RSS | RSS after import | peak - floor |")
        print("|---|---|---|---|---|---|---|")
        for family in opts.cases:
            total, largest = write_folder(family, root / family)
            for dtype in opts.dtypes:
                out = Path(tmp) / f"ckpt-{family}-{dtype}"
                run = subprocess.run([sys.executable, "-c", CONVERT, str(root / family), str(out), dtype],
                                     check=True, capture_output=True, text=True)
                rss = json.loads(run.stdout.strip().splitlines()[-1])  # KiB
                mib = {k: v / 1024 for k, v in rss.items()}
                print(f"| {family} | {total / 2**20:,.0f} MiB | {largest / 2**20:,.0f} MiB | {dtype} | "
                      f"{mib['peak']:,.0f} MiB | {mib['floor']:,.0f} MiB | {mib['peak'] - mib['floor']:,.0f} MiB |")


if __name__ == "__main__":
    main()
