"""The job builder: from a resolved run to the parallelized model, its optimizers and schedules.

    run = resolve_run(cfg, world_size, Target.of(device))   # every check and choice, no process group
    meshes = build_meshes(run, device.type)                 # needs the process group
    job = build_job(run, device, meshes)
    loss, grad_norm = train_step(job, microbatches)          # kenotron/train/step.py

`build_job` follows the recipe's order: model on the meta device, the resolved kernels put
in place (attention, eager RoPE/SwiGLU, Mamba's scan), `plan.apply` (pipeline split -> TP/SP -> CP -> AC ->
compile -> FSDP), materialize and initialize (seeded identically on every rank), one optimizer
and LR scheduler per model part, the loss, then the job's extensions (train/extension.py): the
MoE routers' balancing, the pipeline executor, the early all-gather, DoReMi's reference model.
The trainer calls it as it is; the memory estimator calls it under its fake process group
with `tensor_mode` a FakeTensorMode, `init_values=False` (values do not change memory) and
`hooks` that swap CUDA kernels for stand-ins with their allocations.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from kenotron.kernel_choice.attention_backend import BlockMasks, use_attention_kernel, use_narrow_values
from kenotron.models.common.eager_kernels import use_eager_kernels, use_expert_kernel
from kenotron.models.common.mamba import use_scan_kernel
from kenotron.parallel.data_parallel import unsharded_expert_params
from kenotron.parallel.dims import Meshes, build_device_meshes
from kenotron.parallel.early_gather import EarlyGather
from kenotron.parallel.zero1 import Zero1Optimizer
from kenotron.train.doremi import build_doremi, load_reference
from kenotron.train.expert_balance import ExpertBalance
from kenotron.train.extension import JobExtension, check_one_runs_the_passes
from kenotron.train.flops import active_matmul_params
from kenotron.train.lr_schedule import LRSchedule, build_lr_scheduler
from kenotron.train.mtp import MultiTokenPrediction
from kenotron.train.optim import build_param_groups, optimizer_factory
from kenotron.train.pipeline_step import PipelineExecutor, PipelineExtension, PipelineRunner
from kenotron.train.resolve import ResolvedRun
from kenotron.train.training_job import TrainingJob
from kenotron.train.vocab_parallel_loss import loss_chunk_step_for


@dataclass
class BuildHooks:
    """Where a caller may adjust the job while it is built (the estimator's CUDA stand-ins)."""

    meta_model: Callable[[nn.Module], None] | None = None
    """Called with the meta model once the resolved kernels are in place, before the plan is applied."""
    applied: Callable[[nn.Module, Meshes], None] | None = None
    """Called with each model part (the model, or this rank's pipeline stages) and the meshes right after `plan.apply`."""


def build_meshes(run: ResolvedRun, device_type: str) -> Meshes:
    """The job's meshes (the process group must exist with more than one rank, or when FSDP's
    mixed precision runs on one device, whose 1-device mesh this returns)."""
    if run.dims.world_size > 1:
        return build_device_meshes(run.dims, device_type)
    if run.choices.precision != "fsdp":
        return Meshes(run.dims, None)
    return Meshes(run.dims, init_device_mesh(device_type, (1,), mesh_dim_names=("dp_shard",)))


def build_job(
    run: ResolvedRun,
    device: torch.device,
    meshes: Meshes,
    *,
    tensor_mode: contextlib.AbstractContextManager | None = None,
    init_values: bool = True,
    hooks: BuildHooks | None = None,
    pipeline: Callable[[TrainingJob], PipelineExecutor] | None = None,
) -> TrainingJob:
    """Build the job on `device` over `meshes` (see the module docstring).

    `tensor_mode` is entered around everything that makes tensors (the estimator's
    FakeTensorMode; meshes and the plan are applied outside it, as a mesh reads its rank
    table's values). `init_values=False` computes only the buffers (RoPE tables).
    `pipeline` makes the pipeline executor (default: torch's schedule, PipelineRunner).
    """
    cfg, choices, hooks = run.cfg, run.choices, hooks or BuildHooks()
    with torch.device("meta"):
        model = run.spec.build(run.model_args)
    use_attention_kernel(model, choices.attention_backend, device)
    use_narrow_values(model, choices.narrow_values)
    use_eager_kernels(model, choices.eager_kernels)
    use_expert_kernel(model, choices.expert_kernel, choices.expert_gate)
    use_scan_kernel(model, choices.ssm_kernel)
    if hooks.meta_model is not None:
        hooks.meta_model(model)
    n_params, n_matmul = sum(p.numel() for p in model.parameters()), active_matmul_params(model)
    fused_loss = choices.fused_loss
    applied = run.plan.apply(model, meshes)
    if choices.precision != "float32" and applied.data_parallel.casts_params != (choices.precision == "fsdp"):
        raise AssertionError(f"resolve_run chose precision {choices.precision!r} but the plan's data parallel is "
                             f"{applied.data_parallel.kind}")
    if hooks.applied is not None:
        for part in applied.model_parts:
            hooks.applied(part, meshes)
    with tensor_mode or contextlib.nullcontext():
        for part in applied.model_parts:
            part.to_empty(device=device)
            if init_values:
                part.init_weights(buffer_device=device, seed=cfg.training.seed,
                                  parametrization=cfg.model.parametrization)
            else:
                # Fake tensors: init_weights' truncated normal asks data-dependent questions.
                part.init_buffers(device)
            part.train()
        # With master weights, building the optimizer turns the parameters bf16 (fp32 masters in its
        # state): all of them on one device, or the routed experts outside FSDP (Choices.expert_masters).
        masters_for = None
        if choices.expert_masters:  # None also where no expert is outside FSDP (an empty set)
            masters_for = unsharded_expert_params(model, meshes, run.plan.layout, run.plan.settings) or None
        factory = optimizer_factory(cfg.optimizer, choices.adamw,
                                    master_weights=choices.precision == "master_weights" or masters_for is not None,
                                    device_type=device.type,
                                    muon_tuning=(cfg.tuning.muon_redistribution, cfg.tuning.muon_compile),
                                    masters_for=masters_for)
        optimizers: list[Any] = []
        for part in applied.model_parts:
            groups = build_param_groups(part, cfg.optimizer, cfg.model.parametrization)
            if applied.data_parallel.kind == "zero1":
                optimizers.append(Zero1Optimizer(groups, applied.data_parallel.mesh, factory))
            else:
                optimizers.append(factory(groups))
    s = cfg.lr_scheduler
    schedule = LRSchedule(total_steps=cfg.training.steps, warmup_steps=s.warmup_steps, decay=s.decay,
                          min_lr_ratio=s.min_lr_ratio, decay_ratio=s.decay_ratio)
    block_masks = None
    if choices.attention_backend == "flex":
        eos_id = run.tokenizer.eos_id if cfg.data.document_masking else None
        block_masks = BlockMasks(eos_id, getattr(model, "sliding_window", None))
    job = TrainingJob(
        run=run, device=device, meshes=meshes, applied=applied, optimizers=optimizers,
        lr_schedulers=[], schedule=schedule,
        fused_loss=fused_loss,
        loss_chunk_fn=loss_chunk_step_for(choices.loss_kernel, vocab_parallel=run.dims.tp > 1) if fused_loss else None,
        block_masks=block_masks, n_params=n_params, matmul_params=n_matmul,
    )
    job.lr_schedulers = [build_lr_scheduler(o, schedule) for o in job.torch_optimizers]
    job.extensions = _extensions(job, pipeline or PipelineRunner, tensor_mode, hooks, init_values)
    check_one_runs_the_passes(job.extensions)
    return job


def _extensions(job: TrainingJob, pipeline: Callable[[TrainingJob], PipelineExecutor],
                tensor_mode: contextlib.AbstractContextManager | None, hooks: BuildHooks,
                init_values: bool) -> list[JobExtension]:
    """The optional features this job attaches, in the order their hooks run: the MoE routers'
    balancing first (its loss weights are set before any pass runs), then whatever runs the passes."""
    run, applied = job.run, job.applied
    out: list[JobExtension] = []
    if run.spec.is_moe:
        out.append(ExpertBalance(job))
    if getattr(run.model_args, "mtp_depth", 0):
        out.append(MultiTokenPrediction(job))
    if applied.stage_ids:
        out.append(PipelineExtension(pipeline(job)))
    gather = _early_gather(job)
    if gather is not None:
        out.append(EarlyGatherStep(gather))
    if run.cfg.doremi.reference:
        doremi = build_doremi(job, _reference_model(run, job.device, job.meshes, tensor_mode, hooks))
        if init_values:
            load_reference(doremi, run.cfg.doremi.reference)
        out.append(doremi)
    return out


def _reference_model(run: ResolvedRun, device: torch.device, meshes: Meshes,
                     tensor_mode: contextlib.AbstractContextManager | None, hooks: BuildHooks) -> nn.Module:
    """DoReMi's reference model: the proxy's shape under the same plan, its weights still to load."""
    with torch.device("meta"):
        model = run.spec.build(run.model_args)
    use_attention_kernel(model, run.choices.attention_backend, device)
    use_narrow_values(model, run.choices.narrow_values)
    use_eager_kernels(model, run.choices.eager_kernels)
    if hooks.meta_model is not None:
        hooks.meta_model(model)
    (part,) = run.plan.apply(model, meshes).model_parts  # DoReMi runs without pipeline parallel
    with tensor_mode or contextlib.nullcontext():
        part.to_empty(device=device)
        part.init_buffers(device)
    return part


def _early_gather(job: TrainingJob) -> EarlyGather | None:
    """The early all-gather where it applies: FSDP / HSDP sharding over more than one rank, one
    model part (no pipeline), one optimizer of its own (not ZeRO-1's)."""
    dp = job.applied.data_parallel
    if (not job.run.plan.settings.early_all_gather or dp.kind not in ("fsdp", "hsdp") or dp.mesh is None
            or dp.mesh.size() == 1 or job.applied.stage_ids or len(job.optimizers) != 1):
        return None
    return EarlyGather(job.model)


class EarlyGatherStep(JobExtension):
    """FSDP's early all-gather (parallel/early_gather.py) as the job's optimizer step: the
    first unit's parameters step first, their all-gather for the next forward starts, the rest
    step while it runs."""

    name = "early_gather"

    def __init__(self, gather: EarlyGather) -> None:
        self.gather = gather

    def step_optimizer(self, optimizer: Any) -> bool:
        self.gather.step(optimizer)
        return True

    def finish(self) -> None:
        self.gather.finish()  # no forward waits for the last step's all-gathers
