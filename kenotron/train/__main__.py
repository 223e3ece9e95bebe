"""`python -m kenotron.train --config X.toml [--section.key value ...]`: one training process.

`kenotron train` / `./run_train.sh` start one of these per rank through torchrun
(kenotron/launch/launcher.py; signals and the last word: train/worker_guard.py). Whatever ends it, it ends with at most one line of its own:

- exit 0: trained to training.steps (or found nothing left to do);
- exit 2: a config error (`kenotron: config error: ...`), found before any process group;
- exit 1: training stopped on a non-finite loss, or an unexpected error (its traceback first);
- exit 128 + N: stopped by signal N (130 for Ctrl-C), after finishing or abandoning a save.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import traceback

from kenotron.config import ConfigError, load_config, split_config_arg
from kenotron.models import MODEL_SPECS
from kenotron.models.args import SET_BY_THE_TRAINER
from kenotron.train.worker_guard import WorkerGuard, exit_code_of, report_failure

CONFIG_ERRORS = (ConfigError, FileNotFoundError)
"""What a bad config raises (PlanError, ParallelConfigError, UnknownModelError are ConfigErrors);
each is reported as one line and exit code 2."""


def answer_info_flags(argv: list[str], prog: str = "python -m kenotron.train") -> bool:
    """Print --help or --list-models when asked (True), without starting anything."""
    if "-h" in argv or "--help" in argv:
        from kenotron.config.help import help_for_argv

        print(help_for_argv([a for a in argv if a not in ("-h", "--help")], prog=prog))
        return True
    if "--list-models" in argv:
        for name, spec in MODEL_SPECS.items():
            flavor = next(iter(spec.flavors.values()))
            # A nested table (an MoE family's moe) with its own fields: `moe.n_experts` and the like.
            fields = [f"{f.name} ({', '.join(g.name for g in dataclasses.fields(value))})"
                      if dataclasses.is_dataclass(value := getattr(flavor, f.name)) else f.name
                      for f in dataclasses.fields(flavor) if f.name not in SET_BY_THE_TRAINER]
            print(f"{name}: {', '.join(spec.flavors)}\n  model.<field>: {', '.join(fields)}")
        return True
    return False


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if answer_info_flags(argv):
            return 0
    except ConfigError as e:
        report_failure(f"kenotron: config error: {e}", kind="config")
        return 2
    guard = WorkerGuard.install()
    try:
        path, overrides = split_config_arg(argv)
        cfg = load_config(path, overrides)
        # Imported here so config errors come before torch's start-up.
        from kenotron.train.trainer import run_training

        run_training(cfg)
    except CONFIG_ERRORS as e:
        report_failure(f"kenotron: config error: {e}", kind="config")
        return 2
    except KeyboardInterrupt as stop:
        from kenotron.train.interrupt import TrainingInterrupted

        if isinstance(stop, TrainingInterrupted):
            report_failure(f"kenotron: {stop}", kind="interrupted")
            return stop.exit_code
        report_failure("kenotron: interrupted during start-up", kind="interrupted")
        return exit_code_of(stop)
    except Exception as e:  # noqa: BLE001 - every other failure: one line (a traceback first when unexpected)
        from kenotron.checkpoint import CheckpointError
        from kenotron.checkpoint.diagnose import explain_os_error
        from kenotron.train.guards import NonFiniteLossError

        if isinstance(e, NonFiniteLossError):
            report_failure(f"kenotron: stopped: {e}")
            return 1
        if isinstance(e, CheckpointError):  # a damaged, foreign or mismatching checkpoint, a failed save
            report_failure(f"kenotron: checkpoint error: {e}")
            return 1
        if isinstance(e, OSError):  # a folder that cannot be created or written, a file that cannot be read
            report_failure(f"kenotron: error: {explain_os_error(e)}")
            return 1
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


if __name__ == "__main__":
    exit_process(main())
