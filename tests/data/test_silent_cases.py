"""Data cases that used to pass silently now warn: a data set shorter than one window, a resume
under another global batch."""

from __future__ import annotations

import logging

from kenotron.data import build_tokenizer
from kenotron.data.loader import GlobalBatchLoader
from kenotron.data.packing import PackedWindows
from kenotron.data.text_source import list_documents


def test_a_data_set_shorter_than_one_window_warns_that_windows_repeat_it(caplog):
    windows = PackedWindows(list_documents("two sentences", ["Hello there.", "Bye."]), build_tokenizer(""), 64,
                            read_ahead=2)
    with caplog.at_level(logging.WARNING, logger="kenotron"):
        for _ in range(3):
            windows.next_window()
    warnings = [r.message for r in caplog.records if "fewer than one window" in r.message]
    assert len(warnings) == 1, caplog.text  # once, not at every epoch
    assert "the whole data set (two sentences) is" in warnings[0] and "training.seq_len + 1 = 65" in warnings[0]


def test_a_data_set_longer_than_a_window_does_not_warn(caplog):
    text = " ".join(f"word{i}" for i in range(400))
    windows = PackedWindows(list_documents("long", [text]), build_tokenizer(""), 16, read_ahead=1)
    with caplog.at_level(logging.WARNING, logger="kenotron"):
        for _ in range(200):
            windows.next_window()
    assert "fewer than one window" not in caplog.text


def _loader(global_batch: int, dp_size: int) -> GlobalBatchLoader:
    windows = PackedWindows(list_documents("docs", ["some text " * 50] * 8), build_tokenizer(""), 16)
    return GlobalBatchLoader(windows, 16, global_batch, local_batch_size=2, dp_size=dp_size)


def test_resuming_under_another_global_batch_warns_with_the_setting_that_keeps_it(caplog):
    saved = _loader(-1, 2)  # 2 x dp 2 = 4 sequences per step
    saved.next_step()
    state = saved.state_dict()
    with caplog.at_level(logging.WARNING, logger="kenotron"):
        _loader(-1, 4).load_state_dict(state)  # the same command under dp 4: 8 per step
    assert "trained with global batches of 4 sequences, this run uses 8" in caplog.text
    assert "Set training.global_batch_size=4 to keep the run as it was" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="kenotron"):
        _loader(4, 1).load_state_dict(state)  # the same global batch by accumulation: nothing to say
    assert caplog.text == ""
