"""The trainer's job on a fake process group and fake tensors, and its training step.

Built from the same pieces as `kenotron.train.trainer.Trainer`, in the same order: the
RunPlan from `resolve_run`, `dims.build_meshes` (or the trainer's 1-device FSDP mesh for bf16
on one GPU), the model on meta, `plan.apply`, `to_empty` (+ the buffers `init_weights` makes),
the optimizer from `optimizer_factory` + `param_groups` (in `Zero1Optimizer` for ZeRO-1), and
a step that mirrors `Trainer.forward_backward` + `clip_gradients` + `optimizer_step`.
The Trainer itself is not driven: its constructor also builds the tokenizer, the data loader,
the checkpoint manager and the metrics writer, and its step counts label tokens with
`.item()`, which fake tensors cannot answer.

Decisions that depend on the device are taken for the device the job would run on (CUDA,
unless training.device = "cpu"), while the fake tensors themselves live on the CPU: fused
AdamW, FSDP mixed precision on one GPU, and under context parallel torch's ring attention
(context.py) where the plan would pick kenotron's CPU ring. Compile and float8 are left out
(`ignored_features`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor.parallel import loss_parallel

from kenotron.estimate.context import use_torch_ring
from kenotron.estimate.cuda_kernels import use_fused_gate_memory
from kenotron.parallel.dims import Meshes
from kenotron.parallel.grad_norm import (
    clip_grads_,
    reduce_partial_grads_,
    total_grad_norm,
)
from kenotron.parallel.plan import AppliedPlan, matching_modules
from kenotron.parallel.zero1 import Zero1Optimizer
from kenotron.train.eager_kernels import resolve_eager_kernels
from kenotron.train.fused_loss import (
    chunk_fn_for,
    linear_cross_entropy_sum,
    resolve_loss_kernel,
)
from kenotron.train.loss import cross_entropy_sum
from kenotron.train.optim import optimizer_factory, param_groups
from kenotron.train.precision import single_device_fsdp, uses_master_weights
from kenotron.train.resolve import RunPlan
from kenotron.train.trainer import uses_fused_loss

FAKE_DEVICE = torch.device("cpu")
"""Where the fake tensors live; memory is counted as the target device's allocator would."""


def target_device(run: RunPlan) -> torch.device:
    """The device type the trainer would pick on a GPU machine."""
    return torch.device("cpu") if run.cfg.training.device == "cpu" else torch.device("cuda")


def fused_gate(run: RunPlan) -> bool:
    """Whether the trainer would run SwiGLU's gate as the fused Triton kernel (eager CUDA runs)."""
    kernels = resolve_eager_kernels(
        run.cfg.model.eager_kernels, target_device(run).type, run.cfg.compile.enable, triton_present=True
    )
    return kernels == "triton"


def loss_kernel(run: RunPlan) -> str:
    """The fused loss's chunk kernel the trainer would pick on the planned device."""
    return resolve_loss_kernel(
        run.cfg.training.loss_kernel, target_device(run).type, run.cfg.compile.enable, triton_present=True
    )


def loss_chunk_fn(run: RunPlan):
    """The fused loss's chunk step as the trainer would run it; the compiled one is simulated by
    PyTorch's ops (both give the gradient a buffer of its own beside the logits)."""
    kernel = loss_kernel(run)
    return chunk_fn_for("torch" if kernel == "compiled" else kernel)


def ignored_features(run: RunPlan) -> list[str]:
    """Config choices the fake step cannot reproduce, each with what is estimated instead."""
    notes = []
    if run.cfg.compile.enable:
        notes.append("compile.enable: blocks are estimated eager (compiled blocks usually keep fewer activations)")
    if run.cfg.float8.enable:
        notes.append("float8.enable: linear layers are estimated in bf16 (float8 keeps smaller activations)")
    if run.cfg.model.attention_backend in ("flex", "flash_attn") or run.cfg.data.document_masking:
        notes.append("flex / flash_attn attention: estimated as SDPA's fused kernels (none of them keeps the scores)")
    return notes


def forget_dtensor_caches() -> None:
    """Drop DTensor's caches of sharding decisions and redistribution plans.

    They are keyed by DeviceMesh, and meshes compare equal by shape and names, not by process
    group: after one fake process group is destroyed and another made (the next estimate in
    this process), a cached decision would hand back a mesh whose groups no longer exist.
    The names differ between torch versions, so each cache is cleared if it exists.
    """
    from torch.distributed.tensor import DTensor, debug

    clear_all = getattr(debug, "_clear_sharding_prop_cache", None)
    if clear_all is not None:  # the Python cache and the C++ fast path's
        clear_all()
    propagator = DTensor._op_dispatcher.sharding_propagator
    for name in ("propagate_op_sharding", "_propagate_tensor_meta_cached", "_propagate_tensor_meta"):
        clear = getattr(getattr(propagator, name, None), "cache_clear", None)
        if clear is not None:
            clear()
    try:
        from torch.distributed.tensor._redistribute import (
            clear_redistribute_planner_cache,
        )
    except ImportError:
        return
    clear_redistribute_planner_cache()


@contextlib.contextmanager
def fake_process_group(world_size: int, rank: int = 0):
    """A process group of `world_size` ranks in which this process is `rank`; collectives do nothing."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

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


@dataclass
class FakeJob:
    """A job as the trainer builds it, on fake tensors."""

    run: RunPlan
    """The resolved config the job comes from (its model args may have fewer layers, see build_fake_job)."""
    meshes: Meshes
    """The job's meshes on the fake process group."""
    model: nn.Module
    """The parallelized model (FSDP/TP applied), with fake parameters."""
    applied: AppliedPlan
    """What plan.apply did (data-parallel kind and mesh, loss parallel)."""
    optimizer: Any
    """The torch optimizer, or a Zero1Optimizer."""
    use_autocast: bool
    """bf16 through autocast (no FSDP casting the parameters), as the trainer decides."""
    compute_dtype: torch.dtype
    """Matmul dtype of the fused loss."""
    fused_loss: bool
    """Whether the chunked linear + cross-entropy loss replaces the output layer."""

    @property
    def blocks(self) -> list[nn.Module]:
        return [m for _, m in matching_modules(self.model, self.run.plan.blocks)]

    def optimizer_state(self) -> list[torch.Tensor]:
        inner = self.optimizer.inner if isinstance(self.optimizer, Zero1Optimizer) else self.optimizer
        return [v for s in inner.state.values() for v in s.values() if isinstance(v, torch.Tensor)]


def _build_meshes(run: RunPlan, device: torch.device) -> Meshes:
    """Trainer._build_meshes on the fake group: one device with FSDP mixed precision gets a 1-device mesh."""
    if run.dims.world_size > 1:
        return run.dims.build_meshes(FAKE_DEVICE.type)
    if not single_device_fsdp(run, device):
        return Meshes(run.dims, None)
    from torch.distributed.device_mesh import init_device_mesh

    return Meshes(run.dims, init_device_mesh(FAKE_DEVICE.type, (1,), mesh_dim_names=("dp_shard",)))


def _hidden_states(h: torch.Tensor) -> torch.Tensor:
    return h


def build_fake_job(run: RunPlan, fake_mode: Any, n_layers: int | None = None) -> FakeJob:
    """Build the job inside an active fake process group; tensors are made under `fake_mode`.

    The meshes and the plan are built outside the FakeTensorMode (a mesh reads its rank
    table's values). `n_layers` builds the same model with fewer blocks (for depth
    extrapolation); None keeps the configured depth.
    """
    cfg = run.cfg
    device = target_device(run)
    if n_layers is not None and n_layers != run.model_args.n_layers:
        run = dataclasses.replace(run, model_args=dataclasses.replace(run.model_args, n_layers=n_layers))
    # Left out: compiling would trace the tracker's module hooks and take minutes on a CPU, and
    # float8 needs torchao (an optional extra); the report says so (ignored_features).
    plan = dataclasses.replace(run.plan.copy(), compile=False, float8="")
    run = dataclasses.replace(run, plan=plan)
    meshes = _build_meshes(run, device)
    with torch.device("meta"):
        model = run.spec.build(run.model_args)
    if fused_gate(run):
        use_fused_gate_memory(model)
    applied = plan.apply(model, meshes)
    # Context parallel: the plan chose kenotron's ring for the CPU mesh; a CUDA job runs torch's.
    use_torch_ring(model, meshes, run, device)
    master_weights = uses_master_weights(run, device.type)  # bf16 parameters: no autocast
    with fake_mode:
        model.to_empty(device=FAKE_DEVICE)
        # Weight values do not change memory, and init_weights' truncated normal asks data-dependent
        # questions fake tensors cannot answer; only the buffers (RoPE tables) are computed.
        model.init_buffers(FAKE_DEVICE)
        model.train()
        factory = optimizer_factory(cfg.optimizer, device.type, master_weights=master_weights)
        groups = param_groups(model, cfg.optimizer.weight_decay)
        if applied.data_parallel.kind == "zero1":
            optimizer: Any = Zero1Optimizer(groups, applied.data_parallel.mesh, factory)
        else:
            optimizer = factory(groups)
    bf16 = cfg.training.param_dtype == "bfloat16"
    fused = uses_fused_loss(cfg.training.loss, meshes.get("tp") is not None, model)
    if fused:
        model.output.forward = _hidden_states  # type: ignore[union-attr,method-assign]
    return FakeJob(
        run=run, meshes=meshes, model=model, applied=applied, optimizer=optimizer,
        use_autocast=bf16 and not applied.data_parallel.casts_params and not master_weights,
        compute_dtype=torch.bfloat16 if bf16 else torch.float32, fused_loss=fused,
    )


class StepObserver(Protocol):
    """What the step reports to a memory tracker (see tracker.StepMemoryTracker)."""

    def set_phase(self, phase: str, micro_step: int = 0) -> None: ...

    def end_forward(self) -> None: ...

    def end_backward(self) -> None: ...

    def mark_gradients(self, params: Any) -> None: ...


class NoObserver:
    """A StepObserver that ignores everything (the warm-up step)."""

    def set_phase(self, phase: str, micro_step: int = 0) -> None:
        pass

    def end_forward(self) -> None:
        pass

    def end_backward(self) -> None:
        pass

    def mark_gradients(self, params: Any) -> None:
        pass


def simulated_micro_steps(run: RunPlan) -> int:
    """Micro-steps to simulate: a second one sees the gradients the first left; more repeat it."""
    return min(run.grad_accum_steps, 2)


def _device_batch(job: FakeJob) -> torch.Tensor:
    """One micro-batch of token ids on the device, as the trainer's `.to(device)` makes it."""
    t = job.run.cfg.training
    return torch.randint(0, job.run.model_args.vocab_size, (t.local_batch_size, t.seq_len))


def forward_backward(job: FakeJob, micro_steps: int, observer: StepObserver) -> None:
    """Trainer.forward_backward, with the observer told where the step is.

    Variables live as long as they do there: the previous micro-step's output and loss stay
    referenced while the next micro-step's forward runs. Batches are made on the device in
    each micro-step, as the trainer copies them there (the loader's CPU tensors are not GPU memory).
    """
    cfg, model = job.run.cfg, job.model
    label_tokens = job.run.global_batch_size * cfg.training.seq_len
    autocast = torch.autocast(FAKE_DEVICE.type, dtype=torch.bfloat16, enabled=job.use_autocast)
    loss_context = loss_parallel if job.applied.loss_parallel else contextlib.nullcontext
    for i in range(micro_steps):
        observer.set_phase("forward", i)
        job.applied.data_parallel.set_microstep(model, is_last=i == micro_steps - 1)
        inputs, labels = _device_batch(job), _device_batch(job)
        positions = None
        if job.applied.sequence_sharder is not None:
            # Context parallel: this rank's seq_len / cp tokens and labels, and their global positions.
            shard = job.applied.sequence_sharder.shard(inputs, labels)
            inputs, labels, positions = shard.inputs, shard.labels, shard.positions
        with loss_context():
            with autocast:
                out = model(inputs) if positions is None else model(inputs, positions)
            if job.fused_loss:
                loss_sum = linear_cross_entropy_sum(
                    out, model.output.weight, labels, chunk_tokens=cfg.training.loss_chunk_tokens,
                    compute_dtype=job.compute_dtype, chunk_fn=loss_chunk_fn(job.run),
                )
            else:
                loss_sum = cross_entropy_sum(out, labels)
            loss = loss_sum / label_tokens
            observer.end_forward()
            observer.set_phase("backward", i)
            (loss * job.applied.data_parallel.averaging_size).backward()
        observer.end_backward()
        observer.mark_gradients(model.parameters())


def clip_and_step(job: FakeJob, observer: StepObserver) -> None:
    """Trainer.clip_gradients + optimizer_step (the LR schedule holds no tensors)."""
    observer.set_phase("optimizer")
    params = [p for p in job.model.parameters() if p.grad is not None]
    reduce_partial_grads_(params)
    grads = [p.grad for p in params]
    norm = total_grad_norm(grads, pp_mesh=job.meshes.get("pp"))
    if job.run.cfg.training.max_norm > 0:
        clip_grads_(grads, job.run.cfg.training.max_norm, norm)
    observer.mark_gradients(job.model.parameters())
    job.optimizer.step()
    job.optimizer.zero_grad(set_to_none=True)


def train_step(job: FakeJob, observer: StepObserver | None = None) -> None:
    """One optimizer step of the simulated micro-steps (inside the job's FakeTensorMode)."""
    observer = observer or NoObserver()
    forward_backward(job, simulated_micro_steps(job.run), observer)
    clip_and_step(job, observer)

