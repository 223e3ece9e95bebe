"""One training step of a built Job: forward/backward (or the pipeline schedule), loss scaling,
gradient clipping, optimizer step. The trainer runs it on real batches; the memory estimator
runs the same functions on fake tensors, with a `StepObserver` told where the step is.

    loss = forward_backward(job, microbatches)     # this rank's share of the step's mean loss
    grad_norm = clip_gradients(job)                # global L2 norm, before clipping
    optimizer_step(job)                            # every part's optimizer and LR schedule
    val = eval_loss(job, microbatches)             # validation: forward and loss only

The loss: every micro-batch's summed token cross-entropy is divided by the label tokens of
the whole global batch, so each token weighs the same whatever the layout; data parallel
averages gradients over its ranks, so the back-propagated loss is multiplied by that averaging
size (the backends' native averaging collectives stay; gloo has no pre-multiplied sum).

This is the plain step. The job's extensions (train/extension.py) hook into it: the pipeline
schedule and DoReMi run the passes themselves, the MoE routers' balancing sets its loss
weights before them and updates the biases after the optimizer step, FSDP's early all-gather
steps the optimizer in its own order.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import torch
from torch.distributed.tensor.parallel import loss_parallel

from kenotron.data import MicroBatch
from kenotron.dtensor import full_tensor
from kenotron.kernel_choice.attention_backend import attention_context
from kenotron.parallel.grad_norm import (
    clip_divisor,
    clip_grads_,
    optimizer_unscales_gradients,
    reduce_partial_grads_,
    total_grad_norm,
)
from kenotron.train.fused_loss import linear_cross_entropy_sum
from kenotron.train.loss import IGNORE_INDEX, cross_entropy_sum
from kenotron.train.training_job import TrainingJob
from kenotron.train.vocab_parallel_loss import vocab_parallel_linear_cross_entropy_sum


class StepObserver(Protocol):
    """What the step reports as it runs (the estimator's memory tracker implements it)."""

    def set_phase(self, phase: str, micro_step: int = 0) -> None: ...

    def end_forward(self) -> None: ...

    def end_backward(self) -> None: ...

    def mark_gradients(self, params: Any) -> None: ...


class NoObserver:
    """A StepObserver that ignores everything (the trainer's)."""

    def set_phase(self, phase: str, micro_step: int = 0) -> None:
        pass

    def end_forward(self) -> None:
        pass

    def end_backward(self) -> None:
        pass

    def mark_gradients(self, params: Any) -> None:
        pass


NO_OBSERVER = NoObserver()


@contextlib.contextmanager
def step_context(job: TrainingJob) -> Iterator[None]:
    """Around forward and backward: vocab-parallel loss, the attention kernel, bf16 autocast."""
    lp = loss_parallel() if job.applied.loss_parallel else contextlib.nullcontext()
    autocast = torch.autocast(job.device.type, dtype=torch.bfloat16, enabled=job.use_autocast)
    with lp, attention_context(job.run.choices.attention_backend, job.device), autocast:
        yield


def label_tokens(job: TrainingJob, seq_len: int | None = None) -> int:
    """The loss's denominator: label tokens of the whole global batch (of `seq_len`-token
    sequences: a data stage may set a shorter one than training.seq_len)."""
    return job.run.global_batch_size * (seq_len or job.run.cfg.training.seq_len)


def microbatch_loss(job: TrainingJob, output: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """What a model part that ends in logits back-propagates for one micro-batch (or pipeline
    microbatch): its summed token loss over the global label count, times the data-parallel
    averaging size. `labels` are this rank's part of every sequence: whole sequences, or under
    context parallel the cp shard (the pipeline shards before its schedule splits the batch)."""
    denominator = label_tokens(job, labels.shape[-1] * job.run.dims.cp)
    return cross_entropy_sum(output, labels) / denominator * job.applied.data_parallel.averaging_size


def check_label_tokens(job: TrainingJob, microbatches: Sequence[MicroBatch]) -> None:
    """Packed windows never hold ignored labels: each rank has its exact share of the global
    count that the loss divides by. Anything else would need a global count: refuse it.
    (Pipeline stages without the loss get no labels: nothing to check.)"""
    if microbatches[0].labels is None:
        return
    expected = label_tokens(job, microbatches[0].labels.shape[-1]) // job.run.dims.dp
    local = sum(int((mb.labels != IGNORE_INDEX).sum()) for mb in microbatches)
    if local != expected:
        raise RuntimeError(f"expected {expected} label tokens per rank, got {local}")


def extension_inputs(job: TrainingJob, inputs: torch.Tensor) -> dict[str, torch.Tensor]:
    """The extensions' keyword inputs of the model (JobExtension.model_inputs) for a micro-batch's
    whole token ids on the device, cut along the sequence as context parallel cuts the tokens."""
    kwargs: dict[str, torch.Tensor] = {}
    for ext in job.extensions:
        kwargs.update(ext.model_inputs(inputs))
    sharder = job.applied.sequence_sharder
    if sharder is not None and kwargs:
        layout = sharder.layout(inputs.shape[1])
        kwargs = {name: layout.shard(value, sharder.rank) for name, value in kwargs.items()}
    return kwargs


def microbatch_forward(job: TrainingJob, mb: MicroBatch, denominator: int) -> torch.Tensor:
    """One micro-batch through the (unpipelined) model and the loss, inside step_context: its
    summed token loss over `denominator`, this rank's share (context parallel included)."""
    model, applied = job.model, job.applied
    inputs = mb.inputs.to(job.device, non_blocking=True)
    labels = mb.labels.to(job.device, non_blocking=True)
    kwargs: dict[str, Any] = extension_inputs(job, inputs)
    if applied.sequence_sharder is not None:
        # Context parallel: the document ids of the whole sequence (document masking), then this
        # rank's tokens and labels, and their global RoPE positions.
        documents = job.block_masks.documents(inputs) if job.block_masks is not None else None
        if documents is not None:
            kwargs["block_mask"] = documents
        shard = applied.sequence_sharder.shard(inputs, labels)
        inputs, labels, kwargs["positions"] = shard.inputs, shard.labels, shard.positions
    elif job.block_masks is not None:
        kwargs["block_mask"] = job.block_masks(inputs)
    if job.fused_loss:  # the model stops at its final norm; the loss applies the output weight chunk by chunk
        return fused_loss_sum(job, model(inputs, logits=False, **kwargs), labels) / denominator
    return cross_entropy_sum(model(inputs, **kwargs), labels) / denominator


def fused_loss_sum(job: TrainingJob, normed: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The summed token loss of the final norm's output `normed` by the fused chunked loss: over the
    vocabulary shards of the output weight under tensor parallel (its "output" style's Shard(0))."""
    model, chunk_tokens = job.model, job.run.choices.loss_chunk_tokens
    if job.run.dims.tp > 1:
        plan = job.run.plan
        # A local `normed` is laid out as the output layer's input would be (parallel/tensor.py's "output").
        sequence_parallel = plan.layout.sequence_parallel_at("output", plan.settings.sequence_parallel)
        return vocab_parallel_linear_cross_entropy_sum(
            normed, model.output.weight, labels, sequence_parallel=sequence_parallel, chunk_tokens=chunk_tokens,
            compute_dtype=job.compute_dtype, step=job.loss_chunk_fn,
        )
    return linear_cross_entropy_sum(normed, model.output.weight, labels, chunk_tokens=chunk_tokens,
                                    compute_dtype=job.compute_dtype, chunk_fn=job.loss_chunk_fn)


def forward_backward(job: TrainingJob, microbatches: Sequence[MicroBatch], observer: StepObserver = NO_OBSERVER) -> torch.Tensor:
    """Accumulate this rank's gradients over its micro-batches.

    Returns this rank's share of the step loss (sum of token losses / global token count),
    detached; summed over the data- and context-parallel ranks (each cp rank holds part of
    every sequence) it is the step's mean loss. Under pipeline parallel the job's pipeline
    runs the schedule instead (0 on ranks without the last stage), a DoReMi proxy its two passes.
    """
    for ext in job.extensions:
        ext.before_forward_backward(microbatches)
    loss = _extension_passes(job, microbatches, observer)
    if loss is None:
        loss = plain_forward_backward(job, microbatches, observer)
    for ext in job.extensions:
        ext.after_forward_backward()
    return loss


def _extension_passes(job: TrainingJob, microbatches: Sequence[MicroBatch], observer: StepObserver) -> torch.Tensor | None:
    """The loss of the extension that runs the passes itself (at most one, build_job checks), or None."""
    for ext in job.extensions:
        loss = ext.forward_backward(microbatches, observer)
        if loss is not None:
            return loss
    return None


def plain_forward_backward(job: TrainingJob, microbatches: Sequence[MicroBatch],
                           observer: StepObserver = NO_OBSERVER) -> torch.Tensor:
    """forward_backward's passes over the unpipelined model, micro-batch by micro-batch."""
    model, applied = job.model, job.applied
    total = torch.zeros((), device=job.device)
    n = len(microbatches)
    denominator = label_tokens(job, microbatches[0].labels.shape[-1])
    for i in range(n):
        observer.set_phase("forward", i)
        applied.data_parallel.set_microstep(model, is_last=i == n - 1)
        with step_context(job):
            loss = microbatch_forward(job, microbatches[i], denominator)
            observer.end_forward()
            observer.set_phase("backward", i)
            # Data parallel averages gradients over ranks; the loss wants their sum.
            (loss * applied.data_parallel.averaging_size).backward()
        observer.end_backward()
        observer.mark_gradients(model.parameters())
        total += full_tensor(loss.detach())
    return total


@torch.no_grad()
def eval_loss(job: TrainingJob, microbatches: Sequence[MicroBatch]) -> torch.Tensor:
    """The step's forward and loss without backward, for validation: this rank's share of the
    batch's mean token loss, as forward_backward returns it (summed over the data-, context- and
    pipeline-parallel ranks it is the batch's mean loss). No gradient is touched. Under pipeline
    parallel the schedule runs forward only (0 on ranks without the last stage)."""
    for ext in job.extensions:
        loss = ext.eval_loss(microbatches)
        if loss is not None:
            return loss
    total = torch.zeros((), device=job.device)
    denominator = label_tokens(job, microbatches[0].labels.shape[-1])
    for mb in microbatches:
        with step_context(job):
            total += full_tensor(microbatch_forward(job, mb, denominator))
    return total


def clip_gradients(job: TrainingJob, observer: StepObserver = NO_OBSERVER) -> torch.Tensor:
    """Global L2 norm of all gradients; scaled down to training.max_norm when above it: in place,
    or, when every optimizer divides by its `grad_scale` inside its kernel (torch's GradScaler
    protocol), by handing each optimizer the divisor, which its next step uses and optimizer_step
    clears."""
    observer.set_phase("optimizer")
    params = [p for part in job.model_parts for p in part.parameters() if p.grad is not None]
    reduce_partial_grads_(params)
    grads = [p.grad for p in params]
    # A weight tied across pipeline stages has one copy per stage: its norm counts once.
    duplicates = set().union(*(ext.norm_duplicates() for ext in job.extensions))
    norm = total_grad_norm([p.grad for p in params if id(p) not in duplicates], pp_mesh=job.meshes.get("pp"),
                           kernel=job.run.choices.grad_norm_kernel)
    max_norm = job.run.cfg.training.max_norm
    if max_norm > 0:
        if all(optimizer_unscales_gradients(o) for o in job.optimizers):
            divisor = clip_divisor(max_norm, norm)
            for optimizer in job.optimizers:
                optimizer.grad_scale = divisor
        else:
            clip_grads_(grads, max_norm, norm)
    observer.mark_gradients(params)
    return norm


def optimizer_step(job: TrainingJob, before_update: Callable[[], None] | None = None) -> None:
    """Every part's optimizer step (clipping inside the kernel when clip_gradients handed it a
    divisor), its LR schedule step, and zeroed gradients. `before_update` runs first (the
    trainer waits there for a background checkpoint copy of the weights)."""
    if before_update is not None:
        before_update()
    for optimizer, lr_scheduler in zip(job.optimizers, job.lr_schedulers):
        if not any(ext.step_optimizer(optimizer) for ext in job.extensions):
            optimizer.step()
        optimizer.grad_scale = None  # the divisor is for this step only
        lr_scheduler.step()
        optimizer.zero_grad(set_to_none=True)
    for ext in job.extensions:
        ext.after_optimizer_step()


def train_step(
    job: TrainingJob,
    microbatches: Sequence[MicroBatch],
    observer: StepObserver = NO_OBSERVER,
    before_update: Callable[[], None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """forward_backward + clip_gradients + optimizer_step; returns (loss share, grad norm)."""
    loss = forward_backward(job, microbatches, observer)
    grad_norm = clip_gradients(job, observer)
    optimizer_step(job, before_update)
    return loss, grad_norm
