"""The extensions a config asks for from this room, for the Trainer (`job_extensions`): the
launcher's rank program hands `fault_tolerance_extensions` to it."""

from __future__ import annotations

from kenotron.fault_tolerance.checks import check_fault_tolerance
from kenotron.fault_tolerance.diloco import DiLoCoReplicas
from kenotron.fault_tolerance.replicas import FaultTolerantReplicas
from kenotron.train.extension import JobExtension
from kenotron.train.training_job import TrainingJob


def fault_tolerance_extensions(job: TrainingJob) -> list[JobExtension]:
    """[the replica group's extension] when fault_tolerance.enable, else []."""
    cfg = job.run.cfg
    if not cfg.fault_tolerance.enable:
        return []
    check_fault_tolerance(cfg)
    if cfg.fault_tolerance.sync_every > 1:
        return [DiLoCoReplicas(job)]
    return [FaultTolerantReplicas(job)]
