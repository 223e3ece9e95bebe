"""The errors of the checkpoint package; each message names the bad value and the fix."""

from __future__ import annotations


class CheckpointError(RuntimeError):
    """Base class: something about a checkpoint folder, a save or a load went wrong."""


class CheckpointFormatError(CheckpointError):
    """A folder that is not a complete kenotron checkpoint: interrupted, truncated or foreign."""


class NonFiniteStateError(CheckpointFormatError):
    """A loaded checkpoint holds NaN or Inf (parameters, buffers or optimizer state): not resumed from."""


class CheckpointMismatchError(CheckpointError):
    """The checkpoint does not fit what it is loaded into (a missing key or another shape)."""


class CheckpointSaveError(CheckpointError):
    """A save (usually an asynchronous one) failed; the previous complete checkpoint stays."""


class RemoteStorageError(CheckpointError):
    """Talking to the remote (S3-compatible) store failed: bucket, credentials or network."""


class NonFiniteCheckpointError(CheckpointSaveError):
    """The weights, buffers or optimizer state hold NaN or Inf: the save is refused, the previous
    checkpoint stays the latest."""
