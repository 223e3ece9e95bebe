"""The TOML presets that ship inside the package, and what `--config X` names.

`--config` takes a TOML file's path or a preset's bare name (`--config llama3_8b`). The presets
live in kenotron/presets/ (package data), so they are found from a clone and from an installed
wheel alike; a file dropped into that folder is a preset with no other change.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from kenotron.errors import ConfigError

PRESETS_DIR = Path(__file__).resolve().parents[1] / "presets"
"""kenotron/presets/: one `<name>.toml` per preset (pyproject's package data ships them)."""


def preset_names() -> list[str]:
    """The shipped presets' names, sorted (the file names without `.toml`)."""
    return sorted(p.stem for p in PRESETS_DIR.glob("*.toml"))


def preset_path(name: str) -> Path | None:
    """The file of preset `name` (`llama3_8b` or `llama3_8b.toml`), or None when none has that name."""
    path = PRESETS_DIR / f"{name.removesuffix('.toml')}.toml"
    return path if path.is_file() else None


def _is_bare_name(value: str) -> bool:
    """A word with no folder in it (`debug`, `llama3_8b.toml`): what a preset name looks like."""
    return "/" not in value and "\\" not in value and value not in ("", ".", "..")


def resolve_config_path(value: str | Path) -> Path:
    """The TOML file `--config value` names: an existing file first, else the preset of that
    bare name. ConfigError (one line, with the presets listed) when it names neither."""
    path = Path(value)
    if path.is_file():
        return path
    text = str(value)
    names = preset_names()
    listing = f"presets: {', '.join(names)}"
    if _is_bare_name(text):
        if (found := preset_path(text)) is not None:
            return found
        if path.exists():
            raise ConfigError(f"--config {text!r} is a folder, not a TOML file; give a TOML file or a preset ({listing})")
        close = difflib.get_close_matches(text.removesuffix(".toml"), names, n=1, cutoff=0.5)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ConfigError(f"--config {text!r} is neither a TOML file nor a preset{hint} ({listing})")
    if path.exists():
        raise ConfigError(f"--config {text!r} is a folder, not a TOML file; give a TOML file or a preset ({listing})")
    # An old command (`debug`, from before the presets moved into the package).
    hint = f"; the preset of that name is --config {path.stem}" if path.stem in names else ""
    raise ConfigError(f"config file {text!r} does not exist{hint} (give a TOML file or a preset; {listing})")
