"""scripts/mup_lr_sweep.py (docs/mup.md's sweep) end to end on a tiny grid: it trains every
(parametrization, width, learning rate) run, prints each width's best learning rate, writes the
curves and the plot; `--load` of those curves prints the same table without training (the
script's main in this process: a second interpreter would only import torch again)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

from tests.ahead import Lane
from tests.fork_server import TRAINER_PRELOAD, fork_server

ROOT = Path(__file__).parents[2]
TINY = ["--widths", "64", "--lrs", "1e-3,1e-1", "--steps", "3", "--tail", "2", "--", "--training.seq_len", "16",
        "--training.local_batch_size", "2"]


def sweep(*args: str) -> str:
    """The script run as `python scripts/mup_lr_sweep.py *args` in a fresh process (forked by a
    server that imported the trainer once: tests/fork_server.py); returns what it printed."""
    code, out, err = fork_server(TRAINER_PRELOAD).run([str(ROOT / "scripts" / "mup_lr_sweep.py"), *args], 300)
    assert code == 0, err[-3000:]
    return out


def tables(output: str) -> list[str]:
    """The printed tables: the lines after the per-run progress lines."""
    return [line for line in output.splitlines() if line.startswith(("standard:", "spectral_mup:", "  "))]


def sweep_in_this_process(capsys, *args: str) -> str:
    spec = importlib.util.spec_from_file_location("mup_lr_sweep", ROOT / "scripts" / "mup_lr_sweep.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    capsys.readouterr()
    assert script.main(list(args)) == 0
    return capsys.readouterr().out


def tiny_sweep(folder: Path, lane: Lane) -> tuple[Path, str]:
    """The tiny sweep, its curves and plot into `folder`: ~15 s of training, run ahead of the test
    (tests/ahead.py). Returns the folder and what the sweep printed."""
    trained = sweep(*TINY[:8], "--json", str(folder / "w64.json"), "--out", str(folder / "sweep.png"), *TINY[8:])
    return folder, trained


@pytest.mark.run_ahead(job=tiny_sweep)
def test_the_sweep_trains_every_run_and_load_reprints_its_table(ran_ahead, tmp_path, capsys):
    folder, trained = ran_ahead
    curves, plot = folder / "w64.json", folder / "sweep.png"
    data = json.loads(curves.read_text())
    assert set(data["losses"]) == {"standard", "spectral_mup"}
    for by_width in data["losses"].values():
        runs = by_width["64"]
        assert len(runs) == 2 and all(len(curve) == 3 and all(math.isfinite(v) for v in curve) for curve in runs.values())
    assert plot.stat().st_size > 0
    rows = tables(trained)
    assert len(rows) == 6 and rows[2].split()[0] == "64"  # per parametrization: title, header, width 64
    loaded = sweep_in_this_process(capsys, "--load", str(curves), "--tail", "2", "--out", str(tmp_path / "again.png"))
    assert tables(loaded) == rows
