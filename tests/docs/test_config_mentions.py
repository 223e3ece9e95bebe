"""Every `--config X` and `CONFIG_FILE=X` that the docs, the examples and the shell scripts show
names a shipped preset or a file of the repository: the commands run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kenotron.config import ConfigError
from kenotron.config.presets import resolve_config_path

ROOT = Path(__file__).resolve().parents[2]

CONFIG_VALUE = re.compile(r"(?:--config(?:=|[ \t]+|[ \t]*\\?\n[ \t]*)|CONFIG_FILE=)([^\s\"'`\\),;\]]+)")
"""The value after `--config` (also on the next line of a wrapped command) or `CONFIG_FILE=`."""

PLACEHOLDER = re.compile(r"[A-Z_|.]+(\.toml)?")
"""`X.toml`, `NAME`, `FILE.toml`, `NAME|X.toml`, `...`: a usage line's stand-in, not a command."""


def _documents() -> list[Path]:
    found = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "run_train.sh", ROOT / "estimation.py"]
    found += sorted((ROOT / "docs").rglob("*.md")) + sorted((ROOT / "examples").rglob("*.md"))
    found += sorted((ROOT / "examples").rglob("*.sh")) + sorted((ROOT / "scripts").glob("*.sh"))
    found += sorted((ROOT / "kenotron" / "presets").glob("*.toml"))
    return found


def config_mentions(text: str) -> list[str]:
    """The `--config` / `CONFIG_FILE` values `text` shows, stand-ins left out."""
    return [v for v in CONFIG_VALUE.findall(text) if not PLACEHOLDER.fullmatch(v) and not v.startswith(("$", "<"))]


def test_the_mention_reader_takes_commands_and_leaves_stand_ins():
    text = ("kenotron train --config debug\nCONFIG_FILE=llama3_1b ./run_train.sh\n"
            "`--config=qwen3_debug`, --config X.toml, --config NAME|X.toml, --config \"$CONFIG\"\n"
            'bench --case "NAME=--config\nllama3_8b --model.n_layers 8"\n')
    assert config_mentions(text) == ["debug", "llama3_1b", "qwen3_debug", "llama3_8b"]


def test_every_config_the_docs_show_is_a_preset_or_a_file_of_the_repository(monkeypatch):
    monkeypatch.chdir(ROOT)  # the examples' paths are given from the repository root
    mentions = {(path.relative_to(ROOT), value) for path in _documents() for value in config_mentions(path.read_text())}
    assert len(mentions) > 20, mentions
    broken = []
    for where, value in sorted(mentions):
        try:
            resolve_config_path(value)
        except ConfigError as e:
            broken.append(f"{where}: --config {value}: {e}")
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize("old", ["train_configs/"])
def test_no_document_points_to_the_old_presets_folder(old):
    stale = [str(path.relative_to(ROOT)) for path in _documents() if old in path.read_text()]
    assert not stale, f"{old} is now kenotron/presets/ (--config NAME): {stale}"
