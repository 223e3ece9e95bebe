"""Multi-token prediction's layout check (train/mtp.py is the feature), importable without the trainer.

The MTP modules run under every parallelism; their placement in a pipeline split is checked where
the split is made (models/deepseek_v3/mtp.py's mtp_stage_copies). What is left is one schedule
family: torch's zero-bubble schedules split each backward into an input pass and a weight pass,
and the weight pass of the MTP modules' stage fails on CPU/gloo with torch 2.13 ("Trying to
backward through the graph a second time", in stage_backward_weight), so they are refused.
"""

from __future__ import annotations

from typing import Any

from kenotron.degrees import ZERO_BUBBLE_SCHEDULES
from kenotron.errors import ConfigError


def check_multi_token_prediction(args: Any, pp: int, schedule: str) -> None:
    """Refuse MTP under a zero-bubble pipeline schedule (see the module docstring)."""
    depth = getattr(args, "mtp_depth", 0)
    if depth and pp > 1 and schedule in ZERO_BUBBLE_SCHEDULES:
        raise ConfigError(
            f"model.mtp_depth={depth} with parallelism.pp_schedule={schedule!r}: torch's split weight pass fails on "
            f"the MTP modules' stage; use a schedule among GPipe, 1F1B, Interleaved1F1B, LoopedBFS, or "
            f"model.mtp_depth=0")
