"""One training process from its command line to its exit code, whatever ends it.

    sys.exit(run_rank(argv, run_training))   # kenotron/train/__main__.py

The process ends with at most one line of its own:

- exit 0: trained to training.steps (or found nothing left to do);
- exit 2: a config error (`kenotron: config error: ...`), found before any process group;
- exit 1: training stopped on a non-finite loss, or an unexpected error (its traceback first);
- exit 128 + N: stopped by signal N (130 for Ctrl-C), after finishing or abandoning a save.

`train` is handed in (the trainer's `run_training`): this room knows nothing of the step.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

from kenotron.checkpoint import CheckpointError
from kenotron.checkpoint.diagnose import explain_os_error
from kenotron.config import ConfigError, JobConfig, load_config, split_config_arg
from kenotron.runtime.divergence import NonFiniteLossError
from kenotron.runtime.info_flags import answer_info_flags
from kenotron.runtime.interrupt import TrainingInterrupted
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
    try:
        path, overrides = split_config_arg(argv)
        train(load_config(path, overrides))
    except CONFIG_ERRORS as e:
        report_failure(f"kenotron: config error: {e}", kind="config")
        return 2
    except KeyboardInterrupt as stop:
        if isinstance(stop, TrainingInterrupted):
            report_failure(f"kenotron: {stop}", kind="interrupted")
            return stop.exit_code
        report_failure("kenotron: interrupted during start-up", kind="interrupted")
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
        traceback.print_exc()
        report_failure(f"kenotron: error: {type(e).__name__}: {e}")
        return 1
    finally:
        guard.uninstall()
    return 0


def exit_process(code: int) -> None:
    """End the process with `code`. After a stop signal, without the interpreter's teardown: a save
    that the signal cut at its start can leave a native thread behind whose destruction at exit
    aborts the process (SIGABRT), which would hide the clean stop just reported."""
    if code >= 128:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
