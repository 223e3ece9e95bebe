"""`kenotron train` checks the whole config once, in the launcher, before torchrun starts any
rank: one line, exit code 2; the config-only and model-shape mistakes before torch is even imported."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.ahead import Lane

ROOT = Path(__file__).resolve().parents[2]

# Runs `kenotron train ARGS` in this interpreter, then reports whether torch was imported.
PROGRAM = """
import sys
from kenotron.cli import main
code = main(["train", *sys.argv[1:]])
print("torch imported" if "torch" in sys.modules else "torch not imported")
sys.exit(code)
"""


def kenotron_train(*args: str) -> Callable[[Path, Lane], tuple[Path, subprocess.CompletedProcess]]:
    """The `run_ahead` job (tests/ahead.py) of `kenotron train --config debug ARGS` in a new
    interpreter, into the job's folder/run ("{folder}" in an argument is the job's folder); gives
    the folder and the finished process."""
    def job(folder: Path, lane: Lane) -> tuple[Path, subprocess.CompletedProcess]:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
                   OMP_NUM_THREADS="1")
        proc = lane.run([sys.executable, "-c", PROGRAM, "--config", "debug", "--job.dump_folder", folder / "run",
                         *(arg.format(folder=folder) for arg in args)], cwd=ROOT, env=env, timeout=300)
        return folder, proc
    job.__name__ = "kenotron_train"
    return job


@pytest.mark.run_ahead(job=kenotron_train("--nproc", "2", "--parallelism.tp", "3"))
def test_degrees_that_do_not_fit_the_world_size_are_one_line_before_torch_is_imported(ran_ahead):
    tmp_path, proc = ran_ahead
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [(
        "kenotron: config error: dp_shard=-1 has no room: dp_replicate x cp x tp x pp = 1 x 1 x 3 x 1 = 3 does not "
        "divide the world size 2; choose degrees whose product divides 2 (divisors: [1, 2])")]
    assert proc.stdout.strip() == "torch not imported"
    assert not (tmp_path / "run").exists()  # nothing started


@pytest.mark.run_ahead(job=kenotron_train("--nproc", "3", "--parallelism.tp", "3"))
def test_tp_not_dividing_the_heads_is_one_line_from_the_launcher_before_torch_is_imported(ran_ahead):
    tmp_path, proc = ran_ahead
    assert proc.returncode == 2, proc.stderr
    # A rank's line would carry torchrun's "[rankN]:" prefix and come once per rank.
    assert proc.stderr.strip().splitlines() == [
        "kenotron: config error: tp=3 does not divide n_heads=8; use one of [1, 2, 4, 8]"]
    assert proc.stdout.strip() == "torch not imported"  # the model's shape is checked without torch (issue 34)
    assert not (tmp_path / "run" / "logs").exists()  # torchrun never started


@pytest.mark.run_ahead(job=kenotron_train("--nproc", "2", "--tuning.loss", "fused", "--parallelism.pp", "2"))
def test_a_kernel_choice_error_is_one_line_from_the_launcher_before_torch_is_imported(ran_ahead):
    tmp_path, proc = ran_ahead
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "kenotron: config error: tuning.loss='fused' does not combine with pipeline parallel; use 'auto' or 'plain'"]
    assert proc.stdout.strip() == "torch not imported"  # kernel_choice/config_checks.py (issue 34)
    assert not (tmp_path / "run" / "logs").exists()


@pytest.mark.run_ahead(job=kenotron_train("--nproc", "2", "--tokenizer.path", "{folder}/absent.json"))
def test_an_error_only_the_full_resolve_finds_is_one_line_from_the_launcher(ran_ahead):
    tmp_path, proc = ran_ahead
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "tokenizer.path=" in proc.stderr and "does not exist" in proc.stderr
    assert not (tmp_path / "run" / "logs").exists()


@pytest.mark.run_ahead(job=kenotron_train("--help"))
def test_train_help_answers_without_importing_torch(ran_ahead):
    _, proc = ran_ahead
    assert proc.returncode == 0, proc.stderr
    assert "--nproc" in proc.stdout and "--training.steps" in proc.stdout
    assert proc.stdout.strip().endswith("torch not imported")
