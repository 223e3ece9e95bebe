"""Parallelism on PyTorch's own stack: the degrees and meshes, the plan (the model's structure and
the run's parallel settings) and what applies it.

    from kenotron.parallel import ParallelDims, plan_for

Importing this package imports the plan and everything it applies (torch.distributed's FSDP,
tensor parallel and pipelining).
"""

from kenotron.degrees import ParallelConfigError, ParallelDims
from kenotron.parallel.describe import describe_parameters, format_description
from kenotron.parallel.dims import Meshes
from kenotron.parallel.grad_norm import clip_grads_, total_grad_norm
from kenotron.parallel.model_layout import ModelLayout, PlanError, matching_modules
from kenotron.parallel.parallel_settings import ParallelSettings
from kenotron.parallel.pipeline import PipelineSplit
from kenotron.parallel.plan import AppliedPlan, Plan, plan_for

__all__ = [
    "AppliedPlan",
    "Meshes",
    "ModelLayout",
    "ParallelConfigError",
    "ParallelDims",
    "ParallelSettings",
    "PipelineSplit",
    "Plan",
    "PlanError",
    "clip_grads_",
    "describe_parameters",
    "format_description",
    "matching_modules",
    "plan_for",
    "total_grad_norm",
]
