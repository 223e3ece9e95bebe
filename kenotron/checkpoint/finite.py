"""Never write NaN or infinite weights into a checkpoint.

A run that diverged between two logging steps used to save checkpoints full of NaN as complete,
and rotation then deleted the last good one. The trainer stops at the first non-finite
gradient norm (runtime/divergence.py); this is the checkpointer's own last line of defence, for every
caller: one pass over the local weights and one all-reduce of a flag, at each save only.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor


def first_nonfinite_parameter(
    model_parts: Sequence[nn.Module], process_group: dist.ProcessGroup | None = None
) -> str | None:
    """The name of a parameter holding NaN or Inf on some rank (this rank's first one, or
    "a parameter on another rank"), or None when every rank's weights are finite."""
    bad_name = None
    for part in model_parts:
        for name, p in part.named_parameters():
            local = p.to_local() if isinstance(p, DTensor) else p
            if local.numel() and not bool(torch.isfinite(local.detach()).all()):
                bad_name = name
                break
        if bad_name is not None:
            break
    if dist.is_available() and dist.is_initialized():
        device = next((p.device for part in model_parts for p in part.parameters()), torch.device("cpu"))
        if device.type == "meta":
            device = torch.device("cpu")
        flag = torch.tensor(1.0 if bad_name is not None else 0.0, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=process_group)
        if bool(flag.item()) and bad_name is None:
            return "a parameter on another rank"
    return bad_name
