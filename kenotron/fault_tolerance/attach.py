"""The extensions a config asks for from this room, for the Trainer (`job_extensions`): the
launcher's rank program makes a `FaultToleranceExtensions` once its imports are done and hands
it to the Trainer, which calls it on the built job."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from kenotron.fault_tolerance.checks import check_fault_tolerance
from kenotron.fault_tolerance.diloco import DiLoCoReplicas
from kenotron.fault_tolerance.rejoin_timeline import RejoinTimeline, process_start_time
from kenotron.fault_tolerance.replicas import FaultTolerantReplicas
from kenotron.train.extension import JobExtension
from kenotron.train.training_job import TrainingJob


@dataclass
class FaultToleranceExtensions:
    """[the replica group's extension] when fault_tolerance.enable, else [] (called on the built job)."""

    imports_done: float = field(default_factory=time.time)
    """When the rank program made this: its imports done (the rejoin timeline's second mark)."""

    def __call__(self, job: TrainingJob) -> list[JobExtension]:
        cfg = job.run.cfg
        if not cfg.fault_tolerance.enable:
            return []
        check_fault_tolerance(cfg)
        timeline = RejoinTimeline(cfg.fault_tolerance.replica_id)
        started = process_start_time()
        if started is not None:
            timeline.mark("process_start", at=started)
        timeline.mark("imports_done", at=self.imports_done)
        timeline.mark("model_built")
        if cfg.fault_tolerance.sync_every > 1:
            return [DiLoCoReplicas(job, timeline)]
        return [FaultTolerantReplicas(job, timeline)]
