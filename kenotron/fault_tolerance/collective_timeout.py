"""How long this step's cross-group all-reduce may take before the group gives the step up.

On NCCL a peer that died does not fail the all-reduce: the survivors wait until the process
group's timeout aborts it (torchft's ProcessGroupNCCL, ncclCommAbort), so that timeout is what a
failure costs every surviving group. It is short once the groups are warm, and long where a peer
may still be compiling its first step:

- a step in which more groups take part than in this group's previous step (this group's first
  step, or one where a restarted group rejoined and runs its first, compiling, step): the long
  warm-up timeout, `max(fault_tolerance.timeout_s, fault_tolerance.start_timeout_s)`;
- any other step: `fault_tolerance.timeout_s`, or `SLOWEST_MARGIN` times the slowest all-reduce
  this group has completed in such a step if that is longer (a large model on a slow link must
  not time out by default).

torchft applies a new timeout to NCCL's next operation, and to gloo's when the process group is
next reconfigured (a change of the groups in the quorum).
"""

from __future__ import annotations

from dataclasses import dataclass

SLOWEST_MARGIN = 5.0
"""A warm step's timeout is at least this many times the slowest warm all-reduce so far."""


@dataclass
class CollectiveTimeouts:
    """The rule of the module docstring, step by step (`for_step` at each step's all-reduce,
    `completed` after it)."""

    steady_s: float
    """fault_tolerance.timeout_s: a warm step's timeout."""
    warmup_s: float
    """The timeout of a step in which a group may still be compiling."""
    slowest_s: float = 0.0
    """The slowest all-reduce of a warm step this group completed."""
    participants: int = 0
    """Groups in this group's previous step (0 before its first)."""
    warm: bool = False
    """Whether the current step is a warm one."""

    def for_step(self, participants: int) -> float:
        """The timeout of this step's all-reduce, which `participants` groups take part in."""
        self.warm = 0 < participants <= self.participants
        self.participants = participants
        if not self.warm:
            return self.warmup_s
        return max(self.steady_s, SLOWEST_MARGIN * self.slowest_s)

    def completed(self, seconds: float) -> None:
        """This step's all-reduce completed in `seconds`: a warm step's sets the floor of the next."""
        if self.warm:
            self.slowest_s = max(self.slowest_s, seconds)
