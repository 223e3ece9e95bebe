"""LR schedule values at chosen steps, for every decay shape, and LambdaLR wiring."""

from __future__ import annotations

import math

import pytest
import torch

from kenotron.train.lr_schedule import LRSchedule, build_lr_scheduler, warmup_outlasts_run


def sched(decay: str, **kw) -> LRSchedule:
    base = {"total_steps": 100, "warmup_steps": 10, "decay": decay, "min_lr_ratio": 0.1, "decay_ratio": 0.2}
    base.update(kw)
    return LRSchedule(**base)


@pytest.mark.parametrize("decay", ["linear", "cosine", "wsd", "1-sqrt", "constant"])
def test_warmup_is_linear_from_the_first_step_and_reaches_peak(decay):
    s = sched(decay)
    assert s.lr_factor(1) == pytest.approx(0.1)
    assert s.lr_factor(5) == pytest.approx(0.5)
    assert s.lr_factor(10) == pytest.approx(1.0)


def test_linear_and_cosine_values():
    lin, cos = sched("linear"), sched("cosine")
    # step 55 is half-way through the 90 decay steps
    assert lin.lr_factor(55) == pytest.approx(0.1 + 0.9 * 0.5)
    assert cos.lr_factor(55) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert cos.lr_factor(32.5) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.25)))
    for s in (lin, cos):
        assert s.lr_factor(100) == pytest.approx(0.1)
        assert s.lr_factor(150) == pytest.approx(0.1)


def test_wsd_and_1_sqrt_hold_then_decay_over_the_last_fifth():
    wsd, sq = sched("wsd"), sched("1-sqrt")
    for s in (wsd, sq):
        assert s.lr_factor(11) == 1.0 and s.lr_factor(80) == 1.0
        assert s.lr_factor(100) == pytest.approx(0.1)
    assert wsd.lr_factor(90) == pytest.approx(0.1 + 0.9 * 0.5)
    assert sq.lr_factor(90) == pytest.approx(0.1 + 0.9 * (1 - math.sqrt(0.5)))


def test_constant_holds_the_peak():
    s = sched("constant")
    assert [s.lr_factor(i) for i in (11, 50, 100)] == [1.0, 1.0, 1.0]


def test_no_warmup_starts_at_the_peak():
    assert sched("cosine", warmup_steps=0).lr_factor(1) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 100)))


def test_lambda_lr_gives_step_k_its_factor():
    s = sched("cosine")
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2.0)
    lr = build_lr_scheduler(opt, s)
    seen = []
    for _ in range(12):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        lr.step()
    assert seen == pytest.approx([2.0 * s.lr_factor(k) for k in range(1, 13)])


def test_warmup_reaching_the_run_length_is_named_with_the_lr_the_run_ends_at():
    short = warmup_outlasts_run(sched("cosine", total_steps=20, warmup_steps=25), peak_lr=1e-3)
    assert short is not None and "\n" not in short
    assert "lr_scheduler.warmup_steps=25 >= training.steps=20" in short and "ends in warmup at lr 0.0008" in short
    assert warmup_outlasts_run(sched("cosine", total_steps=20, warmup_steps=20), peak_lr=1e-3) is not None
    assert warmup_outlasts_run(sched("cosine", total_steps=250, warmup_steps=25), peak_lr=1e-3) is None
    assert warmup_outlasts_run(sched("constant", total_steps=20, warmup_steps=20), peak_lr=1e-3) is None


def test_a_run_shorter_than_its_warmup_starts_with_one_warning_and_keeps_its_schedule(tmp_path, caplog):
    from kenotron.config import load_config
    from kenotron.train.trainer import Trainer

    cfg = load_config(None, ["--model.n_layers", "1", "--training.seq_len", "32", "--training.local_batch_size", "2",
                             "--training.steps", "20", "--lr_scheduler.warmup_steps", "25",
                             "--metrics.tensorboard", "false", "--job.dump_folder", str(tmp_path)])
    with caplog.at_level("WARNING", logger="kenotron"):
        trainer = Trainer(cfg)
        trainer.close()
    said = [r.getMessage() for r in caplog.records if "lr_scheduler.warmup_steps" in r.getMessage()]
    assert len(said) == 1 and "training.steps=20" in said[0], caplog.text
    assert trainer.job.schedule.warmup_steps == 25
