"""A resume trains with this launch's optimizer and schedule settings, and says which changed.

Loading a checkpoint restores the optimizer's parameter groups as saved: its peak lr
(`initial_lr`), weight decay, betas and eps, and the lr of the next step. Left so, a resumed run
with a new `--optimizer.lr` would keep the old one while its metrics reported the new one. So the
trainer takes the groups' settings as this launch built them before loading (`built_settings`),
and after the load (`apply_launch_settings`) puts them back, sets every group's lr for the next
step from this launch's schedule, and returns one line naming each setting that changed and the
lr the next step now uses. The schedule's own settings (lr_scheduler.*, training.steps) are
compared with the schedule the checkpoint recorded (train/lr_schedule.py). What a resume
refuses to change instead (the optimizer itself, the data order) is checked before any process
starts: checkpoint/resume_rules.py.
"""

from __future__ import annotations

import copy
from dataclasses import asdict
from typing import Any

from kenotron.train.lr_schedule import LRSchedule, ScheduledLR

SCHEDULE_KEYS = {
    "total_steps": "training.steps", "warmup_steps": "lr_scheduler.warmup_steps", "decay": "lr_scheduler.decay",
    "decay_ratio": "lr_scheduler.decay_ratio", "min_lr_ratio": "lr_scheduler.min_lr_ratio",
}
"""LRSchedule's fields and the config keys that set them."""

_RECOMPUTED = ("params", "lr")
"""Group entries not taken from the build: the parameters, and the lr (set from the schedule)."""


def built_settings(optimizers: list[Any]) -> list[list[dict[str, Any]]]:
    """Every parameter group's settings (all but its parameters), as this launch built them."""
    return [[{k: copy.deepcopy(v) for k, v in group.items() if k != "params"} for group in o.param_groups]
            for o in optimizers]


def _fmt(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else repr(value) if isinstance(value, str) else str(value)


def _group_changes(loaded: dict[str, Any], built: dict[str, Any], peak_lr: float) -> dict[str, str]:
    """The config keys whose values differ between a loaded group and the built one, as 'old -> new'."""
    changes: dict[str, str] = {}
    for key, new in built.items():
        if key in _RECOMPUTED or key not in loaded or loaded[key] == new:
            continue
        old = loaded[key]
        if key == "initial_lr":
            # A group's rate is optimizer.lr times its own scale (spectral µP): report optimizer.lr.
            scale = new / peak_lr
            changes["optimizer.lr"] = f"{_fmt(old / scale)} -> {_fmt(peak_lr)}"
        elif key == "betas":
            for i, (a, b) in enumerate(zip(old, new)):
                if a != b:
                    changes[f"optimizer.beta{i + 1}"] = f"{_fmt(a)} -> {_fmt(b)}"
        elif isinstance(new, (int, float)) and not isinstance(new, bool):
            changes[f"optimizer.{key}"] = f"{_fmt(old)} -> {_fmt(new)}"
        # Flags (foreach, fused, ...) follow this machine's build silently: they are choices, not settings.
    return changes


def _schedule_changes(saved: dict[str, Any] | None, schedule: LRSchedule) -> dict[str, str]:
    if saved is None:
        return {}
    now = asdict(schedule)
    return {SCHEDULE_KEYS[k]: f"{_fmt(saved[k])} -> {_fmt(v)}" for k, v in now.items()
            if k in saved and k in SCHEDULE_KEYS and saved[k] != v}


def apply_launch_settings(optimizers: list[Any], schedulers: list[ScheduledLR], built: list[list[dict[str, Any]]],
                          peak_lr: float, step: int) -> str | None:
    """After a load: every group gets back the settings it was built with, and the lr of step
    `step + 1` from this launch's schedule. Returns the one line saying what changed (None when
    nothing did). `peak_lr` is optimizer.lr."""
    changes: dict[str, str] = {}
    next_lr_before: float | None = None
    for optimizer, scheduler, groups in zip(optimizers, schedulers, built):
        for group, settings in zip(optimizer.param_groups, groups):
            changes.update(_group_changes(group, settings, peak_lr))
            if next_lr_before is None and settings.get("initial_lr"):
                next_lr_before = group["lr"] * peak_lr / settings["initial_lr"]
            group.update(copy.deepcopy({k: v for k, v in settings.items() if k not in _RECOMPUTED}))
        changes.update(_schedule_changes(scheduler.resumed_schedule, scheduler.schedule))
        lrs = scheduler.get_lr()
        for group, lr in zip(optimizer.param_groups, lrs):
            group["lr"] = lr
        scheduler._last_lr = list(lrs)
    if not changes or not schedulers:
        return None
    next_lr = peak_lr * schedulers[0].schedule.lr_factor(schedulers[0].last_epoch + 1)
    before = f"; the checkpoint's settings gave {next_lr_before:.4g}" if next_lr_before is not None else ""
    return (f"resumed at step {step} with changed settings, applied from step {step + 1}: "
            f"{', '.join(f'{k} {v}' for k, v in changes.items())} (lr of step {step + 1}: {next_lr:.4g}{before})")
