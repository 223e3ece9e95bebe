"""The trainer's forward/backward under pipeline parallel: one schedule step per micro-step.

Words: the trainer's *micro-steps* are gradient-accumulation steps (the loader's MicroBatch
list); the schedule cuts each micro-step's local batch into `pp_microbatches` pipeline
*microbatches*. Only the first stage is fed token ids and only the last stage labels; the
middle stages get nothing from the loader. Under context parallel both are this cp rank's
shard of every sequence (the head-tail layout), cut before the schedule splits the batch; the
stages' RoPE positions come from `feed_positions` (kenotron/parallel/pipeline.py).

The loss: the schedule calls `loss_fn` once per microbatch on the last stage and
back-propagates its value as it is (scale_grads=False). It is the step's `microbatch_loss`
(train/step.py): the summed token cross-entropy over the global batch's token count, times
the data-parallel averaging size, so gradients match whatever the split. The loss is the plain one
(full logits of one microbatch): the fused chunked loss reads the output weight outside the
stage's forward, where the pipeline's FSDP policy may have resharded it, and the logits of a
microbatch are already a fraction of a micro-step's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch
import torch.distributed as dist

from kenotron.data import MicroBatch
from kenotron.dtensor import full_tensor
from kenotron.models.common.router import TopKRouter
from kenotron.parallel.context.documents import SequenceDocuments
from kenotron.parallel.pipeline import build_schedule
from kenotron.parallel.pipeline_tied import TiedAcrossStages
from kenotron.train.extension import JobExtension
from kenotron.train.step import extension_inputs, microbatch_loss, step_context
from kenotron.train.training_job import TrainingJob

RETURN_OUTPUTS = False
"""Whether `schedule.step()` keeps and returns the last stage's outputs. torch's default (True)
keeps every microbatch's logits until the step ends and concatenates them: for Llama-3.2-1B
with 16 microbatches of 4096 tokens, 2 x 15.7 GiB of the last stage's 39 GiB, for a value the
trainer never reads (the losses come through `losses`). The estimator simulates the same
choice (kenotron/estimate/pipeline_replay.py)."""


class PipelineExecutor(Protocol):
    """Runs forward and backward of one step through this rank's pipeline stages (the trainer's
    is torch's schedule, PipelineRunner; the estimator replays it on fake tensors)."""

    def forward_backward(self, microbatches: Sequence[MicroBatch], observer: Any) -> torch.Tensor: ...

    def norm_duplicates(self) -> set[int]: ...


class PipelineExtension(JobExtension):
    """The job's pipeline: its executor runs the step's passes (and validation's, where it can)."""

    name = "pipeline"

    def __init__(self, executor: PipelineExecutor) -> None:
        self.executor = executor

    def forward_backward(self, microbatches: Sequence[MicroBatch], observer: Any) -> torch.Tensor:
        return self.executor.forward_backward(microbatches, observer)

    def eval_loss(self, microbatches: Sequence[MicroBatch]) -> torch.Tensor:
        return self.executor.eval_loss(microbatches)  # type: ignore[attr-defined]

    def norm_duplicates(self) -> set[int]:
        return self.executor.norm_duplicates()


class PipelineRunner:
    """Owns the schedule of this rank's stages and runs the micro-steps of one optimizer step
    (the job's PipelineExecutor on real devices)."""

    def __init__(self, job: TrainingJob) -> None:
        applied = job.applied
        split = applied.plan.pipeline
        pp_mesh = applied.meshes.get("pp")
        if split is None or pp_mesh is None:
            raise ValueError("PipelineRunner needs a plan with a pipeline split applied on a mesh with a pp dimension")
        self.job = job
        self.has_first_stage = 0 in applied.stage_ids
        self.has_last_stage = split.n_stages - 1 in applied.stage_ids
        self.schedule = build_schedule(
            split, applied.model_parts, applied.stage_ids, pp_mesh.get_group(), job.device,
            lambda output, labels: microbatch_loss(job, output, labels),
        )
        self.tied = TiedAcrossStages(split, applied.model_parts, applied.stage_ids, applied.meshes)
        self.tied.sync_weights_()  # the initialized copies of a tied weight start equal
        _quiet_routers_during_metadata_inference(self.schedule, applied.model_parts)
        self.forward_only = ForwardOnlyPipeline(job, pp_mesh)

    def forward_backward(self, microbatches: Sequence[MicroBatch], observer: Any = None) -> torch.Tensor:
        """Accumulate this rank's gradients over the micro-steps; returns this rank's share of
        the step loss: on the last stage as the unpipelined step's, 0 elsewhere."""
        job = self.job
        total = torch.zeros((), device=job.device)
        data_parallel = job.applied.data_parallel
        averaging_size = data_parallel.averaging_size
        for i, mb in enumerate(microbatches):
            for part in job.model_parts:
                data_parallel.set_microstep(part, is_last=i == len(microbatches) - 1)
            inputs, labels = self.rank_shard(mb)
            args = (inputs,) if self.has_first_stage else ()
            target = labels if self.has_last_stage else None
            losses: list[torch.Tensor] | None = [] if self.has_last_stage else None
            # The extensions' inputs (MTP's future tokens) go to this rank's stages (torch hands a
            # step's keyword inputs to every local stage, split into the microbatches).
            kwargs = {}
            if self.has_last_stage and mb.inputs is not None:
                kwargs = extension_inputs(job, mb.inputs.to(job.device, non_blocking=True))
            with step_context(job):
                self.schedule.step(*args, target=target, losses=losses, return_outputs=RETURN_OUTPUTS,
                                   **self.stage_kwargs(mb), **kwargs)
            for loss in losses or []:
                # Undo the averaging-size factor for reporting (exact for power-of-two sizes).
                total += full_tensor(loss.detach()) / averaging_size
        self.tied.sum_gradients_()
        return total

    def rank_shard(self, mb: MicroBatch) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """This rank's token ids (first stage) and labels (last stage) of a micro-step, on the
        device; None where no local stage needs them. Under context parallel both are this cp
        rank's shard of every sequence (the stages' positions come from plan.apply's hook)."""
        device = self.job.device
        inputs = mb.inputs.to(device, non_blocking=True) if self.has_first_stage else None
        labels = mb.labels.to(device, non_blocking=True) if self.has_last_stage else None
        sharder = self.job.applied.sequence_sharder
        whole = mb.inputs if mb.inputs is not None else mb.labels  # a feed carries what its stages need
        if sharder is not None and whole is not None:
            layout = sharder.layout(whole.shape[1])
            inputs = None if inputs is None else layout.shard(inputs, sharder.rank)
            labels = None if labels is None else layout.shard(labels, sharder.rank)
        return inputs, labels

    def stage_kwargs(self, mb: MicroBatch) -> dict[str, Any]:
        """What every stage's forward takes beside its input: under context parallel with document
        masking, the document ids of the whole sequences (every rank is fed the token ids then),
        which the schedule splits into its microbatches with the batch."""
        masks, sharder = self.job.block_masks, self.job.applied.sequence_sharder
        if masks is None or sharder is None or mb.inputs is None:
            return {}
        documents = masks.documents(mb.inputs.to(self.job.device, non_blocking=True))
        return {} if documents is None else {"block_mask": documents}

    def eval_loss(self, microbatches: Sequence[MicroBatch]) -> torch.Tensor:
        """Forward and loss only, for validation; the return value is forward_backward's and no
        gradient is touched. See ForwardOnlyPipeline for why this is not `schedule.eval`."""
        job = self.job
        total = torch.zeros((), device=job.device)
        averaging_size = job.applied.data_parallel.averaging_size
        with torch.no_grad():
            for mb in microbatches:
                for loss in self.forward_only.run(*self.rank_shard(mb), **self.stage_kwargs(mb)):
                    total += full_tensor(loss) / averaging_size
        return total

    def norm_duplicates(self) -> set[int]:
        """Parameters whose gradient norm another stage's copy already counts."""
        return self.tied.norm_duplicates()


def _quiet_routers_during_metadata_inference(schedule: Any, parts: list[torch.nn.Module]) -> None:
    """torch 2.13's stages infer their tensors' metadata by running forward (and backward) once on
    the first microbatch or on placeholder tensors, before the real ones: MoE routers must not
    count that run in the step's expert loads, nor the MTP modules in their losses (modules with
    a `counting` switch; older torch infers on meta tensors, which both pass through)."""
    routers = [m for part in parts for m in part.modules() if isinstance(m, TopKRouter) or hasattr(m, "counting")]
    stages = getattr(schedule, "_stages", None) or [getattr(schedule, "_stage", None)]
    if not routers:
        return
    for stage in stages:
        infer = getattr(stage, "_forward_metadata_inference", None)
        if infer is None:
            continue

        def quiet(*args: Any, _infer: Any = infer, **kwargs: Any) -> Any:
            for router in routers:
                router.counting = False
            try:
                return _infer(*args, **kwargs)
            finally:
                for router in routers:
                    router.counting = True

        stage._forward_metadata_inference = quiet


_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
_HEADER = 6  # ndim, up to 4 sizes, dtype code


class ForwardOnlyPipeline:
    """The pipeline's forward without backward: each microbatch goes through the stages in order,
    activations sent from stage to stage by point-to-point messages, the loss on the last stage.

    torch's `schedule.eval()` runs the training schedule with backward switched off, which fails
    for the zero-bubble schedules (ZBVZeroBubble: "can't steal_bwd_input if this stage doesn't
    have backward") and switches the stages' buffers between modes. Validation is rare and needs
    no overlap, so this runs one plain path for every schedule and every stage placement: rank
    r runs its stages in increasing order, receiving each input from the rank of the stage
    before (a header with shape and dtype, then the tensor) and sending each output on. The
    micro-step's local batch is cut into the schedule's `pp_microbatches`, so the last stage's
    logits are no larger than in training.
    """

    def __init__(self, job: TrainingJob, pp_mesh: Any) -> None:
        split = job.applied.plan.pipeline
        self.job, self.split = job, split
        self.group = pp_mesh.get_group()
        self.pp_rank = pp_mesh.get_local_rank()
        self.parts = dict(zip(job.applied.stage_ids, job.applied.model_parts, strict=True))

    def _peer(self, stage: int) -> int:
        return dist.get_global_rank(self.group, self.split.rank_of_stage(stage))

    def _send(self, tensor: torch.Tensor, stage: int) -> None:
        header = torch.zeros(_HEADER, dtype=torch.int64)
        header[0] = tensor.dim()
        header[1 : 1 + tensor.dim()] = torch.tensor(tensor.shape)
        header[-1] = _DTYPES.index(tensor.dtype)
        dist.send(header.to(tensor.device), self._peer(stage), group=self.group, tag=stage)
        dist.send(tensor.contiguous(), self._peer(stage), group=self.group, tag=stage)

    def _recv(self, stage: int) -> torch.Tensor:
        device = self.job.device
        header = torch.zeros(_HEADER, dtype=torch.int64, device=device)
        dist.recv(header, self._peer(stage - 1), group=self.group, tag=stage)
        ndim, dtype = int(header[0]), _DTYPES[int(header[-1])]
        tensor = torch.empty(header[1 : 1 + ndim].tolist(), dtype=dtype, device=device)
        dist.recv(tensor, self._peer(stage - 1), group=self.group, tag=stage)
        return tensor

    def run(self, inputs: torch.Tensor | None, labels: torch.Tensor | None,
            block_mask: SequenceDocuments | None = None) -> list[torch.Tensor]:
        """The last stage's losses of one micro-step's microbatches (empty on other ranks), from
        this rank's token ids and labels as `PipelineRunner.rank_shard` gives them (and the
        document ids of `stage_kwargs`, split like the batch)."""
        job, split = self.job, self.split
        chunks = split.microbatches
        inputs = inputs.tensor_split(chunks) if inputs is not None else [None] * chunks
        labels = labels.tensor_split(chunks) if labels is not None else [None] * chunks
        documents = ([{"block_mask": SequenceDocuments(ids)} for ids in block_mask.ids.tensor_split(chunks)]
                     if block_mask is not None else [{}] * chunks)
        last = split.n_stages - 1
        losses = []
        for chunk_inputs, chunk_labels, kwargs in zip(inputs, labels, documents, strict=True):
            hidden = chunk_inputs
            for stage in sorted(self.parts):
                if stage > 0 and split.rank_of_stage(stage - 1) != self.pp_rank:
                    hidden = self._recv(stage)
                with step_context(job):
                    hidden = self.parts[stage](hidden, **kwargs)
                    if stage == last:
                        losses.append(microbatch_loss(job, hidden, chunk_labels))
                if stage < last and split.rank_of_stage(stage + 1) != self.pp_rank:
                    self._send(hidden, stage + 1)
        return losses
