"""Features attach to a job through JobExtension's hooks (train/extension.py): the step calls them
in order, no value is parked on the job, and the fused loss needs no patched forward."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch

from kenotron.config import load_config
from kenotron.data import MicroBatch
from kenotron.kernel_choice.target import Target
from kenotron.parallel.grad_norm import clip_divisor
from kenotron.train.extension import JobExtension, check_one_runs_the_passes
from kenotron.train.job import build_job, build_meshes
from kenotron.train.resolve import resolve_run
from kenotron.train.step import clip_gradients, optimizer_step, plain_forward_backward, train_step
from kenotron.train.trainer import Trainer

TINY = ["--model.n_layers", "2", "--training.seq_len", "32", "--training.local_batch_size", "2",
        "--training.steps", "2", "--metrics.tensorboard", "false", "--training.device", "cpu",
        "--lr_scheduler.warmup_steps", "0"]


def _job(*overrides: str):
    run = resolve_run(load_config(None, [*TINY, *overrides]), 1, Target("cpu"))
    return build_job(run, torch.device("cpu"), build_meshes(run, "cpu"))


def _batch(job, n: int = 1):
    g = torch.Generator().manual_seed(0)
    vocab = job.run.model_args.vocab_size
    out = []
    for _ in range(n):
        tokens = torch.randint(0, vocab, (2, 33), generator=g)
        out.append(MicroBatch(inputs=tokens[:, :-1], labels=tokens[:, 1:]))
    return out


class Recorder(JobExtension):
    name = "recorder"

    def __init__(self) -> None:
        self.calls: list[str] = []

    def before_forward_backward(self, microbatches: Sequence[Any]) -> None:
        self.calls.append(f"before {len(microbatches)}")

    def after_forward_backward(self) -> None:
        self.calls.append("after")

    def step_optimizer(self, optimizer: Any) -> bool:
        self.calls.append("step")
        return False  # the plain optimizer.step()

    def after_optimizer_step(self) -> None:
        self.calls.append("after step")


def test_the_step_calls_an_extensions_hooks_in_order_and_steps_as_without_it():
    plain, hooked = _job(), _job()
    recorder = Recorder()
    hooked.extensions.append(recorder)
    batches = _batch(plain, 2)
    loss_a, norm_a = train_step(plain, batches)
    loss_b, norm_b = train_step(hooked, batches)
    assert recorder.calls == ["before 2", "after", "step", "after step"]
    assert torch.equal(loss_a, loss_b) and torch.equal(norm_a, norm_b)
    for a, b in zip(plain.model.parameters(), hooked.model.parameters(), strict=True):
        assert torch.equal(a, b)


class RunsPasses(JobExtension):
    name = "runs-passes"

    def forward_backward(self, microbatches: Sequence[Any], observer: Any) -> torch.Tensor:
        return torch.zeros(())


def test_two_extensions_that_run_the_passes_are_refused():
    check_one_runs_the_passes([RunsPasses(), Recorder()])
    with pytest.raises(ValueError, match=r"extensions \['runs-passes', 'runs-passes'\] each run the step's passes"):
        check_one_runs_the_passes([RunsPasses(), RunsPasses()])


def test_an_extension_that_runs_the_passes_replaces_the_plain_ones():
    job = _job()
    job.extensions.append(RunsPasses())
    before = [p.detach().clone() for p in job.model.parameters()]
    loss, _ = train_step(job, _batch(job))
    assert float(loss) == 0.0
    for a, b in zip(before, job.model.parameters(), strict=True):
        assert torch.equal(a, b)  # no gradient: the optimizer step changed nothing


def test_the_fused_loss_stops_the_model_at_its_norm_without_patching_forward():
    job = _job("--tuning.loss", "fused")
    assert job.fused_loss
    model = job.model
    assert "forward" not in vars(model.output)  # the output layer's forward is its class's
    tokens = _batch(job)[0].inputs
    hidden = model(tokens, logits=False)
    logits = model(tokens)
    assert hidden.shape[-1] == job.run.model_args.dim
    torch.testing.assert_close(model.output(hidden), logits, rtol=0, atol=0)


def test_the_fused_and_plain_losses_agree_through_the_step():
    fused, plain = _job("--tuning.loss", "fused"), _job("--tuning.loss", "plain")
    batches = _batch(fused, 2)
    torch.testing.assert_close(plain_forward_backward(fused, batches), plain_forward_backward(plain, batches),
                               rtol=1e-5, atol=1e-6)


def test_clipping_hands_the_divisor_to_optimizers_that_divide_and_the_step_clears_it():
    # torch's fused AdamW divides by grad_scale inside its kernel (on CPU too).
    job = _job("--training.max_norm", "1e-3", "--tuning.adamw_implementation", "fused")
    optimizer = job.optimizers[0]
    seen = []
    real_step = optimizer.step

    def step(*args, **kwargs):
        seen.append(optimizer.grad_scale)
        return real_step(*args, **kwargs)

    optimizer.step = step
    plain_forward_backward(job, _batch(job))
    norm = clip_gradients(job)
    # Handed to the optimizer that uses it, not parked on the job for optimizer_step to fetch.
    torch.testing.assert_close(optimizer.grad_scale, clip_divisor(1e-3, norm))
    assert not any(isinstance(v, torch.Tensor) for v in vars(job).values())
    optimizer_step(job)
    torch.testing.assert_close(seen[0], clip_divisor(1e-3, norm))
    assert optimizer.grad_scale is None


def test_the_launcher_path_checks_the_run_folder_once(tmp_path, monkeypatch):
    from kenotron.train import trainer as trainer_module

    calls = []
    monkeypatch.setattr(trainer_module, "check_run_folder", calls.append)
    cfg = load_config(None, [*TINY, "--job.dump_folder", str(tmp_path / "run")])
    trainer = Trainer(cfg, checked_by_launcher=True)
    trainer.close()
    assert calls == []
    trainer = Trainer(cfg)  # a notebook's Trainer(cfg) checks itself
    trainer.close()
    assert calls == [cfg]
