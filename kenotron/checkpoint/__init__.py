"""Checkpoints: the full train state through torch.distributed.checkpoint (DCP), three save
modes, crash-safe step folders, S3 copies, and Hugging Face import/export (`kenotron.checkpoint.hf`).

The trainer hands the manager its stateful parts; nothing here imports `kenotron.train`.
See docs/checkpointing.md.
"""

from kenotron.checkpoint.errors import (
    CheckpointError,
    CheckpointFormatError,
    CheckpointMismatchError,
    CheckpointSaveError,
    NonFiniteCheckpointError,
    NonFiniteStateError,
    RemoteStorageError,
)
from kenotron.checkpoint.folders import (
    MARKER_NAME,
    list_step_folders,
    read_marker,
    step_folder_name,
)
from kenotron.checkpoint.manager import EXPORT_DTYPES, CheckpointManager
from kenotron.checkpoint.state import PART_NAMES, TrainState

__all__ = [
    "EXPORT_DTYPES",
    "MARKER_NAME",
    "PART_NAMES",
    "CheckpointError",
    "CheckpointFormatError",
    "CheckpointManager",
    "CheckpointMismatchError",
    "CheckpointSaveError",
    "NonFiniteCheckpointError",
    "NonFiniteStateError",
    "RemoteStorageError",
    "TrainState",
    "list_step_folders",
    "read_marker",
    "step_folder_name",
]
