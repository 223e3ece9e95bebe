"""From a config to a checked ResolvedRun, before any process group exists.

Everything that can be wrong with a config is found here, on every rank, from the config, the
world size, the tokenizer file, a meta-device model and the target machine: bad degrees, a
tokenizer larger than the model's vocabulary, batch sizes that do not divide, a plan naming
missing modules, a kernel the device cannot run. Every such error is a ConfigError (or one of
its subclasses) whose message names the config key and the fix. Every device-dependent choice
is made here too (kenotron/kernel_choice/choices.py), once, for the trainer and the estimator alike.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from kenotron.config import ConfigError, JobConfig
from kenotron.data import build_tokenizer, check_data_config
from kenotron.degrees import ParallelDims, model_ulysses_degree
from kenotron.kernel_choice.choices import Choices, resolve_choices
from kenotron.kernel_choice.config_checks import settle_kernels
from kenotron.kernel_choice.target import Target
from kenotron.models import ModelSpec
from kenotron.models.common.parametrization import matrix_fans
from kenotron.parallel.context.apply import cp_attention_kind
from kenotron.parallel.float8 import check_float8_experts
from kenotron.parallel.parallel_settings import ParallelSettings
from kenotron.parallel.pipeline import PipelineSplit, build_pipeline_split
from kenotron.parallel.plan import Plan, layout_for
from kenotron.runtime.preflight import resolve_degrees, resolve_model
from kenotron.train.doremi_checks import check_doremi
from kenotron.train.muon_groups import muon_names


@dataclass(frozen=True)
class ResolvedRun:
    """What the config resolves to: checked values and settled choices, ready to build."""

    cfg: JobConfig
    dims: ParallelDims
    spec: ModelSpec
    model_args: Any
    plan: Plan
    """The family's layout with the run's parallel settings (and its pipeline split)."""
    global_batch_size: int
    grad_accum_steps: int
    choices: Choices
    tokenizer: Any
    """The tokenizer, built once (its vocabulary was checked against the model's)."""


def check_parametrization(cfg: JobConfig, meta_model: torch.nn.Module) -> None:
    """What the optimizer and spectral µP need of the built model: Muon's included parameters are
    matrices, and spectral µP's fans of every weight matrix (models/common/parametrization.py);
    µP's optimizer and untied embeddings are checked with the model's args (runtime/preflight.py)."""
    if cfg.optimizer.name == "muon":
        muon_names(meta_model, cfg.optimizer.muon_include, cfg.optimizer.muon_exclude)  # included non-matrices
    if cfg.model.parametrization == "spectral_mup":
        matrix_fans(meta_model)


def build_pipeline_split_from_config(meta_model: torch.nn.Module, cfg: JobConfig, pp: int, blocks: str) -> PipelineSplit:
    """The pipeline split that `[parallelism]`'s pp_* fields describe (checked; ParallelConfigError)."""
    p, u = cfg.parallelism, cfg.tuning
    stage_modules = [entry.split() for entry in p.pp_stage_modules] or None
    return build_pipeline_split(
        meta_model, pp=pp, schedule=p.pp_schedule, local_batch_size=cfg.training.local_batch_size,
        microbatches=p.pp_microbatches, stages_per_rank=p.pp_stages_per_rank,
        layers_per_stage=list(p.pp_layers_per_stage) or None, stage_modules=stage_modules,
        first_stage_weight=u.pp_first_stage_weight, last_stage_weight=u.pp_last_stage_weight, blocks=blocks,
    )


def resolve_run(cfg: JobConfig, world_size: int, target: Target | None = None, check_data: bool = True) -> ResolvedRun:
    """Every check and choice that needs only the config, the world size, the tokenizer file, the
    data and the target machine (default: the GPU machine the config is planned for, Target.planned).

    Raises ConfigError (ParallelConfigError, PlanError and UnknownModelError are ConfigErrors)
    with the fix in the message. `check_data=False` leaves the data unopened: the estimator plans
    jobs whose data lives on another machine.
    """
    spec, args = resolve_model(cfg)
    tokenizer = build_tokenizer(cfg.tokenizer.path)
    if tokenizer.vocab_size > args.vocab_size:
        raise ConfigError(
            f"the tokenizer has {tokenizer.vocab_size} tokens but the model's vocabulary is {args.vocab_size}; "
            f"set --model.vocab_size {tokenizer.vocab_size} (or larger) or use a smaller tokenizer"
        )
    with torch.device("meta"):
        meta_model = spec.build(args)
    layout_for(spec, args).check(meta_model)  # the family's layout fits its model whatever the parallel layout
    check_parametrization(cfg, meta_model)
    if cfg.doremi.reference:
        check_doremi(cfg, spec, args)
    run = resolve_layout(cfg, world_size, spec, args, meta_model, tokenizer, target or Target.planned(cfg))
    if cfg.doremi.reference and run.global_batch_size < len(cfg.data.sources):
        raise ConfigError(
            f"the global batch of {run.global_batch_size} sequences is smaller than the {len(cfg.data.sources)} "
            f"DoReMi domains: every step must see every domain; raise training.global_batch_size to at least "
            f"{len(cfg.data.sources)}"
        )
    if check_data:
        check_data_config(cfg, tokenizer, args.vocab_size, run.global_batch_size)
    return run


def resolve_layout(cfg: JobConfig, world_size: int, spec: ModelSpec, args: Any, meta_model: torch.nn.Module,
                   tokenizer: Any, target: Target, splits: dict | None = None) -> ResolvedRun:
    """The checks and choices that depend on the parallel layout (`cfg.parallelism`, the batch
    sizes, activation checkpointing): resolve_run's second half, which the planner runs for
    every candidate layout. `meta_model` is `spec.build(args)` on the meta device; `splits`
    (the planner's) keeps each pipeline split built, by the config values it depends on."""
    dims, global_batch, accum = resolve_degrees(cfg, world_size, spec, args, target.device_type)
    kernels = settle_kernels(cfg, dims, spec, args, target, accum)  # what the launcher checked before torch
    plan = Plan(layout_for(spec, args), ParallelSettings.from_config(cfg))
    # The kind of ring the target runs (the estimator builds a CUDA job's torch ring on its CPU mesh).
    plan.settings.cp_attention = cp_attention_kind(plan.settings.cp_attention, target.device_type,
                                                   cfg.data.document_masking)
    if dims.cp > 1 and getattr(args, "n_heads", None):  # the all-to-all's share of cp under cp_scheme ulysses
        plan.settings.cp_ulysses_degree = model_ulysses_degree(args, dims)
    plan.settings.check(plan.layout.count_blocks(meta_model), dims.degrees())
    if dims.pp > 1:
        q, u = cfg.parallelism, cfg.tuning
        key = (dims.pp, q.pp_schedule, q.pp_microbatches, q.pp_stages_per_rank, tuple(q.pp_layers_per_stage),
               tuple(q.pp_stage_modules), cfg.training.local_batch_size, u.pp_first_stage_weight, u.pp_last_stage_weight)
        splits = {} if splits is None else splits
        if key not in splits:
            splits[key] = build_pipeline_split_from_config(meta_model, cfg, dims.pp, spec.blocks)
        plan.pipeline = copy.deepcopy(splits[key])
    choices = resolve_choices(cfg, dims, target, meta_model, kernels,
                              plan.settings.cp_ulysses_degree or dims.cp)
    check_float8_experts(cfg.float8.enable, cfg.float8.experts, choices.expert_kernel, spec.is_moe)
    return ResolvedRun(cfg, dims, spec, args, plan, global_batch, accum, choices, tokenizer)
