"""The checks of a config that need only its values, the world size, the model's shape and
the machine's facts.

    spec, args = resolve_model(cfg)                           # the family and its checked args
    dims, global_batch, accum = resolve_degrees(cfg, world_size, spec, args, device_type)
    preflight(cfg, world_size, machine_target(cfg))           # both, and the kernel choices' checks

They are resolve_run's first steps (kenotron/train/resolve.py; the kernel choices' checks are
kernel_choice/config_checks.py), kept where importing them costs no more than the config and
the model registry: the launcher runs them before it imports torch, after the config-only ones
(runtime/degrees.py). Every error is a ConfigError naming the key and the fix.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kenotron.config import ConfigError, JobConfig, MoE, validate_config
from kenotron.degrees import ParallelDims, check_compile, check_split_backward, expert_parallel_degrees
from kenotron.kernel_choice.config_checks import settle_kernels
from kenotron.kernel_choice.target import Target, nvidia_smi_cuda_major, torch_built_with_cuda, visible_cuda_gpus
from kenotron.models import MODEL_SPECS, ModelSpec, get_model_spec
from kenotron.runtime.degrees import layout_degrees


def check_moe_config(cfg: JobConfig, spec: ModelSpec) -> None:
    """[moe] values that are invalid, or set for a family without experts."""
    m, default = cfg.moe, MoE()
    for name in ("aux_loss_coef", "z_loss_coef", "bias_update_rate"):
        if getattr(m, name) < 0:
            raise ConfigError(f"moe.{name}={getattr(m, name)} must be >= 0")
    if spec.is_moe:
        return
    changed = [f"moe.{f.name}={getattr(m, f.name)!r}" for f in dataclasses.fields(m)
               if getattr(m, f.name) != getattr(default, f.name)]
    if cfg.parallelism.ep > 1:
        changed.append(f"parallelism.ep={cfg.parallelism.ep}")
    if changed:
        moe_families = ", ".join(name for name, s in MODEL_SPECS.items() if s.is_moe)
        raise ConfigError(f"{', '.join(changed)} set, but model.name={spec.name!r} has no experts; leave it at its "
                          f"default or use an MoE family ({moe_families})")


def check_expert_parallel(cfg: JobConfig, dims: ParallelDims, spec: ModelSpec, args: Any) -> None:
    """ep against the experts and the data-parallel mode."""
    if dims.ep == 1:
        return
    n_experts = args.moe.n_experts
    if n_experts % dims.ep:
        valid = expert_parallel_degrees(dims.dp_shard, dims.cp, n_experts)
        raise ConfigError(f"parallelism.ep={dims.ep} does not divide the {n_experts} experts of {spec.name} "
                          f"{cfg.model.flavor}; use one of {valid}")
    if cfg.parallelism.dp_mode != "fsdp":
        raise ConfigError(f"parallelism.ep={dims.ep} shards the experts with FSDP over the remaining ranks; "
                          f"use parallelism.dp_mode='fsdp'")


def check_model_features(cfg: JobConfig, spec: ModelSpec, args: Any) -> None:
    """Features of the config that the family or its args cannot have: document masking where
    the sequence mixing crosses documents, spectral µP without AdamW or with tied embeddings."""
    if cfg.data.document_masking and spec.no_document_masking:
        raise ConfigError(f"data.document_masking=true is not supported by model.name={spec.name!r}: "
                          f"{spec.no_document_masking}; set data.document_masking=false")
    if cfg.model.parametrization != "spectral_mup":
        return
    if cfg.optimizer.name not in ("adamw", "muon"):
        raise ConfigError(
            f"model.parametrization='spectral_mup' sets AdamW's per-matrix learning rates (or Muon's); "
            f"optimizer.name={cfg.optimizer.name!r} would need other ones; use optimizer.name='adamw' or 'muon'"
        )
    if getattr(args, "tie_embeddings", False):
        raise ConfigError(
            f"model.parametrization='spectral_mup' starts the embedding at std 1 and the output layer at 1/dim, "
            f"which one tied matrix cannot do, but {cfg.model.name} {cfg.model.flavor} ties them; set "
            f"model.tie_embeddings=false"
        )


def resolve_model(cfg: JobConfig) -> tuple[ModelSpec, Any]:
    """The config's values checked together, its model family and the family's args (the flavor
    with the config's model.<field> values)."""
    validate_config(cfg)
    spec = get_model_spec(cfg.model.name)
    check_moe_config(cfg, spec)
    args = spec.model_args(cfg.model.flavor, cfg.model.args, max_seq_len=cfg.training.seq_len)  # checked there
    check_model_features(cfg, spec, args)
    return spec, args


def resolve_degrees(cfg: JobConfig, world_size: int, spec: ModelSpec, args: Any,
                    device_type: str) -> tuple[ParallelDims, int, int]:
    """The parallel degrees laid out on `world_size` and checked against the model's dimensions,
    the global batch size and the gradient-accumulation steps. `device_type` is the target's
    ("cuda" or "cpu")."""
    p, t = cfg.parallelism, cfg.training
    dims, global_batch, accum = layout_degrees(cfg, world_size)
    dims.check_model(spec.tp_divisors(args), n_layers=args.n_layers)
    # An MoE layer's width is not split by tensor parallel (it runs on this rank's sequence shard).
    dims.check_seq_len(t.seq_len, sequence_parallel=p.sequence_parallel or spec.is_moe)
    for i, stage in enumerate(cfg.data.stages):  # a stage's windows are split the same way
        if stage.seq_len:
            dims.check_seq_len(stage.seq_len, p.sequence_parallel or spec.is_moe, key=f"data.stages[{i}].seq_len")
    check_expert_parallel(cfg, dims, spec, args)
    if p.async_tp and dims.tp > 1 and not (device_type == "cuda" and cfg.compile.enable):
        raise ConfigError("parallelism.async_tp needs CUDA and compile.enable=true (the overlap is done by the "
                          "compiler); turn it off or enable both")
    if dims.tp > 1 and not spec.tp_styles:
        raise ConfigError(f"model.name={spec.name!r} has no tensor-parallel plan yet; use parallelism.tp=1")
    if dims.pp > 1:
        check_compile(p.pp_schedule, cfg.compile.enable)
        check_split_backward(p.pp_schedule, cfg.activation_checkpoint.mode, spec.is_moe)
    return dims, global_batch, accum


def machine_target(cfg: JobConfig) -> Target:
    """The machine the ranks started here will run on, told without torch (Target.of_machine);
    nvidia-smi is asked only when a GPU will be used."""
    gpus = visible_cuda_gpus() if cfg.training.device != "cpu" and torch_built_with_cuda() else 0
    return Target.of_machine(cfg.training.device, gpus, nvidia_smi_cuda_major() if gpus else 0)


def preflight(cfg: JobConfig, world_size: int, target: Target) -> None:
    """Every check of resolve_run that needs no torch, no model build and no file, for `target`:
    the model's args, the degrees against them, the kernel choices (ConfigError naming the fix)."""
    spec, args = resolve_model(cfg)
    dims, _, accum = resolve_degrees(cfg, world_size, spec, args, target.device_type)
    settle_kernels(cfg, dims, spec, args, target, accum)
