"""tuning.adamw_implementation = "triton" (kenotron/kernels/adamw.py): the kernel equals torch's AdamW
(run on the CPU through Triton's interpreter, in a child process), the refusal off CUDA, the
clipping divisor handed to the kernel, and a dry run on fake tensors that only creates the state."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from kenotron.config import ConfigError, load_config
from kenotron.train.optim import optimizer_factory
from tests.triton_interpreter import interpreter_job

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs the triton package")


@needs_triton
@pytest.mark.run_ahead(job=interpreter_job(Path(__file__).with_name("adamw_child.py")))
def test_triton_adamw_equals_torch_adamw_through_clipping_lr_changes_checkpoints_and_dtensors(ran_ahead):
    assert ran_ahead.strip().endswith("ok")  # the script's checks passed (tests/triton_interpreter.py)


def test_triton_on_cpu_is_refused_before_training():
    from kenotron.train.resolve import resolve_run

    cfg = load_config(None, ["--training.device", "cpu", "--tuning.adamw_implementation", "triton"])
    with pytest.raises(ConfigError, match="tuning.adamw_implementation='triton' needs a CUDA device"):
        resolve_run(cfg, world_size=1)


@needs_triton
def test_triton_adamw_takes_the_clipping_divisor_and_a_dry_run_only_creates_state():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from kenotron.parallel.grad_norm import optimizer_unscales_gradients
    from kenotron.train.optim import TritonAdamW

    cfg = load_config(None, ["--tuning.adamw_implementation", "triton"]).optimizer
    factory = optimizer_factory(cfg, "triton")
    with FakeTensorMode():
        p = torch.nn.Parameter(torch.empty(64, 32))
        opt = factory([{"params": [p], "weight_decay": 0.1}])
        assert isinstance(opt, TritonAdamW) and optimizer_unscales_gradients(opt)
        p.grad = torch.empty_like(p)
        opt.step()  # no kernel on fake tensors (no device to run it): the moments are made
        state = opt.state[p]
        assert state["exp_avg"].shape == state["exp_avg_sq"].shape == (64, 32) and float(state["step"]) == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or importlib.util.find_spec("triton") is None,
                    reason="needs a CUDA device and triton")
def test_triton_adamw_on_cuda_equals_torch_fused_adamw():
    from kenotron.train.optim import TritonAdamW

    g = torch.Generator(device="cuda").manual_seed(0)
    ours = [torch.randn(s, generator=g, device="cuda").requires_grad_() for s in ((4096, 1000), (3,))]
    ref = [p.detach().clone().requires_grad_() for p in ours]
    opt = TritonAdamW([{"params": ours, "weight_decay": 0.1}], lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    ref_opt = torch.optim.AdamW([{"params": ref, "weight_decay": 0.1}], lr=1e-3, betas=(0.9, 0.95), eps=1e-8,
                                fused=True)
    scale = torch.tensor(2.5, device="cuda")
    for _ in range(3):
        for p, q in zip(ours, ref, strict=True):
            p.grad = torch.randn(p.shape, generator=g, device="cuda")
            q.grad = p.grad.clone()
        opt.grad_scale = ref_opt.grad_scale = scale
        opt.step()
        ref_opt.step()
    for p, q in zip(ours, ref, strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_a_gpu_job_with_triton_is_planned_on_a_cpu_machine_and_refused_by_its_trainer_here(tmp_path):
    from kenotron.train.resolve import resolve_run
    from kenotron.train.trainer import Trainer

    if torch.cuda.is_available():
        pytest.skip("checks the CPU-only machine's behaviour")
    # A folder of the test's own: the Trainer first checks its run folder (the default ./outputs may hold a run).
    cfg = load_config(None, ["--tuning.adamw_implementation", "triton", "--job.dump_folder", str(tmp_path)])
    resolve_run(cfg, world_size=1)  # estimation.py's view: planned for a GPU machine
    with pytest.raises(ConfigError, match="tuning.adamw_implementation='triton' needs a CUDA device"):
        Trainer(cfg)
