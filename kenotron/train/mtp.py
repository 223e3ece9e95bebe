"""Multi-token prediction over a job (DeepSeek-V3's MTP, models/deepseek_v3/mtp.py): the loss
weight each step and the metrics per depth.

    model.mtp_depth = D > 0           the model holds D MTP modules after its main blocks
    model.mtp_loss_weight = λ         the step's loss adds λ / D x the sum over the modules of
                                      their mean cross-entropy over the global batch

Each module's summed token loss joins backward inside the model's forward (as the MoE routers'
balancing terms do); this extension sets its weight before the passes, λ / D over the global
batch's label tokens times the data-parallel averaging size (what the cross-entropy gets), and
reports `mtp_loss/<k>` (module k's mean loss over its targets, all ranks) at logging steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from kenotron.data import MicroBatch
from kenotron.train.extension import JobExtension
from kenotron.train.training_job import TrainingJob


class MultiTokenPrediction(JobExtension):
    """The MTP modules of this rank's model parts (see the module docstring)."""

    name = "mtp"

    def __init__(self, job: TrainingJob) -> None:
        self.job = job
        # The model's `mtp` (models/deepseek_v3/mtp.py's MTPLoss) on the parts that hold MTP modules.
        self.losses = [part.mtp for part in job.model_parts if getattr(part, "mtp", None) is not None]
        self.last: torch.Tensor | None = None
        """(2, depth): the last step's summed losses and target counts of this rank."""

    def before_forward_backward(self, microbatches: Sequence[MicroBatch]) -> None:
        job = self.job
        args = job.run.model_args
        tokens = job.run.global_batch_size * job.run.cfg.training.seq_len
        scale = args.mtp_loss_weight / args.mtp_depth / tokens * job.applied.data_parallel.averaging_size
        for loss in self.losses:
            loss.loss_scale = scale

    @torch.no_grad()
    def after_optimizer_step(self) -> None:
        if self.losses:
            self.last = torch.stack([sum(m.loss_sum for m in self.losses), sum(m.targets for m in self.losses)])
            for m in self.losses:
                m.reset()

    def metrics(self) -> dict[str, Any]:
        """`mtp_loss/<k>`: module k's mean cross-entropy over its targets in the last step, every
        rank's tokens (collective over the data, context and tensor parallel ranks)."""
        if self.last is None:
            return {}
        stats = self.last.clone()
        tokens = self.job.meshes.get("dp_cp_tp")
        if tokens is not None:
            dist.all_reduce(stats, group=tokens.get_group())
        means = (stats[0] / stats[1].clamp(min=1)).tolist()
        return {f"mtp_loss/{k}": value for k, value in enumerate(means, start=1)}
