"""A resume trains with this launch's optimizer and schedule settings and says which changed
(train/resume_settings.py); the settings the restored state depends on stop the launch instead
(checkpoint/resume_rules.py)."""

from __future__ import annotations

import pytest
import torch

from kenotron.checkpoint.resume_rules import FIXED_ON_RESUME, check_fixed_on_resume
from kenotron.config import ConfigError, load_config
from kenotron.runtime.run_folder import check_run_folder
from kenotron.train.lr_schedule import LRSchedule, build_lr_scheduler
from kenotron.train.resume_settings import apply_launch_settings, built_settings
from kenotron.train.trainer import Trainer

RUN = ["--model.n_layers", "1", "--training.seq_len", "32", "--training.local_batch_size", "2",
       "--lr_scheduler.warmup_steps", "2", "--metrics.tensorboard", "false", "--metrics.log_freq", "1",
       "--checkpoint.enable", "true", "--checkpoint.interval", "2"]


def _train(folder, *overrides: str) -> tuple[list[dict], list[float], list[str]]:
    """Train (resuming what `folder` holds): the records, the lr each optimizer step used, the warnings."""
    import logging

    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage()) if record.levelno >= logging.WARNING else None
    logging.getLogger("kenotron").addHandler(handler)
    try:
        trainer = Trainer(load_config(None, [*RUN, "--job.dump_folder", str(folder), *overrides]))
        used: list[float] = []
        trainer.job.torch_optimizers[0].register_step_pre_hook(lambda opt, *_: used.append(opt.param_groups[0]["lr"]))
        try:
            records = trainer.train()
        finally:
            trainer.close()
    finally:
        logging.getLogger("kenotron").removeHandler(handler)
    return records, used, said


def test_a_resume_with_a_new_lr_trains_with_it_from_the_resumed_step_and_says_so(tmp_path):
    _train(tmp_path, "--training.steps", "2")
    records, used, said = _train(tmp_path, "--training.steps", "4", "--optimizer.lr", "1e-3")
    schedule = LRSchedule(total_steps=4, warmup_steps=2, decay="cosine", min_lr_ratio=0.1)
    expected = [1e-3 * schedule.lr_factor(step) for step in (3, 4)]
    assert used == pytest.approx(expected, rel=1e-12)
    assert [r["lr"] for r in records] == pytest.approx(used, rel=1e-12)  # the metrics report the lr used
    line = next(s for s in said if s.startswith("resumed at step 2 with changed settings"))
    assert "applied from step 3" in line and "optimizer.lr 0.003 -> 0.001" in line and "training.steps 2 -> 4" in line
    # A schedule started afresh over a restored step: the records still give the lr each step used.
    records, used, _ = _train(tmp_path, "--training.steps", "6", "--optimizer.lr", "1e-3",
                              "--checkpoint.exclude_from_loading", "lr_scheduler")
    assert [r["step"] for r in records] == [5, 6]
    assert [r["lr"] for r in records] == pytest.approx(used, rel=1e-12)
    # The optimizer itself cannot change under its restored state: one line naming the key, before any process.
    with pytest.raises(ConfigError, match=r"^optimizer.name changed on resume \(\"adamw\" -> \"sgd\"\).*"
                                          r"--optimizer.name \"adamw\".*exclude_from_loading"):
        check_run_folder(load_config(None, [*RUN, "--job.dump_folder", str(tmp_path), "--optimizer.name", "sgd"]))
    check_run_folder(load_config(None, [*RUN, "--job.dump_folder", str(tmp_path), "--optimizer.name", "sgd",
                                        "--checkpoint.exclude_from_loading", "optimizer"]))


SAVED_SCHEDULE = LRSchedule(10, 2, "cosine", 0.1)


def _adamw(lr: float, weight_decay: float, betas: tuple[float, float], schedule: LRSchedule = SAVED_SCHEDULE) -> tuple[torch.optim.AdamW, object]:
    p = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.AdamW([{"params": [p], "weight_decay": weight_decay}], lr=lr, betas=betas)
    return optimizer, build_lr_scheduler(optimizer, schedule)


def test_every_optimizer_setting_a_checkpoint_restores_gives_way_to_the_launch_and_is_named():
    saved_opt, saved_sched = _adamw(3e-3, 0.1, (0.9, 0.95))
    for _ in range(4):
        saved_opt.step()
        saved_sched.step()
    optimizer, scheduler = _adamw(1e-3, 0.05, (0.8, 0.95), LRSchedule(20, 2, "wsd", 0.1))
    built = built_settings([optimizer])
    optimizer.load_state_dict(saved_opt.state_dict())
    scheduler.load_state_dict(saved_sched.state_dict())
    line = apply_launch_settings([optimizer], [scheduler], built, 1e-3, 4)
    group = optimizer.param_groups[0]
    assert (group["weight_decay"], group["betas"], group["initial_lr"]) == (0.05, (0.8, 0.95), 1e-3)
    assert group["lr"] == pytest.approx(1e-3 * scheduler.schedule.lr_factor(5))
    for named in ("optimizer.lr 0.003 -> 0.001", "optimizer.weight_decay 0.1 -> 0.05", "optimizer.beta1 0.9 -> 0.8",
                  "training.steps 10 -> 20", "lr_scheduler.decay 'cosine' -> 'wsd'"):
        assert named in line, line
    assert "beta2" not in line and "\n" not in line


def test_an_unchanged_resume_keeps_the_lr_bit_for_bit_and_says_nothing():
    saved_opt, saved_sched = _adamw(3e-3, 0.1, (0.9, 0.95))
    for _ in range(3):
        saved_opt.step()
        saved_sched.step()
    optimizer, scheduler = _adamw(3e-3, 0.1, (0.9, 0.95))
    built = built_settings([optimizer])
    optimizer.load_state_dict(saved_opt.state_dict())
    scheduler.load_state_dict(saved_sched.state_dict())
    assert apply_launch_settings([optimizer], [scheduler], built, 3e-3, 3) is None
    assert optimizer.param_groups[0]["lr"] == saved_opt.param_groups[0]["lr"]


@pytest.mark.parametrize("key", sorted(FIXED_ON_RESUME))
def test_a_setting_the_restored_state_depends_on_stops_the_resume_unless_its_part_starts_afresh(key):
    previous, now = {key: 1}, {key: 2}
    with pytest.raises(ConfigError, match=rf"^{key} changed on resume \(1 -> 2\)"):
        check_fixed_on_resume(previous, now, excluded=())
    check_fixed_on_resume(previous, now, excluded=(FIXED_ON_RESUME[key].part,))
