"""ModelSpec: what the trainer needs to know about a model family, as one object.

A spec is data and imports no torch: the model class and the HF adapter are named by their
import paths and imported when first used, so that the launcher checks a config's model shape
(args, flavors, tensor-parallel divisors) before torch is imported.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kenotron.errors import ConfigError
from kenotron.models.args import args_with_overrides, check_decoder_args

if TYPE_CHECKING:
    from torch import nn

    from kenotron.models.hf_adapter import HFAdapter

_IMPORT_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


class UnknownModelError(ConfigError):
    """A model name or flavor that the registry does not have."""


def import_path_target(path: str) -> Any:
    """The object an import path "package.module:attribute" names, its module imported if needed."""
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


def attention_tp_divisors(args: Any) -> dict[str, int]:
    """What tensor parallel splits in an attention decoder: heads, key/value heads, the MLP, the vocabulary."""
    sizes = {"n_heads": args.n_heads, "n_kv_heads": args.n_kv_heads, "ffn_dim": getattr(args, "ffn_dim", None),
             "vocab_size": args.vocab_size}
    return {name: size for name, size in sizes.items() if size is not None}  # MoE families: no dense MLP


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
    model_cls_path: str
    """The family's nn.Module class as "module:attribute" ("kenotron.models.llama3.model:Llama3"),
    imported on first use (`model_cls`, `build`)."""
    flavors: dict[str, Any]
    """{flavor name: frozen args dataclass}."""
    tp_styles: dict[str, str] = dataclasses.field(default_factory=dict)
    """Tensor-parallel style per module FQN pattern (see llama3/parallel_hints.py); empty = no TP plan."""
    blocks: str = "layers.*"
    """FQN pattern of the repeated transformer blocks (FSDP units, AC and compile units)."""
    hf_adapter_path: str = ""
    """The family's HFAdapter (key and config translation to/from its transformers class) as
    "module:attribute", imported on first use (`hf_adapter`); "" when there is none."""
    moe_modules: str = ""
    """FQN pattern of the MoE feed-forward modules (models/common/moe.py); empty for a dense family."""
    experts: str = ""
    """FQN pattern of their routed experts (the modules expert parallelism shards)."""
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

    check_args: Callable[[Any], None] = check_decoder_args
    """Raises ConfigError (naming `model.<field>` keys) for args that do not make a valid model."""
    parameter_count: Callable[[Any], int] | None = None
    """args -> the model's parameter count (a tied embedding once), from the args alone
    (models/common/param_count.py; `--list-models`); None: counted on a meta-device build."""

    def __post_init__(self) -> None:
        for key, path in (("model_cls_path", self.model_cls_path), ("hf_adapter_path", self.hf_adapter_path)):
            if path and not _IMPORT_PATH.fullmatch(path):
                raise ValueError(f"ModelSpec {self.name!r}: {key}={path!r} is not an import path; write "
                                 f"'package.module:attribute'")

    @property
    def model_cls(self) -> Callable[[Any], nn.Module]:
        """The family's nn.Module class (its module imported now, with torch)."""
        return import_path_target(self.model_cls_path)

    @property
    def hf_adapter(self) -> HFAdapter | None:
        """The family's HF adapter, None when it has none (its module imported now, with torch)."""
        return import_path_target(self.hf_adapter_path) if self.hf_adapter_path else None

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

    def tp_styles_of(self, args: Any) -> dict[str, str]:
        """The tensor-parallel styles of the model `args` builds."""
        return dict(self.tp_styles_for(args) if self.tp_styles_for is not None else self.tp_styles)

    def count_parameters(self, args: Any) -> int:
        """The parameters the model `args` builds has: from the args where the family says how,
        else from a build on the meta device (no memory, slower)."""
        if self.parameter_count is not None:
            return self.parameter_count(args)
        import torch  # a family without a count from its args: the spec itself stays free of torch

        with torch.device("meta"):
            return sum(p.numel() for p in self.build(args).parameters())

    def build(self, args: Any) -> nn.Module:
        """Construct the model on the current default device (use `torch.device("meta")`)."""
        return self.model_cls(args)
