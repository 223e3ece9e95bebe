"""Checks between fields of one config that need no model, mesh or process group."""

from __future__ import annotations

import dataclasses

from kenotron.config.loader import ConfigError
from kenotron.config.ranges import RANGE_KEY, range_problem
from kenotron.config.schema import all_fields
from kenotron.config.sections import CHECKPOINT_ASYNC_MODES, CHECKPOINT_PARTS, JobConfig
from kenotron.config.sections import Checkpoint as CheckpointConfig


def check_ranges(cfg: JobConfig) -> None:
    """ConfigError for the first numeric value outside its field's range (config/ranges.py),
    tables of list fields (data.sources, data.stages) included: a config built in Python skips
    the check that load_config makes while reading."""
    for info in all_fields(JobConfig).values():
        value = getattr(getattr(cfg, info.section), info.name)
        if problem := range_problem(info.key, value, info.range, info.default):
            raise ConfigError(problem)
        if isinstance(value, list):
            for i, item in enumerate(value):
                if not dataclasses.is_dataclass(item):
                    continue
                for f in dataclasses.fields(item):
                    if problem := range_problem(f"{info.key}[{i}].{f.name}", getattr(item, f.name),
                                                f.metadata.get(RANGE_KEY)):
                        raise ConfigError(problem)


def check_checkpoint_config(config: CheckpointConfig) -> None:
    """ConfigError for checkpoint settings that are wrong on their own (no files looked at); the
    checkpoint manager checks a config built in Python with it too."""
    if config.interval <= 0:
        raise ConfigError(f"checkpoint.interval={config.interval} must be a positive number of steps")
    if config.keep_latest_k < 0:
        raise ConfigError(f"checkpoint.keep_latest_k={config.keep_latest_k} must be >= 0 (0 keeps every checkpoint)")
    if config.load_step < -1:
        raise ConfigError(f"checkpoint.load_step={config.load_step} must be -1 (latest), 0 (fresh start) or a step")
    unknown = [p for p in config.exclude_from_loading if p not in CHECKPOINT_PARTS]
    if unknown:
        raise ConfigError(f"checkpoint.exclude_from_loading has {unknown[0]!r}, which is not a part; use some of "
                          f"{', '.join(CHECKPOINT_PARTS)}")
    if config.async_mode not in CHECKPOINT_ASYNC_MODES:
        raise ConfigError(f"checkpoint.async_mode={config.async_mode!r} is not one of {', '.join(CHECKPOINT_ASYNC_MODES)}")
    if config.remote_folder and not config.remote_folder.startswith("s3://"):  # checkpoint/remote.py's is_remote
        raise ConfigError(f"checkpoint.remote_folder={config.remote_folder!r} must look like s3://bucket/prefix")


def validate_config(cfg: JobConfig) -> None:
    """Raise ConfigError for values out of their range, or valid alone but unusable together."""
    check_ranges(cfg)
    check_checkpoint_config(cfg.checkpoint)
    t = cfg.training
    o = cfg.optimizer
    if cfg.tuning.mixed_precision == "master_weights" and (t.param_dtype != "bfloat16" or o.name != "adamw"):
        raise ConfigError(
            f"tuning.mixed_precision='master_weights' keeps bf16 parameters with fp32 masters in AdamW, but "
            f"training.param_dtype={t.param_dtype!r} and optimizer.name={o.name!r}; set param_dtype='bfloat16' "
            f"and optimizer.name='adamw', or use mixed_precision='auto'"
        )
    backend = cfg.model.attention_backend
    if cfg.data.document_masking and backend not in ("auto", "flex"):
        raise ConfigError(
            f"data.document_masking=true needs FlexAttention, but model.attention_backend={backend!r} runs plain "
            f"causal attention over the whole window; set model.attention_backend to 'flex' or 'auto'"
        )
