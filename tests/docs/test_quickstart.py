"""README.md's quick start, run as a user runs it: `./run_train.sh` trains the debug model for
250 steps. Its first and last losses are the ones README.md and kenotron/presets/debug.toml state,
every logged loss is within 1% of the golden run (tests/golden/debug_losses.jsonl, made by
`kenotron compare`'s own reader), and the run prints no warning of kenotron's own."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from kenotron.runs import compare_losses
from tests.ahead import Lane

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "debug_losses.jsonl"


def _stated(text: str, where: str) -> tuple[float, float]:
    found = re.search(r"loss (?:is )?(\d+\.\d+) at step 1 and (\d+\.\d+) at step 250", " ".join(text.split()))
    assert found, f"{where} no longer states 'loss X at step 1 and Y at step 250'"
    return float(found.group(1)), float(found.group(2))


def quick_start(folder: Path, lane: Lane) -> tuple[Path, subprocess.CompletedProcess]:
    """README's `./run_train.sh`, as a user runs it, into `folder`/debug: 250 steps (~70-100 s),
    run ahead of the test while the in-process tests run (tests/ahead.py)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    # One OpenMP thread, as every other process the tests start: the in-process tests use the other
    # core meanwhile, and OpenMP's waiting threads on a busy core make each step several times slower.
    env.setdefault("OMP_NUM_THREADS", "1")
    proc = lane.run([ROOT / "run_train.sh", "--job.dump_folder", folder / "debug"], cwd=ROOT, env=env, timeout=900)
    return folder / "debug", proc


@pytest.mark.slow
@pytest.mark.run_ahead(job=quick_start)
def test_the_readme_quick_start_gives_the_stated_losses(ran_ahead):
    folder, proc = ran_ahead
    assert proc.returncode == 0, proc.stderr[-3000:]
    output = proc.stdout + proc.stderr
    assert not [line for line in output.splitlines() if "warning" in line.lower()], output[-3000:]
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    first, last = records[0], records[-1]
    assert (first["step"], last["step"]) == (1, 250)
    for where in ("README.md", "kenotron/presets/debug.toml"):
        stated_first, stated_last = _stated((ROOT / where).read_text(), where)
        assert abs(first["loss"] - stated_first) <= 0.011, (where, first["loss"])
        assert abs(last["loss"] - stated_last) <= 0.011, (where, last["loss"])
    comparison = compare_losses(folder, GOLDEN, rtol=0.01)
    assert comparison.ok, comparison.format()


def test_the_variables_readme_gives_several_nodes_are_those_run_train_reads():
    readme = (ROOT / "README.md").read_text()
    sentence = readme[readme.index("several nodes take"):].split(".")[0]
    taken = re.findall(r"`([A-Z_]+)`", sentence.split("(")[0])
    script = (ROOT / "run_train.sh").read_text()
    assert taken and all(f"${{{name}" in script for name in taken), (taken, sentence)
