"""Checks of the `[checkpoint]` settings on their own, before any file is looked at."""

from __future__ import annotations

from kenotron.checkpoint.remote import is_remote
from kenotron.checkpoint.saver import ASYNC_MODES
from kenotron.checkpoint.state import PART_NAMES
from kenotron.config import ConfigError
from kenotron.config.sections import Checkpoint as CheckpointConfig


def check_checkpoint_config(config: CheckpointConfig) -> None:
    """ConfigError for checkpoint settings that are wrong on their own (no files looked at)."""
    if config.interval <= 0:
        raise ConfigError(f"checkpoint.interval={config.interval} must be a positive number of steps")
    if config.keep_latest_k < 0:
        raise ConfigError(f"checkpoint.keep_latest_k={config.keep_latest_k} must be >= 0 (0 keeps every checkpoint)")
    if config.load_step < -1:
        raise ConfigError(f"checkpoint.load_step={config.load_step} must be -1 (latest), 0 (fresh start) or a step")
    unknown = [p for p in config.exclude_from_loading if p not in PART_NAMES]
    if unknown:
        raise ConfigError(
            f"checkpoint.exclude_from_loading has {unknown[0]!r}, which is not a part; use some of {', '.join(PART_NAMES)}"
        )
    if config.async_mode not in ASYNC_MODES:
        raise ConfigError(f"checkpoint.async_mode={config.async_mode!r} is not one of {', '.join(ASYNC_MODES)}")
    if config.remote_folder and not is_remote(config.remote_folder):
        raise ConfigError(f"checkpoint.remote_folder={config.remote_folder!r} must look like s3://bucket/prefix")
