"""Learning-rate sweep at several widths: where the best learning rate lies for each width, under
one parametrization (µTransfer's test: under µP it stays put; scripts/mup_lr_sweep.py).

Every (width, learning rate) pair trains the same family and flavor, widened as in the coord
check (tools/coord_check.py), from the same seed on the same batches, with the real trainer;
the score of a run is its mean training loss over the last `tail` steps.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field

from kenotron.config import load_config
from kenotron.tools.coord_check import width_overrides
from kenotron.train.trainer import Trainer


@dataclass
class LRSweep:
    """losses[width][lr]: the training loss of every step; final[width][lr]: the run's score."""

    parametrization: str
    widths: list[int]
    lrs: list[float]
    steps: int
    tail: int
    losses: dict[int, dict[float, list[float]]] = field(default_factory=dict)

    def final(self, width: int, lr: float) -> float:
        """Mean loss over the last `tail` steps (inf if the run diverged)."""
        last = self.losses[width][lr][-self.tail:]
        value = sum(last) / len(last)
        return value if math.isfinite(value) else math.inf

    def best_lr(self, width: int) -> float:
        return min(self.lrs, key=lambda lr: self.final(width, lr))


def run_one(width: int, lr: float, parametrization: str, steps: int, overrides: list[str]) -> list[float]:
    """The loss of every step of one run (a diverged run's later losses are inf)."""
    with tempfile.TemporaryDirectory() as folder:
        cfg = load_config(None, [
            "--model.parametrization", parametrization, "--optimizer.lr", repr(lr), "--training.steps", str(steps),
            "--job.dump_folder", folder, "--training.device", "cpu", "--metrics.tensorboard", "false",
            *width_overrides(width), *overrides,
        ])
        trainer = Trainer(cfg)
        losses: list[float] = []
        try:
            for _ in range(steps):
                loss, _ = trainer.run_step(trainer.loader.next_step())
                value = trainer.global_losses([loss])[0].item()
                losses.append(value if math.isfinite(value) else math.inf)
                if not math.isfinite(value):
                    losses += [math.inf] * (steps - len(losses))
                    break
        finally:
            trainer.close()
    return losses


def lr_sweep(widths: list[int], lrs: list[float], parametrization: str, steps: int, tail: int = 10,
             overrides: list[str] = (), on_run: Callable[[LRSweep, int, float], None] | None = None) -> LRSweep:
    """Train every (width, lr) pair for `steps` steps (see module doc); `on_run(sweep, width, lr)`
    hears each run as it ends."""
    sweep = LRSweep(parametrization, list(widths), list(lrs), steps, tail)
    for width in widths:
        sweep.losses[width] = {}
        for lr in lrs:
            sweep.losses[width][lr] = run_one(width, lr, parametrization, steps, list(overrides))
            if on_run is not None:
                on_run(sweep, width, lr)
    return sweep
