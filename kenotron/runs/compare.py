"""Two runs' losses, step by step, within a tolerance (`kenotron compare`, scripts/loss_compare.py).

A step passes when |a - b| <= atol + rtol * |b| (b: the reference), as in numpy.isclose. Only
the steps both runs logged are compared; a comparison with no common step fails.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kenotron.runs.records import read_records, run_label


@dataclass
class LossComparison:
    """The per-step losses of a run against a reference run."""

    name: str
    reference: str
    rtol: float
    atol: float
    rows: list[tuple[int, float, float]] = field(default_factory=list)
    """(step, loss, reference loss) for every common step."""

    def bad_steps(self) -> list[int]:
        return [s for s, a, b in self.rows if abs(a - b) > self.atol + self.rtol * abs(b)]

    @property
    def ok(self) -> bool:
        return bool(self.rows) and not self.bad_steps()

    def max_abs_diff(self) -> float:
        return max((abs(a - b) for _, a, b in self.rows), default=float("nan"))

    def format(self) -> str:
        lines = [f"{'step':>7}  {self.name[:18]:>18}  {self.reference[:18]:>18}  {'diff':>10}  ok"]
        bad = set(self.bad_steps())
        for step, a, b in self.rows:
            lines.append(f"{step:>7}  {a:>18.4f}  {b:>18.4f}  {a - b:>+10.4f}  {'no' if step in bad else 'yes'}")
        if not self.rows:
            verdict = "no common step: nothing to compare"
        elif bad:
            verdict = (f"{len(bad)} of {len(self.rows)} steps differ by more than atol={self.atol} + rtol={self.rtol} "
                       f"x |reference| (first: step {min(bad)}; largest |diff| {self.max_abs_diff():.4g})")
        else:
            verdict = (f"all {len(self.rows)} common steps within atol={self.atol} + rtol={self.rtol} x |reference| "
                       f"(largest |diff| {self.max_abs_diff():.4g})")
        return "\n".join([*lines, verdict])


def compare_losses(run: str | Path, reference: str | Path, *, rtol: float = 0.01, atol: float = 0.0,
                   key: str = "loss") -> LossComparison:
    """Compare `run`'s `key` (default: the step's loss) with `reference`'s at their common steps."""
    ours = {r["step"]: r[key] for r in read_records(run) if r.get(key) is not None}
    theirs = {r["step"]: r[key] for r in read_records(reference) if r.get(key) is not None}
    rows = [(s, float(ours[s]), float(theirs[s])) for s in sorted(set(ours) & set(theirs))]
    return LossComparison(run_label(run), run_label(reference), rtol, atol, rows)
