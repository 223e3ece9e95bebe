"""The example notebooks run top to bottom (a failing cell fails the test)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.ahead import Lane

NOTEBOOKS = sorted((Path(__file__).parents[2] / "examples" / "notebooks").glob("*.ipynb"))


def notebook_run(path: Path) -> Callable[[Path, Lane], str]:
    """The `run_ahead` job (tests/ahead.py) that runs notebook `path` in a kernel of its own (a new
    Python: seconds), ahead of its test; gives the text its code cells printed."""
    def job(folder: Path, lane: Lane) -> str:
        nbformat = pytest.importorskip("nbformat")
        nbclient = pytest.importorskip("nbclient")
        nb = nbformat.read(path, as_version=4)
        client = nbclient.NotebookClient(
            nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parents[2])}}
        )
        client.execute()  # raises CellExecutionError naming the failing cell
        return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    job.__name__ = f"notebook_{path.stem}"
    return job


@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.run_ahead(job=notebook_run(p))) for p in NOTEBOOKS],
                         ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_every_cell(path, ran_ahead):
    outputs = ran_ahead
    assert "data parallel: fsdp" in outputs and "one step: loss" in outputs
