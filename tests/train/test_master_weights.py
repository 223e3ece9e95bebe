"""tuning.mixed_precision = "master_weights": bf16 parameters with fp32 masters in AdamW. The
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
from tests.triton_interpreter import interpreter_job

MW = ["--training.param_dtype", "bfloat16", "--tuning.mixed_precision", "master_weights"]


@pytest.mark.parametrize("kernel", ["foreach", "for-loop", "fused"])
def test_masters_follow_fp32_adamw_and_params_are_their_bf16_rounding(kernel):
    check_masters_follow_fp32_adamw_and_params_are_their_rounding(kernel)


@pytest.mark.parametrize("kernel", ["foreach", "fused"])
def test_state_dict_round_trip_keeps_masters_and_moments_fp32(kernel):
    check_state_dict_round_trip_keeps_fp32_state(kernel)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs the triton package")
@pytest.mark.run_ahead(job=interpreter_job(Path(__file__).with_name("master_weights_checks.py")))
def test_triton_kernel_writes_master_and_bf16_param_like_fp32_adamw(ran_ahead):
    assert ran_ahead.strip().endswith("ok")  # the script's checks passed (tests/triton_interpreter.py)


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
        resolve_run(load_config(None, ["--tuning.mixed_precision", "master_weights"]), world_size=1)
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
    train(str(tmp_path / "autocast"), [*one_batch, "--tuning.mixed_precision", "autocast"])
    train(str(tmp_path / "mw"), [*one_batch, *MW])
    saving = [*one_batch, *MW, "--checkpoint.enable", "true"]
    train(str(tmp_path / "mw_resumed"), saving, stop_after=STOP_AFTER)
    assert (tmp_path / "mw_resumed" / "checkpoints" / f"step-{STOP_AFTER:06d}").is_dir()
    train(str(tmp_path / "mw_resumed"), saving)
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


def test_auto_picks_master_weights_on_one_cuda_device_where_they_apply():
    """auto: master weights on one CUDA device with AdamW and no accumulation; else FSDP's casts
    for eager CUDA runs and autocast otherwise; never on CPU (planned GPU jobs are resolved as
    estimation.py resolves them, on this CPU machine)."""
    from kenotron.kernel_choice.target import Target
    from kenotron.train.resolve import resolve_run

    def decide(*overrides: str, world_size: int = 1, device: str = "cuda") -> tuple[bool, bool]:
        cfg = load_config(None, ["--training.param_dtype", "bfloat16", *overrides])
        precision = resolve_run(cfg, world_size, Target(device, 9, True)).choices.precision
        return precision == "master_weights", precision == "fsdp" and world_size == 1

    assert decide("--compile.enable", "false") == (True, False)
    assert decide("--compile.enable", "true") == (True, False)
    assert decide("--compile.enable", "false", device="cpu") == (False, False)
    accumulating = ["--training.local_batch_size", "2", "--training.global_batch_size", "4"]
    assert decide("--compile.enable", "false", *accumulating) == (False, True)
    assert decide("--compile.enable", "true", *accumulating) == (False, False)
    assert decide("--optimizer.name", "sgd", "--compile.enable", "false") == (False, True)
    assert decide("--tuning.mixed_precision", "autocast") == (False, False)
    assert decide("--tuning.mixed_precision", "fsdp") == (False, True)
    assert decide(world_size=2) == (False, False)
    assert decide("--training.param_dtype", "float32") == (False, False)


RESUME_ARGS = ["--training.local_batch_size", "4", *MW, "--checkpoint.enable", "true"]


def _masters_and_weights(folder: Path, *extra: str, resumed_at: int, steps: int = 0
                         ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """A trainer on `folder` (resuming whatever checkpoint is there, which must bring it to step
    `resumed_at`), after `steps` more steps: its optimizer's fp32 masters and its parameters
    widened to fp32."""
    from kenotron.train.trainer import Trainer
    from tests.checkpoint.test_trainer_resume import COMMON

    cfg = load_config(None, [*COMMON, *RESUME_ARGS, "--job.dump_folder", str(folder), *extra])
    trainer = Trainer(cfg)
    try:
        assert trainer.step == resumed_at
        for _ in range(steps):
            trainer.run_step(trainer.loader.next_step())
        params = list(trainer.job.model.parameters())
        return [trainer.job.optimizers[0].state[p]["master"].clone() for p in params], [p.detach().float() for p in params]
    finally:
        trainer.close()


def test_loading_the_model_part_alone_sets_the_masters_from_it(tmp_path):
    """With the optimizer part left out, the loaded weights become the masters (else the first
    step would bring the initialisation back); a fresh run's masters differ from them."""
    from tests.checkpoint.test_trainer_resume import STOP_AFTER, train

    train(str(tmp_path / "run"), RESUME_ARGS, stop_after=STOP_AFTER)
    loaded, weights = _masters_and_weights(tmp_path / "run", "--checkpoint.exclude_from_loading", "optimizer",
                                           resumed_at=STOP_AFTER)
    fresh, _ = _masters_and_weights(tmp_path / "fresh", resumed_at=0)
    assert all(torch.equal(m, w) for m, w in zip(loaded, weights, strict=True))
    assert not all(torch.equal(m, f) for m, f in zip(loaded, fresh, strict=True))


def test_resuming_model_and_optimizer_restores_the_saved_fp32_masters(tmp_path):
    """Loading both parts gives back the masters of the saving run bit for bit, not its bf16
    weights: the model part's load must not set the masters from the weights when the
    optimizer part is loaded too (dcp.load has already written the saved masters into them)."""
    from tests.checkpoint.test_trainer_resume import STOP_AFTER, train

    train(str(tmp_path / "run"), RESUME_ARGS, stop_after=STOP_AFTER)
    resumed, weights = _masters_and_weights(tmp_path / "run", resumed_at=STOP_AFTER)
    expected, _ = _masters_and_weights(tmp_path / "uninterrupted", "--checkpoint.enable", "false", resumed_at=0,
                                       steps=STOP_AFTER)
    assert all(torch.equal(m, e) for m, e in zip(resumed, expected, strict=True))
    assert not all(torch.equal(m, w) for m, w in zip(resumed, weights, strict=True))


def test_resuming_a_checkpoint_saved_without_master_weights_says_so(tmp_path):
    from kenotron.checkpoint.errors import CheckpointMismatchError
    from tests.checkpoint.test_trainer_resume import STOP_AFTER, train

    saving = ["--training.local_batch_size", "4", "--checkpoint.enable", "true", "--training.param_dtype", "bfloat16"]
    train(str(tmp_path / "run"), [*saving, "--tuning.mixed_precision", "autocast"], stop_after=STOP_AFTER)
    with pytest.raises(CheckpointMismatchError, match=r"has no optimizer entry 'state\..*\.master'.*saved without master "
                       r"weights.*checkpoint.exclude_from_loading = optimizer"):
        train(str(tmp_path / "run"), [*saving, *MW])
