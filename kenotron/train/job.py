"""The job builder: from a resolved run to the parallelized model, its optimizers and schedules.

    run = resolve_run(cfg, world_size, Target.of(device))   # every check and choice, no process group
    meshes = build_meshes(run, device.type)                 # needs the process group
    job = build_job(run, device, meshes)
    loss, grad_norm = train_step(job, microbatches)          # kenotron/train/step.py

`build_job` follows the recipe's order: model on the meta device, the resolved kernels put
in place (attention, eager RoPE/SwiGLU, Mamba's scan), `plan.apply` (pipeline split -> TP/SP -> CP -> AC ->
compile -> FSDP), materialize and initialize (seeded identically on every rank), one optimizer
and LR scheduler per model part, the pipeline executor, the early all-gather and the loss.
The trainer calls it as it is; the memory estimator calls it under its fake process group
with `tensor_mode` a FakeTensorMode, `init_values=False` (values do not change memory) and
`hooks` that swap CUDA kernels for stand-ins with their allocations.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from kenotron.data import MicroBatch
from kenotron.kernel_choice.attention_backend import BlockMasks, use_attention_kernel
from kenotron.models.common.eager_kernels import use_eager_kernels, use_expert_kernel
from kenotron.models.common.mamba import use_scan_kernel
from kenotron.models.common.parametrization import spectral_lr_scales
from kenotron.parallel.dims import Meshes
from kenotron.parallel.early_gather import EarlyGather
from kenotron.parallel.model_layout import matching_modules
from kenotron.parallel.plan import AppliedPlan
from kenotron.parallel.zero1 import Zero1Optimizer
from kenotron.train.doremi import DoReMi, build_doremi, load_reference
from kenotron.train.expert_balance import build_expert_balance
from kenotron.train.flops import active_matmul_params
from kenotron.train.fused_loss import chunk_fn_for
from kenotron.train.lr_schedule import LRSchedule, build_lr_scheduler
from kenotron.train.optim import optimizer_factory, param_groups
from kenotron.train.resolve import ResolvedRun


class PipelineExecutor(Protocol):
    """Runs forward and backward of one step through this rank's pipeline stages (the trainer's
    is torch's schedule, train/pipeline_step.py; the estimator replays it on fake tensors)."""

    def forward_backward(self, microbatches: Sequence[MicroBatch], observer: Any) -> torch.Tensor: ...

    def norm_duplicates(self) -> set[int]: ...


@dataclass
class BuildHooks:
    """Where a caller may adjust the job while it is built (the estimator's CUDA stand-ins)."""

    meta_model: Callable[[nn.Module], None] | None = None
    """Called with the meta model once the resolved kernels are in place, before the plan is applied."""
    applied: Callable[[nn.Module, Meshes], None] | None = None
    """Called with each model part (the model, or this rank's pipeline stages) and the meshes right after `plan.apply`."""


@dataclass
class Job:
    """A built job: everything one training step needs, and nothing about data or storage."""

    run: ResolvedRun
    """The resolved config the job was built from."""
    device: torch.device
    """Where the tensors live."""
    meshes: Meshes
    applied: AppliedPlan
    """What plan.apply made: the model parts this rank runs and how they are wrapped."""
    optimizers: list[Any]
    """One optimizer per model part (a Zero1Optimizer under ZeRO-1)."""
    lr_schedulers: list[Any]
    """One LambdaLR per optimizer, following `schedule`."""
    schedule: LRSchedule
    fused_loss: bool
    """The model stops at its final norm and the loss applies the output weight in chunks."""
    loss_chunk_fn: Callable | None
    """The fused loss's chunk step (None: PyTorch's ops)."""
    block_masks: BlockMasks | None
    """FlexAttention: one BlockMask per micro-batch, shared by every layer."""
    pipeline: PipelineExecutor | None = None
    early_gather: EarlyGather | None = None
    grad_divisor: torch.Tensor | None = None
    """Set by clip_gradients when the optimizers clip inside their kernel; used once by optimizer_step."""
    n_params: int = 0
    """Parameters of the whole model (all stages)."""
    matmul_params: int = 0
    """Parameters that enter matrix products for each token (what the FLOP count uses, train/flops.py):
    an MoE layer counts its top-k routed experts, not all of them."""
    experts: Any = None
    """train/expert_balance.ExpertBalance of a model with MoE layers (None otherwise)."""
    doremi: DoReMi | None = None
    """A DoReMi proxy run's reference model and domain weights (doremi.reference; train/doremi.py)."""

    @property
    def model_parts(self) -> list[nn.Module]:
        """One module per local pipeline stage; without pipeline parallel, the model itself."""
        return self.applied.model_parts

    @property
    def model(self) -> nn.Module:
        """The whole model, or this rank's first stage."""
        return self.applied.model_parts[0]

    @property
    def use_autocast(self) -> bool:
        return self.run.choices.precision == "autocast"

    @property
    def compute_dtype(self) -> torch.dtype:
        return self.run.choices.compute_dtype

    def blocks(self) -> list[nn.Module]:
        """The blocks of every local model part, in order."""
        return [m for part in self.model_parts for _, m in matching_modules(part, self.run.plan.layout.blocks)]

    @property
    def torch_optimizers(self) -> list[torch.optim.Optimizer]:
        """The torch optimizers (a ZeRO-1 wrapper's inner one): what schedules and checkpoints hold."""
        return [o.inner if isinstance(o, Zero1Optimizer) else o for o in self.optimizers]

    def optimizer_state(self) -> list[torch.Tensor]:
        return [v for o in self.torch_optimizers for s in o.state.values() for v in s.values()
                if isinstance(v, torch.Tensor)]


def build_meshes(run: ResolvedRun, device_type: str) -> Meshes:
    """The job's meshes (the process group must exist with more than one rank, or when FSDP's
    mixed precision runs on one device, whose 1-device mesh this returns)."""
    if run.dims.world_size > 1:
        return run.dims.build_meshes(device_type)
    if run.choices.precision != "fsdp":
        return Meshes(run.dims, None)
    from torch.distributed.device_mesh import init_device_mesh

    return Meshes(run.dims, init_device_mesh(device_type, (1,), mesh_dim_names=("dp_shard",)))


def _hidden_states(h: torch.Tensor) -> torch.Tensor:
    return h


def build_job(
    run: ResolvedRun,
    device: torch.device,
    meshes: Meshes,
    *,
    tensor_mode: contextlib.AbstractContextManager | None = None,
    init_values: bool = True,
    hooks: BuildHooks | None = None,
    pipeline: Callable[[Job], PipelineExecutor] | None = None,
) -> Job:
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
    use_eager_kernels(model, choices.eager_kernels)
    use_expert_kernel(model, choices.expert_kernel)
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
        # With master weights, building the optimizer turns the parameters bf16 (fp32 masters in its state).
        factory = optimizer_factory(cfg.optimizer, choices.adamw, master_weights=choices.precision == "master_weights")
        optimizers: list[Any] = []
        for part in applied.model_parts:
            scales = spectral_lr_scales(part) if cfg.model.parametrization == "spectral_mup" else None
            groups = param_groups(part, cfg.optimizer.weight_decay, cfg.optimizer.lr, scales)
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
    if fused_loss:
        for part in applied.model_parts:  # the model stops at the final norm; the loss applies the output weight
            part.output.forward = _hidden_states  # type: ignore[union-attr,method-assign]
    job = Job(
        run=run, device=device, meshes=meshes, applied=applied, optimizers=optimizers,
        lr_schedulers=[], schedule=schedule,
        fused_loss=fused_loss, loss_chunk_fn=chunk_fn_for(choices.loss_kernel) if fused_loss else None,
        block_masks=block_masks, n_params=n_params, matmul_params=n_matmul,
    )
    job.lr_schedulers = [build_lr_scheduler(o, schedule) for o in job.torch_optimizers]
    if applied.stage_ids:
        if pipeline is None:
            from kenotron.train.pipeline_step import PipelineRunner

            pipeline = PipelineRunner
        job.pipeline = pipeline(job)
    job.early_gather = _early_gather(job)
    job.experts = build_expert_balance(job)
    if cfg.doremi.reference:
        job.doremi = build_doremi(job, _reference_model(run, device, meshes, tensor_mode, hooks))
        if init_values:
            load_reference(job)
    return job


def _reference_model(run: ResolvedRun, device: torch.device, meshes: Meshes,
                     tensor_mode: contextlib.AbstractContextManager | None, hooks: BuildHooks) -> nn.Module:
    """DoReMi's reference model: the proxy's shape under the same plan, its weights still to load."""
    with torch.device("meta"):
        model = run.spec.build(run.model_args)
    use_attention_kernel(model, run.choices.attention_backend, device)
    use_eager_kernels(model, run.choices.eager_kernels)
    if hooks.meta_model is not None:
        hooks.meta_model(model)
    (part,) = run.plan.apply(model, meshes).model_parts  # DoReMi runs without pipeline parallel
    with tensor_mode or contextlib.nullcontext():
        part.to_empty(device=device)
        part.init_buffers(device)
    return part


def _early_gather(job: Job) -> EarlyGather | None:
    """The early all-gather where it applies: FSDP / HSDP sharding over more than one rank, one
    model part, one optimizer of its own (not ZeRO-1's)."""
    dp = job.applied.data_parallel
    if (not job.run.plan.settings.early_all_gather or dp.kind not in ("fsdp", "hsdp") or dp.mesh is None
            or dp.mesh.size() == 1 or job.pipeline is not None or len(job.optimizers) != 1):
        return None
    return EarlyGather(job.model)
