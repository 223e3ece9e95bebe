"""The memory estimator behind estimation.py: per-rank GPU memory of a job without GPUs.

    from kenotron.estimate import estimate_memory, search_layouts
    report = estimate_memory(load_config("train_configs/llama3_8b.toml"), ngpu=64)
    print(report.format())          # or report.to_dict() for JSON

- memory.py      estimate_memory / estimate_run: one simulated rank per group of equal ranks
- fake_job.py    the trainer's job and step on a fake process group and fake tensors
- tracker.py     bytes by category, phase and position, from a TorchDispatchMode
- depth.py       deep models from two shallow copies (memory is linear in depth)
- cuda_kernels.py  stand-ins for CUDA kernels whose memory differs from the CPU path
- analytic.py    the closed-form model (the planner's first pass)
- throughput.py  the step-time model that ranks layouts
- step_compute.py  its compute side: kernels, loss, accumulation, optimizer, pipeline schedules
- search.py      the planner (--search)
- report.py      the report, as text and JSON
"""

from kenotron.estimate.memory import estimate_memory, estimate_run
from kenotron.estimate.report import MemoryReport, RankEstimate
from kenotron.estimate.search import SearchResult, search_layouts
from kenotron.estimate.tracker import Breakdown

__all__ = [
    "Breakdown",
    "MemoryReport",
    "RankEstimate",
    "SearchResult",
    "estimate_memory",
    "estimate_run",
    "search_layouts",
]
