"""The model's structure as plans see it: which modules get which tensor-parallel style, which
modules are the blocks (units of FSDP, activation checkpointing and compile), where attention is.

A family states it once as data (its `parallel_hints.py`, through its ModelSpec); a run never
changes it. FQN patterns use `*` for exactly one name component: `layers.*.attention.wq`.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from torch import nn

from kenotron.errors import ConfigError

TP_STYLES = ("embedding", "colwise", "rowwise", "norm", "block_input", "output", "head_norm", "channels",
             "latent_attention", "token_linear")


class PlanError(ConfigError):
    """A plan that does not fit its model or its run (unknown module, bad value); raised before training."""


def fqn_matches(pattern: str, fqn: str) -> bool:
    """`*` matches exactly one dotted component."""
    p, f = pattern.split("."), fqn.split(".")
    return len(p) == len(f) and all(a == "*" or a == b for a, b in zip(p, f))


def matching_modules(model: nn.Module, pattern: str) -> list[tuple[str, nn.Module]]:
    return [(name, m) for name, m in model.named_modules() if name and fqn_matches(pattern, name)]


def _generalize(fqn: str) -> str:
    return re.sub(r"(?<=\.)\d+(?=\.|$)", "*", fqn)


@dataclass
class ModelLayout:
    """Module patterns of one model family; edit freely in a notebook, then apply the plan."""

    tp_styles: dict[str, str] = field(default_factory=dict)
    """Tensor-parallel style per module FQN pattern (one of TP_STYLES)."""
    blocks: str = "layers.*"
    """FQN pattern of the transformer blocks: the units of FSDP, activation checkpointing and compile."""
    fsdp_units: list[str] = field(default_factory=lambda: ["layers.*"])
    """Module FQN patterns that each become one FSDP unit (the root module is always the last unit)."""
    attention_modules: str | None = "layers.*.attention"
    """FQN pattern of the attention modules whose `attention_fn` context parallel replaces (None: the
    model has none, e.g. Mamba-2)."""
    sequence_parallel_off: list[str] = field(default_factory=list)
    """Block FQN patterns that run without sequence parallel although it is on (or with it, if off)."""
    moe_modules: str = ""
    """FQN pattern of the MoE feed-forward layers (routers balanced by the step; replicated over tp); empty: none."""
    experts: str = ""
    """FQN pattern of their routed experts: sharded over ep, each its own FSDP unit over the ranks ep leaves."""

    def check(self, model: nn.Module) -> None:
        """Every pattern names existing modules and every style is valid; raises PlanError."""
        names = [n for n, _ in model.named_modules() if n]
        for label, patterns in (
            ("tp_styles", list(self.tp_styles)),
            ("fsdp_units", self.fsdp_units),
            ("sequence_parallel_off", self.sequence_parallel_off),
            ("blocks", [self.blocks]),
            ("attention_modules", [self.attention_modules] if self.attention_modules is not None else []),
            ("moe_modules", [self.moe_modules] if self.moe_modules else []),
            ("experts", [self.experts] if self.experts else []),
        ):
            for pattern in patterns:
                if not any(fqn_matches(pattern, n) for n in names):
                    known = sorted({_generalize(n) for n in names})
                    close = difflib.get_close_matches(pattern, known, n=1, cutoff=0.5)
                    hint = f"; did you mean {close[0]!r}?" if close else ""
                    raise PlanError(f"plan.layout.{label} names module {pattern!r}, which the model does not have{hint}")
        for pattern, style in self.tp_styles.items():
            if style not in TP_STYLES:
                raise PlanError(f"plan.layout.tp_styles[{pattern!r}]={style!r} is not one of {', '.join(TP_STYLES)}")
        for name in names:
            styles = [p for p in self.tp_styles if fqn_matches(p, name)]
            if len(styles) > 1:
                raise PlanError(f"module {name!r} matches several plan.layout.tp_styles patterns: {styles}; keep one")

    def count_blocks(self, model: nn.Module) -> int:
        container, _, rest = self.blocks.rpartition(".")
        if rest == "*" and container and "*" not in container:  # `layers.*`: the container's length
            return len(model.get_submodule(container))
        return len(matching_modules(model, self.blocks))

    def style_of(self, fqn: str) -> str | None:
        for pattern, style in self.tp_styles.items():
            if fqn_matches(pattern, fqn):
                return style
        return None

    def block_of(self, fqn: str) -> str | None:
        """The block FQN containing `fqn` (itself included), or None for edge modules."""
        parts = fqn.split(".")
        depth = len(self.blocks.split("."))
        if len(parts) >= depth and fqn_matches(self.blocks, ".".join(parts[:depth])):
            return ".".join(parts[:depth])
        return None

    def sequence_parallel_at(self, fqn: str, sequence_parallel: bool) -> bool:
        """Whether sequence parallel applies where `fqn` lives, given the run's `sequence_parallel`:
        the blocks `sequence_parallel_off` names run the other way."""
        block = self.block_of(fqn)
        if block is not None and any(fqn_matches(p, block) for p in self.sequence_parallel_off):
            return not sequence_parallel
        return sequence_parallel

    def iter_tp_modules(self, model: nn.Module) -> Iterator[tuple[str, nn.Module, str]]:
        for name, module in model.named_modules():
            style = self.style_of(name) if name else None
            if style is not None:
                yield name, module, style

    def __str__(self) -> str:
        rows = [("module pattern", "TP style")] + list(self.tp_styles.items())
        width = [max(len(r[i]) for r in rows) for i in range(2)]
        lines = ["ModelLayout"]
        lines += ["  " + "  ".join(cell.ljust(w) for cell, w in zip(rows[0], width))]
        lines += ["  " + "  ".join("-" * w for w in width)]
        lines += ["  " + "  ".join(cell.ljust(w) for cell, w in zip(r, width)) for r in rows[1:]]
        lines.append(f"  blocks: {self.blocks}   FSDP units: {self.fsdp_units} + root   attention: "
                     f"{self.attention_modules}"
                     + (f"   sequence parallel flipped in: {self.sequence_parallel_off}" if self.sequence_parallel_off
                        else ""))
        if self.moe_modules:
            lines.append(f"  {self.moe_summary()}")
        return "\n".join(lines)

    def moe_summary(self) -> str:
        return (f"MoE layers: {self.moe_modules} (under tp: on this rank's sequence shard, weights replicated)   "
                f"experts: {self.experts} (sharded over ep on the expert dim; own FSDP unit over efsdp, "
                f"outside FSDP where efsdp x dp_replicate is 1)")
