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


def attention_tp_divisors(args: Any) -> dict[str, int]:
    """What tensor parallel splits in an attention decoder: heads, key/value heads, the MLP, the vocabulary."""
    return {"n_heads": args.n_heads, "n_kv_heads": args.n_kv_heads, "ffn_dim": args.ffn_dim,
            "vocab_size": args.vocab_size}


def attention_mixing_flops(args: Any, seq_len: int) -> float:
    """12·L·H·d·T: attention's score and value products per trained token (train/flops.py)."""
    return 12.0 * args.n_layers * args.n_heads * args.head_dim * seq_len


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
    tp_styles_for: Callable[[Any], dict[str, str]] | None = None
    """The styles of a flavor whose modules depend on its args (a hybrid's attention blocks);
    None: every flavor has `tp_styles`."""
    attention_modules: str | None = "layers.*.attention"
    """FQN pattern of the attention modules (whose attention context parallel replaces); None: none."""
    tp_divisors: Callable[[Any], dict[str, int]] = attention_tp_divisors
    """args -> {dimension name: size} that the tensor-parallel degree must divide."""
    mixing_flops: Callable[[Any, int], float] = attention_mixing_flops
    """(args, seq_len) -> training FLOPs per token of the sequence mixing that 6·N does not count
    (attention's scores and values; Mamba-2's scan): see kenotron/train/flops.py."""
    no_context_parallel: str = ""
    """Why context parallel cannot split this family's sequences ("" = it can)."""
    no_document_masking: str = ""
    """Why data.document_masking cannot keep this family's documents apart ("" = it can)."""

    def model_args(self, flavor: str, *, vocab_size: int = 0, n_layers: int = 0, max_seq_len: int = 0) -> Any:
        """The flavor's args with the trainer's overrides applied (0 keeps the flavor's value)."""
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
        return dataclasses.replace(args, **changes)

    def tp_styles_of(self, args: Any) -> dict[str, str]:
        """The tensor-parallel styles of the model `args` builds."""
        return dict(self.tp_styles_for(args) if self.tp_styles_for is not None else self.tp_styles)

    def build(self, args: Any) -> nn.Module:
        """Construct the model on the current default device (use `torch.device("meta")`)."""
        return self.model_cls(args)
