"""How a failed call on a worker pool is reported: one RankError (RankTimeout for a hang) whose
message holds each failing rank's traceback and stderr tail, and each rank still running's stack
(dumped by faulthandler on SIGUSR1, tests/distributed/worker.py)."""

from __future__ import annotations

FAILURE_GRACE = 1.0
"""Seconds the other ranks get to finish (or fail) after one rank failed, before the kill."""
OUTPUT_TAIL = 4000
"""Characters of a failing rank's stderr quoted in the error."""


class RankError(RuntimeError):
    """One or more ranks failed (raised, died, or hung) during a call.

    ``failures`` maps each failing rank to a text block (its traceback, or the stack it hung in).
    When a rank raised a picklable exception, the first such exception is chained as
    ``__cause__``.
    """

    def __init__(self, message: str, failures: dict[int, str]):
        super().__init__(message)
        self.failures = failures


class RankTimeout(RankError):
    """A call did not finish on every rank within its timeout (and no rank raised)."""


def rank_failure(what: str, failures: dict[int, tuple[str, BaseException | None]], pending: set[int],
                 tails: list[tuple[str, str]], *, timeout: bool) -> tuple[RankError, BaseException | None]:
    """The error for `what` (a call, or the pool's start): `failures` maps a rank to (its
    traceback text, its exception when it unpickled), `pending` are the ranks still running,
    `tails` each rank's (stdout, stderr) of the call. Returns the error and the exception to
    chain as its cause (the first rank's that came back)."""
    texts: dict[int, str] = {}
    blocks = []
    for r in sorted(failures):
        tb, _ = failures[r]
        texts[r] = tb
        block = f"--- rank {r} ---\n{tb.rstrip()}"
        err_tail = tails[r][1][-OUTPUT_TAIL:]
        if err_tail.strip():
            block += f"\n--- rank {r} stderr (tail) ---\n{err_tail.rstrip()}"
        blocks.append(block)
    for r in sorted(pending):
        err_tail = tails[r][1][-OUTPUT_TAIL:]
        texts[r] = err_tail
        state = "still running" if failures else "did not finish"
        blocks.append(f"--- rank {r}: {state}; stderr tail with its stack ---\n{err_tail.rstrip()}")
    if timeout:
        head = f"{what}: ranks {sorted(pending)} did not finish"
        cls = RankTimeout
    else:
        head = f"{what}: rank(s) {sorted(failures)} failed"
        if pending:
            head += f"; ranks {sorted(pending)} were still running {FAILURE_GRACE:g} s later"
        cls = RankError
    message = head + " (the pool was shut down and restarts on next use)\n" + "\n".join(blocks)
    cause = next((failures[r][1] for r in sorted(failures) if failures[r][1] is not None), None)
    return cls(message, texts), cause
