"""The valid range of every numeric config field, declared beside the field and checked on loading.

    lr: float = ranged(3e-3, above(0))      # in config/sections.py, above the field's docstring

A float must also be finite: NaN and infinities are never a setting (`max_norm nan` would
silently turn clipping off, `lr inf` would end in a traceback steps later). Values with a
documented meaning outside the range (`-1` for "automatic") are listed with that meaning.
`load_config` checks each value as it reads it and `validate_config` checks a config built in
Python, so a bad value stops the job with one line, exit 2, before any process starts:

    optimizer.eps=-1.0 must be > 0 and finite; the default is 1e-08
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

RANGE_KEY = "range"
"""The dataclass field metadata key that holds a field's Range."""


@dataclass(frozen=True)
class Range:
    """The numbers a config field accepts: an interval, plus values with a meaning of their own."""

    low: float | None = None
    """Lower bound; None: none."""
    high: float | None = None
    """Upper bound; None: none."""
    low_open: bool = False
    """Whether `low` itself is excluded (> instead of >=)."""
    high_open: bool = False
    """Whether `high` itself is excluded (< instead of <=)."""
    also: tuple[tuple[float, str], ...] = ()
    """Values accepted outside the interval, each with what it means: ((-1, "automatic"),)."""

    def contains(self, value: float) -> bool:
        if any(value == special for special, _ in self.also):
            return True
        if isinstance(value, float) and not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return not (self.high is not None and (value >= self.high if self.high_open else value > self.high))

    def _interval(self) -> str:
        return (f"{'(' if self.low_open else '['}{_num(self.low)}, {_num(self.high)}"
                f"{')' if self.high_open else ']'}")

    def _bound(self) -> str:
        """`> 0`, `<= 1`: the one bound of a half-open range."""
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {_num(self.low)}"
        return f"{'<' if self.high_open else '<='} {_num(self.high)}"

    def short(self) -> str:
        """`> 0`, `[0, 1)`, `>= 1 or -1`: the range in the config reference's type column."""
        if self.low is not None and self.high is not None:
            text = self._interval()
        elif self.low is not None or self.high is not None:
            text = self._bound()
        else:
            text = "finite"
        return " or ".join([text, *(_num(v) for v, _ in self.also)])

    def describe(self, *, is_float: bool) -> str:
        """`must be > 0 and finite`, `must lie in [0, 1)`, `must be >= 1, or -1 (automatic)`."""
        if self.low is not None and self.high is not None:
            rule = f"lie in {self._interval()}"
        elif self.low is not None or self.high is not None:
            rule = f"be {self._bound()}{' and finite' if is_float else ''}"
        else:
            rule = "be finite"
        specials = ", ".join(f"{_num(v)} ({meaning})" for v, meaning in self.also)
        return f"must {rule}" + (f", or {specials}" if specials else "")


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


def above(low: float, *also: tuple[float, str]) -> Range:
    """> low (and finite)."""
    return Range(low=low, low_open=True, also=also)


def at_least(low: float, *also: tuple[float, str]) -> Range:
    """>= low (and finite)."""
    return Range(low=low, also=also)


def between(low: float, high: float, *, low_open: bool = False, high_open: bool = False) -> Range:
    """In [low, high], each end excluded when its flag says so."""
    return Range(low=low, high=high, low_open=low_open, high_open=high_open)


def ranged(default: float, valid: Range) -> Any:
    """A dataclass field with the number `default`, whose values must lie in `valid` (a list or
    dict of numbers: `field(default_factory=list, metadata={RANGE_KEY: valid})`)."""
    return dataclasses.field(default=default, metadata={RANGE_KEY: valid})


def range_problem(key: str, value: Any, valid: Range | None, default: Any = None) -> str | None:
    """The one-line complaint about `value` of `key` (a number, or a list or dict of numbers),
    or None when it lies in `valid` (or the field declares no range)."""
    if valid is None:
        return None
    if isinstance(value, (list, tuple)):
        return next((p for i, v in enumerate(value) if (p := range_problem(f"{key}[{i}]", v, valid))), None)
    if isinstance(value, dict):
        return next((p for k, v in value.items() if (p := range_problem(f"{key}.{k}", v, valid))), None)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or valid.contains(value):
        return None
    shown_default = f"; the default is {default!r}" if isinstance(default, (int, float)) else ""
    return f"{key}={value!r} {valid.describe(is_float=isinstance(value, float))}{shown_default}"


def field_range(cls: type, name: str) -> Range | None:
    """The Range declared for field `name` of dataclass `cls`, if any."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            return f.metadata.get(RANGE_KEY)
    return None
