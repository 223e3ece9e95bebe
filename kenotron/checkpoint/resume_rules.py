"""The settings a resume cannot change: checked against the run's last config before any process starts.

A resume restores the model, the optimizer's state, the LR schedule's position, the data
position and the step (checkpoint/state.py). Most settings may change across a resume and
apply from the resumed step (train/resume_settings.py says which did, in one line). The ones
here cannot: the restored state would not mean what it meant. A change stops the launch in one
line naming the key, the way back, and the part to leave out of loading to start it afresh.
What makes a run another run (the model, the data) is runtime/run_folder.py's IDENTITY_KEYS.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from kenotron.config import ConfigError, toml_value


@dataclass(frozen=True)
class FixedOnResume:
    """A setting the restored `part` depends on."""

    part: str
    """The checkpoint part (checkpoint.exclude_from_loading's name) whose state would lose its meaning."""
    why: str
    """What goes wrong, with {old} and {new} for the two values."""


FIXED_ON_RESUME = {
    "optimizer.name": FixedOnResume("optimizer", "the checkpoint holds {old}'s optimizer state, which {new} cannot continue"),
    "data.seed": FixedOnResume("dataloader", "the data position counts the windows drawn in the order of seed {old}; "
                                             "another order would repeat some and skip others"),
    "data.shuffle": FixedOnResume("dataloader", "the data position counts the windows drawn in the saved order; "
                                                "another order would repeat some and skip others"),
}
"""Config keys a resume refuses to change while their part is loaded."""


def check_fixed_on_resume(previous: dict[str, Any], now: dict[str, Any], excluded: Collection[str]) -> None:
    """ConfigError (one line) for the first FIXED_ON_RESUME key whose value differs between the
    run's last launch (`previous`, flat 'section.key' values) and this one, unless its part is
    in `excluded` (checkpoint.exclude_from_loading)."""
    for key, rule in FIXED_ON_RESUME.items():
        if rule.part in excluded or key not in previous or key not in now or previous[key] == now[key]:
            continue
        old, new = toml_value(previous[key]), toml_value(now[key])
        raise ConfigError(
            f"{key} changed on resume ({old} -> {new}): {rule.why.format(old=previous[key], new=now[key])}; resume with "
            f"--{key} {old}, or start the {rule.part} afresh by adding {rule.part!r} to checkpoint.exclude_from_loading"
        )
