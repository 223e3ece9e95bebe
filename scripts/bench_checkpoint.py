"""Training stall per checkpoint save, for each checkpoint.async_mode.

    python scripts/bench_checkpoint.py --flavor 1B --seq-len 2048            # one GPU (or CPU)
    torchrun --nproc-per-node 8 scripts/bench_checkpoint.py --flavor 8B      # FSDP over 8 GPUs

For each mode it trains the model (AdamW, bf16 autocast on GPU, FSDP when there are several
ranks), measures the mean step time without saving, then saves at one step and times that step's
save call plus the extra time of the following steps (wait_for_staging before optimizer.step, and
any slow-down while the background write runs). The first save of each mode is a warm-up (the
async_with_pinned_mem writer process starts then, and staging buffers are allocated) and is
reported separately. Checkpoints go to --folder and are deleted afterwards.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

MODES = ("disabled", "async", "async_with_pinned_mem")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama3", help="model family (default llama3)")
    p.add_argument("--flavor", default="1B", help="model flavor (default 1B)")
    p.add_argument("--n-layers", type=int, default=0, help="override the flavor's layer count (0 keeps it)")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch", type=int, default=1, help="sequences per rank per step")
    p.add_argument("--warmup-steps", type=int, default=3)
    p.add_argument("--baseline-steps", type=int, default=5)
    p.add_argument("--saves", type=int, default=2, help="measured saves per mode, after one warm-up save")
    p.add_argument("--steps-after-save", type=int, default=5, help="steps timed after each save")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {', '.join(MODES)}")
    p.add_argument("--folder", default="/tmp/kenotron-bench-checkpoint", help="where checkpoints are written")
    return p.parse_args()


def init_process_group(device: torch.device) -> None:
    """torchrun's group, or a one-rank one (async_with_pinned_mem's writer process needs a group)."""
    backend = "cuda:nccl,cpu:gloo" if device.type == "cuda" else "gloo"
    timeout = datetime.timedelta(minutes=10)
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group(backend, timeout=timeout)
    else:
        store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True)
        dist.init_process_group(backend, store=store, rank=0, world_size=1, timeout=timeout)


def build(args: argparse.Namespace, device: torch.device):
    from kenotron.models import get_model_spec

    spec = get_model_spec(args.model)
    margs = spec.model_args(args.flavor, max_seq_len=args.seq_len, **({"n_layers": args.n_layers} if args.n_layers else {}))
    with torch.device("meta"):
        model = spec.build(margs)
    if dist.get_world_size() > 1:
        from torch.distributed.fsdp import fully_shard

        for block in model.layers.values():
            fully_shard(block)
        fully_shard(model)
    model.to_empty(device=device)
    model.init_weights(buffer_device=device, seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    return model, optimizer, margs.vocab_size


def main() -> None:
    args = parse_args()
    from kenotron.checkpoint import CheckpointManager
    from kenotron.config.sections import Checkpoint

    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    init_process_group(device)
    rank0 = dist.get_rank() == 0
    model, optimizer, vocab = build(args, device)
    n_params = sum(p.numel() for p in model.parameters())
    tokens = torch.randint(0, vocab, (args.batch, args.seq_len + 1), device=device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    def step(manager=None) -> float:
        sync()
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(tokens[:, :-1])
        F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten()).backward()
        if manager is not None:
            manager.wait_for_staging()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        return time.perf_counter() - start

    rows = []
    for mode in args.modes.split(","):
        folder = Path(args.folder) / mode
        manager = CheckpointManager(Checkpoint(enable=True, async_mode=mode, keep_latest_k=1), folder,
                                    model_parts=[model], optimizers=[optimizer])
        for _ in range(args.warmup_steps):
            step()
        baseline = statistics.median(step() for _ in range(args.baseline_steps))
        stalls, calls, writes = [], [], []
        for i in range(args.saves + 1):
            sync()
            start = time.perf_counter()
            manager.save(1000 + i)
            call = time.perf_counter() - start
            extra = sum(max(step(manager) - baseline, 0.0) for _ in range(args.steps_after_save))
            manager.wait()
            written = time.perf_counter() - start
            if i == 0:
                warmup_stall = call + extra
                continue
            stalls.append(call + extra)
            calls.append(call)
            writes.append(written)
        manager.close()
        size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**30 if rank0 else 0.0
        rows.append((mode, baseline, statistics.mean(calls), statistics.mean(stalls), warmup_stall,
                     statistics.mean(writes), size))
        dist.barrier()
        if rank0:
            shutil.rmtree(folder, ignore_errors=True)

    if rank0:
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        print(f"\n{args.model} {args.flavor} ({n_params / 1e9:.2f} B params, AdamW fp32 state), "
              f"{dist.get_world_size()} x {name}, torch {torch.__version__}, batch {args.batch} x {args.seq_len}")
        print("| mode | step (s) | save call (s) | stall per save (s) | first save stall (s) | write done after (s) "
              "| checkpoint (GiB, rank 0 view) |")
        print("|---|---|---|---|---|---|---|")
        for mode, base, call, stall, first, write, size in rows:
            print(f"| {mode} | {base:.3f} | {call:.3f} | {stall:.3f} | {first:.3f} | {write:.2f} | {size:.1f} |")
    dist.destroy_process_group()


if __name__ == "__main__":  # required: the async_with_pinned_mem writer process re-imports this file
    main()
