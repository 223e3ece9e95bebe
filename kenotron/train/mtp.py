"""Multi-token prediction over a job (DeepSeek-V3's MTP, models/deepseek_v3/mtp.py): the loss
weight each step and the metrics per depth.

    model.mtp_depth = D > 0           the model holds D MTP modules after its main blocks
    model.mtp_loss_weight = λ         the step's loss adds λ / D x the sum over the modules of
                                      their mean cross-entropy over the global batch

Each module's summed token loss joins backward inside the model's forward (as the MoE routers'
balancing terms do); this extension sets its weight before the passes, λ / D over the global
batch's label tokens times the data-parallel averaging size (what the cross-entropy gets), and
reports `mtp_loss/<k>` (module k's mean loss over its targets, all ranks) at logging steps.

The heads take the main head's fused chunked loss (train/fused_loss.py, with its chunk size, matmul
dtype and chunk kernel) unless tuning.loss is "plain" or tensor parallel shards the vocabulary
(`fused_heads`); also under pipeline parallel, where the main head's loss is the schedule's plain
one but the heads' runs inside the last stage's forward.

The modules' inputs and targets are the tokens ahead of each position
(models/common/future_tokens.py): this extension makes them from each micro-batch's whole
sequences, so that context parallel cuts them as it cuts the tokens (the tokens ahead of a shard's last position live
on another rank), and under pipeline parallel the last stage, which holds the MTP modules, a copy
of the embedding and no token ids of its own, gets them (its rank is fed the token ids).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from kenotron.data import MicroBatch
from kenotron.models.common.future_tokens import future_tokens
from kenotron.train.extension import JobExtension
from kenotron.train.fused_loss import chunk_fn_for, linear_cross_entropy_sum
from kenotron.train.resolve import ResolvedRun
from kenotron.train.training_job import TrainingJob


def fused_heads(run: ResolvedRun) -> bool:
    """Whether the MTP heads take the fused chunked loss (the module docstring)."""
    return run.cfg.tuning.loss != "plain" and run.dims.tp == 1


class MultiTokenPrediction(JobExtension):
    """The MTP modules of this rank's model parts (see the module docstring)."""

    name = "mtp"

    def __init__(self, job: TrainingJob) -> None:
        self.job = job
        # The model's `mtp` (models/deepseek_v3/mtp.py's MTPLoss) on the parts that hold MTP modules.
        self.losses = [part.mtp for part in job.model_parts if getattr(part, "mtp", None) is not None]
        self.last: torch.Tensor | None = None
        """(2, depth): the last step's summed losses and target counts of this rank."""
        if fused_heads(job.run):
            if not job.fused_loss:  # pipeline parallel: the main head's loss is plain, the job has no chunk step
                job.loss_chunk_fn = chunk_fn_for(job.run.choices.loss_kernel)
            for loss in self.losses:
                loss.head_loss = self.head_loss

    def head_loss(self, normed: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """An MTP head's summed cross-entropy by the fused chunked loss (the job's chunk step, read
        at each call: the estimator swaps a compiled one for PyTorch's ops)."""
        job = self.job
        return linear_cross_entropy_sum(normed, weight, targets, chunk_tokens=job.run.choices.loss_chunk_tokens,
                                        compute_dtype=job.compute_dtype, chunk_fn=job.loss_chunk_fn)

    def data_layout(self, layout: dict[str, Any]) -> dict[str, Any]:
        """The ranks of the MTP modules' stage also read the token ids."""
        return {**layout, "feed_inputs": True} if self.losses else layout

    def model_inputs(self, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"future": future_tokens(tokens, self.job.run.model_args.mtp_depth)}

    def before_forward_backward(self, microbatches: Sequence[MicroBatch]) -> None:
        job = self.job
        args = job.run.model_args
        tokens = job.run.global_batch_size * job.run.cfg.training.seq_len
        scale = args.mtp_loss_weight / args.mtp_depth / tokens * job.applied.data_parallel.averaging_size
        for loss in self.losses:
            loss.loss_scale = scale

    @torch.no_grad()
    def after_optimizer_step(self) -> None:
        depth = self.job.run.model_args.mtp_depth
        self.last = torch.zeros(2, depth, device=self.job.device)  # zeros on stages without the modules
        for m in self.losses:
            self.last += torch.stack([m.loss_sum, m.targets])
            m.reset()

    def metrics(self) -> dict[str, Any]:
        """`mtp_loss/<k>`: module k's mean cross-entropy over its targets in the last step, every
        rank's tokens (collective over the data, context, tensor and pipeline parallel ranks: the
        modules live on the last stage, the log on rank 0), as 0-d device tensors: the trainer
        reads them with the rest of its record in one copy (train/metrics.py's read_on_host)."""
        if self.last is None:
            return {}
        stats = self.last.clone()
        for dims in ("dp_cp_tp", "pp"):
            mesh = self.job.meshes.get(dims)
            if mesh is not None:
                dist.all_reduce(stats, group=mesh.get_group())
        means = stats[0] / stats[1].clamp(min=1)
        return {f"mtp_loss/{k}": means[k - 1] for k in range(1, means.shape[0] + 1)}
