"""The wheel people install: built with no network, installed into a fresh environment, and used
from a folder outside the clone (`kenotron train --config debug`, `kenotron estimate`)."""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

import kenotron
from kenotron.config.presets import preset_names
from tests.ahead import Lane

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("kenotron", "pyproject.toml", "README.md", "LICENSE")
"""What the wheel is built from (pyproject packs kenotron/ and reads README.md)."""


def _run(lane: Lane, args: list[str | Path], cwd: Path, env: dict[str, str],
         timeout: float = 240) -> subprocess.CompletedProcess:
    return lane.run(args, cwd=cwd, env=env, timeout=timeout)


def _offline_env() -> dict[str, str]:
    """No PYTHONPATH (the clone must not be importable), pip kept off the network, one thread."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", OMP_NUM_THREADS="1")
    return env


def _build_wheel(lane: Lane, tmp: Path, env: dict[str, str]) -> Path:
    """`pip wheel --no-deps --no-build-isolation` on a copy of the sources (the build's own files,
    build/ and *.egg-info, stay out of the clone)."""
    src = tmp / "src"
    src.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, src / name)
    out = tmp / "wheel"
    proc = _run(lane, [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                 "-w", out, src], tmp, env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (wheel,) = out.glob("kenotron-*.whl")
    return wheel


def _install(lane: Lane, wheel: Path, tmp: Path, env: dict[str, str]) -> Path:
    """A fresh venv that sees this interpreter's packages (torch) but not the clone; the wheel
    installed into it with --no-deps. Returns its bin/ folder."""
    venv = tmp / "venv"
    proc = _run(lane, [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv], tmp, env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    python = venv / "bin" / "python"
    # Where this interpreter is itself a venv, --system-site-packages reaches the base Python's
    # packages only: add this one's too (a plain path entry, so their .pth files stay unread).
    found = _run(lane, [python, "-c", "import site; print(site.getsitepackages()[0])"], tmp, env)
    Path(found.stdout.strip(), "outer_site_packages.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    proc = _run(lane, [python, "-m", "pip", "install", "--no-deps", "--no-index", "-q", wheel], tmp, env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return venv / "bin"


def build_install_and_use(tmp_path: Path, lane: Lane) -> dict[str, Any]:
    """Build the wheel, install it in a fresh venv and run its commands in a folder outside the
    clone: ~15 s of processes, run ahead of the test (tests/ahead.py). Returns what each gave."""
    env = _offline_env()
    wheel = _build_wheel(lane, tmp_path, env)
    bin_dir = _install(lane, wheel, tmp_path, env)
    elsewhere = tmp_path / "elsewhere"  # no clone, no presets folder here
    elsewhere.mkdir()
    commands = {
        "where": [bin_dir / "python", "-c", "import kenotron; print(kenotron.__file__)"],
        "version": [bin_dir / "kenotron", "--version"],
        "wrong": [bin_dir / "kenotron", "train", "--config", "lama3_8b"],
        "train": [bin_dir / "kenotron", "train", "--config", "debug", "--training.steps", "2", "--training.seq_len",
                  "64", "--training.local_batch_size", "2", "--training.global_batch_size", "2",
                  "--metrics.tensorboard", "false", "--job.dump_folder", "run"],
        "estimate": [bin_dir / "kenotron", "estimate", "--config", "debug", "--ngpu", "2"],
    }
    ran = {name: _run(lane, args, elsewhere, env) for name, args in commands.items()}
    return {"tmp_path": tmp_path, "wheel": wheel, "elsewhere": elsewhere, **ran}


@pytest.mark.slow
@pytest.mark.run_ahead(job=build_install_and_use)
def test_the_wheel_ships_the_presets_and_trains_and_estimates_outside_the_clone(ran_ahead):
    tmp_path, wheel, elsewhere = ran_ahead["tmp_path"], ran_ahead["wheel"], ran_ahead["elsewhere"]
    assert wheel.name.startswith(f"kenotron-{kenotron.__version__}-"), wheel.name
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [n for n in preset_names() if f"kenotron/presets/{n}.toml" not in names]
    assert not missing, f"presets left out of the wheel: {missing} (pyproject's package-data)"
    assert "kenotron/data/assets/builtin_corpus.json.gz" in names

    where = ran_ahead["where"]
    assert Path(where.stdout.strip()).is_relative_to(tmp_path / "venv"), where.stdout + where.stderr

    version = ran_ahead["version"]
    assert version.returncode == 0 and version.stdout.strip() == f"kenotron {kenotron.__version__}", version

    wrong = ran_ahead["wrong"]
    assert wrong.returncode == 2 and "did you mean 'llama3_8b'?" in wrong.stderr and "debug" in wrong.stderr, wrong

    train = ran_ahead["train"]
    assert train.returncode == 0, train.stdout[-2000:] + train.stderr[-3000:]
    steps = [json.loads(line)["step"] for line in (elsewhere / "run" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]

    estimate = ran_ahead["estimate"]
    assert estimate.returncode == 0, estimate.stdout[-2000:] + estimate.stderr[-3000:]
    assert "llama3 debug" in estimate.stdout and "verdict: fits" in estimate.stdout, estimate.stdout
