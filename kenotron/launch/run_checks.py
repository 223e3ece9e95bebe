"""The launcher's second round of checks: the whole of resolve_run and the trainer's own checks,
in the launcher process, before torchrun starts any rank. Importing this imports torch and the
trainer (seconds), which is why the launcher runs the torch-free checks (runtime/preflight.py:
the config, the model's shape, the kernel choices) first and this module only after them.

What only this round finds: what needs the meta model (the family's layout, spectral µP's fans,
the pipeline split, Mamba sizes the Triton scan does not take, a fused loss without an output
layer), files (the tokenizer, the data, a DoReMi reference checkpoint), flash-attn's import and
version, torch's own view of CUDA (launch_target), and the trainer's checks (run folder, wandb,
float8)."""

from __future__ import annotations

import torch

from kenotron.config import ConfigError, JobConfig
from kenotron.kernel_choice.target import Target
from kenotron.kernel_choice.tuning import triton_importable
from kenotron.train.resolve import resolve_run
from kenotron.train.trainer import check_before_start


def launch_target(cfg: JobConfig) -> Target:
    """The machine the ranks will run on, as Target.of(device) will find it on each of them."""
    device = cfg.training.device
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("training.device='cuda' but no CUDA device is visible; use 'cpu' or 'auto'")
    if device == "cpu" or not torch.cuda.is_available():
        return Target("cpu")
    return Target("cuda", torch.cuda.get_device_capability(0)[0], triton_importable())


def check_run(cfg: JobConfig, world_size: int) -> None:
    """Every check the ranks would run before their process group: ConfigError naming the fix."""
    resolve_run(cfg, world_size, launch_target(cfg))
    check_before_start(cfg)
