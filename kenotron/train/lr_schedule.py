"""Learning-rate schedules: linear warmup, then linear / cosine / WSD / 1-sqrt / constant.

`lr_factor(step)` is the multiplier of the peak LR used for optimizer step `step` (1-based:
the first step trains at factor 1/warmup, never 0). It is a pure function of the step so a
resumed run continues the schedule exactly.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class LRSchedule:
    """The schedule of one run, as plain data."""

    total_steps: int
    warmup_steps: int
    decay: str
    """linear | cosine | wsd | 1-sqrt | constant"""
    min_lr_ratio: float
    decay_ratio: float = 0.2
    """For wsd / 1-sqrt: share of the total steps spent decaying at the end."""

    def lr_factor(self, step: int) -> float:
        if self.warmup_steps > 0 and step <= self.warmup_steps:
            return step / self.warmup_steps
        lo = self.min_lr_ratio
        if self.decay == "constant":
            return 1.0
        if self.decay in ("linear", "cosine"):
            span = max(self.total_steps - self.warmup_steps, 1)
            progress = min(max((step - self.warmup_steps) / span, 0.0), 1.0)
            if self.decay == "linear":
                return lo + (1 - lo) * (1 - progress)
            return lo + (1 - lo) * 0.5 * (1 + math.cos(math.pi * progress))
        if self.decay in ("wsd", "1-sqrt"):
            # Warmup-stable-decay: hold the peak, then decay over the last decay_ratio of training.
            decay_steps = max(round(self.decay_ratio * self.total_steps), 1)
            decay_start = max(self.total_steps - decay_steps, self.warmup_steps)
            if step <= decay_start:
                return 1.0
            progress = min((step - decay_start) / max(self.total_steps - decay_start, 1), 1.0)
            shape = 1 - progress if self.decay == "wsd" else 1 - math.sqrt(progress)
            return lo + (1 - lo) * shape
        raise ValueError(f"lr_scheduler.decay={self.decay!r} is not one of linear, cosine, wsd, 1-sqrt, constant")


def warmup_outlasts_run(schedule: LRSchedule, peak_lr: float) -> str | None:
    """One line when lr_scheduler.warmup_steps reaches training.steps: the run would end still
    warming up (or at the peak), never decaying. The schedule is kept as configured (a short
    trial run of a preset trains as the preset's first steps would); the line says what happens
    and the fix. None when the run leaves warmup."""
    total, warmup = schedule.total_steps, schedule.warmup_steps
    if warmup < total or (warmup == total and schedule.decay == "constant"):
        return None
    last = peak_lr * schedule.lr_factor(total)
    return (f"lr_scheduler.warmup_steps={warmup} >= training.steps={total}: the run ends in warmup at lr {last:.3g} "
            f"(optimizer.lr={peak_lr:g} is reached at step {warmup}) and never decays; set "
            f"--lr_scheduler.warmup_steps below {total} (e.g. {min(max(total // 10, 1), total - 1)}) for a full schedule")


class ScheduledLR(torch.optim.lr_scheduler.LambdaLR):
    """LambdaLR that scales each parameter group's own `initial_lr` rather than the list of base
    rates it saves, so one saved state fits every optimizer on the schedule: pipeline stages hold
    different groups (with spectral µP, different per-matrix rates), and the checkpoint keeps one
    scheduler state for all of them. Its state also records the schedule it followed, so that a
    resume can say which of the schedule's settings changed (train/resume_settings.py)."""

    def __init__(self, optimizer: torch.optim.Optimizer, schedule: LRSchedule) -> None:
        self.schedule = schedule
        self.resumed_schedule: dict | None = None
        """The schedule the loaded checkpoint followed (None: nothing loaded, or saved before it was recorded)."""
        # LambdaLR evaluates its lambda at 0 on construction; shifting by one makes the first
        # optimizer step use lr_factor(1).
        super().__init__(optimizer, lambda i: schedule.lr_factor(i + 1))

    def get_lr(self) -> list[float]:  # type: ignore[override]
        factor = self.lr_lambdas[0](self.last_epoch)
        return [group["initial_lr"] * factor for group in self.optimizer.param_groups]

    def state_dict(self) -> dict:
        state = super().state_dict()  # every attribute but the optimizer and the lambda
        state.pop("resumed_schedule", None)
        state["schedule"] = asdict(self.schedule)
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = dict(state_dict)
        # LambdaLR would make every saved key an attribute: the saved schedule must not replace this run's.
        self.resumed_schedule = state_dict.pop("schedule", None)
        state_dict.pop("resumed_schedule", None)
        super().load_state_dict(state_dict)
        self.base_lrs = [group["initial_lr"] for group in self.optimizer.param_groups]


def build_lr_scheduler(optimizer: torch.optim.Optimizer, schedule: LRSchedule) -> ScheduledLR:
    """A scheduler whose k-th `.step()` sets the LR for optimizer step k + 1."""
    return ScheduledLR(optimizer, schedule)
