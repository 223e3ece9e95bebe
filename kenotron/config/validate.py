"""Checks between fields of one config that need no model, mesh or process group."""

from __future__ import annotations

import dataclasses

from kenotron.config.loader import ConfigError
from kenotron.config.ranges import RANGE_KEY, range_problem
from kenotron.config.schema import all_fields
from kenotron.config.sections import JobConfig


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


def validate_config(cfg: JobConfig) -> None:
    """Raise ConfigError for values out of their range, or valid alone but unusable together."""
    check_ranges(cfg)
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
