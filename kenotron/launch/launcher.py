"""Start the training processes of one node through torchrun, and end with one clear line.

    launch(["--config", "debug", "--training.steps", "20"], nproc=2)

`kenotron train` and `./run_train.sh` call this. It runs torchrun's own launcher in this process
(torch.distributed.run: its rendezvous, its per-rank log files, its restarts), and adds:

- the config is checked first, in this process, before any rank starts: a bad key, degrees that
  do not fit the world size or the model (runtime/preflight.py, before torch is imported), then
  everything resolve_run and the trainer check (launch/run_checks.py): one line, exit code 2;
- a rank's failure ends with that rank's one-line error on the console, also when the rank's own
  output is not shown (`log_ranks`), instead of torchrun's ChildFailedError block; a rank that
  died without a word (a signal, a native crash) is named with the end of its log;
- the exit code is the failing rank's (2 for config errors, 128 + N for signal N);
- Ctrl-C or SIGTERM is passed to the ranks, which stop cleanly and say so in one line;
- every rank's output is kept under `<job.dump_folder>/logs/` (with several processes), and the
  watchdog's warnings of the ranks not shown are repeated on the console (launch/log_echo.py).
- with fault_tolerance.enable it runs one replica group (kenotron/fault_tolerance/lighthouse.py).
"""

from __future__ import annotations

import glob
import json
import logging
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kenotron.config import ConfigError, JobConfig, load_config, split_config_arg, validate_config
from kenotron.fault_tolerance.checks import check_fault_tolerance
from kenotron.fault_tolerance.lighthouse import ReplicaGroupLaunch, prepare_replica_group, replica_group_argv
from kenotron.kernel_choice.target import NVIDIA_GPUS, visible_cuda_gpus
from kenotron.launch.log_echo import LogEcho
from kenotron.runtime.degrees import layout_degrees
from kenotron.runtime.preflight import machine_target, preflight

# What torchrun logs and kenotron says better itself: the failure summary, the signal forwarding.
_REPLACED_LOG_LINES = ("failed (exitcode", "death signal, shutting down workers", "closing signal",
                       "Setting OMP_NUM_THREADS")
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
"""What the launcher sends its ranks to stop them."""
_CAUSE_ORDER = {"config": 0, "error": 0, "crash": 0, "peer": 1, "interrupted": 2}
"""How a failure ranks as the cause of a job's end: lower first, then earlier."""


@dataclass
class Failure:
    """One rank's end as the launcher saw it."""

    rank: int
    local_rank: int
    exitcode: int
    line: str
    kind: str
    time: float
    printed: bool = True
    """The rank printed its line (False: its output file could not take it, e.g. on a full disk)."""

    @property
    def exit_code(self) -> int:
        return 128 - self.exitcode if self.exitcode < 0 else self.exitcode


class _TorchrunLogFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(text in message for text in _REPLACED_LOG_LINES)


def _quiet_torchrun_logs() -> None:
    """torchrun's own warnings stay, one line each; the lines kenotron replaces go."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("torchrun: %(message)s"))
    handler.addFilter(_TorchrunLogFilter())
    for name in ("torch.distributed.elastic", "torch.distributed.run"):
        logger = logging.getLogger(name)
        logger.handlers = [handler]
        logger.propagate = False


def default_nproc(environ: Mapping[str, str] = os.environ, driver_gpus: str = NVIDIA_GPUS) -> int:
    """One process per visible GPU (counted without torch: kernel_choice/target.py), or one on a
    machine without GPUs."""
    return max(visible_cuda_gpus(environ, driver_gpus), 1)


def torchrun_args(train_argv: Sequence[str], *, nproc: int, nnodes: int, rdzv_endpoint: str, rdzv_id: str,
                  log_ranks: str, log_dir: str, module: str) -> list[str]:
    """torchrun's command line for these settings."""
    args = ["--nnodes", str(nnodes), "--nproc-per-node", str(nproc), "--log-dir", log_dir]
    if nnodes == 1:
        args.append("--standalone")
    else:
        if not rdzv_endpoint:
            raise ConfigError(f"{nnodes} nodes need the rendezvous endpoint host:port of node 0 "
                              f"(--rdzv-endpoint, or RDZV_ENDPOINT for run_train.sh)")
        args += ["--rdzv-backend", "c10d", "--rdzv-endpoint", rdzv_endpoint, "--rdzv-id", rdzv_id]
    if nproc * nnodes > 1:
        # Every rank's output goes to its own file; the console shows the ranks in log_ranks.
        args += ["--role", "rank", "--tee", "3", "--local-ranks-filter", log_ranks]
    return [*args, "-m", module, *train_argv]


def _read_record(error_file: str) -> dict[str, Any]:
    try:
        with open(error_file) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    entry = data.get("kenotron") if isinstance(data, dict) else None
    if isinstance(entry, dict):
        return entry
    message = data.get("message") if isinstance(data, dict) else None
    if isinstance(message, dict):  # torch's own error-file format (@record)
        message = message.get("message")
    return {"line": str(message), "kind": "error"} if message else {}


def _log_tail(log_dir: str, local_rank: int, lines: int = 4) -> tuple[str, list[str]]:
    """The newest stderr log of a local rank under `log_dir`, and its last non-empty lines."""
    found = glob.glob(os.path.join(log_dir, "*", "attempt_*", str(local_rank), "stderr.log"))
    if not found:
        return "", []
    newest = max(found, key=os.path.getmtime)
    try:
        text = Path(newest).read_text(errors="replace").splitlines()
    except OSError:
        return newest, []
    return newest, [t for t in text if t.strip()][-lines:]


def _line_from_log(log_dir: str, local_rank: int) -> dict[str, Any]:
    """The rank's own last line from its log, as a record not known to be on the console. torchrun
    keeps the error file beside the logs: on a full disk the rank prints its line but cannot record it."""
    _, tail = _log_tail(log_dir, local_rank, lines=1) if log_dir else ("", [])
    if tail and tail[-1].startswith("kenotron: "):
        kind = "config" if tail[-1].startswith("kenotron: config error:") else "error"
        return {"line": tail[-1], "kind": kind, "printed": False}
    return {}


def failures_of(exc: Any, log_dir: str = "") -> list[Failure]:
    """The failures of torchrun's ChildFailedError, each with the rank's own line when it wrote one."""
    out = []
    for rank, pf in exc.failures.items():
        record = _read_record(pf.error_file) if pf.error_file and os.path.isfile(pf.error_file) else {}
        if not record and pf.exitcode > 0:
            record = _line_from_log(log_dir, pf.local_rank)
        if record:
            kind, line = record.get("kind", "error"), record.get("line", "")
        elif -pf.exitcode in _STOP_SIGNALS:
            # Stopped by the launcher (it sends these to the others when one rank fails) before
            # it could say anything: a consequence, not a cause.
            kind, line = "interrupted", f"stopped by {pf.signal_name()} before it could report"
        elif pf.exitcode < 0:
            kind, line = "crash", f"died of {pf.signal_name()} without a Python error"
        else:
            kind, line = "crash", f"exited with code {pf.exitcode} without a kenotron error"
        out.append(Failure(rank, pf.local_rank, pf.exitcode, line, kind, float(record.get("time", pf.timestamp)),
                           bool(record.get("printed", True))))
    return sorted(out, key=lambda f: (_CAUSE_ORDER.get(f.kind, 0), f.time, f.rank))


def report(failures: list[Failure], *, shown_local_ranks: set[int] | None, log_dir: str) -> str:
    """The console line(s) for the first failure; empty when the rank already said it there."""
    first = failures[0]
    shown = shown_local_ranks is None or first.local_rank in shown_local_ranks
    if first.kind != "crash" and shown and first.printed:
        return ""  # its one line is on the console already (it printed it)
    text = first.line.removeprefix("kenotron: ")
    out = [f"kenotron: rank {first.rank}: {text}"]
    path, tail = _log_tail(log_dir, first.local_rank)
    if first.kind == "crash":
        out += [f"  | {t}" for t in tail]
    if path:
        out.append(f"  (rank {first.rank}'s output: {path})")
    return "\n".join(out)


def make_log_dir(log_dir: str) -> None:
    """Create the ranks' log folder (torchrun's own attempt is a 25-line traceback); ConfigError
    naming the folder and the reason when it cannot be (a read-only disk, a file in the way)."""
    try:
        os.makedirs(log_dir, exist_ok=True)
        probe = Path(log_dir) / f".write-test-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as e:
        where = f" at {e.filename}" if e.filename and os.path.abspath(e.filename) != os.path.abspath(log_dir) else ""
        reason = (e.strerror or str(e)).lower()
        raise ConfigError(f"the run's log folder {log_dir} cannot be written ({reason}{where}); point job.dump_folder "
                          f"at a writable folder") from None


TRAINER = "kenotron.launch.rank"
"""The program of every rank: the trainer, told that the checks below ran here (launch/rank.py)."""


def _answer_info_flags(train_argv: list[str]) -> bool:
    """--help / --list-models (runtime/info_flags.py, which imports the model registry: only when asked)."""
    if not any(flag in train_argv for flag in ("-h", "--help", "--list-models")):
        return False
    from kenotron.runtime.info_flags import answer_info_flags

    return answer_info_flags(train_argv, prog="kenotron train")


def check_config(cfg: JobConfig, world_size: int) -> None:
    """Every check of the ranks' start, once, here (ConfigError), cheapest first: the config's
    own checks, the model's shape and the kernel choices need no torch (runtime/preflight.py);
    the rest needs the trainer (seconds to import), imported only once they passed."""
    validate_config(cfg)
    check_fault_tolerance(cfg)
    layout_degrees(cfg, world_size)
    preflight(cfg, world_size, machine_target(cfg))  # the model's shape, the kernel choices: no torch
    from kenotron.launch.run_checks import check_run

    check_run(cfg, world_size)
    if cfg.fault_tolerance.enable:
        from kenotron.fault_tolerance.torchft_import import import_torchft

        import_torchft()  # torchft installed and loading with this torch


def launch(train_argv: Sequence[str], *, nproc: int | None = None, nnodes: int = 1, rdzv_endpoint: str = "",
           rdzv_id: str = "kenotron", log_ranks: str = "0", module: str = TRAINER, log_dir: str = "") -> int:
    """Run training on this node (module docstring); returns the exit code to end with.

    `module` is the program of every rank (`python -m module ARGS`), kenotron's trainer by
    default, whose config is checked here first and whose logs go to `<job.dump_folder>/logs`;
    another program needs `log_dir`."""
    train_argv = list(train_argv)
    try:
        if module == TRAINER and _answer_info_flags(train_argv):
            return 0
        nproc = nproc or default_nproc()
        if module == TRAINER:
            path, overrides = split_config_arg(train_argv)
            cfg = load_config(path, overrides)
            if cfg.fault_tolerance.enable:  # one replica group, in its own run folder
                train_argv = replica_group_argv(cfg, train_argv)
                cfg = load_config(*split_config_arg(train_argv))
            check_config(cfg, nproc * nnodes)
            log_dir = log_dir or str(Path(cfg.job.dump_folder) / "logs")
        if not log_dir:
            raise ConfigError(f"launching {module} needs a log_dir")
        make_log_dir(log_dir)
        try:
            shown = {int(r) for r in log_ranks.split(",") if r.strip()}
            argv = torchrun_args(train_argv, nproc=nproc, nnodes=nnodes, rdzv_endpoint=rdzv_endpoint,
                                 rdzv_id=rdzv_id, log_ranks=log_ranks, log_dir=log_dir, module=module)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        # torch's launcher, imported once the config passed every check.
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.run import get_args_parser, run
    except (ConfigError, FileNotFoundError) as e:  # what a rank reports as a config error (runtime/rank_process.py)
        print(f"kenotron: config error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C while the config is checked (seconds of imports): nothing started yet
        print("kenotron: interrupted (SIGINT) while checking the config; no rank was started", file=sys.stderr)
        return 128 + signal.SIGINT
    if nproc * nnodes > 1 and "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = "1"  # one thread per rank on CPU unless the caller chose otherwise
    _quiet_torchrun_logs()
    group: ReplicaGroupLaunch | None = None
    if module == TRAINER and cfg.fault_tolerance.enable:
        group = prepare_replica_group(cfg)  # the lighthouse, torchrun's restarts of the group
        argv = [*group.torchrun_args, *argv]
    # The watchdog's lines of the ranks not shown (launch/log_echo.py): a stopped rank 0 is named by rank 1.
    echo = LogEcho(log_dir, [r for r in range(nproc) if r not in shown] if nproc * nnodes > 1 else [],
                   one_node=nnodes == 1).start()
    try:
        try:
            run(get_args_parser().parse_args(argv))
        finally:
            echo.stop()  # its last lines before the launcher's own
    except ChildFailedError as exc:
        failures = failures_of(exc, log_dir)
        line = report(failures, shown_local_ranks=shown if nproc * nnodes > 1 else None, log_dir=log_dir)
        if line:
            print(line, file=sys.stderr, flush=True)
        return failures[0].exit_code
    except SignalException as exc:
        # The ranks got the signal too and said how they stopped.
        return 128 + int(exc.sigval)
    except KeyboardInterrupt:
        return 128 + signal.SIGINT
    finally:
        if group is not None:
            group.close()
    return 0
