"""Trainer end to end in one process: the loss falls, records are written, bad input stops early."""

from __future__ import annotations

import json

import pytest

from kenotron.config import ConfigError, load_config
from kenotron.degrees import ParallelConfigError
from kenotron.runtime.divergence import NonFiniteLossError
from kenotron.train.trainer import resolve_run, run_training

TINY = [
    "--training.seq_len", "64", "--training.local_batch_size", "4", "--metrics.log_freq", "5",
    "--lr_scheduler.warmup_steps", "5",
]


def test_loss_falls_and_metrics_jsonl_has_one_record_per_log_step(tmp_path):
    cfg = load_config(None, TINY + ["--training.steps", "10", "--job.dump_folder", str(tmp_path)])
    records = run_training(cfg)
    assert [r["step"] for r in records] == [1, 5, 10]  # the first step, then every 5
    assert records[0]["loss"] > 7.0
    assert records[-1]["loss"] < records[0]["loss"] - 1.0
    written = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert written == records
    assert (tmp_path / "config.toml").is_file()
    assert records[-1]["tokens_seen"] == 10 * 4 * 64


def test_gradient_accumulation_matches_one_big_batch(tmp_path):
    common = TINY + ["--training.steps", "3", "--metrics.log_freq", "1", "--lr_scheduler.warmup_steps", "1"]
    big = run_training(load_config(None, common + ["--job.dump_folder", str(tmp_path / "a"),
                                                   "--training.local_batch_size", "4"]))
    acc = run_training(load_config(None, common + ["--job.dump_folder", str(tmp_path / "b"),
                                                   "--training.local_batch_size", "1",
                                                   "--training.global_batch_size", "4"]))
    for a, b in zip(big, acc):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)


def test_tensorboard_scalars_are_written(tmp_path):
    cfg = load_config(None, TINY + ["--training.steps", "5", "--metrics.tensorboard", "--job.dump_folder",
                                    str(tmp_path)])
    run_training(cfg)
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))


def test_non_finite_loss_stops_with_a_clear_message(tmp_path):
    cfg = load_config(None, TINY + ["--training.steps", "30", "--optimizer.lr", "1e6", "--training.max_norm", "0",
                                    "--lr_scheduler.warmup_steps", "0", "--lr_scheduler.decay", "constant",
                                    "--job.dump_folder", str(tmp_path)])
    with pytest.raises(NonFiniteLossError, match=r"is (nan|inf) at step \d+: training stopped.* Lower optimizer.lr .*or clip gradients with "
                                                r"training.max_norm > 0 \(now 0: off\)"):
        run_training(cfg)


def test_tokenizer_larger_than_the_model_vocabulary_is_rejected():
    cfg = load_config(None, ["--model.vocab_size", "1000"])
    with pytest.raises(ConfigError, match=r"tokenizer has 4096 tokens but the model's vocabulary is 1000; set "
                                          r"--model.vocab_size 4096"):
        resolve_run(cfg, world_size=1)


def test_missing_tokenizer_file_is_rejected(tmp_path):
    cfg = load_config(None, ["--tokenizer.path", str(tmp_path / "nope.model")])
    with pytest.raises(Exception, match=r"tokenizer.path=.*does not exist"):
        resolve_run(cfg, world_size=1)


def test_global_batch_not_divisible_by_local_times_dp_is_rejected():
    cfg = load_config(None, ["--training.global_batch_size", "10", "--training.local_batch_size", "4"])
    with pytest.raises(ParallelConfigError, match=r"global_batch_size=10 is not divisible by local_batch_size x dp "
                                                  r"= 4 x 1 = 4; use a multiple of 4"):
        resolve_run(cfg, world_size=1)


def test_cli_reports_config_errors_without_a_traceback(capsys):
    from kenotron.train.__main__ import main

    assert main(["--training.stepz", "3"]) == 2
    err = capsys.readouterr().err
    assert "did you mean 'training.steps'" in err and "Traceback" not in err
    assert main(["--help"]) == 0
    assert "--training.steps" in capsys.readouterr().out


def test_clipping_inside_fused_adamw_equals_clipping_the_gradients(tmp_path):
    """max_norm far below the gradient norm: fused AdamW's in-kernel divisor vs the foreach clip."""
    common = TINY + ["--training.steps", "4", "--metrics.log_freq", "1", "--lr_scheduler.warmup_steps", "1",
                     "--training.max_norm", "0.05"]
    runs = {}
    for kernel in ("fused", "foreach"):
        cfg = load_config(None, common + ["--tuning.adamw_implementation", kernel,
                                          "--job.dump_folder", str(tmp_path / kernel)])
        runs[kernel] = run_training(cfg)
    assert runs["fused"][0]["grad_norm"] > 10 * 0.05  # clipping is active from the first step
    for a, b in zip(runs["fused"], runs["foreach"]):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-6)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
