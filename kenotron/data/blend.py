"""Blending and data stages: which dataset each sample of the global batch comes from.

A *stage* starts at an optimizer step and gives every dataset a weight (and optionally its own
sequence length). Within a stage the datasets are interleaved deterministically, sample by
sample, so that the counts follow the weights as closely as possible:

- after any number n of samples since the stage started, dataset d has given c_d samples with
  |c_d - w_d n| < 1 (Tijdeman's bound, 1 - 1/(2K-2) for K datasets);
- hence over any window of N consecutive samples, |count_d - w_d N| < 2.

(A window bound below 1 for every dataset at once is impossible in general for three or more
datasets, Fraenkel's balanced-word problem; below 1 holds for every prefix.)

The rule (Tijdeman's "chairman assignment"): for sample n (from 0), among the datasets whose
share so far is at least 1/(2K-2) short of their weight, w_d (n+1) - c_d >= 1/(2K-2), take the
one with the earliest deadline (c_d + 1 - 1/(2K-2)) / w_d; ties go to the lower index.

Everything is a function of the stage's counters, so the state is K + 2 integers, identical on
every rank, and a resumed run continues the interleaving exactly.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Stage:
    """From `start_step` on: dataset weights (normalized, one per dataset) and the sequence length."""

    start_step: int
    weights: tuple[float, ...]
    seq_len: int


def check_weights(weights: Sequence[float], where: str) -> tuple[float, ...]:
    """`weights` normalized to sum 1; ValueError naming `where` when negative or all zero."""
    bad = [w for w in weights if not np.isfinite(w) or w < 0]
    if bad:
        raise ValueError(f"{where}: weight {bad[0]} is negative or not finite; weights must be >= 0")
    total = float(sum(weights))
    if not np.isfinite(total):  # each finite, but 1e308 + 1e308 is not
        raise ValueError(f"{where}: the weights add up to more than the largest float ({max(weights):g} and more); "
                         "scale them down: only their ratios count")
    if total <= 0:
        raise ValueError(f"{where}: the weights are all zero; give at least one dataset a positive weight")
    return tuple(float(w) / total for w in weights)


def check_stages(stages: Sequence[Stage]) -> None:
    """The first stage starts at step 0 and start steps strictly increase."""
    if not stages:
        raise ValueError("at least one data stage is needed")
    if stages[0].start_step != 0:
        raise ValueError(f"the first data stage starts at step {stages[0].start_step}; it must start at step 0")
    for before, after in itertools.pairwise(stages):
        if after.start_step <= before.start_step:
            raise ValueError(
                f"data stage starting at step {after.start_step} comes after the one starting at step "
                f"{before.start_step}; list stages in increasing start_step order"
            )


class Interleaver:
    """The sample-by-sample dataset choice of one stage (see the module docstring)."""

    def __init__(self, weights: Sequence[float]) -> None:
        self.weights = list(weights)
        k = sum(w > 0 for w in self.weights)
        self.slack = 1.0 / (2 * k - 2) if k > 1 else 0.0
        self.drawn = [0] * len(self.weights)
        self.samples = 0

    def next(self, count: int) -> np.ndarray:
        """Dataset index of each of the next `count` samples."""
        out = np.empty(count, dtype=np.int64)
        weights, drawn, slack = self.weights, self.drawn, self.slack
        for i in range(count):
            n1 = self.samples + 1
            best, best_deadline = -1, float("inf")
            for d, w in enumerate(weights):
                if w > 0 and w * n1 - drawn[d] >= slack - 1e-12:
                    deadline = (drawn[d] + 1 - slack) / w
                    if deadline < best_deadline:
                        best, best_deadline = d, deadline
            drawn[best] += 1
            self.samples = n1
            out[i] = best
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"samples": self.samples, "drawn": list(self.drawn)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if len(state["drawn"]) != len(self.weights):
            raise ValueError(
                f"the saved blend has {len(state['drawn'])} datasets but this run has {len(self.weights)}; resume with "
                "the same data.sources"
            )
        self.samples = int(state["samples"])
        self.drawn = [int(c) for c in state["drawn"]]


def stage_index(stages: Sequence[Stage], step: int) -> int:
    """The index of the stage that step `step` (0-based: the step about to run) belongs to."""
    index = 0
    for i, stage in enumerate(stages):
        if stage.start_step <= step:
            index = i
    return index
