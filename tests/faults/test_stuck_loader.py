"""A data loader stuck inside next_step() (a dead file system, a lock it never gets) does not keep
the rank from ending: closing the prefetcher gives up on its thread after a bounded wait."""

from __future__ import annotations

import threading

from kenotron.data import prefetch
from kenotron.data.prefetch import Prefetcher


class StuckAfterFirstStep:
    def __init__(self) -> None:
        self.release = threading.Event()
        self.steps = 0

    def next_step(self) -> list:
        self.steps += 1
        if self.steps > 1:
            self.release.wait()  # never set while the test runs: the loader hangs
        return []

    def state_dict(self) -> dict:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.steps = state["steps"]


def test_closing_a_prefetcher_whose_loader_hangs_returns(monkeypatch):
    monkeypatch.setattr(prefetch, "CLOSE_WAIT_S", 0.3)
    stuck = StuckAfterFirstStep()
    ahead = Prefetcher(stuck, depth=1)
    ahead.next_step()
    closing = threading.Thread(target=ahead.close, daemon=True)
    closing.start()
    closing.join(timeout=5)
    stuck.release.set()  # lets the loader's thread end after the test
    assert not closing.is_alive(), "Prefetcher.close() waited for a loader that never returns"
