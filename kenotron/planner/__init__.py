"""The planner behind `estimation.py --search`: layouts that fit, ranked by modelled throughput.

    from kenotron.planner import search_layouts, format_search
    print(format_search(search_layouts(load_config("llama3_8b"), ngpu=64, gpu_memory_gib=80)))

A closed form prices hundreds of layouts in a second; the best few are then confirmed by the
fake-tensor estimator (kenotron/estimate), which stays the authority on memory.

- analytic.py           the closed-form peak memory of a step (formulas in its docstring)
- step_shape.py         the sizes of a micro-step the formulas read, and the block's variant
- analytic_loss.py, analytic_moe.py, analytic_mamba.py   the loss's, an MoE layer's and a Mamba-2 block's terms
- analytic_pipeline.py  the same per pipeline rank under 1F1B
- analytic_model.py     AnalyticModel: one family and size, with what does not depend on the layout cached
- throughput.py         the step-time model that ranks layouts
- step_compute.py       its compute side: kernels, loss, accumulation, optimizer, pipeline schedules
- hardware.py           the cluster the throughput model assumes (fitted constants)
- search.py             the search (--search)
- closed_form_column.py the closed form beside the fake-tensor estimate (the report's analytic column)
- reshard_choice.py     fsdp_reshard_after_forward "default" settled by memory, for the trainer, the estimate and the search
- cli.py                the `kenotron estimate` command (estimation.py)
"""

from kenotron.planner.analytic_model import AnalyticModel
from kenotron.planner.closed_form_column import add_closed_form, estimate_with_closed_form
from kenotron.planner.hardware import Hardware
from kenotron.planner.search import SearchResult, format_search, search_layouts
from kenotron.planner.throughput import StepTime, step_time

__all__ = [
    "AnalyticModel",
    "Hardware",
    "SearchResult",
    "StepTime",
    "add_closed_form",
    "estimate_with_closed_form",
    "format_search",
    "search_layouts",
    "step_time",
]
