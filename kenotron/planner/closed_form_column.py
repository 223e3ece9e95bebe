"""The closed form beside the fake-tensor estimate: the report's `analytic` column.

The fake-tensor estimator (kenotron/estimate) is the authority on memory and knows nothing of
the planner; `kenotron estimate` prints the planner's closed form next to its figures so that a
reader sees at once how far the planner's first pass is from the simulation for this config.
"""

from __future__ import annotations

import time

from kenotron.config import JobConfig
from kenotron.estimate.breakdown import Breakdown
from kenotron.estimate.memory import estimate_run
from kenotron.estimate.report import MemoryReport
from kenotron.planner.analytic_model import AnalyticModel
from kenotron.train.resolve import ResolvedRun, resolve_run


def closed_form_peaks(run: ResolvedRun) -> tuple[list[Breakdown | None], str | None]:
    """The closed form's peak for each of the report's rank classes (one, or one per pipeline
    rank), and a note on the column where it needs one (pipelines)."""
    model = AnalyticModel(run)
    if run.dims.pp == 1:
        return [model.peak(run)], None
    schedule = run.plan.pipeline.schedule
    return model.pipeline_peaks(run), f"analytic column: the closed form for a {schedule} pipeline rank (planner/analytic_pipeline.py)"


def add_closed_form(report: MemoryReport, run: ResolvedRun) -> MemoryReport:
    """Fill `report`'s analytic column for `run` (the run it was estimated for) and return it."""
    start = time.perf_counter()
    peaks, note = closed_form_peaks(run)
    if len(peaks) != len(report.ranks):
        raise ValueError(f"the report has {len(report.ranks)} rank classes, the closed form {len(peaks)}: "
                         "pass the run the report was estimated for")
    for rank, peak in zip(report.ranks, peaks):
        rank.analytic = peak
    if note is not None:
        report.notes.append(note)
    report.elapsed_s += time.perf_counter() - start
    return report


def estimate_with_closed_form(
    cfg: JobConfig, ngpu: int, gpu_memory_gib: float | None = None, full_depth: bool = False
) -> MemoryReport:
    """`kenotron.estimate.estimate_memory`'s report with the closed form beside it (what
    `kenotron estimate` prints)."""
    run = resolve_run(cfg, ngpu, check_data=False)
    return add_closed_form(estimate_run(run, gpu_memory_gib, full_depth), run)
