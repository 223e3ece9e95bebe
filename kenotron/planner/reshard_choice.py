"""FSDP's `parallelism.fsdp_reshard_after_forward = "default"`, settled by memory, in one place.

Keeping every unit's gathered weights from forward to backward ("never") spares the backward's
re-gather of each resharded unit and FSDP's copy-out of it: one all-gather of the whole model per
micro-step (its gain on GPUs: docs/performance.md, "MoE FSDP").
It costs the gathered compute copies of every block at the loss and through backward. So
"default" becomes "never" when the closed-form peak with "never" (planner/analytic.py) fits the
GPU with the estimator's headroom (estimate/report.py's RESERVED_FRACTION, as its verdict "fits"),
and else stays the per-unit policy of kenotron/parallel/data_parallel.py (every unit resharded
but the last).

The trainer (every `Trainer(cfg)`, however it is started: the launcher's ranks, `python -m
kenotron.train`, the benchmark, a notebook), `kenotron estimate` and the planner's search all call
`settle_reshard_after_forward`, so the three agree on the choice for the same GPU memory. The
Trainer imports this module when it is built (train/ sits below the planner: the one import
against the rooms' directions, tests/architecture_rules.py's UPWARD_ON_PURPOSE).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from kenotron.estimate.report import GIB, RESERVED_FRACTION, verdict
from kenotron.estimate.static_memory import data_parallel_kind
from kenotron.planner.analytic_model import AnalyticModel
from kenotron.train.resolve import ResolvedRun


@dataclass(frozen=True)
class ReshardChoice:
    """What `fsdp_reshard_after_forward` resolved to for a run, and why."""

    policy: str
    """The value the plan applies: "never", "default" (the per-unit policy) or "always"."""
    why: str
    """The reason in words (the config's own value, the memory comparison, or nothing to decide)."""
    peak_never: int | None = None
    """The closed-form peak bytes per rank with "never" (None where it was not priced)."""

    def __str__(self) -> str:
        return f"FSDP reshard after forward: {self.policy} ({self.why})"


def with_settings(run: ResolvedRun, **changes: object) -> ResolvedRun:
    """A copy of `run` whose plan settings take `changes` (the run itself is left as is)."""
    settings = dataclasses.replace(run.plan.settings, **changes)
    return dataclasses.replace(run, plan=dataclasses.replace(run.plan, settings=settings))


def compare_with_gpu(peak: int, gpu_memory_gib: float) -> tuple[bool, str]:
    """Whether the closed-form `peak` fits the GPU as the estimator's verdict "fits" decides
    (RESERVED_FRACTION kept), and the comparison in words."""
    fits = verdict(peak, gpu_memory_gib) == "fits"
    return fits, (f"{peak / GIB:.1f} GiB, {'fits' if fits else 'exceeds'} {100 * (1 - RESERVED_FRACTION):.0f}% of "
                  f"{gpu_memory_gib:g} GiB")


def choose_reshard_after_forward(run: ResolvedRun, gpu_memory_gib: float | None,
                                 model: AnalyticModel | None = None) -> ReshardChoice:
    """The policy `run` applies on GPUs of `gpu_memory_gib` (None: a run without a GPU, which keeps
    the per-unit policy; `model`: the planner's cached closed form for this family and size, else
    one is built)."""
    policy = run.plan.settings.reshard_after_forward
    if policy != "default":
        return ReshardChoice(policy, "parallelism.fsdp_reshard_after_forward in the config")
    if data_parallel_kind(run) not in ("fsdp", "hsdp"):
        return ReshardChoice(policy, "no FSDP sharding: nothing is resharded")
    if run.dims.pp > 1:
        return ReshardChoice(policy, "pipeline parallel: each stage keeps its blocks gathered for the schedule's step")
    if gpu_memory_gib is None:
        return ReshardChoice(policy, "every unit but the last resharded: no GPU, and host memory is not what a "
                                     "GPU plan is sized for")
    peak = (model or AnalyticModel(run)).peak(with_settings(run, reshard_after_forward="never")).total
    fits, against_gpu = compare_with_gpu(peak, gpu_memory_gib)
    compared = f"the peak with every unit kept gathered, {against_gpu}"
    if fits:
        return ReshardChoice("never", f"default: {compared}", peak)
    return ReshardChoice(policy, f"every unit but the last resharded: {compared}", peak)


def settle_reshard_after_forward(run: ResolvedRun, gpu_memory_gib: float | None,
                                 model: AnalyticModel | None = None) -> ReshardChoice:
    """Choose the policy (choose_reshard_after_forward) and write it into `run`'s plan settings,
    which the data-parallel step applies and the estimator simulates."""
    choice = choose_reshard_after_forward(run, gpu_memory_gib, model)
    run.plan.settings.reshard_after_forward = choice.policy
    return choice


def device_memory_gib(device: torch.device) -> float | None:
    """The memory of the rank's own GPU in GiB; None on CPU (host memory is not what a GPU plan is
    sized for)."""
    return torch.cuda.get_device_properties(device).total_memory / GIB if device.type == "cuda" else None
