"""The semi-synchronous variant: DiLoCo over the replica groups (fault_tolerance.sync_every = H > 1).

Each group trains alone with its own optimizer (the inner one, AdamW) for H steps; then the
groups average their pseudo-gradients (the global weights of the last sync minus this group's
weights) and an outer Nesterov SGD (fault_tolerance.outer_lr, outer_momentum) steps the global
weights with that average, which every group takes (Douillard et al., 2023). torchft's `DiLoCo`
(torchft/local_sgd.py) does it from hooks on the inner optimizer's step: the quorum, the
all-reduce, the commit and the outer step happen inside the step that ends every H.

Failures, as torchft handles them: a group that dies drops out of the next sync; a sync that does
not commit puts the weights back to the last global ones (the H local steps are dropped, their
data is not trained on again). A restarted group trains alone from its checkpoint (or step 0) until
its first sync, where it takes the live state of a peer (this module's run state and DiLoCo's
global weights and outer momentum) and then computes the peer's pseudo-gradient a second time
(torchft: "batches can be overrepresented"). The outer momentum is not in kenotron's checkpoints:
a whole-run restart from disk starts it from zero.
"""

from __future__ import annotations

from typing import Any

import torch

from kenotron.errors import ConfigError
from kenotron.fault_tolerance.rejoin_timeline import RejoinTimeline
from kenotron.fault_tolerance.replicas import FaultTolerantReplicas
from kenotron.train.training_job import TrainingJob


class DiLoCoReplicas(FaultTolerantReplicas):
    """This job as one replica group of a DiLoCo run (module docstring)."""

    def __init__(self, job: TrainingJob, timeline: RejoinTimeline | None = None) -> None:
        if len(job.model_parts) != 1 or len(job.optimizers) != 1:
            raise ConfigError(f"fault_tolerance.sync_every={job.run.cfg.fault_tolerance.sync_every} (DiLoCo) takes one "
                              f"model part and one optimizer, this job has {len(job.model_parts)} (pipeline stages); "
                              "set parallelism.pp=1 or fault_tolerance.sync_every=1")
        if job.extension("early_gather") is not None:
            raise ConfigError(f"fault_tolerance.sync_every={job.run.cfg.fault_tolerance.sync_every} (DiLoCo) counts "
                              "the optimizer's steps, which FSDP's early all-gather splits in two; set "
                              "tuning.fsdp_early_all_gather=false")
        super().__init__(job, timeline)
        # Every sync keeps the process group's first timeout, max(timeout_s, start_timeout_s):
        # a sync moves the whole model, over the slow links DiLoCo is for (the per-step rule of
        # collective_timeout.py is the synchronous mode's).
        self.diloco: Any = None

    def defer_resume(self, resume: Any) -> bool:
        """False: the trainer loads the group's checkpoint first, as without fault tolerance. The
        synchronous mode's second start quorum (replicas.py) would meet the others' next sync
        here, where they all-reduce and this group does not."""
        return False

    def attach_run_state(self, parts: dict[str, Any]) -> None:
        from torchft.local_sgd import DiLoCo

        # The first quorum as in the synchronous mode: a fresh run waits there for every group,
        # so that their first sync comes at the same step.
        super().attach_run_state(parts)
        ft = self.cfg
        model, optimizer = self.job.model_parts[0], self.job.optimizers[0]
        outer = torch.optim.SGD(model.parameters(), lr=ft.outer_lr, momentum=ft.outer_momentum,
                                nesterov=ft.outer_momentum > 0)
        self.diloco = DiLoCo(self.manager, [model], optimizer, outer, sync_every=ft.sync_every,
                             pin_memory=self.job.device.type == "cuda")
        self.diloco.__enter__()

    def _commits_done(self, step: int) -> int:
        """torchft's manager counts syncs here: a run resumed at `step` has done step // H."""
        return step // self.cfg.sync_every

    # The passes, clipping and the optimizer step are the plain ones: DiLoCo's hooks on the step
    # synchronize every H steps, and nothing is undone between syncs.
    def after_forward_backward(self) -> None:
        pass

    def step_optimizer(self, optimizer: Any) -> bool:
        return False

    def after_optimizer_step(self) -> None:
        pass

    def on_step(self, step: int) -> None:
        pass

    def metrics(self) -> dict[str, Any]:
        return {"ft_replicas": self.manager.num_participants(), "ft_syncs": self.manager.current_step(),
                "ft_recoveries": self.recoveries}

    def finish(self) -> None:
        if self.diloco is not None:
            self.diloco.__exit__(None, None, None)
            self.diloco = None
        super().finish()
