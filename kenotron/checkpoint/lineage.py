"""Which checkpoints belong to the run that is going on, and which ones rotation may delete.

A run that resumes from step S continues the history up to S; complete checkpoints above S in
the same folder belong to a continuation that this run abandons (a resume from an earlier step;
`checkpoint.load_step = 0` on a folder with checkpoints is refused before this, runtime/run_folder.py).
Left in place they would be loaded by the next restart (it takes
the highest step) and `keep_latest_k` would keep them instead of this run's own saves. So they
are moved aside, into `abandoned-<time>/` beside the step folders, never deleted and never
loaded. After that, every step folder of the checkpoint folder is this run's history, and
rotation keeps the newest `keep_latest_k` complete, full checkpoints of it.

Rotation never counts or deletes a model-only export (checkpoint.last_save_model_only), and
nothing here touches a folder that kenotron did not write (folders.StepFolder.ours). A step
folder that is a symbolic link is only ever moved or removed as a link (folders.remove_step_folder).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from kenotron.checkpoint.errors import CheckpointFormatError
from kenotron.checkpoint.folders import StepFolder, list_step_folders, step_folder_name

ABANDONED_PREFIX = "abandoned-"
"""Start of the name of a folder holding the checkpoints of an abandoned continuation."""
_ABANDONED_FOLDER = re.compile(rf"^{ABANDONED_PREFIX}(\d{{8}}-\d{{6}})(?:-(\d+))?-after-step-(\d+)$")


def rotation_victims(folders: list[StepFolder], keep: int, just_saved: int) -> list[StepFolder]:
    """The folders to delete after step `just_saved` was saved (`folders` by increasing step):
    complete full checkpoints beyond the newest `keep` (0 keeps all), and kenotron's own
    interrupted saves older than `just_saved`."""
    full = [f for f in folders if f.complete and not f.model_only]
    doomed = full[:-keep] if keep > 0 else []
    doomed += [f for f in folders if not f.complete and f.ours and f.step < just_saved]
    return sorted(doomed, key=lambda f: f.step)


def later_steps(folder: str | Path, resume_step: int) -> list[StepFolder]:
    """kenotron's step folders above `resume_step`: an abandoned continuation."""
    return [f for f in list_step_folders(folder) if f.step > resume_step and f.ours]


def foreign_step_folders(folder: str | Path) -> list[StepFolder]:
    """`step-N` folders that kenotron did not write (no marker, no save stamp)."""
    return [f for f in list_step_folders(folder) if not f.ours]


def set_aside(folder: str | Path, doomed: list[StepFolder], resume_step: int) -> Path:
    """Move `doomed` into a new `abandoned-<time>-after-step-N` folder of `folder`; returns it.

    A rename within one filesystem: nothing is copied, and an interruption leaves each step
    folder either in place (set aside again at the next resume) or moved whole. A step folder
    that is a symbolic link moves as a link: what it points to stays where it is, untouched.
    """
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = Path(folder) / f"{ABANDONED_PREFIX}{stamp}-after-{step_folder_name(resume_step)}"
    suffix = 1
    while target.exists():  # two resumes within one second
        suffix += 1
        target = Path(folder) / f"{ABANDONED_PREFIX}{stamp}-{suffix}-after-{step_folder_name(resume_step)}"
    target.mkdir(parents=True)
    for f in doomed:
        f.path.rename(target / f.path.name)
    return target


def newest_set_aside(folder: str | Path, resume_step: int) -> Path | None:
    """The folder that the latest resume from `resume_step` set checkpoints aside into (None if
    none did): the place for the abandoned continuation's metrics records too."""
    found = []
    for path in Path(folder).glob(f"{ABANDONED_PREFIX}*"):
        match = _ABANDONED_FOLDER.match(path.name)
        if match and int(match.group(3)) == resume_step and path.is_dir() and not path.is_symlink():
            found.append(((match.group(1), int(match.group(2) or 1)), path))
    return max(found)[1] if found else None


def check_no_foreign_above(folder: str | Path, resume_step: int) -> None:
    """CheckpointFormatError when a step folder that kenotron did not write sits where this run
    will save (above `resume_step`): it would neither be replaced nor deleted."""
    foreign = [f for f in foreign_step_folders(folder) if f.step > resume_step]
    if foreign:
        names = ", ".join(f.path.name for f in foreign[:3]) + (" ..." if len(foreign) > 3 else "")
        raise CheckpointFormatError(
            f"checkpoint folder {folder} holds {names}, not written by kenotron (no completion marker, no save "
            f"stamp), where this run will save; kenotron never deletes or replaces such folders. Move them out "
            f"of {folder} or choose another checkpoint.folder"
        )
