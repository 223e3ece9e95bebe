"""training.mixed_precision = "master_weights": bf16 parameters with fp32 masters in AdamW. The
optimizer against fp32 AdamW (torch's kernels here, the Triton kernel through Triton's
interpreter), its state dict, the config checks, and training runs (loss, resume)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from kenotron.config import ConfigError, load_config
from tests.train.master_weights_checks import (
    check_masters_follow_fp32_adamw_and_params_are_their_rounding,
    check_state_dict_round_trip_keeps_fp32_state,
    make_params,
)
from tests.triton_interpreter import run_in_triton_interpreter

MW = ["--training.param_dtype", "bfloat16", "--training.mixed_precision", "master_weights"]


@pytest.mark.parametrize("kernel", ["foreach", "for-loop", "fused"])
def test_masters_follow_fp32_adamw_and_params_are_their_bf16_rounding(kernel):
    check_masters_follow_fp32_adamw_and_params_are_their_rounding(kernel)


@pytest.mark.parametrize("kernel", ["foreach", "fused"])
def test_state_dict_round_trip_keeps_masters_and_moments_fp32(kernel):
    check_state_dict_round_trip_keeps_fp32_state(kernel)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs the triton package")
def test_triton_kernel_writes_master_and_bf16_param_like_fp32_adamw():
    run_in_triton_interpreter(Path(__file__).with_name("master_weights_checks.py"))


def test_loading_state_saved_without_masters_names_the_missing_entry():
    from kenotron.train.master_weights import MasterWeightAdamW

    plain = make_params(0)
    ref = torch.optim.AdamW(plain, lr=1e-3)
    for p in plain:
        p.grad = torch.ones_like(p)
    ref.step()
    opt = MasterWeightAdamW(make_params(0), lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    with pytest.raises(KeyError, match="no fp32 'master' entry: it was saved without master weights"):
        opt.load_state_dict(ref.state_dict())


def test_config_checks_name_the_bad_fields():
    from kenotron.train.resolve import resolve_run

    with pytest.raises(ConfigError, match=r"param_dtype='float32' and optimizer.name='adamw'; set param_dtype='bfloat16'"):
        resolve_run(load_config(None, ["--training.mixed_precision", "master_weights"]), world_size=1)
    with pytest.raises(ConfigError, match="optimizer.name='sgd'"):
        resolve_run(load_config(None, [*MW, "--optimizer.name", "sgd"]), world_size=1)
    accumulating = load_config(None, [*MW, "--training.local_batch_size", "2", "--training.global_batch_size", "4"])
    with pytest.raises(ConfigError, match="1 ranks and 2 micro-steps per step.*or global_batch_size=2"):
        resolve_run(accumulating, world_size=1)
    with pytest.raises(ConfigError, match="this job has 2 ranks"):
        resolve_run(load_config(None, MW), world_size=2)


def test_training_with_master_weights_follows_autocast_and_resumes_exactly(tmp_path):
    """On the debug model (CPU, bf16): the loss curve stays within bf16 rounding of autocast's
    (same fp32 updates; bf16 residual stream and gradients), and a run stopped at step 2 and
    resumed writes the same losses, bit for bit, as one run (the masters come back fp32)."""
    from tests.checkpoint.test_trainer_resume import STOP_AFTER, losses_by_step, train

    one_batch = ["--training.local_batch_size", "4", "--training.param_dtype", "bfloat16"]
    train(str(tmp_path / "autocast"), [*one_batch, "--training.mixed_precision", "autocast"])
    train(str(tmp_path / "mw"), [*one_batch, *MW])
    train(str(tmp_path / "mw_resumed"), [*one_batch, *MW], stop_after=STOP_AFTER)
    train(str(tmp_path / "mw_resumed"), [*one_batch, *MW])
    autocast, mw, resumed = (losses_by_step(tmp_path / n) for n in ("autocast", "mw", "mw_resumed"))
    assert mw == resumed
    assert len(mw) == len(autocast) == 4
    for step, loss in mw.items():
        assert abs(loss - autocast[step]) < 0.02 * autocast[step], (step, loss, autocast[step])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or importlib.util.find_spec("triton") is None,
                    reason="needs a CUDA device and triton")
def test_triton_and_torch_fused_master_weights_agree_on_cuda():
    from kenotron.train.master_weights import MasterWeightAdamW

    g = torch.Generator(device="cuda").manual_seed(0)
    shapes = ((4096, 1000), (3,))
    ours = [torch.nn.Parameter(torch.randn(s, generator=g, device="cuda")) for s in shapes]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    hyper = {"lr": 1e-3, "betas": (0.9, 0.95), "eps": 1e-8}
    opt = MasterWeightAdamW([{"params": ours, "weight_decay": 0.1}], kernel="triton", **hyper)
    ref_opt = MasterWeightAdamW([{"params": ref, "weight_decay": 0.1}], kernel="fused", **hyper)
    scale = torch.tensor(2.5, device="cuda")
    for _ in range(3):
        for p, q in zip(ours, ref, strict=True):
            p.grad = torch.randn(p.shape, generator=g, device="cuda").bfloat16()
            q.grad = p.grad.clone()
        opt.grad_scale = ref_opt.grad_scale = scale
        opt.step()
        ref_opt.step()
    for p, q in zip(ours, ref, strict=True):
        torch.testing.assert_close(opt.state[p]["master"], ref_opt.state[q]["master"], rtol=1e-5, atol=1e-6)
        assert torch.equal(p.detach(), opt.state[p]["master"].bfloat16()), "rounded to nearest even on the GPU"
