"""Never write NaN or infinite state into a checkpoint, never resume from one that holds some.

A run that diverged between two logging steps used to save checkpoints full of NaN as complete,
and rotation then deleted the last good one. The trainer stops at the first non-finite
gradient norm (runtime/divergence.py); this is the checkpointer's own last line of defence, for every
caller, at each save and after each load: the model's parameters, its persistent buffers (an
MoE router's `expert_bias`, which no gradient norm sees) and the optimizers' state. A NaN
that reaches a checkpoint anyway (a bit flipped on disk without checksums) is named on load,
with its step, instead of being trained on until the next save refuses.

Cost: one summing pass over the local tensors (0.07 s for a 153M-parameter model with AdamW's
state on one CPU thread, against 1.7 s for an isfinite mask), one device-to-host copy per
device and one all-reduce of a flag; the names are gathered only when something is wrong.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from kenotron.checkpoint.errors import NonFiniteStateError
from kenotron.checkpoint.folders import list_step_folders, step_folder_name

# Wrappers that activation checkpointing and torch.compile put into module names.
_WRAPPER_NAMES = ("_checkpoint_wrapped_module.", "_orig_mod.")


def _clean(name: str) -> str:
    for wrapper in _WRAPPER_NAMES:
        name = name.replace(wrapper, "")
    return name


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return (tensor.to_local() if isinstance(tensor, DTensor) else tensor).detach()


def checked_tensors(
    model_parts: Sequence[nn.Module], optimizers: Sequence[torch.optim.Optimizer] = ()
) -> Iterator[tuple[str, torch.Tensor]]:
    """(description, local tensor) of everything a checkpoint holds in floating point: parameters,
    persistent buffers, and optimizer state (per parameter, by the parameter's name)."""
    names: dict[int, str] = {}
    for part in model_parts:
        for name, p in part.named_parameters():
            names[id(p)] = _clean(name)
            yield f"parameter {_clean(name)}", _local(p)
        for module_name, module in part.named_modules():
            for name, buffer in module.named_buffers(recurse=False):
                if buffer is not None and name not in module._non_persistent_buffers_set:
                    yield f"buffer {_clean(f'{module_name}.{name}' if module_name else name)}", _local(buffer)
    for optimizer in optimizers:
        for param, state in optimizer.state.items():
            for key, value in state.items():
                if isinstance(value, torch.Tensor):
                    yield f"optimizer state {key} of {names.get(id(param), 'a parameter')}", _local(value)


def first_nonfinite(
    model_parts: Sequence[nn.Module],
    optimizers: Sequence[torch.optim.Optimizer] = (),
    process_group: dist.ProcessGroup | None = None,
) -> str | None:
    """The first tensor holding NaN or Inf on any rank (e.g. "buffer layers.1.feed_forward.router.expert_bias",
    "optimizer state exp_avg of output.weight on rank 3"), or None when all are finite."""
    found = [(d, t) for d, t in checked_tensors(model_parts, optimizers)
             if t.is_floating_point() and t.numel() and t.device.type != "meta"]
    bad: str | None = None
    by_device: dict[torch.device, list[int]] = {}
    for i, (_, tensor) in enumerate(found):
        by_device.setdefault(tensor.device, []).append(i)
    suspects = []
    for indices in by_device.values():
        # A sum is non-finite whenever an element is (NaN and +-Inf propagate), and costs a
        # fraction of isfinite's pass (no mask to allocate); a finite tensor whose sum overflows
        # is cleared by the exact check below.
        sums = torch.stack([found[i][1].sum(dtype=torch.float32) for i in indices])
        flags = torch.isfinite(sums).cpu().tolist()
        suspects += [i for i, ok in zip(indices, flags) if not ok]
    for i in sorted(suspects):
        if not bool(torch.isfinite(found[i][1]).all()):
            bad = found[i][0]
            break
    if not (dist.is_available() and dist.is_initialized()):
        return bad
    device = next((t.device for _, t in found), torch.device("cpu"))
    flag = torch.tensor(1.0 if bad is not None else 0.0, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=process_group)
    if not bool(flag.item()):
        return None
    reports: list[str | None] = [None] * dist.get_world_size(process_group)
    dist.all_gather_object(reports, bad, group=process_group)
    rank, first = next((r, b) for r, b in enumerate(reports) if b is not None)
    return first if dist.get_world_size(process_group) == 1 else f"{first} on rank {rank}"


def nonfinite_load_error(path: Path, step: int, bad: str, folder: Path) -> NonFiniteStateError:
    """The one line for a loaded checkpoint holding NaN or Inf (`bad` names the tensor): its step,
    and the earlier complete step of `folder` to resume from instead."""
    earlier = [f.step for f in list_step_folders(folder) if f.complete and f.step < step and not f.model_only]
    fix = (f"resume from an earlier step (--checkpoint.load_step {earlier[-1]}) or delete {path}" if earlier
           else f"delete {path} or start from another checkpoint")
    return NonFiniteStateError(
        f"{step_folder_name(step)} ({path}) holds NaN or Inf ({bad}): it is damaged or was saved after training "
        f"diverged, so it is not resumed from; {fix}"
    )
