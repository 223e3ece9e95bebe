"""examples/nanosets/README.md's try-it commands run as written: the one-liner writes the sample
corpus and its tokenized folder, and the training command trains on that folder (a few steps)."""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path

import pytest

from tests.ahead import Lane

ROOT = Path(__file__).parents[2]
README = ROOT / "examples" / "nanosets" / "README.md"


def readme_command(starts: str) -> str:
    """The README's command line that begins with `starts`."""
    lines = [line.strip() for line in README.read_text().splitlines() if line.strip().startswith(starts)]
    assert len(lines) == 1, f"examples/nanosets/README.md has {len(lines)} commands starting {starts!r}"
    return lines[0]


def readme_commands(tmp_path: Path, lane: Lane) -> tuple[Path, str]:
    """The README's one-liner, then its training command (a few steps), in `tmp_path`: run ahead
    of the test (tests/ahead.py). Returns `tmp_path` and the folder the one-liner wrote in it."""
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    write = shlex.split(readme_command("python -c"), comments=True)
    assert write[0] == "python"
    # Run where the user's shell would leave the folder: relative to the working directory.
    proc = lane.run([sys.executable, *write[1:]], cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = re.search(r"write_sample_data\('([^']+)'\)", write[2]).group(1)

    train = shlex.split(readme_command("./run_train.sh"), comments=True)
    path = train[train.index("--data.path") + 1]
    assert path == f"{folder}/tokenized", "the training command reads another folder than the one-liner writes"
    # run_train.sh runs from the repository root: give it the folder the one-liner wrote; a few
    # steps (later flags win) into a folder of the test's.
    train[train.index("--data.path") + 1] = str(tmp_path / path)
    proc = lane.run(["bash", ROOT / "run_train.sh", *train[1:], "--training.steps", "3",
                     "--job.dump_folder", tmp_path / "out"], cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return tmp_path, folder


@pytest.mark.run_ahead(job=readme_commands)
def test_the_readme_writes_the_sample_data_and_trains_on_its_tokenized_folder(ran_ahead):
    tmp_path, folder = ran_ahead
    assert (tmp_path / folder / "corpus.jsonl").is_file()
    assert (tmp_path / "out" / "metrics.jsonl").is_file()


def test_the_readme_trains_into_a_folder_of_its_own():
    # The quick start's outputs/debug holds another run (another config): the README's command
    # must not be refused there after the quick start, nor replace it.
    assert "--job.dump_folder outputs/nanosets" in readme_command("./run_train.sh")
