"""Job configuration: dataclasses per section, TOML loading, CLI overrides, validation."""

from kenotron.config.data_sections import Data, DataSource, DataStage, Tokenizer, Validation
from kenotron.config.help import config_help
from kenotron.config.loader import (
    ConfigError,
    config_from_dict,
    config_reference_markdown,
    config_to_toml,
    convert_value,
    load_config,
    parse_overrides,
    split_config_arg,
    toml_value,
)
from kenotron.config.schema import FieldInfo, all_fields
from kenotron.config.sections import (
    ActivationCheckpoint,
    Checkpoint,
    Compile,
    Float8,
    Job,
    JobConfig,
    LRScheduler,
    Metrics,
    Model,
    MoE,
    Optimizer,
    Parallelism,
    Training,
    Tuning,
)
from kenotron.config.validate import validate_config

__all__ = [
    "ActivationCheckpoint",
    "Checkpoint",
    "Compile",
    "ConfigError",
    "Data",
    "DataSource",
    "DataStage",
    "FieldInfo",
    "Float8",
    "Job",
    "JobConfig",
    "LRScheduler",
    "Metrics",
    "MoE",
    "Model",
    "Optimizer",
    "Parallelism",
    "Tokenizer",
    "Training",
    "Tuning",
    "Validation",
    "all_fields",
    "config_from_dict",
    "config_help",
    "config_reference_markdown",
    "config_to_toml",
    "convert_value",
    "load_config",
    "parse_overrides",
    "split_config_arg",
    "toml_value",
    "validate_config",
]
