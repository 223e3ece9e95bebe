"""Estimate a deep model from two shallow copies of it: memory is linear in the number of blocks.

Every block of a decoder holds the same parameters and saves the same activations, so at a
given *structural* position of the step (the forward of the second block, the backward of
the last one, the loss after the blocks, the optimizer step) each kind of memory is
`a + b · n_blocks`. Two fake runs with K_a = 4 and K_b = 5 units of blocks give `a` and `b`
exactly; the configured depth is then read off the line. A unit is one block, or `every_n`
blocks when activation checkpointing alternates (`every-n-layers`), so that every unit is
the same.

Positions inside the blocks are named by their place: first, second, penultimate and last
unit (and the block's offset in its unit). Memory along the middle units is linear in the
unit index, so its maximum over a deep model is at one of the ends that are tracked: the
second or the penultimate unit. Both runs have all four places, which is why the shallow
models have at least four units; a model with at most five units is run whole instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kenotron.estimate.breakdown import CATEGORIES, Breakdown, Position, TrackedStep
from kenotron.parallel.plan import Plan

SHALLOW_UNITS = (4, 5)
"""Units of blocks in the two shallow models (at least four: see the module doc)."""


@dataclass(frozen=True)
class StepPlace:
    """A structural position of the step, the same in models of any depth."""

    phase: str
    """"start", "forward", "backward" or "optimizer"."""
    micro_step: int
    """Micro-step index within the step."""
    where: str
    """"before"/"after" the blocks, or "first"/"second"/"penultimate"/"last" unit of blocks; "" elsewhere."""
    offset: int = 0
    """Block index within its unit (every-n-layers AC), 0 otherwise."""

    def describe(self) -> str:
        if self.phase in ("start", "optimizer"):
            return {"start": "between steps", "optimizer": "clipping and optimizer step"}[self.phase]
        micro = f", micro-step {self.micro_step + 1}" if self.micro_step else ""
        if self.where == "before":
            return f"{self.phase}{micro}, embedding"
        if self.where == "after":
            return f"{self.phase}{micro}, output and loss"
        return f"{self.phase}{micro}, {self.where} block" + (f" (+{self.offset})" if self.offset else "")


def block_period(plan: Plan) -> int:
    """Blocks per repeating unit: every_n under every-n-layers activation checkpointing, else 1."""
    return plan.settings.ac_every_n if plan.settings.ac_mode == "every-n-layers" else 1


def shallow_depths(n_layers: int, period: int) -> tuple[int, int] | None:
    """Block counts of the two shallow models, or None when the model is shallow enough to run whole."""
    a, b = (units * period for units in SHALLOW_UNITS)
    return None if n_layers <= b else (a, b)


def place_of(position: Position, n_blocks: int, period: int) -> StepPlace | None:
    """The structural place of a position in a model of `n_blocks` blocks (None: a middle unit)."""
    if position.block is None:
        return StepPlace(position.phase, position.micro_step, position.edge)
    units = n_blocks // period
    unit, offset = divmod(position.block, period)
    names = {0: "first", 1: "second", units - 2: "penultimate", units - 1: "last"}
    if unit not in names:
        return None
    return StepPlace(position.phase, position.micro_step, names[unit], offset)


def peaks_by_place(step: TrackedStep, n_blocks: int, period: int) -> dict[StepPlace, Breakdown]:
    out: dict[StepPlace, Breakdown] = {}
    for position, breakdown in step.peaks.items():
        place = place_of(position, n_blocks, period)
        if place is not None and (place not in out or breakdown.total > out[place].total):
            out[place] = breakdown
    return out


def extrapolate_peaks(
    shallow: tuple[TrackedStep, TrackedStep], depths: tuple[int, int], n_layers: int, period: int
) -> dict[StepPlace, Breakdown]:
    """Each place's breakdown at `n_layers` blocks, on the line through the two shallow runs."""
    (step_a, step_b), (la, lb) = shallow, depths
    peaks_a = peaks_by_place(step_a, la, period)
    peaks_b = peaks_by_place(step_b, lb, period)
    return extrapolate_line(peaks_a, peaks_b, (n_layers - la) / (lb - la))


def extrapolate_line(a: dict[Any, Breakdown], b: dict[Any, Breakdown], scale: float) -> dict[Any, Breakdown]:
    """Each place present in both runs at a + scale·(b − a), category by category (never below 0)."""
    out = {}
    for place in a.keys() & b.keys():
        x, y = a[place].as_dict(), b[place].as_dict()
        out[place] = Breakdown(**{c: max(0, round(x[c] + (y[c] - x[c]) * scale)) for c in CATEGORIES})
    return out


def module_pattern(plan: Plan, fqn: str) -> str:
    """`layers.7.attention.wq` -> `layers.*.attention.wq` (the plan's block pattern); others unchanged."""
    block = plan.layout.block_of(fqn) if fqn else None
    return fqn if block is None else plan.layout.blocks + fqn[len(block):]


@dataclass(frozen=True)
class ModuleActivations:
    """Activations one module (pattern) keeps for backward, on one rank, in one micro-step."""

    module: str
    """Module FQN, with `*` for the block index; "(loss)" for what the loss keeps outside any module."""
    instances: int
    """How many modules the pattern stands for (the number of blocks, or 1)."""
    bytes_per_instance: int
    """Bytes kept by one of them."""

    @property
    def total(self) -> int:
        return self.instances * self.bytes_per_instance


def activations_by_module(step: TrackedStep, plan: Plan, n_blocks: int, n_layers: int) -> list[ModuleActivations]:
    """Per module pattern, scaled from a run with `n_blocks` blocks to `n_layers`, largest first."""
    totals: dict[tuple[str, bool], int] = {}
    for fqn, nbytes in step.activations_by_module.items():
        in_block = bool(fqn) and plan.layout.block_of(fqn) is not None
        key = (module_pattern(plan, fqn) if fqn else "(loss)", in_block)
        totals[key] = totals.get(key, 0) + nbytes
    rows = [
        ModuleActivations(name, n_layers, round(nbytes / n_blocks)) if in_block else ModuleActivations(name, 1, nbytes)
        for (name, in_block), nbytes in totals.items()
    ]
    return sorted(rows, key=lambda r: -r.total)
