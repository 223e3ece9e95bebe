"""Ctrl-C during training: the run stops with one line and exit code 130, after the checkpoint
being written in the background is finished (or naming it as abandoned when the signal cut its
start), and the same command resumes from the latest complete one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from kenotron.checkpoint.folders import list_step_folders

ROOT = Path(__file__).resolve().parents[2]
ARGS = ["--model.n_layers", "2", "--training.seq_len", "16", "--training.local_batch_size", "2",
        "--metrics.log_freq", "1", "--metrics.tensorboard", "false", "--training.device", "cpu",
        "--checkpoint.enable", "true", "--checkpoint.interval", "1", "--checkpoint.async_mode", "async"]


def test_ctrl_c_finishes_the_save_in_flight_and_says_so_in_one_line(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    folder = tmp_path / "run"
    command = [sys.executable, "-m", "kenotron.train", *ARGS, "--job.dump_folder", str(folder)]
    proc = subprocess.Popen([*command, "--training.steps", "100000"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and len([f for f in list_step_folders(folder / "checkpoints") if f.complete]) < 2:
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("kenotron: interrupted (SIGINT) at step ") and "/100000" in last
    assert "(run the same command to resume from it)" in last
    latest = max(f.step for f in list_step_folders(folder / "checkpoints") if f.complete)
    assert f"the latest complete checkpoint is step-{latest:06d}" in last
    # A save cut short where it starts (the signal lands inside it) is named as abandoned; never loaded.
    for cut in (f for f in list_step_folders(folder / "checkpoints") if not f.complete):
        assert f"abandoned the save of step-{cut.step:06d}" in last
    # The same command resumes from it (a few more steps here).
    resumed = subprocess.run([*command, "--training.steps", str(latest + 2)], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=120, check=False)
    assert resumed.returncode == 0, resumed.stderr
    steps = [json.loads(line)["step"] for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, latest + 3))
