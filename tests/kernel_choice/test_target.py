"""The machine the launcher describes without torch (kernel_choice/target.py): the GPUs it
counts, their generation from nvidia-smi, the device the ranks will pick."""

from __future__ import annotations

import os
import stat

import pytest

from kenotron.config import ConfigError, load_config
from kenotron.kernel_choice.target import Target, nvidia_smi_cuda_major, torch_built_with_cuda, visible_cuda_gpus
from kenotron.runtime.preflight import machine_target


def test_the_ranks_device_follows_training_device_and_the_visible_gpus():
    assert Target.of_machine("auto", gpus=0) == Target("cpu")
    assert Target.of_machine("cpu", gpus=4, cuda_major=9) == Target("cpu")
    on_gpus = Target.of_machine("auto", gpus=2, cuda_major=9)
    assert (on_gpus.device_type, on_gpus.cuda_major) == ("cuda", 9)
    with pytest.raises(ConfigError, match="training.device='cuda' but no CUDA device is visible; use 'cpu' or 'auto'"):
        Target.of_machine("cuda", gpus=0)


def test_visible_gpus_are_the_drivers_narrowed_by_cuda_visible_devices(tmp_path):
    for gpu in range(4):
        (tmp_path / f"0000:0{gpu}:00.0").mkdir()
    assert visible_cuda_gpus({}, str(tmp_path)) == 4
    assert visible_cuda_gpus({"CUDA_VISIBLE_DEVICES": "1,2"}, str(tmp_path)) == 2
    assert visible_cuda_gpus({"CUDA_VISIBLE_DEVICES": "-1"}, str(tmp_path)) == 0


def _fake_nvidia_smi(folder, output: str) -> None:
    """An nvidia-smi that prints `output` and records its arguments in args.txt."""
    script = folder / "nvidia-smi"
    script.write_text(f'#!/bin/sh\necho "$@" > "{folder}/args.txt"\nprintf "{output}"\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def test_the_gpu_generation_comes_from_nvidia_smi_for_the_first_visible_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    _fake_nvidia_smi(tmp_path, "9.0\\n")
    assert nvidia_smi_cuda_major({"CUDA_VISIBLE_DEVICES": "3,1"}) == 9
    assert (tmp_path / "args.txt").read_text().split() == ["--query-gpu=compute_cap", "--format=csv,noheader",
                                                           "-i", "3"]
    _fake_nvidia_smi(tmp_path, "[N/A]\\n")  # a driver without the compute_cap query: unknown
    assert nvidia_smi_cuda_major({}) == 0
    monkeypatch.setenv("PATH", str(tmp_path / "absent"))
    assert nvidia_smi_cuda_major({}) == 0


def test_a_cpu_run_is_planned_on_the_cpu_whatever_the_machine_has():
    assert machine_target(load_config("debug", ["--training.device", "cpu"])) == Target("cpu")


def test_whether_torch_has_cuda_is_read_from_its_files_as_torch_itself_says():
    import torch

    assert torch_built_with_cuda() == torch.backends.cuda.is_built()
