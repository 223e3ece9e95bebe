"""Blends and stages through the trainer: per-dataset tokens in metrics, the stage switch at its
step (with its own sequence length), and a run stopped and resumed from its checkpoint logs the
same losses bit for bit."""

from __future__ import annotations

import pytest

from kenotron.config import load_config
from kenotron.data.sample_data import write_sample_data
from tests.train.short_run import read_records, train_until

G, SEQ, STEPS = 4, 32, 4


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    return write_sample_data(tmp_path_factory.mktemp("sample"), workers=1)


def train(folder, sample, stop_after=0, checkpoint=False):
    jsonl, tokenized = sample
    cfg = load_config(None, [
        "--data.sources", (f'[{{name = "web", path = "{tokenized}", weight = 3}}, '
                           f'{{name = "raw", dataset = "jsonl", path = "{jsonl}"}}]'),
        "--data.stages", '[{start_step = 0}, {start_step = 2, weights = {raw = 1}, seq_len = 16}]',
        "--model.n_layers", "1", "--training.seq_len", str(SEQ), "--training.local_batch_size", "2",
        "--training.global_batch_size", str(G), "--training.steps", str(STEPS), "--metrics.log_freq", "1",
        "--lr_scheduler.warmup_steps", "1", "--checkpoint.enable", str(checkpoint).lower(),
        "--checkpoint.interval", "2", "--checkpoint.async_mode", "disabled", "--job.dump_folder", str(folder),
        "--training.device", "cpu",
    ])
    train_until(cfg, stop_after)
    return read_records(folder)


def test_blend_and_stages_through_the_trainer_resume_bitwise(sample, tmp_path):
    records = train(tmp_path / "full", sample)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    # Stage 0: 3 of 4 samples from web; stage 1 (from step 3 on): raw only, 16-token sequences.
    assert [(r["tokens_seen/web"], r["tokens_seen/raw"]) for r in records] == [
        (3 * SEQ, SEQ), (6 * SEQ, 2 * SEQ), (6 * SEQ, 2 * SEQ + G * 16), (6 * SEQ, 2 * SEQ + 2 * G * 16),
    ]
    assert records[-1]["tokens_seen"] == 2 * G * SEQ + 2 * G * 16
    train(tmp_path / "resumed", sample, stop_after=2, checkpoint=True)
    resumed = train(tmp_path / "resumed", sample, checkpoint=True)
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    assert [r["loss"] for r in resumed] == [r["loss"] for r in records]
    assert resumed[-1]["tokens_seen/raw"] == records[-1]["tokens_seen/raw"]
