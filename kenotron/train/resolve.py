"""From a config to a checked RunPlan, before any process group exists.

Everything that can be wrong with a config is found here, on every rank, from the config,
the world size, the tokenizer file and a meta-device model: bad degrees, a tokenizer larger
than the model's vocabulary, batch sizes that do not divide, a plan naming missing modules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kenotron.checkpoint import check_checkpoint_config
from kenotron.config import ConfigError, JobConfig, validate_config
from kenotron.data import build_tokenizer, check_data_config
from kenotron.models import ModelSpec, get_model_spec
from kenotron.parallel.dims import ParallelDims
from kenotron.parallel.pipeline import (
    PipelineSplit,
    build_pipeline_split,
    check_compile,
)
from kenotron.parallel.plan import Plan, plan_for
from kenotron.train.attention_backend import check_attention, window_shorter_than
from kenotron.train.optim import resolve_adamw_implementation


@dataclass(frozen=True)
class RunPlan:
    """What the config resolves to: checked values, ready to build."""

    cfg: JobConfig
    dims: ParallelDims
    spec: ModelSpec
    model_args: Any
    plan: Plan
    global_batch_size: int
    grad_accum_steps: int


def build_plan(cfg: JobConfig, spec: ModelSpec) -> Plan:
    """The family's default plan with the job's parallelism, precision, AC and compile choices."""
    p = cfg.parallelism
    return plan_for(
        spec,
        sequence_parallel=p.sequence_parallel,
        loss_parallel=p.loss_parallel,
        async_tp=p.async_tp,
        dp_mode=p.dp_mode,
        reshard_after_forward=p.fsdp_reshard_after_forward,
        reduce_dtype=p.fsdp_reduce_dtype,
        fsdp_gradients_in_compute_pool=p.fsdp_gradients_in_compute_pool,
        param_dtype=cfg.training.param_dtype,
        ac_mode=cfg.activation_checkpoint.mode,
        ac_every_n=cfg.activation_checkpoint.every_n,
        ac_save_matmul_every=cfg.activation_checkpoint.save_matmul_every,
        offload_blocks=cfg.activation_checkpoint.offload_blocks,
        compile=cfg.compile.enable,
        float8=cfg.float8.recipe if cfg.float8.enable else "",
        float8_all_gather=cfg.float8.fsdp_all_gather,
        cp_load_balance=p.cp_load_balance,
        cp_rotate_method=p.cp_rotate_method,
        cp_attention=p.cp_attention,
    )


def check_context_parallel(cfg: JobConfig, dims: ParallelDims, meta_model: torch.nn.Module) -> None:
    """What context parallel (cp > 1) cannot run: its attention is plain causal attention over
    the whole sequence, on one model part, with FSDP sharding over dp_shard x cp."""
    p, t = cfg.parallelism, cfg.training
    if dims.cp == 1:
        return
    if dims.pp > 1:
        raise ConfigError(f"parallelism.cp={dims.cp} does not combine with pipeline parallel (pp={dims.pp}) yet; "
                          f"use cp=1 or pp=1")
    if p.dp_mode == "zero1":
        raise ConfigError(f"parallelism.dp_mode='zero1' does not combine with cp={dims.cp}; use dp_mode='fsdp'")
    window = window_shorter_than(meta_model, t.seq_len)
    if window is not None:
        raise ConfigError(
            f"parallelism.cp={dims.cp} supports plain causal attention only, but model {cfg.model.name} "
            f"{cfg.model.flavor} attends through a {window}-token sliding window, shorter than training.seq_len="
            f"{t.seq_len}; use training.seq_len <= {window}, a flavor without a window, or cp=1"
        )
    on_cuda = torch.cuda.is_available() and t.device != "cpu"
    if p.cp_attention == "torch" and not on_cuda:
        raise ConfigError("parallelism.cp_attention='torch' needs CUDA (torch has no context-parallel CPU kernel); "
                          "use 'auto' or 'ring'")
    if p.cp_attention != "ring" and on_cuda and cfg.model.attention_backend == "math":
        raise ConfigError("torch's context-parallel attention runs only the fused SDPA kernels, not "
                          "model.attention_backend='math'; choose another backend or parallelism.cp_attention='ring'")


def build_pipeline_split_from_config(
    meta_model: torch.nn.Module, p: Any, pp: int, local_batch_size: int, blocks: str
) -> PipelineSplit:
    """The pipeline split that `[parallelism]`'s pp_* fields describe (checked; ParallelConfigError)."""
    stage_modules = [entry.split() for entry in p.pp_stage_modules] or None
    return build_pipeline_split(
        meta_model, pp=pp, schedule=p.pp_schedule, local_batch_size=local_batch_size,
        microbatches=p.pp_microbatches, stages_per_rank=p.pp_stages_per_rank,
        layers_per_stage=list(p.pp_layers_per_stage) or None, stage_modules=stage_modules,
        first_stage_weight=p.pp_first_stage_weight, last_stage_weight=p.pp_last_stage_weight, blocks=blocks,
    )


def resolve_run(cfg: JobConfig, world_size: int, check_data: bool = True) -> RunPlan:
    """Every check that needs only the config, the world size, the tokenizer file and the data.

    Raises ConfigError / ParallelConfigError / UnknownModelError / PlanError with the fix in
    the message. `check_data=False` skips opening the data (the estimator plans a job whose data
    lives on another machine).
    """
    validate_config(cfg)
    p = cfg.parallelism
    dims = ParallelDims.from_degrees(
        world_size, dp_replicate=p.dp_replicate, dp_shard=p.dp_shard, cp=p.cp, tp=p.tp, pp=p.pp, ep=p.ep
    )
    unsupported = {name: getattr(dims, name) for name in ("ep",) if getattr(dims, name) > 1}
    if unsupported:
        # These land with their own issues; until then say so plainly.
        raise ConfigError(
            f"parallel degrees {unsupported} are not supported yet in this version; use data parallel "
            f"(dp_shard, dp_replicate), tensor parallel (tp), pipeline parallel (pp) and context parallel (cp)"
        )
    spec = get_model_spec(cfg.model.name)
    t = cfg.training
    args = spec.model_args(
        cfg.model.flavor, vocab_size=cfg.model.vocab_size, n_layers=cfg.model.n_layers, max_seq_len=t.seq_len
    )
    tokenizer = build_tokenizer(cfg.tokenizer.path)
    if tokenizer.vocab_size > args.vocab_size:
        raise ConfigError(
            f"the tokenizer has {tokenizer.vocab_size} tokens but the model's vocabulary is {args.vocab_size}; "
            f"set --model.vocab_size {tokenizer.vocab_size} (or larger) or use a smaller tokenizer"
        )
    dims.check_model(
        n_heads=args.n_heads, n_kv_heads=args.n_kv_heads, ffn_dim=args.ffn_dim, vocab_size=args.vocab_size,
        n_layers=args.n_layers,
    )
    dims.check_seq_len(t.seq_len, sequence_parallel=p.sequence_parallel)
    global_batch = t.global_batch_size if t.global_batch_size != -1 else t.local_batch_size * dims.dp
    accum = dims.grad_accum_steps(global_batch, t.local_batch_size)
    if check_data:
        check_data_config(cfg, tokenizer, args.vocab_size, global_batch)
    check_checkpoint_config(cfg.checkpoint)
    if t.mixed_precision == "master_weights" and (world_size > 1 or accum > 1):
        raise ConfigError(
            f"training.mixed_precision='master_weights' runs on one device without gradient accumulation (its "
            f"gradients are bf16), but this job has {world_size} ranks and {accum} micro-steps per step; use "
            f"mixed_precision='auto' (FSDP's mixed precision casts the weights with several ranks)"
            + (f" or global_batch_size={t.local_batch_size}" if world_size == 1 else "")
        )
    on_cuda = torch.cuda.is_available() and t.device != "cpu"
    if p.async_tp and dims.tp > 1 and not (on_cuda and cfg.compile.enable):
        raise ConfigError(
            "parallelism.async_tp needs CUDA and compile.enable=true (the overlap is done by the "
            "compiler); turn it off or enable both"
        )
    if cfg.optimizer.name == "adamw" and t.device == "cpu":
        # Only what the config itself contradicts: a GPU job planned on a CPU machine (estimation.py)
        # stays valid; the trainer checks the device it got before any process group exists.
        resolve_adamw_implementation(cfg.optimizer.implementation, "cpu")
    if dims.tp > 1 and not spec.tp_styles:
        raise ConfigError(f"model.name={spec.name!r} has no tensor-parallel plan yet; use parallelism.tp=1")
    plan = build_plan(cfg, spec)
    with torch.device("meta"):
        meta_model = spec.build(args)
    plan.check(meta_model)
    check_context_parallel(cfg, dims, meta_model)
    check_attention(cfg, dims, meta_model)
    if dims.pp > 1:
        if t.loss == "fused":
            raise ConfigError(
                "training.loss='fused' does not combine with pipeline parallel (the last stage computes the plain "
                "loss per microbatch); use 'auto' or 'plain'"
            )
        check_compile(p.pp_schedule, cfg.compile.enable)
        plan.pipeline = build_pipeline_split_from_config(meta_model, p, dims.pp, t.local_batch_size, spec.blocks)
    if p.dp_mode == "zero1" and dims.dp == 1 and world_size > 1:
        raise ConfigError("parallelism.dp_mode='zero1' needs a data-parallel degree > 1 (dp_shard or dp_replicate)")
    return RunPlan(cfg, dims, spec, args, plan, global_batch, accum)
