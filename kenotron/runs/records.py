"""A run's records: `<run folder>/metrics.jsonl` (one JSON object per logged step), or such a file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

METRICS_NAME = "metrics.jsonl"


def metrics_file(run: str | Path) -> Path:
    """The metrics.jsonl of a run folder, or `run` itself when it is such a file."""
    path = Path(run)
    file = path / METRICS_NAME if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"{path} has no {METRICS_NAME}: give a run folder (job.dump_folder) or a metrics file")
    return file


def read_records(run: str | Path) -> list[dict[str, Any]]:
    """The records of a run, by step; a line that is not a record (e.g. cut by a crash) is named."""
    file = metrics_file(run)
    records = []
    for number, line in enumerate(file.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            raise ValueError(f"{file} line {number} is not a JSON record: {line[:60]!r}") from None
        if not isinstance(record, dict) or "step" not in record:
            raise ValueError(f"{file} line {number} has no 'step': {line[:60]!r}")
        records.append(record)
    return sorted(records, key=lambda r: r["step"])


def run_label(run: str | Path) -> str:
    """A short name for a run in legends: its folder name (or the file's stem)."""
    path = Path(run)
    return path.resolve().name if path.is_dir() else path.stem
