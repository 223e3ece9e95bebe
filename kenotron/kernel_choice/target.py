"""The machine a job's choices are made for: the trainer's device, or the GPU machine the
estimator plans a config for."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kenotron.config import JobConfig
from kenotron.kernel_choice.tuning import triton_importable
from kenotron.models.common.flash_attention import cuda_major


@dataclass(frozen=True)
class Target:
    """The machine a job runs on, as far as its choices depend on it."""

    device_type: str
    """"cuda" or "cpu"."""
    cuda_major: int = 0
    """Compute capability major of its GPU (0: no GPU or unknown)."""
    triton: bool = False
    """Whether the triton package imports there."""

    @classmethod
    def of(cls, device: torch.device) -> Target:
        """The machine this process runs on, for `device`."""
        return cls(device.type, cuda_major(device), triton_importable() if device.type == "cuda" else False)

    @classmethod
    def planned(cls, cfg: JobConfig) -> Target:
        """The GPU machine a config is planned for: CUDA with Triton (of this machine's GPU generation
        when one is visible), unless training.device = "cpu"."""
        if cfg.training.device == "cpu":
            return cls("cpu")
        return cls("cuda", torch.cuda.get_device_capability()[0] if torch.cuda.is_available() else 0, True)
