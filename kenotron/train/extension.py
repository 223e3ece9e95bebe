"""How a feature attaches to a training job: one small interface of named hooks.

The step (train/step.py) and the loop (train/trainer.py) are written for the plain case and
call these hooks on every extension of the job, in the order `build_job` attached them:

    before_forward_backward(microbatches)      # e.g. the MoE routers' loss weights
    model_inputs(tokens)                       # more keyword inputs of the model (MTP's future tokens)
    forward_backward(microbatches, observer)   # an extension that runs the passes itself
    eval_loss(microbatches)                    #   (the pipeline schedule, DoReMi's two passes)
    after_forward_backward()
    norm_duplicates()                          # parameters another rank's copy counts in the norm
    step_optimizer(optimizer) -> bool          # around each optimizer step (the early all-gather)
    after_optimizer_step()                     # e.g. the routers' bias update
    checkpoint_state()                         # JSON-able state the checkpoints keep
    metrics()                                  # at logging steps, every rank
    on_step(step)                              # the loop, after each step
    data_layout(layout) -> layout              # the trainer: this rank's place in the data
    defer_resume(resume) -> bool               # the trainer: leave the checkpoint's load to the extension
    attach_run_state(parts)                    # the trainer: what a checkpoint keeps, once loaded
    write_records(folder, final)               # rank 0, at logging steps and once at the end
    finish()                                   # every rank, once the last step is done

Every hook is a no-op here; a feature overrides the ones it needs. At most one extension runs
the passes (`forward_backward` / `eval_loss` return a value instead of None): build_job checks it.
A new feature (an optimizer's own step, multi-token prediction, fault tolerance) is a new
subclass attached by build_job, not a new branch in the step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch

from kenotron.data import MicroBatch


class JobExtension:
    """A feature of a training job (module docstring); `name` finds it on the job (`job.extension(name)`)."""

    name: ClassVar[str] = ""

    def before_forward_backward(self, microbatches: Sequence[MicroBatch]) -> None:
        """Before the step's forward and backward passes."""

    def model_inputs(self, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
        """Keyword inputs of the model made from a micro-batch's whole token ids (batch, seq) on
        the device; the step cuts each along dim 1 as context parallel cuts the tokens, and under
        pipeline parallel gives them to the last stage (train/step.py's `extension_inputs`)."""
        return {}

    def forward_backward(self, microbatches: Sequence[MicroBatch], observer: Any) -> torch.Tensor | None:
        """Run the step's passes instead of the plain ones and return this rank's loss share; None: not this one."""
        return None

    def eval_loss(self, microbatches: Sequence[MicroBatch]) -> torch.Tensor | None:
        """Run validation's forward instead of the plain one and return this rank's loss share; None: not this one."""
        return None

    def after_forward_backward(self) -> None:
        """After the passes, before the gradient norm."""

    def norm_duplicates(self) -> set[int]:
        """ids of parameters whose gradient another copy already counts in the global norm."""
        return set()

    def step_optimizer(self, optimizer: Any) -> bool:
        """Step `optimizer` in this extension's way and return True; False: the plain `optimizer.step()`."""
        return False

    def after_optimizer_step(self) -> None:
        """After every optimizer and LR schedule stepped, gradients zeroed."""

    def checkpoint_state(self) -> dict[str, Any]:
        """{key: object with state_dict / load_state_dict, equal on every rank}: saved as JSON in each checkpoint."""
        return {}

    def metrics(self) -> dict[str, Any]:
        """Values for the logging step's record (called on every rank: it may be collective); device
        tensors and train/metrics.py's Deferred are read with the record's others in one copy."""
        return {}

    def on_step(self, step: int) -> None:
        """The loop, once step `step` is done and counted."""

    def data_layout(self, layout: dict[str, Any]) -> dict[str, Any]:
        """This rank's place in the data as the loader gets it (dp_rank, dp_size, global_batch_size,
        feed_inputs, feed_labels), returned as is or changed (fault tolerance's replica groups)."""
        return layout

    def defer_resume(self, resume: Callable[[], int | None]) -> bool:
        """The trainer, before it resumes the run from its checkpoint: True when this extension
        calls `resume` (the checkpoint's load; the step loaded, or None) in its attach_run_state,
        only where it must (fault tolerance: not when a peer sends the live state); False: the
        trainer resumes first."""
        return False

    def attach_run_state(self, parts: dict[str, Any]) -> None:
        """The trainer, once the run's state is built and resumed: the parts a checkpoint keeps
        (model, optimizer, lr_scheduler, dataloader, train_state, ...), each with state_dict /
        load_state_dict, by name (fault tolerance hands them to a recovering peer)."""

    def write_records(self, folder: Path, final: bool) -> None:
        """Rank 0: files of this feature in the run folder, at logging steps and once at the end (`final`)."""

    def finish(self) -> None:
        """Every rank, after the last step: nothing of the step may still be in flight afterwards."""


def check_one_runs_the_passes(extensions: Sequence[JobExtension]) -> None:
    """At most one extension replaces the plain passes (two would each expect to run them)."""
    runners = [e.name for e in extensions
               if type(e).forward_backward is not JobExtension.forward_backward]
    if len(runners) > 1:
        raise ValueError(f"extensions {runners} each run the step's passes; a job has at most one")
