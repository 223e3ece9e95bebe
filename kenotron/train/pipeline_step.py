"""The trainer's forward/backward under pipeline parallel: one schedule step per micro-step.

Words: the trainer's *micro-steps* are gradient-accumulation steps (the loader's MicroBatch
list); the schedule cuts each micro-step's local batch into `pp_microbatches` pipeline
*microbatches*. Only the first stage is fed token ids and only the last stage labels; the
middle stages get nothing from the loader.

The loss: the schedule calls `loss_fn` once per microbatch on the last stage and
back-propagates its value as it is (scale_grads=False). It is the microbatch's summed token
cross-entropy divided by the global batch's token count, times the data-parallel averaging
size (FSDP/DDP average gradients, the loss wants their sum): exactly the non-pipelined
trainer's per-token weight, so gradients match whatever the split. The loss is the plain one
(full logits of one microbatch): the fused chunked loss reads the output weight outside the
stage's forward, where the pipeline's FSDP policy may have resharded it, and the logits of a
microbatch are already a fraction of a micro-step's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch.distributed.tensor import DTensor

from kenotron.data import MicroBatch
from kenotron.parallel.pipeline import build_schedule
from kenotron.parallel.pipeline_tied import TiedAcrossStages
from kenotron.parallel.plan import AppliedPlan
from kenotron.train.loss import cross_entropy_sum

RETURN_OUTPUTS = False
"""Whether `schedule.step()` keeps and returns the last stage's outputs. torch's default (True)
keeps every microbatch's logits until the step ends and concatenates them: for Llama-3.2-1B
with 16 microbatches of 4096 tokens, 2 x 15.7 GiB of the last stage's 39 GiB, for a value the
trainer never reads (the losses come through `losses`). The estimator simulates the same
choice (kenotron/estimate/pipeline_step.py)."""


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


class PipelineRunner:
    """Owns the schedule of this rank's stages and runs the micro-steps of one optimizer step."""

    def __init__(
        self,
        applied: AppliedPlan,
        device: torch.device,
        label_tokens: int,
        step_context: Callable[[], contextlib.AbstractContextManager],
    ) -> None:
        """`label_tokens`: label tokens of the whole global batch (the loss's denominator);
        `step_context`: entered around each schedule step (loss parallel, attention backend,
        autocast), as the trainer does around forward and backward."""
        split = applied.plan.pipeline
        pp_mesh = applied.meshes.get("pp")
        if split is None or pp_mesh is None:
            raise ValueError("PipelineRunner needs a plan with a pipeline split applied on a mesh with a pp dimension")
        self.applied = applied
        self.device = device
        self.label_tokens = label_tokens
        self.step_context = step_context
        self.averaging_size = applied.data_parallel.averaging_size
        self.has_first_stage = 0 in applied.stage_ids
        self.has_last_stage = split.n_stages - 1 in applied.stage_ids
        self.schedule = build_schedule(
            split, applied.model_parts, applied.stage_ids, pp_mesh.get_group(), device, self.loss_fn
        )
        self.tied = TiedAcrossStages(split, applied.model_parts, applied.meshes)

    def loss_fn(self, output: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """What the last stage back-propagates for one microbatch (see the module docstring)."""
        loss = cross_entropy_sum(output, labels) / self.label_tokens
        return loss * self.averaging_size

    def forward_backward(self, microbatches: list[MicroBatch]) -> torch.Tensor:
        """Accumulate this rank's gradients over the micro-steps; returns this rank's share of
        the step loss: on the last stage as the trainer's forward_backward, 0 elsewhere."""
        total = torch.zeros((), device=self.device)
        data_parallel = self.applied.data_parallel
        for i, mb in enumerate(microbatches):
            for part in self.applied.model_parts:
                data_parallel.set_microstep(part, is_last=i == len(microbatches) - 1)
            args = (mb.inputs.to(self.device, non_blocking=True),) if self.has_first_stage else ()
            target = mb.labels.to(self.device, non_blocking=True) if self.has_last_stage else None
            losses: list[torch.Tensor] | None = [] if self.has_last_stage else None
            with self.step_context():
                self.schedule.step(*args, target=target, losses=losses, return_outputs=RETURN_OUTPUTS)
            for loss in losses or []:
                # Undo the averaging-size factor for reporting (exact for power-of-two sizes).
                total += _full(loss.detach()) / self.averaging_size
        self.tied.sum_gradients_()
        return total

    def after_init(self) -> None:
        """Once the weights are initialized (or loaded): make tied copies equal."""
        self.tied.sync_weights_()
