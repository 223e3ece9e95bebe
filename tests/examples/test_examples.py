"""The examples/ folders: the index lists every one, and each example's README command (its
run.sh, about a minute on CPU) runs here as `run.sh --tiny` (the same runs, fewer steps of a
smaller model: seconds) and does what the README says."""

from __future__ import annotations

import importlib.util
import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.ahead import Lane

ROOT = Path(__file__).parents[2]
EXAMPLES = ROOT / "examples"


def run_example(name: str, out: Path, lane: Lane, *args: str) -> str:
    """`bash examples/<name>/run.sh --tiny` (its README's command, shrunk), into `out`, through the
    background lane (tests/ahead.py: each example's test runs it ahead); returns the output."""
    readme = (EXAMPLES / name / "README.md").read_text()
    assert f"bash examples/{name}/run.sh" in readme, f"examples/{name}/README.md does not give its command"
    # One thread per process: these models are too small to gain from a second one, and on a busy
    # two-core machine OpenMP's waiting threads make every step several times slower.
    env = {**os.environ, "OUT": str(out), "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    proc = lane.run(["bash", f"examples/{name}/run.sh", "--tiny", *args], cwd=ROOT, env=env, timeout=600)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    return output


def example_run(name: str, *needs: str) -> Callable[[Path, Lane], tuple[Path, str]]:
    """The `run_ahead` job of example `name`: its run into the job's folder; gives (folder, output).
    The test skips, without a run, where a module of `needs` is missing."""
    def job(folder: Path, lane: Lane) -> tuple[Path, str]:
        for module in needs:
            pytest.importorskip(module)
        return folder, run_example(name, folder, lane)
    job.__name__ = f"example_{name.replace('-', '_')}"
    return job


def metric_steps(out: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_the_index_lists_every_example_folder():
    index = (EXAMPLES / "README.md").read_text()
    folders = sorted(p.name for p in EXAMPLES.iterdir() if p.is_dir() and (p / "README.md").exists())
    for name in folders:
        assert f"]({name}/)" in index, f"examples/README.md does not link {name}/"
    for name in re.findall(r"\]\(([\w-]+)/\)", index):
        assert (EXAMPLES / name / "README.md").exists(), f"examples/README.md links {name}/, which has no README"


@pytest.mark.run_ahead(job=example_run("async-checkpoint"))
def test_async_checkpoint_example_saves_in_the_background_and_resumes(ran_ahead):
    tmp_path, output = ran_ahead
    # The writer process saves in the background and says nothing (launch/rank.py: its four INFO
    # lines per save are gone from the console); its saves complete and resume below.
    assert "Received async checkpoint request" not in output
    assert re.search(r"checkpoint \S+step-000004 complete", output)
    assert "loaded step-000004 (model, optimizer, lr_scheduler, dataloader, train_state)" in output
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-000004", "step-000006"]
    assert metric_steps(tmp_path)[-1] == 6


@pytest.mark.run_ahead(job=example_run("s3", "moto.server", "boto3"))
def test_s3_example_uploads_and_resumes_from_the_bucket(ran_ahead):
    tmp_path, output = ran_ahead
    assert "uploaded step-000002 to s3://kenotron-example/debug-run" in output
    assert "loaded step-000002" in output
    assert "complete checkpoints in s3://kenotron-example/debug-run: step-000002, step-000004" in output
    assert metric_steps(tmp_path)[-1] == 4
    # Local copies are deleted after their upload (so the restart found step 2 in the bucket only).
    assert not (tmp_path / "checkpoints" / "step-000004").exists()


@pytest.mark.run_ahead(job=example_run("mup", "matplotlib"))
def test_mup_example_runs_a_flat_coordinate_check_and_trains_wide(ran_ahead):
    tmp_path, output = ran_ahead
    assert (tmp_path / "coord_check.png").stat().st_size > 10_000
    exponents = json.loads((tmp_path / "coord_check.json").read_text())["spectral_mup"]["exponents"]
    assert all(abs(v) < 0.15 for name, v in exponents["2"].items() if name != "logits"), exponents
    assert "spectral_mup step 2" in output
    assert metric_steps(tmp_path / "wide")[-2:] == [2, 4]  # (step 1 is always recorded)


@pytest.mark.run_ahead(job=example_run("doremi"))
def test_doremi_example_learns_domain_weights_and_trains_on_them(ran_ahead):
    tmp_path, output = ran_ahead
    weights = json.loads((tmp_path / "proxy" / "doremi_weights.json").read_text())["weights"]
    assert sorted(weights) == ["noise", "reference", "stdlib"] and sum(weights.values()) == pytest.approx(1.0)
    assert f"--doremi.reference {tmp_path}/reference/checkpoints/step-000004" in output or \
        "loaded step-000004 (model)" in output  # the proxy read the reference's last step
    assert "DoReMi domain weights (average over 4 steps)" in output
    main = [json.loads(line) for line in (tmp_path / "main" / "metrics.jsonl").read_text().splitlines()]
    seen = {name: main[-1][f"tokens_seen/{name}"] for name in weights}
    assert max(seen, key=seen.get) == max(weights, key=weights.get)  # the main run's blend follows them
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / "plots" / "domain_weights.png").stat().st_size > 10_000
