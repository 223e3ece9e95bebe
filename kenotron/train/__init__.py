"""The trainer: resolve the run, build the job, step it; optimizers, LR schedules, losses, metrics.

    from kenotron.train import Target, build_job, build_meshes, resolve_run, train_step
"""

from __future__ import annotations

from kenotron.kernel_choice.choices import Choices
from kenotron.kernel_choice.target import Target
from kenotron.runtime.divergence import NonFiniteLossError
from kenotron.train.extension import JobExtension
from kenotron.train.fused_loss import linear_cross_entropy_sum
from kenotron.train.job import build_job, build_meshes
from kenotron.train.loss import cross_entropy_sum
from kenotron.train.lr_schedule import LRSchedule, build_lr_scheduler
from kenotron.train.metrics import MetricsLogger
from kenotron.train.optim import optimizer_factory, param_groups
from kenotron.train.resolve import ResolvedRun, resolve_layout, resolve_run
from kenotron.train.step import clip_gradients, eval_loss, forward_backward, optimizer_step, train_step
from kenotron.train.trainer import Trainer, run_training
from kenotron.train.training_job import TrainingJob

__all__ = [
    "Choices",
    "JobExtension",
    "LRSchedule",
    "MetricsLogger",
    "NonFiniteLossError",
    "ResolvedRun",
    "Target",
    "Trainer",
    "TrainingJob",
    "build_job",
    "build_lr_scheduler",
    "build_meshes",
    "clip_gradients",
    "cross_entropy_sum",
    "eval_loss",
    "forward_backward",
    "linear_cross_entropy_sum",
    "optimizer_factory",
    "optimizer_step",
    "param_groups",
    "resolve_layout",
    "resolve_run",
    "run_training",
    "train_step",
]
