"""The trainer's job and step on a fake process group and fake tensors.

The job is built by the trainer's own builder (`kenotron.train.job.build_job`) from the
`ResolvedRun` that `resolve_run` makes for the GPU machine the config is planned for (its
choices: kernels, master weights, FSDP mixed precision on one GPU, torch's ring under context
parallel), inside a FakeTensorMode and on a fake process group; the step is the trainer's
`train_step` (kenotron/train/step.py) with the memory tracker as its observer. What differs
is only where the fake tensors live (the CPU) and the CUDA kernels a CPU cannot run, whose
allocations stand-ins reproduce (cuda_kernels.py), and the MoE layers' data-dependent shapes,
planned for even routing (moe_memory.py). Compile and float8 are left out
(`ignored_features`); the step runs at most two micro-steps (`simulated_micro_steps`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

from kenotron.data import MicroBatch
from kenotron.dtensor import forget_dtensor_caches
from kenotron.estimate.cp_ring_memory import use_flex_memory, use_torch_ring
from kenotron.estimate.cuda_kernels import use_fused_gate_memory, use_narrow_value_memory
from kenotron.estimate.moe_memory import plan_even_routing, use_moe_memory
from kenotron.train.job import BuildHooks, build_job, build_meshes
from kenotron.train.pipeline_step import PipelineExecutor
from kenotron.train.resolve import ResolvedRun
from kenotron.train.training_job import TrainingJob
from kenotron.train.vocab_parallel_loss import loss_chunk_step_for

FAKE_DEVICE = torch.device("cpu")
"""Where the fake tensors live; memory is counted as the target device's allocator would."""


def ignored_features(run: ResolvedRun) -> list[str]:
    """Config choices the fake step cannot reproduce, each with what is estimated instead."""
    notes = []
    if run.cfg.compile.enable:
        notes.append("compile.enable: blocks are estimated eager (compiled blocks usually keep fewer activations)")
    if run.cfg.float8.enable:
        notes.append("float8.enable: linear layers are estimated in bf16 (float8 keeps smaller activations)")
    if run.cfg.model.attention_backend in ("flex", "flash_attn") or run.cfg.data.document_masking:
        notes.append("flex / flash_attn attention: estimated as SDPA's fused kernels (none of them keeps the scores)")
    return notes


@contextlib.contextmanager
def fake_process_group(world_size: int, rank: int = 0):
    """A process group of `world_size` ranks in which this process is `rank`; collectives do nothing."""
    if dist.is_initialized():
        raise RuntimeError(
            "a process group already exists in this process; run the estimator in a process of its own "
            "(python estimation.py ...), not inside a training job"
        )
    forget_dtensor_caches()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()
        forget_dtensor_caches()


def estimated_run(run: ResolvedRun, n_layers: int | None = None) -> ResolvedRun:
    """The run the fake step builds: compile and float8 off (`ignored_features`), attention by
    SDPA, and `n_layers` blocks when given (for depth extrapolation)."""
    plan = run.plan.copy()
    plan.settings.compile, plan.settings.float8 = False, ""
    choices = run.choices
    if choices.attention_backend in ("flex", "flash_attn"):
        choices = dataclasses.replace(choices, attention_backend="auto")
    args = run.model_args
    if n_layers is not None and n_layers != args.n_layers:
        args = dataclasses.replace(args, n_layers=n_layers)
    return dataclasses.replace(run, plan=plan, choices=choices, model_args=args)


def build_fake_job(run: ResolvedRun, fake_mode: Any, pipeline: Any = None) -> TrainingJob:
    """Build `run`'s job inside an active fake process group, its tensors under `fake_mode`
    (`pipeline`: the estimator's replay of the schedule, under pipeline parallel)."""
    gate = run.choices.eager_kernels == "triton"

    def meta_model(model: torch.nn.Module) -> None:
        if gate:  # the fused Triton gate of eager CUDA runs, as its allocations
            use_fused_gate_memory(model)
        use_moe_memory(model, fused_gate=run.choices.fused_expert_gate)
        use_narrow_value_memory(model)  # MLA under Choices.narrow_values: cuDNN's allocations

    def applied(model: torch.nn.Module, meshes: Any) -> None:
        use_torch_ring(run, meshes)
        use_flex_memory(run, model)
        plan_even_routing(model)

    hooks = BuildHooks(meta_model=meta_model, applied=applied)
    meshes = build_meshes(run, FAKE_DEVICE.type)
    job = build_job(run, FAKE_DEVICE, meshes, tensor_mode=fake_mode, init_values=False, hooks=hooks, pipeline=pipeline)
    if job.loss_chunk_fn is not None and run.choices.loss_kernel == "compiled":  # the fused loss's (or the MTP heads')
        # Compiling would trace on fake tensors; PyTorch's ops allocate what the compiled step does
        # (the gradient in a buffer of its own beside the logits).
        job.loss_chunk_fn = loss_chunk_step_for("torch", vocab_parallel=run.dims.tp > 1 and job.fused_loss)
    return job


def simulated_micro_steps(run: ResolvedRun) -> int:
    """Micro-steps to simulate: a second one sees the gradients the first left; more repeat it."""
    return min(run.grad_accum_steps, 2)


class DeviceBatches:
    """Micro-batches of random token ids, each made on the device when the step asks for it (as
    the trainer copies the loader's CPU batches there), so a batch lives as long as it does there."""

    def __init__(self, run: ResolvedRun, micro_steps: int) -> None:
        self.run, self.micro_steps = run, micro_steps

    def __len__(self) -> int:
        return self.micro_steps

    def __getitem__(self, index: int) -> MicroBatch:
        if not 0 <= index < self.micro_steps:
            raise IndexError(index)
        t, vocab = self.run.cfg.training, self.run.model_args.vocab_size
        shape = (t.local_batch_size, t.seq_len)
        return MicroBatch(torch.randint(0, vocab, shape), torch.randint(0, vocab, shape))

    def __iter__(self) -> Iterator[MicroBatch]:
        return (self[i] for i in range(self.micro_steps))


__all__ = [
    "FAKE_DEVICE",
    "DeviceBatches",
    "PipelineExecutor",
    "build_fake_job",
    "estimated_run",
    "fake_process_group",
    "ignored_features",
    "simulated_micro_steps",
]
