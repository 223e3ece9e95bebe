"""torchtitan's training step on the shapes kenotron is compared with, timed like scripts/bench.py.

    PYTHONPATH=/path/to/torchtitan python scripts/bench_torchtitan.py --flavor 30B-A3B --n-layers 4 \\
        --batch 4 --seq 4096 --case compiled --case eager
    PYTHONPATH=/path/to/torchtitan python scripts/bench_torchtitan.py --model llama3 --flavor 1B \\
        --ngpu 2 --case compiled                       # FSDP over 2 GPUs (--dp-replicate 2: DDP)
    PYTHONPATH=/path/to/torchtitan python scripts/bench_torchtitan.py --ngpu 4 --ep 4 --case compiled
    PYTHONPATH=/path/to/torchtitan python scripts/bench_torchtitan.py --model llama3 --flavor 8B --n-layers 8 \
        --batch 2 --seq 8192 --ngpu 4 --tp 2 --case compiled --case compiled-async-tp   # FSDP 2 x TP 2
    PYTHONPATH=/path/to/torchtitan python scripts/bench_torchtitan.py --model deepseek_v3 --flavor 16B \
        --n-layers 4 --batch 4 --seq 4096 --case compiled --case compiled-float8-experts

torchtitan (0.2.2, not a kenotron dependency: give its folder on PYTHONPATH) trains through its
own Trainer, which also builds a tokenizer and a Hugging Face dataset. This script builds what
one step needs with torchtitan's own functions, as its Trainer does: the model on the meta
device (the flavor's args, n_layers overridden), its `parallelize_qwen3` / `parallelize_llama`
(per-block compile when compiling; FSDP, DDP or expert parallel over `--ngpu` GPUs as its
ParallelDims lays them out), init_weights, `build_optimizers` (AdamW, its default fused
implementation), `build_lr_schedulers`, `build_cross_entropy_loss` (compiled with the model),
mixed precision as its Trainer sets it (FSDP's policy, else autocast in bf16), and its step:
forward, loss sum / tokens, backward, `clip_grad_norm_` (max norm 1), optimizer and scheduler
steps. Data: uniform random token ids, another stream per rank.

`--model deepseek_v3` builds torchtitan's DeepSeek-V3 (MLA, 1 dense block then MoE blocks with
shared experts; its `16B` flavor is kenotron's deepseek_v3 16B, which has no MTP module there:
run kenotron with `--model.mtp_depth 0`) with `parallelize_deepseekv3` and, as its TrainSpec, the
optimizers that update the routers' expert bias (`build_optimizers_with_moe_load_balancing`). Its
16B flavor asks for FlexAttention with a per-document mask; the comparison runs SDPA's causal
attention over whole windows, as kenotron does (attn_type "sdpa", attn_mask_type "causal"). The
`-float8-experts` cases convert the routed experts' grouped GEMMs to float8 rowwise with
torchtitan's own converter ("quantize.grouped_mm.float8" on the "experts" modules: torchao's
MoE training prototype, which must be installed), as kenotron's `--float8.enable true
--float8.recipe rowwise --float8.experts true` does.

`--model llama3 --flavor 1B` is kenotron's llama3_1b shape in torchtitan's args (dim 2048, 16
layers, 32 heads, 8 kv heads, SwiGLU width 8192 from ffn_dim_multiplier 1.5), except that
torchtitan's Llama does not tie the embeddings (262 M more parameters to reduce and update).

torchtitan's modules import `datasets`, `torchdata` and `tyro` at import time, for data loading and
its command line, which this script does not use: where they are missing, empty stand-in modules
are registered so the imports succeed.

Each case runs in its own process (torchrun with `--ngpu` > 1); tokens/s are per GPU (rank 0's
median step), and TFLOP/s and MFU use torchtitan's own FLOP count (`get_nparams_and_flops`:
active parameters) and peak (989 TFLOP/s for an H100/H200).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
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


NEEDS_PROCESS_GROUP = ("deepseek_v3",)
"""Families whose torchtitan step calls collectives even on one GPU."""


def _init_distributed(model_name: str):
    """Under torchrun: NCCL on this rank's GPU; (world size, rank). deepseek_v3 needs a process
    group on one GPU too (its load-balancing optimizer hook all-reduces the expert counts): its
    worker always runs under torchrun."""
    import torch
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1 and model_name not in NEEDS_PROCESS_GROUP:
        return 1, 0
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    return world, dist.get_rank()


def _model_and_parallelize(model_name: str, flavor: str):
    """(args of the flavor, model class, parallelize function) of torchtitan's family."""
    if model_name == "qwen3":
        from torchtitan.models.qwen3 import Qwen3Model, parallelize_qwen3, qwen3_args

        return qwen3_args[flavor], Qwen3Model, parallelize_qwen3
    if model_name == "deepseek_v3":
        from torchtitan.models.deepseek_v3 import DeepSeekV3Model, deepseekv3_args, parallelize_deepseekv3

        args = deepseekv3_args[flavor]
        args.attn_type, args.attn_mask_type = "sdpa", "causal"  # kenotron's attention (module docstring)
        return args, DeepSeekV3Model, parallelize_deepseekv3
    from torchtitan.models.llama3 import Transformer, TransformerModelArgs, llama3_args, parallelize_llama

    if flavor == "1B":  # kenotron's llama3_1b shape (see the module docstring)
        args = TransformerModelArgs(dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, ffn_dim_multiplier=1.5,
                                    multiple_of=256, rope_theta=500000)
    else:
        args = llama3_args[flavor]
    return args, Transformer, parallelize_llama


def run_case(compiled: bool, model_name: str, flavor: str, n_layers: int, batch: int, seq: int, warmup: int,
             steps: int, force_balance: bool, dp_replicate: int = 1, ep: int = 1, ac: str = "none",
             float8_experts: bool = False, cp: int = 1, tp: int = 1, async_tp: bool = False) -> dict:
    import torch

    _stub_missing_imports()
    from torchtitan.components.loss import build_cross_entropy_loss
    from torchtitan.components.lr_scheduler import build_lr_schedulers
    from torchtitan.components.optimizer import build_optimizers, build_optimizers_with_moe_load_balancing
    from torchtitan.config.job_config import JobConfig
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed import utils as dist_utils
    from torchtitan.distributed.context_parallel import prepare_context_parallel_input
    from torchtitan.protocols.model_converter import build_model_converters

    world, rank = _init_distributed(model_name)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    job = JobConfig()
    job.model.name, job.model.flavor = model_name, flavor
    job.training.local_batch_size, job.training.seq_len = batch, seq
    job.training.steps = warmup + steps
    job.training.max_norm = 1.0
    job.compile.enable = compiled
    job.activation_checkpoint.mode = ac
    job.activation_checkpoint.selective_ac_option = "op"
    job.debug.moe_force_load_balance = force_balance
    dp_shard = world // (dp_replicate * cp * tp)
    job.parallelism.data_parallel_replicate_degree = dp_replicate
    job.parallelism.data_parallel_shard_degree = dp_shard
    job.parallelism.expert_parallel_degree = ep
    job.parallelism.context_parallel_degree = cp  # head-tail balancing and allgather rotation: its defaults
    job.parallelism.tensor_parallel_degree = tp  # loss parallel on, as its default
    job.parallelism.enable_async_tensor_parallel = async_tp
    if float8_experts:  # torchtitan's float8 grouped GEMMs of the routed experts (module docstring)
        job.model.converters = ["quantize.grouped_mm.float8"]
        job.quantize.grouped_mm.float8.fqns = ["experts"]
    args, model_cls, parallelize = _model_and_parallelize(model_name, flavor)
    if n_layers:
        args.n_layers = n_layers
    args.update_from_config(job)
    dims = ParallelDims(dp_replicate=dp_replicate, dp_shard=dp_shard, cp=cp, tp=tp, pp=1, ep=ep, etp=1,
                        world_size=world)
    if world > 1:
        dims.build_mesh()
    with torch.device("meta"):
        model = model_cls(args)
    n_params, flops_per_token = args.get_nparams_and_flops(model, seq)
    converters = build_model_converters(job, dims)  # as torchtitan's Trainer: before parallelizing
    converters.convert(model)
    model = parallelize(model, dims, job)
    model.to_empty(device=device)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    model.train()
    # deepseek_v3's TrainSpec updates the routers' expert bias through its optimizers' hook.
    build = build_optimizers_with_moe_load_balancing if model_name == "deepseek_v3" else build_optimizers
    optimizers = build([model], job.optimizer, dims)
    schedulers = build_lr_schedulers(optimizers, job.lr_scheduler, job.training.steps)
    loss_fn = build_cross_entropy_loss(job)
    amp = dist_utils.maybe_enable_amp(dims, job.training.mixed_precision_param, device.type)
    train_context = dist_utils.get_train_context(dims.tp_enabled)  # as its Trainer: loss parallel under TP
    gen = torch.Generator().manual_seed(rank // (cp * tp))  # the ranks of one cp x tp group read one batch

    def step() -> torch.Tensor:
        tokens = torch.randint(0, args.vocab_size, (batch, seq + 1), generator=gen)
        inputs, labels = tokens[:, :-1].to(device), tokens[:, 1:].to(device)
        extra: dict = {}
        if cp > 1:  # as torchtitan's Trainer: each rank keeps its head-tail share of tokens, labels, positions
            inputs, labels, extra = prepare_context_parallel_input(inputs, labels, {}, dims.get_mesh("cp"), device,
                                                                   job.parallelism.context_parallel_load_balancer)
        optimizers.zero_grad()
        with train_context():
            with amp:
                pred = model(inputs, **extra)
                loss = loss_fn(pred, labels) / labels.numel()
            del pred
            loss.backward()
        dist_utils.clip_grad_norm_(list(model.parameters()), job.training.max_norm, foreach=True,
                                   ep_enabled=dims.ep_enabled)
        optimizers.step()
        converters.post_optimizer_hook(model)
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
    tps = batch * seq / step_time / (cp * tp)  # each sequence counted once: cp and tp GPUs share it
    return {
        "tokens_per_sec": tps, "tflops": tps * flops_per_token / 1e12, "mfu": 100 * tps * flops_per_token / 989e12,
        "memory_allocated_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0,
        "memory_reserved_gib": torch.cuda.max_memory_reserved() / 2**30 if cuda else 0.0,
        "loss_last": losses[-1].item(), "params": n_params, "flops_per_token": flops_per_token,
        "torch": torch.__version__, "ngpu": world, "cp": cp, "tp": tp,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description="torchtitan's step on one or more GPUs, one table row per case")
    parser.add_argument("--model", choices=["qwen3", "llama3", "deepseek_v3"], default="qwen3")
    parser.add_argument("--flavor", default="30B-A3B")
    parser.add_argument("--n-layers", type=int, default=4, help="0 keeps the flavor's")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--ngpu", type=int, default=1, help="GPUs (torchrun); FSDP over them unless --dp-replicate")
    parser.add_argument("--dp-replicate", type=int, default=1, help="replicas (DDP when it equals --ngpu)")
    parser.add_argument("--ep", type=int, default=1, help="expert-parallel degree (MoE)")
    parser.add_argument("--ac", choices=["none", "selective", "full"], default="none", help="activation checkpointing")
    parser.add_argument("--cp", type=int, default=1, help="context-parallel degree (plain causal SDPA, its only mode)")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (loss parallel on, its default; "
                        "torchtitan trains TP without FSDP in fp32: give FSDP GPUs too for bf16)")
    parser.add_argument("--case", action="append", default=[],
                        choices=["compiled", "eager", "compiled-balanced", "compiled-float8-experts",
                                 "compiled-async-tp"])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--json", help="write all rows to this file")
    args = parser.parse_args()
    if args.worker:
        name = args.case[0]
        row = run_case(name.startswith("compiled"), args.model, args.flavor, args.n_layers, args.batch, args.seq,
                       args.warmup, args.steps, name.endswith("balanced"), args.dp_replicate, args.ep, args.ac,
                       name.endswith("float8-experts"), args.cp, args.tp, name.endswith("async-tp"))
        if int(os.environ.get("RANK", "0")) == 0:
            Path(args.worker).write_text(json.dumps(row))
        return 0
    layout = (f" x{args.ngpu} (dp_replicate {args.dp_replicate}, ep {args.ep}, cp {args.cp}, tp {args.tp})"
              if args.ngpu > 1 else "")
    print(f"| torchtitan 0.2.2 {args.model} {args.flavor}{layout} case | tokens/s/device | TFLOP/s/device | MFU | "
          "peak GiB alloc / reserved | last loss |\n|---|---|---|---|---|---|", flush=True)
    rows = []
    for name in args.case or ["compiled", "eager"]:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "row.json"
            worker = [__file__, "--worker", str(out), "--case", name, "--model", args.model, "--flavor", args.flavor,
                      "--n-layers", str(args.n_layers), "--batch", str(args.batch), "--seq", str(args.seq),
                      "--warmup", str(args.warmup), "--steps", str(args.steps), "--dp-replicate",
                      str(args.dp_replicate), "--ep", str(args.ep), "--ac", args.ac, "--cp", str(args.cp),
                      "--tp", str(args.tp)]
            if args.ngpu > 1 or args.model in NEEDS_PROCESS_GROUP:
                cmd = ["torchrun", "--standalone", "--nproc-per-node", str(args.ngpu), *worker]
            else:
                cmd = [sys.executable, *worker]
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
