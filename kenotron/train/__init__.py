"""The trainer: resolve the run, build the job, step it; optimizers, LR schedules, losses, metrics.

    from kenotron.train import Target, build_job, build_meshes, resolve_run, train_step

The names below load their module on first use, so importing this package (or any of its
modules) costs nothing more and creates no import cycle.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "ResolvedRun": "kenotron.train.resolve",
    "resolve_run": "kenotron.train.resolve",
    "resolve_layout": "kenotron.train.resolve",
    "Choices": "kenotron.kernel_choice.choices",
    "Target": "kenotron.kernel_choice.target",
    "Job": "kenotron.train.job",
    "build_job": "kenotron.train.job",
    "build_meshes": "kenotron.train.job",
    "train_step": "kenotron.train.step",
    "forward_backward": "kenotron.train.step",
    "clip_gradients": "kenotron.train.step",
    "optimizer_step": "kenotron.train.step",
    "eval_loss": "kenotron.train.step",
    "NonFiniteLossError": "kenotron.train.guards",
    "Trainer": "kenotron.train.trainer",
    "run_training": "kenotron.train.trainer",
    "LRSchedule": "kenotron.train.lr_schedule",
    "build_lr_scheduler": "kenotron.train.lr_schedule",
    "MetricsLogger": "kenotron.train.metrics",
    "optimizer_factory": "kenotron.train.optim",
    "param_groups": "kenotron.train.optim",
    "cross_entropy_sum": "kenotron.train.loss",
    "linear_cross_entropy_sum": "kenotron.train.fused_loss",
}

__all__ = [
    "Choices",
    "Job",
    "LRSchedule",
    "MetricsLogger",
    "NonFiniteLossError",
    "ResolvedRun",
    "Target",
    "Trainer",
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

if TYPE_CHECKING:
    from kenotron.kernel_choice.choices import Choices
    from kenotron.kernel_choice.target import Target
    from kenotron.train.fused_loss import linear_cross_entropy_sum
    from kenotron.train.guards import NonFiniteLossError
    from kenotron.train.job import Job, build_job, build_meshes
    from kenotron.train.loss import cross_entropy_sum
    from kenotron.train.lr_schedule import LRSchedule, build_lr_scheduler
    from kenotron.train.metrics import MetricsLogger
    from kenotron.train.optim import optimizer_factory, param_groups
    from kenotron.train.resolve import ResolvedRun, resolve_layout, resolve_run
    from kenotron.train.step import clip_gradients, eval_loss, forward_backward, optimizer_step, train_step
    from kenotron.train.trainer import Trainer, run_training


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
