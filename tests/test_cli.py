"""The `kenotron` command's own flags (kenotron/cli.py); each command is tested in its room."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import kenotron
from kenotron.cli import main
from kenotron.config.presets import preset_names

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_prints_the_package_release_and_exits_0(flag, capsys):
    assert main([flag]) == 0
    assert capsys.readouterr().out.strip() == f"kenotron {kenotron.__version__}"


def test_the_release_is_written_once_and_pyproject_reads_it():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "kenotron.__version__"}
    assert kenotron.__version__.count(".") == 2 and all(part.isdigit() for part in kenotron.__version__.split("."))


def test_the_usage_names_the_version_flag_and_every_shipped_preset(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "kenotron --version" in out
    assert "  " + ", ".join(preset_names()) in out.splitlines()


def test_output_into_a_closed_pipe_ends_quietly():
    """`kenotron ... | head`: the reader is gone before the first line; no traceback follows."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "kenotron.cli", "--help"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, cwd=ROOT)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 1 and err == "", err
