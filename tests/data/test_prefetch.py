"""Prefetch: the background thread runs ahead, but batches, state and resume are exactly the
synchronous loader's; errors surface at the step that needed the data; waits are measured."""

from __future__ import annotations

import time

import pytest
import torch

from kenotron.data.loader import GlobalBatchLoader
from kenotron.data.prefetch import Prefetcher
from tests.data.fakes import CountingWindows

SEQ, G = 5, 4


def loader():
    return GlobalBatchLoader(CountingWindows(SEQ), SEQ, G, 2)


def inputs(batches):
    return torch.cat([mb.inputs for mb in batches])


def test_batches_and_state_are_those_of_the_steps_handed_out():
    plain, ahead = loader(), Prefetcher(loader(), depth=3)
    try:
        for _ in range(4):
            assert torch.equal(inputs(ahead.next_step()), inputs(plain.next_step()))
        time.sleep(0.2)  # the thread has read further ahead by now
        assert ahead.loader.step > 4
        assert ahead.state_dict() == plain.state_dict()
    finally:
        ahead.close()


def test_resume_from_a_prefetching_loader_is_exact():
    reference = loader()
    expected = [inputs(reference.next_step()) for _ in range(6)]
    first = Prefetcher(loader())
    for _ in range(3):
        first.next_step()
    state = first.state_dict()
    first.close()
    resumed = Prefetcher(loader())
    resumed.load_state_dict(state)
    try:
        assert [torch.equal(inputs(resumed.next_step()), expected[s]) for s in range(3, 6)] == [True] * 3
        # Loading a state mid-run drops what was read ahead.
        resumed.load_state_dict(state)
        assert torch.equal(inputs(resumed.next_step()), expected[3])
    finally:
        resumed.close()


class Failing(CountingWindows):
    def next_window(self):
        if self.next_index == 2 * G:
            raise ValueError("bad data in window 8")
        return super().next_window()


def test_an_error_in_the_thread_is_raised_by_the_step_that_needed_the_data():
    ahead = Prefetcher(GlobalBatchLoader(Failing(SEQ), SEQ, G, G))
    ahead.next_step()
    ahead.next_step()
    with pytest.raises(ValueError, match="bad data in window 8"):
        ahead.next_step()
    ahead.close()


class Slow(CountingWindows):
    def next_window(self):
        time.sleep(0.02)
        return super().next_window()


def test_time_waiting_for_data_is_measured():
    ahead = Prefetcher(GlobalBatchLoader(Slow(SEQ), SEQ, G, G), depth=1)
    try:
        ahead.next_step()
        assert ahead.take_wait_seconds() >= 0.05  # the first step waits for 4 windows
        assert ahead.take_wait_seconds() == 0.0  # taken
        time.sleep(1.0)  # the thread has the next step ready
        ahead.next_step()
        assert ahead.take_wait_seconds() < 0.05
    finally:
        ahead.close()
    assert ahead._thread is None
