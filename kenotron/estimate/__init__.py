"""The memory estimator behind estimation.py: per-rank GPU memory of a job without GPUs.

    from kenotron.estimate import estimate_memory
    report = estimate_memory(load_config("llama3_8b"), ngpu=64)
    print(report.format())          # or report.to_dict() for JSON

It is the authority on memory; the planner (kenotron/planner) builds on it and it knows nothing
of the planner.

- memory.py          estimate_memory / estimate_run: one simulated rank per group of equal ranks
- rank_classes.py    those groups of equal ranks
- fake_job.py        the trainer's job and step on a fake process group and fake tensors
- tracker.py         each allocation and free of a step, from a TorchDispatchMode
- breakdown.py       what it reports: bytes by category (Breakdown) at a position of the step
- depth.py           deep models from two shallow copies (memory is linear in depth)
- static_memory.py   parameters and optimizer state, exactly, from the plan's table (plan.describe)
- cuda_kernels.py    stand-ins for CUDA kernels whose memory differs from the CPU path
- cp_ring_memory.py  context parallel's ring attention as torch runs it on a GPU
- moe_memory.py      MoE layers with even routing
- pipeline_memory.py, pipeline_order.py, pipeline_replay.py   pipeline ranks, in their schedule's order
- pipeline_rank_step.py   one pipeline rank's tracked step and the places its memory is read at
- report.py          the report, as text and JSON
"""

from kenotron.estimate.breakdown import Breakdown
from kenotron.estimate.memory import estimate_memory, estimate_run
from kenotron.estimate.report import MemoryReport, RankEstimate

__all__ = [
    "Breakdown",
    "MemoryReport",
    "RankEstimate",
    "estimate_memory",
    "estimate_run",
]
