"""The machine a job's choices are made for: the trainer's device, the machine the launcher
starts the ranks on, or the GPU machine the estimator plans a config for.

Importing this module imports no torch: the launcher describes its machine (`Target.of_machine`)
from the NVIDIA driver, `nvidia-smi` and the installed packages, and checks the kernel choices
of a config before torch is imported (kenotron/kernel_choice/config_checks.py).
"""

from __future__ import annotations

import glob
import importlib.util
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kenotron.config import ConfigError, JobConfig
from kenotron.kernel_choice.tuning import triton_importable

if TYPE_CHECKING:
    import torch

NVIDIA_GPUS = "/proc/driver/nvidia/gpus"
"""One folder per GPU that the NVIDIA driver sees (Linux)."""


def torch_built_with_cuda() -> bool:
    """Whether the installed torch has its CUDA (or ROCm) library, found without importing torch:
    a CPU build sees no GPU whatever the driver says."""
    spec = importlib.util.find_spec("torch")
    folders = spec.submodule_search_locations if spec else None
    return any(glob.glob(os.path.join(folder, "lib", pattern))
               for folder in folders or () for pattern in ("libtorch_cuda*", "libtorch_hip*"))


def visible_cuda_gpus(environ: Mapping[str, str] = os.environ, driver_gpus: str = NVIDIA_GPUS) -> int:
    """The GPUs a CUDA program here sees, counted without torch: the driver's GPUs, narrowed by
    CUDA_VISIBLE_DEVICES as CUDA reads it (its list ends at the first entry that is not a device,
    such as -1)."""
    gpus = len(glob.glob(os.path.join(driver_gpus, "*")))
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if gpus and visible is not None:
        entries = 0
        for entry in visible.split(","):
            entry = entry.strip()
            if not entry or entry.startswith("-"):
                break
            entries += 1
        gpus = min(gpus, entries)
    return gpus


def nvidia_smi_cuda_major(environ: Mapping[str, str] = os.environ) -> int:
    """The compute capability's major number of the first visible GPU from `nvidia-smi`; 0 when it
    cannot tell (no nvidia-smi, an old driver without the compute_cap query, a device by UUID)."""
    first = environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
    command = ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"]
    if first.isdigit():
        command += ["-i", first]
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=10, check=True).stdout
        return int(out.split()[0].split(".")[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return 0


@dataclass(frozen=True)
class Target:
    """The machine a job runs on, as far as its choices depend on it."""

    device_type: str
    """"cuda" or "cpu"."""
    cuda_major: int = 0
    """Compute capability major of its GPU (0: no GPU or unknown)."""
    triton: bool = False
    """Whether the triton package imports there."""
    packages_here: bool = True
    """Whether the optional kernel packages installed in this process are the target's: False for a
    GPU machine planned from another (the estimator on a laptop), where flash-attn may be installed."""

    @classmethod
    def of(cls, device: torch.device) -> Target:
        """The machine this process runs on, for `device` (torch is loaded: a rank's device)."""
        from kenotron.models.common.flash_attention import cuda_major  # torch: where a device exists

        return cls(device.type, cuda_major(device), triton_importable() if device.type == "cuda" else False)

    @classmethod
    def of_machine(cls, device: str, gpus: int, cuda_major: int = 0) -> Target:
        """The machine the launcher starts the ranks on, told without torch: `device` is
        training.device ("auto", "cuda", "cpu"), `gpus` the visible GPUs (visible_cuda_gpus),
        `cuda_major` their compute capability's major (nvidia_smi_cuda_major; 0 unknown).
        The ranks pick their device as runtime/distributed.py's pick_device does (torch sees the
        GPUs when visible_cuda_gpus counts them and torch_built_with_cuda)."""
        if device == "cuda" and not gpus:
            raise ConfigError("training.device='cuda' but no CUDA device is visible; use 'cpu' or 'auto'")
        if device == "cpu" or not gpus:
            return cls("cpu")
        return cls("cuda", cuda_major, triton_importable())

    @classmethod
    def planned(cls, cfg: JobConfig) -> Target:
        """The GPU machine a config is planned for: CUDA with Triton (of this machine's GPU generation
        when one is visible), unless training.device = "cpu"."""
        if cfg.training.device == "cpu":
            return cls("cpu")
        import torch  # the estimator's process has it loaded

        here = torch.cuda.is_available()
        return cls("cuda", torch.cuda.get_device_capability()[0] if here else 0, True, packages_here=here)
