"""One training process from its command line to its exit code, whatever ends it.

    sys.exit(run_rank(argv, run_training))   # kenotron/train/__main__.py

The process ends with at most one line of its own:

- exit 0: trained to training.steps (or found nothing left to do);
- exit 2: a config error (`kenotron: config error: ...`), found before any process group;
- exit 1: training stopped on a non-finite loss, or an unexpected error (its traceback first; a
  collective that timed out or lost its peer: one line, the traceback in the run's logs);
- exit 128 + N: stopped by signal N (130 for Ctrl-C), after finishing or abandoning a save.

torch's own warnings and log lines go to `<job.dump_folder>/logs/rank<N>_torch.log`, not the console
(runtime/library_output.py).

`train` is handed in (the trainer's `run_training`): this room knows nothing of the step.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kenotron.checkpoint import CheckpointError
from kenotron.checkpoint.diagnose import explain_os_error
from kenotron.config import ConfigError, JobConfig, load_config, split_config_arg
from kenotron.runtime.distributed import WorldInfo
from kenotron.runtime.divergence import NonFiniteLossError
from kenotron.runtime.info_flags import answer_info_flags
from kenotron.runtime.interrupt import TrainingInterrupted
from kenotron.runtime.library_output import library_output_to
from kenotron.runtime.rank_failure import WATCHDOG_NOTE, collective_failure_line, keep_traceback, watchdog_finding
from kenotron.runtime.worker_guard import WorkerGuard, exit_code_of, report_failure

CONFIG_ERRORS = (ConfigError, FileNotFoundError)
"""What a bad config raises (PlanError, ParallelConfigError, UnknownModelError are ConfigErrors);
each is reported as one line and exit code 2."""


def run_rank(argv: list[str], train: Callable[[JobConfig], Any], prog: str = "python -m kenotron.train") -> int:
    """Answer --help / --list-models, or load the config and `train(cfg)` under a WorkerGuard;
    returns the exit code (module docstring)."""
    try:
        if answer_info_flags(argv, prog):
            return 0
    except ConfigError as e:
        report_failure(f"kenotron: config error: {e}", kind="config")
        return 2
    guard = WorkerGuard.install()
    cfg: JobConfig | None = None
    try:
        path, overrides = split_config_arg(argv)
        cfg = load_config(path, overrides)
        rank = WorldInfo.from_env().rank
        with library_output_to(Path(cfg.job.dump_folder) / "logs" / f"rank{rank}_torch.log"):
            train(cfg)
    except CONFIG_ERRORS as e:
        report_failure(f"kenotron: config error: {e}", kind="config")
        return 2
    except KeyboardInterrupt as stop:
        if isinstance(stop, TrainingInterrupted):
            report_failure(f"kenotron: {stop}", kind="interrupted")
            return stop.exit_code
        timeout_s = cfg.parallelism.collective_timeout_s if cfg is not None else None
        report_failure(f"kenotron: {interrupted_line(stop, timeout_s)}", kind="interrupted")
        return exit_code_of(stop)
    except NonFiniteLossError as e:
        report_failure(f"kenotron: stopped: {e}")
        return 1
    except CheckpointError as e:  # a damaged, foreign or mismatching checkpoint, a failed save
        report_failure(f"kenotron: checkpoint error: {e}")
        return 1
    except OSError as e:  # a folder that cannot be created or written, a file that cannot be read
        report_failure(f"kenotron: error: {explain_os_error(e)}")
        return 1
    except Exception as e:  # noqa: BLE001 - every other failure: one line after its traceback
        line = collective_failure_line(e, cfg.parallelism.collective_timeout_s) if cfg is not None else None
        if line is not None:  # the traceback only in the run's logs (runtime/rank_failure.py)
            kept = keep_traceback(e, cfg.job.dump_folder, WorldInfo.from_env().rank)
            report_failure(f"kenotron: {line}" + (f" (traceback: {kept})" if kept else ""))
            return 1
        traceback.print_exc()
        finding = watchdog_finding(e)
        report_failure(f"kenotron: error: {type(e).__name__}: {e}" + (f"; {WATCHDOG_NOTE}{finding}" if finding else ""))
        return 1
    finally:
        guard.uninstall()
    return 0


def interrupted_line(stop: KeyboardInterrupt, timeout_s: float | None = None) -> str:
    """The line for a stop signal that came outside the training loop's own account of it: during
    start-up, or while the rank was already ending on an error (the launcher stops every rank once
    one fails: the error, not the signal, is what this rank has to say)."""
    cause = stop.__context__
    while isinstance(cause, KeyboardInterrupt) and cause.__context__ is not None:
        cause = cause.__context__
    name = signal.Signals(getattr(stop, "signum", signal.SIGINT)).name
    if cause is None or isinstance(cause, KeyboardInterrupt):
        return f"interrupted ({name}) during start-up"
    collective = collective_failure_line(cause, timeout_s) if timeout_s is not None else None
    what = collective or f"{type(cause).__name__}: {str(cause).splitlines()[0]}"
    return f"stopped ({name}) while ending on an error: {what}"


def exit_process(code: int) -> None:
    """End the process with `code`. After a stop signal, without the interpreter's teardown: a save
    that the signal cut at its start can leave a native thread behind whose destruction at exit
    aborts the process (SIGABRT), which would hide the clean stop just reported."""
    if code >= 128:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
