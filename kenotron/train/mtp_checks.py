"""Multi-token prediction's layout check (train/mtp.py is the feature), importable without the trainer.

The MTP modules run under every parallelism; their placement in a pipeline split is checked where
the split is made (models/deepseek_v3/mtp.py's mtp_stage_copies). What is left is one schedule
family: torch's zero-bubble schedules split each backward into an input pass and a weight pass
run per parameter group, each freeing the graph it walks. The group that fails is the output
head's weight (observed on CPU/gloo); why, as far as read: that weight is used twice
on the last stage (the main logits and the MTP heads'), and the MTP loss joins backward before the
final norm, so the head's weight pass walks from the main logits back through the final norm to
the MTP heads, and finds the norm's graph freed by the norm weight's pass ("Trying to backward
through the graph a second time", torch 2.13). Attaching the MTP loss to the logits instead would
cut that path, but the logits are a DTensor under loss parallel; until then the schedules are refused.
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
            f"model.mtp_depth={depth} with parallelism.pp_schedule={schedule!r}: torch's split weight pass re-walks "
            f"the final norm's freed graph on the MTP stage; use a schedule among GPipe, 1F1B, Interleaved1F1B, LoopedBFS, or "
            f"model.mtp_depth=0")
