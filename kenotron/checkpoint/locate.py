"""Find the checkpoint a user means: a step folder, a checkpoint folder, or a run folder.

    find_checkpoint("outputs/debug")                         # the run's latest complete checkpoint
    find_checkpoint("outputs/debug/checkpoints")             # the same
    find_checkpoint("outputs/debug/checkpoints/step-000250") # that step

The run folder (where config.toml is) comes with it when there is one, so tools can use the
tokenizer the run was trained with.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from kenotron.checkpoint.errors import CheckpointFormatError
from kenotron.checkpoint.folders import MARKER_NAME, list_step_folders

RUN_CONFIG = "config.toml"


@dataclass(frozen=True)
class Located:
    step_folder: Path
    run_folder: Path | None
    """The training run folder that holds it (config.toml), when there is one."""

    def run_config(self) -> dict:
        if self.run_folder is None:
            return {}
        try:
            return tomllib.loads((self.run_folder / RUN_CONFIG).read_text())
        except (OSError, tomllib.TOMLDecodeError):
            return {}

    def tokenizer_path(self) -> str | None:
        """The run's tokenizer.path ("" = the built-in tokenizer), None without a run folder."""
        if self.run_folder is None:
            return None
        return str(self.run_config().get("tokenizer", {}).get("path", ""))


def _latest(folder: Path, what: str) -> Path:
    complete = [f for f in list_step_folders(folder) if f.complete]
    if not complete:
        found = list_step_folders(folder)
        why = f" (only incomplete saves: {', '.join(f.path.name for f in found)})" if found else ""
        raise CheckpointFormatError(
            f"{what} has no complete checkpoint{why}; train with --checkpoint.enable true, or give a step folder"
        )
    return complete[-1].path


def _run_of(step_folder: Path) -> Path | None:
    for parent in list(step_folder.parents)[:3]:
        if (parent / RUN_CONFIG).is_file():
            return parent
    return None


def find_checkpoint(path: str | Path) -> Located:
    """The step folder `path` means (module docstring); CheckpointFormatError says what is wrong."""
    path = Path(path)
    if not path.exists():
        raise CheckpointFormatError(f"{path} does not exist; give a run folder, its checkpoints/ or a step folder")
    if (path / MARKER_NAME).is_file() or path.name.startswith("step-"):
        return Located(path, _run_of(path))
    if (path / RUN_CONFIG).is_file():
        cfg = tomllib.loads((path / RUN_CONFIG).read_text())
        folder = Path(cfg.get("checkpoint", {}).get("folder", "checkpoints"))
        folder = folder if folder.is_absolute() else path / folder
        return Located(_latest(folder, f"the run in {path}"), path)
    if list_step_folders(path):
        step = _latest(path, str(path))
        return Located(step, _run_of(step))
    raise CheckpointFormatError(
        f"{path} is not a run folder (no {RUN_CONFIG}), a checkpoint folder (no step-* folders) or a checkpoint "
        f"(no {MARKER_NAME}); give one of those"
    )
