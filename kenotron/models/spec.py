"""ModelSpec: what the trainer needs to know about a model family, as one object."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from kenotron.errors import ConfigError
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

    @property
    def is_moe(self) -> bool:
        return bool(self.moe_modules)

    def model_args(self, flavor: str, *, vocab_size: int = 0, n_layers: int = 0, max_seq_len: int = 0,
                   n_experts: int = 0, top_k: int = 0) -> Any:
        """The flavor's args with the trainer's overrides applied (0 keeps the flavor's value);
        `n_experts` and `top_k` are an MoE family's."""
        if flavor not in self.flavors:
            valid = ", ".join(self.flavors)
            raise UnknownModelError(f"model.flavor={flavor!r} is not a {self.name} flavor; use one of {valid}")
        args = self.flavors[flavor]
        changes: dict[str, int] = {}
        if vocab_size:
            changes["vocab_size"] = vocab_size
        if n_layers:
            changes["n_layers"] = n_layers
        if max_seq_len:
            changes["max_seq_len"] = max_seq_len
        moe_changes = {k: v for k, v in (("n_experts", n_experts), ("top_k", top_k)) if v}
        if moe_changes:
            if not self.is_moe:
                raise ConfigError(f"model {self.name!r} has no experts: moe.n_experts and moe.top_k apply to MoE families")
            changes["moe"] = dataclasses.replace(args.moe, **moe_changes)
        return dataclasses.replace(args, **changes)

    def build(self, args: Any) -> nn.Module:
        """Construct the model on the current default device (use `torch.device("meta")`)."""
        return self.model_cls(args)
