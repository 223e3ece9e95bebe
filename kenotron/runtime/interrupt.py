"""A training run told to stop (Ctrl-C, SIGTERM): finish or abandon the save in flight, say which.

`run_training` turns the KeyboardInterrupt into `TrainingInterrupted`, whose message is the one
line the user sees, e.g.

    interrupted (SIGINT) at step 37/250; finished the save of step-000035 first; the latest complete
    checkpoint is step-000035 (run the same command to resume from it)
"""

from __future__ import annotations

import signal
from typing import Any

from kenotron.checkpoint.folders import list_step_folders, step_folder_name


class TrainingInterrupted(KeyboardInterrupt):
    """The run stopped on a signal; `str()` is the one-line account, `exit_code` 128 + the signal."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code

    def __str__(self) -> str:
        return self.message


def _signal_name(stop: KeyboardInterrupt) -> tuple[str, int]:
    signum = getattr(stop, "signum", signal.SIGINT)
    return signal.Signals(signum).name, 128 + signum


def stop_training(trainer: Any, stop: KeyboardInterrupt) -> TrainingInterrupted:
    """Wait for the checkpoint in flight (or see that it was cut short) and describe the stop."""
    name, code = _signal_name(stop)
    trainer.metrics.close()  # the records written so far stay (TensorBoard flushes on close)
    total = trainer.cfg.training.steps
    parts = [f"interrupted ({name}) at step {trainer.step}/{total}"]
    checkpointer = trainer.checkpointer
    if not checkpointer.config.enable:
        parts.append("no checkpoint is saved (checkpoint.enable is false): a new run starts from step 0")
        return TrainingInterrupted("; ".join(parts), code)
    before = list_step_folders(checkpointer.folder)
    latest = max((f.step for f in before if f.complete), default=-1)
    in_flight = [f.step for f in before if not f.complete and latest < f.step <= trainer.step]
    failure = None
    try:
        checkpointer.wait()
    except Exception as exc:  # noqa: BLE001 - reported in the line below, not raised over the stop
        failure = exc
    complete = {f.step for f in list_step_folders(checkpointer.folder) if f.complete}
    for step in in_flight:
        if step in complete:
            parts.append(f"finished the save of {step_folder_name(step)} first")
        else:
            why = f" ({type(failure).__name__})" if failure is not None else ""
            parts.append(f"abandoned the save of {step_folder_name(step)}{why}: it is incomplete and never loaded")
    if complete:
        parts.append(f"the latest complete checkpoint is {step_folder_name(max(complete))} "
                     f"(run the same command to resume from it)")
    else:
        parts.append("no complete checkpoint yet: a new run starts from step 0")
    return TrainingInterrupted("; ".join(parts), code)
