"""Divergence guard: stop at the first step whose gradient norm is NaN or infinite.

Checking `loss.item()` every step would synchronize the device every step; checking only on
logging steps let a run save diverged checkpoints in between. Instead every step folds
`isfinite(grad_norm)` into a device-side record of the first bad step (two tiny kernels, no
synchronization), and the record is read where the loop synchronizes anyway: at logging steps
and before a checkpoint is saved, so that a diverged state is never written.

The gradient norm is global (reduced over every parallel dimension), so every rank sees the
same record and stops at the same step, without a collective of its own. A non-finite loss
back-propagates into non-finite gradients, so the norm catches it in the same step; the losses
themselves are checked too, at logging steps, once they are reduced.
"""

from __future__ import annotations

import logging
import math

import torch

logger = logging.getLogger("kenotron")


class NonFiniteLossError(RuntimeError):
    """The loss or the gradient norm became NaN or infinite; training stops rather than writing garbage."""


def divergence_advice(lr: float, warmup_steps: int, max_norm: float) -> str:
    """What to change, naming the current values (clipping is suggested only when it is off)."""
    clip = (f"or lower training.max_norm (now {max_norm:g})" if max_norm > 0
            else "or clip gradients with training.max_norm > 0 (now 0: off)")
    return f"Lower optimizer.lr (now {lr:g}), lengthen lr_scheduler.warmup_steps (now {warmup_steps}), {clip}"


class DivergenceGuard:
    """Records, without synchronizing, the first step whose gradient norm is not finite."""

    def __init__(self, advice: str) -> None:
        self.advice = advice
        self._first_bad: torch.Tensor | None = None  # 0: none yet
        self._bad_norm: torch.Tensor | None = None

    def observe(self, step: int, grad_norm: torch.Tensor) -> None:
        norm = grad_norm.detach().float().reshape(())
        if self._first_bad is None:
            self._first_bad = torch.zeros((), dtype=torch.int64, device=norm.device)
            self._bad_norm = torch.zeros((), dtype=torch.float32, device=norm.device)
        newly_bad = (self._first_bad == 0) & ~torch.isfinite(norm)
        self._first_bad = torch.where(newly_bad, step, self._first_bad)
        self._bad_norm = torch.where(newly_bad, norm, self._bad_norm)

    def check(self) -> None:
        """Raise NonFiniteLossError if some step diverged (one device-to-host copy)."""
        if self._first_bad is not None:
            self.check_state(self._norm_state(self._first_bad.device).tolist(), 0)

    def state(self, losses: torch.Tensor) -> torch.Tensor:
        """(first bad step or 0, its norm, *losses) on the device: what `check_state` checks, for
        the logging step to read with its other values in one copy."""
        return torch.cat([self._norm_state(losses.device), losses.detach().double().reshape(-1)])

    def _norm_state(self, device: torch.device) -> torch.Tensor:
        """(first bad step or 0, its norm) in fp64 on the device."""
        if self._first_bad is None:
            return torch.zeros(2, dtype=torch.float64, device=device)
        return torch.stack([self._first_bad.double(), self._bad_norm.double()])

    def check_state(self, state: list[float], first_step: int) -> dict:
        """Raise NonFiniteLossError for a diverged gradient norm, then for the first non-finite loss of
        `state` read on the host (`state`'s layout; its losses are those of steps first_step...); no record keys."""
        if state[0]:
            raise NonFiniteLossError(f"the gradient norm is {state[1]} at step {int(state[0])}: training stopped "
                                     f"before saving or logging that state. {self.advice}")
        for i, loss in enumerate(state[2:]):
            if not math.isfinite(loss):
                raise NonFiniteLossError(f"loss is {loss} at step {i + first_step}: training stopped. {self.advice}")
        return {}


def warn_if_nothing_to_train(step: int, total: int) -> None:
    """A run resumed at or past training.steps trains nothing: say so instead of exiting silently."""
    if total <= step:
        logger.warning(
            "resumed at step %d, and training.steps=%d: nothing left to train. Raise training.steps to continue "
            "this run (or set checkpoint.load_step to resume an earlier step)", step, total,
        )
