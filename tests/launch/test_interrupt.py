"""Ctrl-C during training: the run stops with one line and exit code 130, after the checkpoint
being written in the background is finished (or naming it as abandoned when the signal cut its
start), and the same command resumes from the latest complete one."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from kenotron.checkpoint.folders import list_step_folders
from tests.ahead import Lane

ROOT = Path(__file__).resolve().parents[2]
ARGS = ["--model.n_layers", "2", "--training.seq_len", "16", "--training.local_batch_size", "2",
        "--metrics.log_freq", "1", "--metrics.tensorboard", "false", "--training.device", "cpu",
        "--checkpoint.enable", "true", "--checkpoint.interval", "1", "--checkpoint.async_mode", "async"]


def interrupt_and_resume(tmp_path: Path, lane: Lane) -> dict:
    """Train with a save per step, Ctrl-C after two complete saves, then the same command resumes
    for two more steps: seconds of training, run ahead of the test (tests/ahead.py). Gives the run
    folder, the interrupted run's exit code and stderr, its complete and cut saves' steps, and the
    resumed run (None if the interrupted run did not end with 130)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    folder = tmp_path / "run"
    command = [sys.executable, "-m", "kenotron.train", *ARGS, "--job.dump_folder", str(folder)]
    proc = lane.start([*command, "--training.steps", "100000"], cwd=ROOT, env=env)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and len([f for f in list_step_folders(folder / "checkpoints") if f.complete]) < 2:
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = lane.wait(proc, timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    saves = list_step_folders(folder / "checkpoints")
    ran = {"folder": folder, "code": proc.returncode, "err": err, "complete": [f.step for f in saves if f.complete],
           "cut": [f.step for f in saves if not f.complete], "resumed": None}
    if proc.returncode == 130 and ran["complete"]:
        # The same command resumes from the latest complete save (a few more steps here).
        ran["resumed"] = lane.run([*command, "--training.steps", str(max(ran["complete"]) + 2)], cwd=ROOT, env=env,
                                  timeout=120)
    return ran


@pytest.mark.run_ahead(job=interrupt_and_resume)
def test_ctrl_c_finishes_the_save_in_flight_and_says_so_in_one_line(ran_ahead):
    folder, err = ran_ahead["folder"], ran_ahead["err"]
    assert ran_ahead["code"] == 130, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("kenotron: interrupted (SIGINT) at step ") and "/100000" in last
    assert "(run the same command to resume from it)" in last
    latest = max(ran_ahead["complete"])
    assert f"the latest complete checkpoint is step-{latest:06d}" in last
    # A save cut short where it starts (the signal lands inside it) is named as abandoned; never loaded.
    for cut in ran_ahead["cut"]:
        assert f"abandoned the save of step-{cut:06d}" in last
    # The same command resumes from it.
    resumed = ran_ahead["resumed"]
    assert resumed.returncode == 0, resumed.stderr
    steps = [json.loads(line)["step"] for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, latest + 3))
