"""No Python file of the package, its tests or its scripts is over 500 lines (the house rule: one
concern per file; past 500 lines a file holds more than one, so it is split along a seam)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).parents[1]
MAX_LINES = 500
CHECKED = ("kenotron", "tests", "scripts", "examples")
"""The folders under the repository root whose .py files are counted."""


def files_over(limit: int, root: Path = ROOT, folders: tuple[str, ...] = CHECKED) -> dict[str, int]:
    """Each .py file under `folders` of `root` with more than `limit` lines, by its path from `root`."""
    found = {}
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            with path.open("rb") as f:
                lines = sum(1 for _ in f)
            if lines > limit:
                found[str(path.relative_to(root))] = lines
    return found


def test_no_python_file_is_over_500_lines():
    over = files_over(MAX_LINES)
    assert not over, (f"files over {MAX_LINES} lines; split each along a seam (one concern per file): "
                      + ", ".join(f"{p} ({n})" for p, n in over.items()))


def test_the_line_counter_finds_a_long_file_and_only_it(tmp_path):
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "sub" / "long.py").write_text("x = 1\n" * 501)
    (tmp_path / "pkg" / "short.py").write_text("x = 1\n" * 500)
    (tmp_path / "pkg" / "notes.txt").write_text("x\n" * 900)
    assert files_over(MAX_LINES, tmp_path, ("pkg",)) == {"pkg/sub/long.py": 501}
