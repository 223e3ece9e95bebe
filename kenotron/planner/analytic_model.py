"""AnalyticModel: the closed-form model of one family and size, with what does not depend on the
layout kept, so that the planner prices hundreds of layouts in a second."""

from __future__ import annotations

from kenotron.estimate.breakdown import Breakdown
from kenotron.estimate.static_memory import (
    ParameterBytes,
    data_parallel_kind,
    master_weights,
    meta_model,
    optimizer_state_bytes,
    parameter_bytes,
)
from kenotron.parallel.pipeline import PipelineSplit
from kenotron.planner.analytic import peak_breakdown
from kenotron.planner.analytic_pipeline import pipeline_peaks, rank_orders
from kenotron.planner.pipeline_timeline import Timeline, build_timeline
from kenotron.planner.step_compute import Unit, model_units
from kenotron.planner.step_shape import block_kind
from kenotron.train.resolve import ResolvedRun


class AnalyticModel:
    """The closed-form model for one family and size: keeps the meta model and what does not
    depend on the layout, so that the planner can price hundreds of layouts quickly."""

    def __init__(self, run: ResolvedRun) -> None:
        self.model = meta_model(run)
        self.kind = block_kind(self.model, run.plan.layout.blocks)
        self._params: dict[tuple, ParameterBytes] = {}
        self._optimizer: dict[tuple, int] = {}
        self._stages: dict[tuple, tuple[ParameterBytes, int]] = {}
        """Pipeline stages' (parameter bytes, optimizer bytes), by stage units and layout."""
        self._units: list[Unit] | None = None
        self._timelines: dict[tuple, Timeline] = {}
        self.parameter_count = sum(p.numel() for p in self.model.parameters())
        """The model's parameters (read for every layout the planner prices: counted once)."""

    def parameters(self, run: ResolvedRun) -> ParameterBytes:
        key = (tuple(run.dims.degrees().items()), run.plan.settings.dp_mode, run.cfg.training.param_dtype)
        if key not in self._params:
            self._params[key] = parameter_bytes(run, self.model)
        return self._params[key]

    def optimizer_state(self, run: ResolvedRun) -> int:
        params = self.parameters(run)
        key = (tuple(run.dims.degrees().items()), data_parallel_kind(run), run.cfg.optimizer.name, master_weights(run))
        if key not in self._optimizer:
            self._optimizer[key] = optimizer_state_bytes(run, self.model, params)
        return self._optimizer[key]

    def units(self, run: ResolvedRun) -> list[Unit]:
        """The model's top-level modules with their work, for the throughput model (step_compute.py)."""
        if self._units is None:
            self._units = model_units(self.model, run.plan.layout.blocks)
        return self._units

    def fused_loss(self, run: ResolvedRun) -> bool:
        """The trainer's choice of loss for this layout."""
        return run.choices.fused_loss

    def peak(self, run: ResolvedRun) -> Breakdown:
        """Peak breakdown of `run` (same family and size as the one this model was built for); under
        pipeline parallel, that of the fullest pipeline rank (analytic_pipeline.py)."""
        if run.dims.pp > 1:
            return max(self.pipeline_peaks(run), key=lambda b: b.total)
        return peak_breakdown(run, self.parameters(run), self.optimizer_state(run), self.kind, self.fused_loss(run))

    def timeline(self, split: PipelineSplit) -> Timeline:
        """The split's schedule step in dependency order (pipeline_timeline.py), built once per
        schedule, ranks, stages and microbatches."""
        key = (split.schedule, split.pp, split.n_stages, split.microbatches)
        if key not in self._timelines:
            self._timelines[key] = build_timeline(rank_orders(split, self._stages), split.n_stages)
        return self._timelines[key]

    def pipeline_peaks(self, run: ResolvedRun) -> list[Breakdown]:
        """One peak per pipeline rank, under the run's schedule."""
        peaks = pipeline_peaks(run, self.model, self.kind, self._stages)
        assert peaks is not None, "pipeline_peaks of a run without a pipeline"
        return peaks
