"""One replica group of a fault-tolerant run: the JobExtension that joins the groups through torchft.

Each group is a job of its own (its ranks, its FSDP/TP/PP, its run folder); torchft's Manager
joins group rank r of every group in one reconfigurable process group. A step:

    quorum (lighthouse)  ->  batch, forward, backward          (inside the group, as always)
      -> average the gradients over the groups in the quorum      (after_forward_backward)
      -> clip -> should_commit: every group in the step agrees     (step_optimizer)
      -> optimizer step only when committed
      -> the next step's quorum (on_step): a group behind the others (restarted, or one whose
         commit failed) receives the live state of a peer here, before it draws its next batch.

A group's start: its quorums ask at step 0, before its checkpoint is read. A group behind a
peer (restarted while the others train) takes the peer's live state there and never reads its
own checkpoint: the peer's is newer. Where no peer is ahead (a fresh run, or every group
restarted) the groups wait for each other (fault_tolerance.start_timeout_s), then each loads its
checkpoint and, with checkpoints on, asks one more quorum at the step it loaded, where a group
whose checkpoint is older than another's takes that one's state. Asking at step 0 first keeps a
group that has not read its checkpoint from being chosen to send its state: torchft's peers
recover from a group at the highest step.

The quorum is synchronous (torchft's use_async_quorum=False): a recovering group loads the peer's
state before its batch is drawn and then computes a real gradient in the same step, and no state
is read while the step runs. A step that does not commit (a peer died in the all-reduce) is
undone: the optimizer did not step, and the step counter, LR schedule and data position go back
to where they were, so the step is retried. A group that died loses its in-flight step only; the
others go on with the groups left (the gradient averaged over them: the global batch of that
step is smaller), and its data of those steps is not seen.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from kenotron.dtensor import local_tensor
from kenotron.fault_tolerance.checks import lighthouse_address
from kenotron.fault_tolerance.collective_timeout import CollectiveTimeouts
from kenotron.fault_tolerance.rejoin_timeline import RejoinTimeline
from kenotron.fault_tolerance.state_transfer import load_local_state, local_state
from kenotron.fault_tolerance.torchft_import import import_torchft
from kenotron.train.extension import JobExtension
from kenotron.train.training_job import TrainingJob

logger = logging.getLogger("kenotron")

SNAPSHOT_PARTS = ("lr_scheduler", "dataloader", "train_state")
"""What an uncommitted step changed besides the weights: restored so that the step is retried."""


def _group_store(rank: int, world_size: int) -> tuple[Any, str, int]:
    """A TCPStore of this group's own, new at every start (a restarted group must not read the
    manager address its previous life left in torchrun's store): rank 0 serves it, the others
    learn its host and port over the group's process group."""
    store = None
    where: list[Any] = [None]
    if rank == 0:
        store = dist.TCPStore(host_name="0.0.0.0", port=0, is_master=True, wait_for_workers=False)
        where = [(socket.gethostname(), store.port)]
    if world_size > 1:
        dist.broadcast_object_list(where, src=0)
    host, port = where[0]
    return store, host, port


class FaultTolerantReplicas(JobExtension):
    """This job as replica group `fault_tolerance.replica_id` of a torchft run (module docstring)."""

    name = "fault_tolerance"

    def __init__(self, job: TrainingJob, timeline: RejoinTimeline | None = None) -> None:
        torchft = import_torchft()
        from kenotron.fault_tolerance.timed_transport import live_state_transport

        self.job = job
        ft = job.run.cfg.fault_tolerance
        self.cfg = ft
        self.timeline = timeline or RejoinTimeline(ft.replica_id)
        distributed = dist.is_available() and dist.is_initialized()
        self.group_rank = dist.get_rank() if distributed else 0
        self.group_size = dist.get_world_size() if distributed else 1
        self._store, host, port = _group_store(self.group_rank, self.group_size)
        # The process group starts with the warm-up timeout (the first step compiles); each step
        # then sets its own (collective_timeout.py). The manager's own timeout (commit, recovery,
        # a backstop on the all-reduce's future) stays the warm-up one.
        self.timeouts = CollectiveTimeouts(steady_s=ft.timeout_s, warmup_s=max(ft.timeout_s, ft.start_timeout_s))
        timeout = timedelta(seconds=self.timeouts.warmup_s)
        self.pg = (torchft.ProcessGroupNCCL(timeout=timeout) if job.device.type == "cuda"
                   else torchft.ProcessGroupGloo(timeout=timeout))
        self.manager = torchft.Manager(
            pg=self.pg, load_state_dict=None, state_dict=None, min_replica_size=ft.min_replicas,
            use_async_quorum=False, timeout=timeout, quorum_timeout=timedelta(seconds=ft.quorum_timeout_s),
            connect_timeout=timeout, rank=self.group_rank, world_size=self.group_size,
            store_addr=host, store_port=port, lighthouse_addr=lighthouse_address(job.run.cfg),
            replica_id=f"kenotron_replica_{ft.replica_id}",
            checkpoint_transport=live_state_transport(self.pg, timeout, job.device, self._manager_state,
                                                      self.timeline),
            init_sync=False,  # every group initializes the same weights from training.seed
        )
        self.parts: dict[str, Any] = {}
        self._snapshot: dict[str, Any] = {}
        self._committed: bool | None = None
        self.failed_commits = 0
        self.recoveries = 0
        self._last_quorum_s = 0.0
        self._timeout_s = self.timeouts.warmup_s
        self._allreduce_s = 0.0
        self._failed_last_step = False
        self._resume: Callable[[], int | None] | None = None
        self.timeline.mark("manager_ready")

    # -- the data: each group reads its own slice of a global batch over all groups ------------

    def data_layout(self, layout: dict[str, Any]) -> dict[str, Any]:
        groups, index = self.cfg.replica_groups, self.cfg.replica_id
        return {**layout, "dp_rank": index * layout["dp_size"] + layout["dp_rank"],
                "dp_size": groups * layout["dp_size"], "global_batch_size": groups * layout["global_batch_size"]}

    # -- start: the state a peer may ask for, and the first quorum -------------------------------

    def defer_resume(self, resume: Callable[[], int | None]) -> bool:
        """The group's checkpoint is loaded in attach_run_state, only when no peer is ahead (module docstring)."""
        self._resume = resume
        return True

    def attach_run_state(self, parts: dict[str, Any]) -> None:
        self.parts = dict(parts)
        train_state = parts["train_state"]
        self.manager.register_state_dict_fn("kenotron", self._load_from_peer, lambda: local_state(self.parts))
        self.timeline.mark("run_state_ready", f"step {train_state.step}")
        self.timeline.mark("quorum_asked", f"step {train_state.step}")
        if self._resume is None:  # the trainer resumed already: the manager counts commits from there
            self.manager.load_state_dict({"step": self._commits_done(train_state.step), "batches_committed": 0})
            self._quorum()
            if train_state.step == 0:
                self._wait_for_every_group()
        else:
            self._start_quorums(self._resume)
        logger.info("fault tolerance: replica group %d of %d starts at step %d with %d group(s) in the quorum",
                    self.cfg.replica_id, self.cfg.replica_groups, train_state.step, self.manager.num_participants())

    def _start_quorums(self, resume: Callable[[], int | None]) -> None:
        """The start of module docstring: quorums at step 0 until a peer ahead sent its state or
        every group is in (or start_timeout_s passed); then, if no peer was ahead, the group's
        checkpoint and, with checkpoints on, one more quorum at the step loaded. A quorum with
        every group ends the wait of all of them: each then asks the same next quorum."""
        self._quorum()
        self._wait_for_every_group()
        if self.recoveries:
            return
        if resume() is not None:
            self.timeline.mark("checkpoint_loaded", f"step {self.parts['train_state'].step}")
        if self.job.run.cfg.checkpoint.enable:  # the same config in every group: all ask this quorum
            self.manager.load_state_dict({"step": self._commits_done(self.parts["train_state"].step),
                                          "batches_committed": 0})
            self._quorum()

    def _wait_for_every_group(self) -> None:
        """More quorums while fewer than every group is in (none took a peer's state), for up to
        start_timeout_s: a group started a few seconds after the others would otherwise only join
        by recovery, after they stepped without it."""
        deadline = time.monotonic() + self.cfg.start_timeout_s
        while (not self.recoveries and self.manager.num_participants() < self.cfg.replica_groups
               and time.monotonic() < deadline):
            time.sleep(0.2)
            self._quorum()

    def _manager_state(self) -> dict[str, Any]:
        """This rank's state as torchft's Manager sends it to a recovering peer ({"user": {key: the
        registered state}, "torchft": its own counters}): the structure a received state is laid
        into, in place (timed_transport.py)."""
        return {"user": {"kenotron": local_state(self.parts)}, "torchft": self.manager.state_dict()}

    def _commits_done(self, step: int) -> int:
        """The commits a run resumed at `step` has done: one per step here."""
        return step

    def _load_from_peer(self, state: dict[str, Any]) -> None:
        # Nothing of this group's last step may be in flight while its state is replaced: FSDP's
        # early all-gather holds gathered copies of the old weights for the next forward.
        for ext in self.job.extensions:
            if ext is not self:
                ext.finish()
        load_local_state(self.parts, state)
        self.recoveries += 1
        self.timeline.mark("live_state_loaded", f"step {self.parts['train_state'].step}")
        logger.info("fault tolerance: replica group %d took the live state of a peer at step %d",
                    self.cfg.replica_id, self.parts["train_state"].step)

    def _quorum(self) -> None:
        """This step's quorum; a group behind the others loads a peer's state in here."""
        start = time.perf_counter()
        before = self.manager.num_participants() if "quorum_done" in self.timeline.seen else 0
        self.manager.start_quorum()
        self._last_quorum_s = time.perf_counter() - start
        self._mark_quorum(before)
        self._snapshot = {name: self.parts[name].state_dict() for name in SNAPSHOT_PARTS if name in self.parts}

    # -- the step -------------------------------------------------------------------------------

    def after_forward_backward(self) -> None:
        """Average the gradients over the groups in the quorum, in place (a failure marks the step).
        Every tensor's all-reduce is issued before the first wait, so they overlap on the wire,
        and none needs a copy (no flattened buckets: no second copy of the gradients in memory)."""
        self._timeout_s = self.timeouts.for_step(self.manager.num_participants())
        self.pg.set_timeout(timedelta(seconds=self._timeout_s))
        start = time.perf_counter()
        works = [self.manager.allreduce(local_tensor(p.grad)) for part in self.job.model_parts
                 for p in part.parameters() if p.grad is not None]
        for work in works:
            work.wait()
        self._allreduce_s = time.perf_counter() - start
        if self.manager.errored() is None:
            self.timeouts.completed(self._allreduce_s)

    def step_optimizer(self, optimizer: Any) -> bool:
        """True (this step's optimizers do not step) unless every group in the step committed."""
        if self._committed is None:
            self._committed = self.manager.should_commit()
        return not self._committed

    def after_optimizer_step(self) -> None:
        if self._committed is None:  # a job without optimizers still agrees on the step
            self._committed = self.manager.should_commit()

    def on_step(self, step: int) -> None:
        committed, self._committed = self._committed, None
        self.timeline.first("first_step_done", f"step {step}")
        self._failed_last_step = not committed
        if not committed:
            self.failed_commits += 1
            error = self.manager.errored()
            self.timeline.mark("step_failed", f"step {step}: all-reduce waited {self._allreduce_s:.3f} s of "
                               f"{self._timeout_s:g} s; {_one_line(error.original_exception if error else None)}")
            for name, state in self._snapshot.items():
                self.parts[name].load_state_dict(state)
            logger.warning("fault tolerance: step %d did not commit on replica group %d (a peer left during it); "
                           "it is retried", step, self.cfg.replica_id)
        if self.parts["train_state"].step < self.job.run.cfg.training.steps:
            self._quorum()

    def _mark_quorum(self, before: int) -> None:
        """The timeline's quorum marks: the first of this process, the one after a failed step, and
        one where more or fewer groups take part than before (a peer rejoined, or died between two
        steps). Nothing on a plain step."""
        now = self.manager.num_participants()
        detail = (f"{now} group(s), this one replica rank {self.manager.participating_rank()}, "
                  f"{self._last_quorum_s:.3f} s")
        if "quorum_done" not in self.timeline.seen:
            if "quorum_granted" not in self.timeline.seen:  # no live state to fetch: granted as it returned
                self.timeline.mark("quorum_granted", detail)
            self.timeline.mark("quorum_done", detail)
        elif self._failed_last_step:
            self.timeline.mark("quorum_after_failure", detail)
        elif now > before:
            self.timeline.mark("peer_joined", detail)
        elif now < before:  # a peer died between two steps: no step of this group failed
            self.timeline.mark("peer_left", detail)

    def metrics(self) -> dict[str, Any]:
        return {"ft_replicas": self.manager.num_participants(), "ft_failed_commits": self.failed_commits,
                "ft_recoveries": self.recoveries, "ft_quorum_s": self._last_quorum_s, "ft_timeout_s": self._timeout_s}

    def finish(self) -> None:
        self.manager.shutdown(wait=False)
        self._store = None


def _one_line(error: BaseException | None) -> str:
    """An error as one line: its type and its message's first line."""
    if error is None:
        return "no error reported"
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]
