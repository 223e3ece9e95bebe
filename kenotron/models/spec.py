"""ModelSpec: what the trainer needs to know about a model family, as one object."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from torch import nn

from kenotron.errors import ConfigError
from kenotron.models.args import args_with_overrides, check_decoder_args
from kenotron.models.hf_adapter import HFAdapter


class UnknownModelError(ConfigError):
    """A model name or flavor that the registry does not have."""


@dataclass(frozen=True)
class ModelSpec:
    """A model family: its nn.Module class, its argument dataclass and its named sizes.

    Later pieces attach to the spec rather than to the model class: the parallel plan, the
    Hugging Face state-dict adapter, pipeline split hints.
    """

    name: str
    model_cls: Callable[[Any], nn.Module]
    flavors: dict[str, Any]
    """{flavor name: frozen args dataclass}."""
    tp_styles: dict[str, str] = dataclasses.field(default_factory=dict)
    """Tensor-parallel style per module FQN pattern (see llama3/parallel_hints.py); empty = no TP plan."""
    blocks: str = "layers.*"
    """FQN pattern of the repeated transformer blocks (FSDP units, AC and compile units)."""
    hf_adapter: HFAdapter | None = None
    """Key and config translation to/from the family's transformers class; None when there is none."""
    moe_modules: str = ""
    """FQN pattern of the MoE feed-forward modules (models/common/moe.py); empty for a dense family."""
    experts: str = ""
    """FQN pattern of their routed experts (the modules expert parallelism shards)."""

    check_args: Callable[[Any], None] = check_decoder_args
    """Raises ConfigError (naming `model.<field>` keys) for args that do not make a valid model."""

    @property
    def is_moe(self) -> bool:
        return bool(self.moe_modules)

    def model_args(self, flavor: str, overrides: Mapping[str, Any] | None = None, *, max_seq_len: int = 0,
                   **fields: Any) -> Any:
        """The flavor's args with `overrides` (the config's `model.<field>` values, as TOML
        types) and `fields` (the same from Python) applied and checked; `max_seq_len` sizes
        the RoPE tables (0 keeps the flavor's)."""
        if flavor not in self.flavors:
            valid = ", ".join(self.flavors)
            raise UnknownModelError(f"model.flavor={flavor!r} is not a {self.name} flavor; use one of {valid}")
        args = args_with_overrides(self.flavors[flavor], {**(overrides or {}), **fields}, self.name)
        if max_seq_len:
            args = dataclasses.replace(args, max_seq_len=max_seq_len)
        self.check_args(args)
        return args

    def build(self, args: Any) -> nn.Module:
        """Construct the model on the current default device (use `torch.device("meta")`)."""
        return self.model_cls(args)
