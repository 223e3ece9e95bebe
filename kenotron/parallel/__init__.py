"""Parallelism on PyTorch's own stack: the degrees and meshes, the plan (the model's structure and
the run's parallel settings) and what applies it.

    from kenotron.parallel import ParallelDims, plan_for

The names below load their module on first use, so importing this package costs nothing and
creates no import cycle.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "AppliedPlan": "kenotron.parallel.plan",
    "Plan": "kenotron.parallel.plan",
    "plan_for": "kenotron.parallel.plan",
    "ModelLayout": "kenotron.parallel.model_layout",
    "PlanError": "kenotron.parallel.model_layout",
    "matching_modules": "kenotron.parallel.model_layout",
    "ParallelSettings": "kenotron.parallel.settings",
    "Meshes": "kenotron.parallel.dims",
    "ParallelConfigError": "kenotron.parallel.dims",
    "ParallelDims": "kenotron.parallel.dims",
    "describe_parameters": "kenotron.parallel.describe",
    "format_description": "kenotron.parallel.describe",
    "PipelineSplit": "kenotron.parallel.pipeline",
    "clip_grads_": "kenotron.parallel.grad_norm",
    "total_grad_norm": "kenotron.parallel.grad_norm",
}

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

if TYPE_CHECKING:
    from kenotron.parallel.describe import describe_parameters, format_description
    from kenotron.parallel.dims import Meshes, ParallelConfigError, ParallelDims
    from kenotron.parallel.grad_norm import clip_grads_, total_grad_norm
    from kenotron.parallel.model_layout import ModelLayout, PlanError, matching_modules
    from kenotron.parallel.pipeline import PipelineSplit
    from kenotron.parallel.plan import AppliedPlan, Plan, plan_for
    from kenotron.parallel.settings import ParallelSettings


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
