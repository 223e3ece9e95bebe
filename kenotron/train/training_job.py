"""A built training job: everything one training step needs, and nothing about data or storage.

`build_job` (train/job.py) makes one; `train_step` (train/step.py) steps it. Optional features
(the pipeline schedule, DoReMi, the MoE routers' balancing, the early all-gather) are
`extensions` (train/extension.py): the job holds them, the step calls their hooks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from kenotron.kernel_choice.attention_backend import BlockMasks
from kenotron.parallel.dims import Meshes
from kenotron.parallel.model_layout import matching_modules
from kenotron.parallel.plan import AppliedPlan
from kenotron.parallel.zero1 import Zero1Optimizer
from kenotron.train.extension import JobExtension
from kenotron.train.lr_schedule import LRSchedule
from kenotron.train.resolve import ResolvedRun
from kenotron.train.vocab_parallel_loss import VocabChunkStep


@dataclass
class TrainingJob:
    """A built job (module docstring). Not the config's `[job]` section (config.sections.Job)."""

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
    """The model stops at its final norm (`logits=False`) and the loss applies the output weight in chunks."""
    loss_chunk_fn: Callable | VocabChunkStep | None
    """The fused loss's chunk step (None: PyTorch's ops); a VocabChunkStep under tensor parallel."""
    block_masks: BlockMasks | None
    """FlexAttention: one BlockMask per micro-batch, shared by every layer."""
    extensions: list[JobExtension] = field(default_factory=list)
    """The job's optional features, in the order their hooks run (train/extension.py)."""
    n_params: int = 0
    """Parameters of the whole model (all stages)."""
    matmul_params: int = 0
    """Parameters that enter matrix products for each token (what the FLOP count uses, train/flops.py):
    an MoE layer counts its top-k routed experts, not all of them."""

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

    def extension(self, name: str) -> Any:
        """The extension called `name` (JobExtension.name), or None: for inspection (tests, the
        estimator); the step and the loop only call hooks."""
        return next((e for e in self.extensions if e.name == name), None)

    @property
    def pipeline(self) -> Any:
        """This rank's pipeline executor (train/pipeline_step.py, or the estimator's replay), or None."""
        ext = self.extension("pipeline")
        return ext.executor if ext is not None else None

    @property
    def experts(self) -> Any:
        """The MoE routers' ExpertBalance (train/expert_balance.py), or None."""
        return self.extension("experts")

    @property
    def early_gather(self) -> Any:
        """FSDP's early all-gather (parallel/early_gather.py), or None."""
        ext = self.extension("early_gather")
        return ext.gather if ext is not None else None
