"""Prefetch: build the next steps' batches in a background thread while the current step runs.

    loader = Prefetcher(GlobalBatchLoader(...))    # or any loader with the same protocol
    batches = loader.next_step()                   # waits only if the thread has fallen behind
    loader.take_wait_seconds()                     # time spent waiting since the last call

The thread calls the wrapped loader's `next_step()` up to `depth` steps ahead and snapshots its
`state_dict()` after each, so `state_dict()` here is the state after the last step *handed
out*, exactly as if there were no read-ahead: a checkpoint taken now resumes at the next step.
The heavy work runs outside the GIL (memory-mapped copies, tiktoken and `tokenizers` encode on
native threads), so the training step is not slowed.

`load_state_dict` stops the thread, drops what it read ahead, and restores the wrapped loader;
the thread restarts on the next `next_step()`. An error in the thread is raised by the
`next_step()` that would have returned its batch.
"""

from __future__ import annotations

import contextlib
import copy
import queue
import threading
import time
from typing import Any

DEFAULT_DEPTH = 2
CLOSE_WAIT_S = 5.0
"""How long close() waits for the thread to end (it ends at its loader's next return)."""


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class Prefetcher:
    """A loader whose `next_step()` was already run ahead in a background thread."""

    def __init__(self, loader: Any, depth: int = DEFAULT_DEPTH) -> None:
        if depth < 1:
            raise ValueError(f"prefetch depth={depth} must be >= 1")
        self.loader = loader
        self.depth = depth
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._state: dict[str, Any] = copy.deepcopy(loader.state_dict())
        self._wait = 0.0
        self._extra: dict[str, Any] = {}

    # -- the background thread ----------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                batches = self.loader.next_step()
                item = (batches, copy.deepcopy(self.loader.state_dict()), self._snapshot())
                while not self._stop.is_set():
                    try:
                        self._queue.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
        except BaseException as error:  # noqa: BLE001 - handed to the consumer
            self._queue.put(_Failure(error))

    def _snapshot(self) -> dict[str, Any]:
        tokens = getattr(self.loader, "tokens_by_dataset", None)
        return {
            "tokens_by_dataset": tokens() if tokens is not None else {},
            "seq_len": getattr(self.loader, "last_seq_len", None),
        }

    def _start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="kenotron-data", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the thread and drop what it read ahead."""
        if self._thread is None:
            return
        self._stop.set()
        # A loader stuck inside next_step() never returns: after CLOSE_WAIT_S the thread (a daemon) is left behind.
        deadline = time.monotonic() + CLOSE_WAIT_S
        while self._thread.is_alive() and time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):
                self._queue.get(timeout=0.05)
        self._thread = None
        self._queue = queue.Queue(maxsize=self.depth)

    # -- the loader protocol ------------------------------------------------------------------

    def next_step(self) -> Any:
        if self._thread is None:
            self._start()
        start = time.perf_counter()
        item = self._queue.get()
        self._wait += time.perf_counter() - start
        if isinstance(item, _Failure):
            self._thread = None
            raise item.error
        batches, self._state, self._extra = item
        return batches

    def __iter__(self) -> Any:
        while True:
            yield self.next_step()

    def take_wait_seconds(self) -> float:
        """Seconds `next_step()` waited for data since the previous call."""
        wait, self._wait = self._wait, 0.0
        return wait

    def tokens_by_dataset(self) -> dict[str, int]:
        """Tokens each dataset has given, up to the last step handed out."""
        return dict(self._extra.get("tokens_by_dataset", {}))

    @property
    def last_seq_len(self) -> int | None:
        """Sequence length of the last step handed out (None if the loader does not say)."""
        return self._extra.get("seq_len")

    def state_dict(self) -> dict[str, Any]:
        return copy.deepcopy(self._state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.close()
        self.loader.load_state_dict(copy.deepcopy(state))
        self._state = copy.deepcopy(state)
        self._extra = self._snapshot()
