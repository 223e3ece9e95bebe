"""How a bf16 job on one device computes in bf16 (`training.mixed_precision`), decided once for
the trainer and the memory estimator alike.

Measured on an H200 (docs/performance.md, run 25): master weights (bf16 parameters, fp32 masters
in AdamW) ran the 1B shape 3.1% faster than autocast compiled and 2.8% faster than FSDP's mixed
precision eager, with less memory, and the 8B width 1.3% faster compiled; so `auto` picks them
wherever they apply on CUDA (one device, AdamW, no gradient accumulation, whose bf16 gradients
would be summed in bf16). Elsewhere: FSDP2 on a 1-device mesh for eager CUDA runs (4-5% faster
than autocast there), autocast otherwise. With several ranks this module decides nothing:
FSDP's mixed precision (or autocast without data parallelism) does it.
"""

from __future__ import annotations

import torch

from kenotron.train.resolve import RunPlan


def uses_master_weights(run: RunPlan, device_type: str) -> bool:
    """bf16 parameters with fp32 masters in AdamW (kenotron/train/master_weights.py). A named
    `master_weights` was checked by resolve_run (one device, no accumulation, AdamW)."""
    t = run.cfg.training
    if t.param_dtype != "bfloat16":
        return False
    if t.mixed_precision == "master_weights":
        return True
    return (t.mixed_precision == "auto" and device_type == "cuda" and run.dims.world_size == 1
            and run.grad_accum_steps == 1 and run.cfg.optimizer.name == "adamw")


def single_device_fsdp(run: RunPlan, device: torch.device) -> bool:
    """bf16 on one device through FSDP2's mixed precision: named, or `auto` on CUDA without
    compile where master weights do not apply (with compile autocast was as fast or faster,
    1.7% on the 8B width, and used less memory)."""
    t = run.cfg.training
    if run.dims.world_size > 1 or t.param_dtype != "bfloat16" or t.mixed_precision in ("autocast", "master_weights"):
        return False
    if t.mixed_precision == "fsdp":
        return True
    return device.type == "cuda" and not run.cfg.compile.enable and not uses_master_weights(run, device.type)
