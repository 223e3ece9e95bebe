"""torchtitan's training step on the shapes kenotron is compared with, timed like scripts/bench.py.

    PYTHONPATH=/path/to/torchtitan python scripts/bench_torchtitan.py --flavor 30B-A3B --n-layers 4 \\
        --batch 4 --seq 4096 --case compiled --case eager

torchtitan (0.2.2, not a kenotron dependency: give its folder on PYTHONPATH) trains through its
own Trainer, which also builds a tokenizer and a Hugging Face dataset. This script builds what
one step needs with torchtitan's own functions, as its Trainer does for one GPU: the model on
the meta device (Qwen3ModelArgs of the flavor, n_layers overridden), `parallelize_qwen3`
(per-block compile of its MoE submodules when compiling, no FSDP on one GPU), init_weights,
`build_optimizers` (AdamW, its default fused implementation), `build_lr_schedulers`,
`build_cross_entropy_loss` (compiled with the model), autocast in bf16 (`maybe_enable_amp`, its
one-GPU mixed precision), and its step: forward, loss sum / tokens, backward, `clip_grad_norm_`
(max norm 1), optimizer and scheduler steps. Data: uniform random token ids.

torchtitan's modules import `datasets`, `torchdata` and `tyro` at import time, for data loading and
its command line, which this script does not use: where they are missing, empty stand-in modules
are registered so the imports succeed.

Each case runs in its own process; tokens/s, TFLOP/s and MFU use torchtitan's own FLOP count
(`get_nparams_and_flops`: active parameters) and peak (989 TFLOP/s for an H100/H200).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

from torch.distributed.checkpoint.stateful import Stateful


class _AnyMeta(type(Stateful)):  # a base class beside torchtitan's Stateful, Protocol-derived bases
    def __getattr__(cls, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return _Any


class _Any(metaclass=_AnyMeta):
    """Any attribute, call or base class of a stand-in module."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def __call__(self, *args, **kwargs):
        return args[0] if len(args) == 1 and callable(args[0]) else _Any()

    def __getattr__(self, name: str):
        return _Any


class _StandIn(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return _Any


def _stub_missing_imports() -> None:
    """Stand-in modules for torchtitan's data-loading and CLI imports when they are not installed."""
    names = ["datasets", "datasets.distributed", "torchdata", "torchdata.stateful_dataloader", "tyro"]
    missing = {n for n in names if n not in sys.modules and importlib.util.find_spec(n.split(".")[0]) is None}
    for name in names:
        if name in missing:
            sys.modules[name] = _StandIn(name)


def run_case(compiled: bool, flavor: str, n_layers: int, batch: int, seq: int, warmup: int, steps: int,
             force_balance: bool) -> dict:
    import torch

    _stub_missing_imports()
    from torchtitan.components.loss import build_cross_entropy_loss
    from torchtitan.components.lr_scheduler import build_lr_schedulers
    from torchtitan.components.optimizer import build_optimizers
    from torchtitan.config.job_config import JobConfig
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed import utils as dist_utils
    from torchtitan.models.qwen3 import Qwen3Model, parallelize_qwen3, qwen3_args

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    job = JobConfig()
    job.model.name, job.model.flavor = "qwen3", flavor
    job.training.local_batch_size, job.training.seq_len = batch, seq
    job.training.steps = warmup + steps
    job.training.max_norm = 1.0
    job.compile.enable = compiled
    job.activation_checkpoint.mode = "none"
    job.debug.moe_force_load_balance = force_balance
    args = qwen3_args[flavor]
    args.n_layers = n_layers
    args.update_from_config(job)
    dims = ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=1, ep=1, etp=1, world_size=1)
    with torch.device("meta"):
        model = Qwen3Model(args)
    n_params, flops_per_token = args.get_nparams_and_flops(model, seq)
    model = parallelize_qwen3(model, dims, job)
    model.to_empty(device=device)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    model.train()
    optimizers = build_optimizers([model], job.optimizer, dims)
    schedulers = build_lr_schedulers(optimizers, job.lr_scheduler, job.training.steps)
    loss_fn = build_cross_entropy_loss(job)
    amp = dist_utils.maybe_enable_amp(dims, job.training.mixed_precision_param, device.type)
    gen = torch.Generator().manual_seed(0)

    def step() -> torch.Tensor:
        tokens = torch.randint(0, args.vocab_size, (batch, seq + 1), generator=gen)
        inputs, labels = tokens[:, :-1].to(device), tokens[:, 1:].to(device)
        optimizers.zero_grad()
        with amp:
            pred = model(inputs)
            loss = loss_fn(pred, labels) / labels.numel()
        del pred
        loss.backward()
        dist_utils.clip_grad_norm_(list(model.parameters()), job.training.max_norm, foreach=True)
        optimizers.step()
        schedulers.step()
        return loss.detach()

    cuda = device.type == "cuda"
    losses = [step() for _ in range(warmup)]
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
        for i in range(steps):
            marks[i].record()
            losses.append(step())
        marks[steps].record()
        torch.cuda.synchronize()
        times = [marks[i].elapsed_time(marks[i + 1]) / 1e3 for i in range(steps)]
    else:
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            losses.append(step())
            times.append(time.perf_counter() - t0)
    step_time = statistics.median(times)
    tps = batch * seq / step_time
    return {
        "tokens_per_sec": tps, "tflops": tps * flops_per_token / 1e12, "mfu": 100 * tps * flops_per_token / 989e12,
        "memory_allocated_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0,
        "memory_reserved_gib": torch.cuda.max_memory_reserved() / 2**30 if cuda else 0.0,
        "loss_last": losses[-1].item(), "params": n_params, "flops_per_token": flops_per_token,
        "torch": torch.__version__,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description="torchtitan's step on one GPU, one table row per case")
    parser.add_argument("--flavor", default="30B-A3B")
    parser.add_argument("--n-layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--case", action="append", choices=["compiled", "eager", "compiled-balanced"], default=[])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--json", help="write all rows to this file")
    args = parser.parse_args()
    shape = (args.flavor, args.n_layers, args.batch, args.seq, args.warmup, args.steps)
    if args.worker:
        name = args.case[0]
        row = run_case(name.startswith("compiled"), *shape[:4], args.warmup, args.steps, name.endswith("balanced"))
        Path(args.worker).write_text(json.dumps(row))
        return 0
    print("| torchtitan 0.2.2 case | tokens/s/device | TFLOP/s/device | MFU | peak GiB alloc / reserved | last loss |\n"
          "|---|---|---|---|---|---|", flush=True)
    rows = []
    for name in args.case or ["compiled", "eager"]:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "row.json"
            cmd = [sys.executable, __file__, "--worker", str(out), "--case", name, "--flavor", args.flavor,
                   "--n-layers", str(args.n_layers), "--batch", str(args.batch), "--seq", str(args.seq),
                   "--warmup", str(args.warmup), "--steps", str(args.steps)]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if proc.returncode or not out.exists():
                print(f"| {name} | failed: {(proc.stdout + proc.stderr).strip().splitlines()[-1:]} | | | | |", flush=True)
                print((proc.stdout + proc.stderr)[-3000:], file=sys.stderr)
                rows.append({"name": name, "error": (proc.stdout + proc.stderr)[-3000:]})
                continue
            r = {"name": name, **json.loads(out.read_text())}
        rows.append(r)
        print(f"| {name} | {r['tokens_per_sec']:,.0f} | {r['tflops']:.1f} | {r['mfu']:.1f}% | "
              f"{r['memory_allocated_gib']:.1f} / {r['memory_reserved_gib']:.1f} | {r['loss_last']:.3f} |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
