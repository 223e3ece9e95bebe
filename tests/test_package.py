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

import pytest

import kenotron
from kenotron.config.presets import preset_names

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("kenotron", "pyproject.toml", "README.md", "LICENSE")
"""What the wheel is built from (pyproject packs kenotron/ and reads README.md)."""


def _run(args: list[str | Path], cwd: Path, env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)


def _offline_env() -> dict[str, str]:
    """No PYTHONPATH (the clone must not be importable), pip kept off the network, one thread."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", OMP_NUM_THREADS="1")
    return env


def _build_wheel(tmp: Path, env: dict[str, str]) -> Path:
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
    proc = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                 "-w", out, src], tmp, env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (wheel,) = out.glob("kenotron-*.whl")
    return wheel


def _install(wheel: Path, tmp: Path, env: dict[str, str]) -> Path:
    """A fresh venv that sees this interpreter's packages (torch) but not the clone; the wheel
    installed into it with --no-deps. Returns its bin/ folder."""
    venv = tmp / "venv"
    proc = _run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv], tmp, env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    python = venv / "bin" / "python"
    # Where this interpreter is itself a venv, --system-site-packages reaches the base Python's
    # packages only: add this one's too (a plain path entry, so their .pth files stay unread).
    found = _run([python, "-c", "import site; print(site.getsitepackages()[0])"], tmp, env)
    Path(found.stdout.strip(), "outer_site_packages.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    proc = _run([python, "-m", "pip", "install", "--no-deps", "--no-index", "-q", wheel], tmp, env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return venv / "bin"


@pytest.mark.slow
def test_the_wheel_ships_the_presets_and_trains_and_estimates_outside_the_clone(tmp_path):
    env = _offline_env()
    wheel = _build_wheel(tmp_path, env)
    assert wheel.name.startswith(f"kenotron-{kenotron.__version__}-"), wheel.name
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [n for n in preset_names() if f"kenotron/presets/{n}.toml" not in names]
    assert not missing, f"presets left out of the wheel: {missing} (pyproject's package-data)"
    assert "kenotron/data/assets/builtin_corpus.json.gz" in names

    bin_dir = _install(wheel, tmp_path, env)
    elsewhere = tmp_path / "elsewhere"  # no clone, no presets folder here
    elsewhere.mkdir()
    where = _run([bin_dir / "python", "-c", "import kenotron; print(kenotron.__file__)"], elsewhere, env)
    assert Path(where.stdout.strip()).is_relative_to(tmp_path / "venv"), where.stdout + where.stderr

    version = _run([bin_dir / "kenotron", "--version"], elsewhere, env)
    assert version.returncode == 0 and version.stdout.strip() == f"kenotron {kenotron.__version__}", version

    wrong = _run([bin_dir / "kenotron", "train", "--config", "lama3_8b"], elsewhere, env)
    assert wrong.returncode == 2 and "did you mean 'llama3_8b'?" in wrong.stderr and "debug" in wrong.stderr, wrong

    train = _run([bin_dir / "kenotron", "train", "--config", "debug", "--training.steps", "2",
                  "--training.seq_len", "64", "--training.local_batch_size", "2", "--training.global_batch_size", "2",
                  "--metrics.tensorboard", "false", "--job.dump_folder", "run"], elsewhere, env)
    assert train.returncode == 0, train.stdout[-2000:] + train.stderr[-3000:]
    steps = [json.loads(line)["step"] for line in (elsewhere / "run" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]

    estimate = _run([bin_dir / "kenotron", "estimate", "--config", "debug", "--ngpu", "2"], elsewhere, env)
    assert estimate.returncode == 0, estimate.stdout[-2000:] + estimate.stderr[-3000:]
    assert "llama3 debug" in estimate.stdout and "verdict: fits" in estimate.stdout, estimate.stdout
