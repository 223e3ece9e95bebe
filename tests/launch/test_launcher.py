"""The launcher (kenotron train / run_train.sh): one line and the right exit code for every end,
also when the failing rank's output is not on the console; workers die with their launcher.

The ranks run tests/launch/rank_program.py (no torch, so each case costs one torchrun start). The
cases that only wait for the launcher's end run ahead, in the background lane (tests/ahead.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.ahead import Lane

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    return env


def _launcher_command(mode: str, tmp_path: Path, nproc: int = 2, blocked: tuple[int, ...] = ()) -> list[str]:
    code = (
        "import sys; from kenotron.launch.launcher import launch; "
        f"sys.exit(launch([{mode!r}, {str(tmp_path)!r}], nproc={nproc}, module='tests.launch.rank_program', "
        f"log_dir={str(tmp_path / 'logs')!r}))"
    )
    if blocked:  # signals masked in the launcher, a mask its ranks inherit through fork and exec
        code = f"import signal; signal.pthread_sigmask(signal.SIG_BLOCK, {[int(s) for s in blocked]!r}); " + code
    return [sys.executable, "-c", code]


def launcher_run(mode: str) -> Callable[[Path, Lane], subprocess.CompletedProcess]:
    """The `run_ahead` job (tests/ahead.py) of the launcher's 2 ranks in `mode` until they end: a
    torchrun start (seconds of imports) that the test only reads the end of."""
    def job(folder: Path, lane: Lane) -> subprocess.CompletedProcess:
        return lane.run(_launcher_command(mode, folder), cwd=ROOT, env=_env(), timeout=120)
    job.__name__ = f"launcher_{mode.replace('-', '_')}"
    return job


def _worker_pids(tmp_path: Path, n: int, timeout: float = 60.0) -> list[int]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        files = sorted(tmp_path.glob("rank*.pid"))
        if len(files) == n and all(f.read_text() for f in files):
            return [int(f.read_text()) for f in files]
        time.sleep(0.2)
    raise AssertionError(f"the ranks did not start within {timeout} s")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its reparented init) counts as gone.
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
            return False
    return True


def _signal_state(pid: int) -> str:
    """What a survivor's /proc says about its state, parent and signals (for a failure's message)."""
    keys = ("State", "PPid", "SigBlk", "SigIgn", "SigCgt", "SigPnd", "ShdPnd")
    with contextlib.suppress(OSError):
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
        return f"{pid}: " + ", ".join(line.replace("\t", " ") for line in lines if line.split(":")[0] in keys)
    return f"{pid}: gone"


def _cleanup(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.run_ahead(job=launcher_run("config-error-on-1"))
def test_a_config_error_on_rank_1_reaches_the_console_with_exit_code_2(ran_ahead):
    proc = ran_ahead
    out, err = proc.stdout, proc.stderr
    assert proc.returncode == 2, err
    assert "kenotron: rank 1: config error: data.path='missing.jsonl' does not exist" in err
    assert "ChildFailedError" not in err + out and "Traceback" not in err + out
    assert "rank 1's output" in err  # where its whole output is kept


@pytest.mark.run_ahead(job=launcher_run("abort-on-1"))
def test_a_rank_dying_of_a_signal_is_named_with_the_end_of_its_log(ran_ahead):
    proc = ran_ahead
    out, err = proc.stdout, proc.stderr
    assert proc.returncode == 128 + signal.SIGABRT, err
    assert "kenotron: rank 1: died of SIGABRT without a Python error" in err
    assert "| rank 1 about to abort" in err
    assert "ChildFailedError" not in err + out


def killed_launcher(blocked: tuple[int, ...]) -> Callable[[Path, Lane], list[str]]:
    """The `run_ahead` job (tests/ahead.py) that SIGKILLs the launcher of 2 sleeping ranks (`blocked`:
    signals masked in it) and gives the /proc state of the ranks still alive 20 s later (none)."""
    def job(folder: Path, lane: Lane) -> list[str]:
        proc = lane.start(_launcher_command("sleep", folder, blocked=blocked), cwd=ROOT, env=_env())
        pids = _worker_pids(folder, 2)
        try:
            proc.kill()  # SIGKILL: the launcher cannot forward anything
            lane.wait(proc, 30)
            deadline = time.time() + 20
            while any(_alive(p) for p in pids) and time.time() < deadline:
                time.sleep(0.2)
            return [_signal_state(p) for p in pids if _alive(p)]
        finally:
            _cleanup(pids)
    job.__name__ = f"killed_launcher_{'_'.join(map(str, blocked)) or 'plain'}"
    return job


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux's")
@pytest.mark.parametrize("blocked", [pytest.param(b, id=name, marks=pytest.mark.run_ahead(job=killed_launcher(b)))
                                     for b, name in [((), "plain"), ((signal.SIGTERM,), "sigterm-blocked-in-the-launcher")]])
def test_workers_die_with_a_killed_launcher(blocked, ran_ahead):
    alive = ran_ahead
    assert not alive, f"workers outlived their launcher: {alive}"


def interrupted_launcher(folder: Path, lane: Lane) -> tuple[int, str, bool]:
    """The `run_ahead` job (tests/ahead.py) that sends SIGINT (Ctrl-C) to the launcher of 2 sleeping
    ranks: its exit code, its output, and whether a rank outlived it."""
    proc = lane.start(_launcher_command("sleep", folder), cwd=ROOT, env=_env())
    pids = _worker_pids(folder, 2)
    try:
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        out, err = lane.wait(proc, 60)
        return proc.returncode, out + err, any(_alive(p) for p in pids)
    finally:
        _cleanup(pids)


@pytest.mark.run_ahead(job=interrupted_launcher)
def test_ctrl_c_stops_every_rank_with_one_line_and_exit_code_130(ran_ahead):
    returncode, output, a_rank_survived = ran_ahead
    assert returncode == 130, output
    assert "kenotron: interrupted on rank 0" in output
    assert "Traceback" not in output and "ChildFailedError" not in output
    assert not a_rank_survived


def test_run_train_sh_passes_a_config_error_through_as_exit_code_2():
    proc = subprocess.run([str(ROOT / "run_train.sh"), "--training.stepz", "3"], check=False, cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "kenotron: config error: unknown config key 'training.stepz'; did you mean 'training.steps'? "
        "(see --help for every key)"
    )
    assert proc.stdout == ""


def test_the_cause_is_the_rank_that_failed_not_the_ones_the_launcher_stopped(tmp_path):
    import json
    from types import SimpleNamespace

    from kenotron.launch.launcher import failures_of

    def failure(rank, exitcode, record=None, timestamp=100):
        error_file = ""
        if record is not None:
            error_file = str(tmp_path / f"error{rank}.json")
            Path(error_file).write_text(json.dumps({"message": record["line"], "kenotron": record}))
        name = signal.Signals(-exitcode).name if exitcode < 0 else "<N/A>"
        return SimpleNamespace(local_rank=rank, exitcode=exitcode, error_file=error_file, timestamp=timestamp,
                               signal_name=lambda: name)

    stopped = failure(0, -signal.SIGTERM, timestamp=99)  # killed by the launcher before its guard was up
    aborted = failure(1, -signal.SIGABRT, timestamp=100)
    assert [f.rank for f in failures_of(SimpleNamespace(failures={0: stopped, 1: aborted}))] == [1, 0]
    interrupted = failure(0, 143, {"line": "kenotron: interrupted", "kind": "interrupted", "time": 1.0})
    config = failure(1, 2, {"line": "kenotron: config error: x", "kind": "config", "time": 2.0})
    first = failures_of(SimpleNamespace(failures={0: interrupted, 1: config}))[0]
    assert (first.rank, first.exit_code, first.line) == (1, 2, "kenotron: config error: x")


def test_default_nproc_counts_the_drivers_gpus_narrowed_by_cuda_visible_devices(tmp_path):
    from kenotron.launch.launcher import default_nproc

    for i in range(4):
        (tmp_path / f"0000:0{i}:00.0").mkdir()
    assert default_nproc({}, str(tmp_path)) == 4
    assert default_nproc({"CUDA_VISIBLE_DEVICES": "2,3"}, str(tmp_path)) == 2
    assert default_nproc({"CUDA_VISIBLE_DEVICES": "0,-1,2"}, str(tmp_path)) == 1  # CUDA stops at -1
    assert default_nproc({"CUDA_VISIBLE_DEVICES": ""}, str(tmp_path)) == 1  # none visible: one CPU process
    assert default_nproc({}, str(tmp_path / "absent")) == 1  # no NVIDIA driver


def test_a_layout_error_needs_no_torch_import(tmp_path):
    """`kenotron train` with a bad layout (and no --nproc) stops before anything imports torch."""
    import subprocess
    import sys

    probe = ("import sys, runpy\nsys.argv = ['kenotron', 'train', '--parallelism.tp', '3', '--job.dump_folder', "
             f"{str(tmp_path / 'run')!r}]\n"
             "try:\n    runpy.run_module('kenotron.cli', run_name='__main__')\n"
             "except SystemExit as e:\n    print('EXIT', e.code, 'torch' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False)
    assert proc.stdout.strip().splitlines()[-1] == "EXIT 2 False", proc.stdout + proc.stderr
    assert "does not divide the world size" in proc.stderr
