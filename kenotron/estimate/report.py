"""The estimator's answer: per-rank peak memory with a breakdown, as text and as JSON."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kenotron.estimate.breakdown import CATEGORIES, Breakdown
from kenotron.estimate.depth import ModuleActivations
from kenotron.estimate.static_memory import data_parallel_kind
from kenotron.train.resolve import ResolvedRun

GIB = 2**30

RESERVED_FRACTION = 0.10
"""Share of the GPU's memory kept free for what allocated bytes do not count: the CUDA context,
NCCL's buffers and the caching allocator's fragmentation."""

CATEGORY_LABELS = {
    "parameters": "parameters (fp32 master, local shard)",
    "unsharded_parameters": "gathered parameters (FSDP compute copies)",
    "gradients": "gradients",
    "optimizer_state": "optimizer state",
    "activations": "activations (saved for backward)",
    "temporaries": "temporaries (incl. communication buffers)",
}


def gib(nbytes: float) -> float:
    return nbytes / GIB


def phase_peaks(peaks: dict[Any, Breakdown]) -> dict[str, Breakdown]:
    """The largest breakdown of each phase (forward, backward, optimizer) over `peaks`, whose
    keys are places of a step with a `phase`; the step's start (before the step) is left out."""
    out: dict[str, Breakdown] = {}
    for place, b in peaks.items():
        if place.phase != "start" and (place.phase not in out or b.total > out[place.phase].total):
            out[place.phase] = b
    return out


def verdict(peak_bytes: int, gpu_memory_gib: float) -> str:
    """fits / tight / does not fit, keeping RESERVED_FRACTION of the GPU for non-tensor memory."""
    usable = gpu_memory_gib * (1 - RESERVED_FRACTION) * GIB
    if peak_bytes <= usable:
        return "fits"
    if peak_bytes <= gpu_memory_gib * GIB:
        return "tight"
    return "does not fit"


def describe_model(run: ResolvedRun, parameter_count: int) -> str:
    """The report's first words: family, flavor, the config's model values and the size."""
    shape = "".join(f" {k}={v}" for k, v in run.cfg.model.args.items())
    return f"{run.spec.name} {run.cfg.model.flavor}{shape} ({parameter_count / 1e9:.2f} B parameters)"


def describe_settings(run: ResolvedRun) -> dict[str, object]:
    """The settings the report's second line names."""
    cfg = run.cfg
    return {
        "data parallel": data_parallel_kind(run),
        "reshard after forward": run.plan.settings.reshard_after_forward,
        "param_dtype": cfg.training.param_dtype,
        "AC": cfg.activation_checkpoint.mode
        + (f"/{cfg.activation_checkpoint.every_n}" if cfg.activation_checkpoint.mode == "every-n-layers" else "")
        + (f", first {run.plan.settings.offload_blocks} blocks offloaded" if run.plan.settings.offload_blocks else ""),
        "local batch": cfg.training.local_batch_size,
        "seq_len": cfg.training.seq_len,
        "micro-steps": run.grad_accum_steps,
        "loss": ("fused chunked" if run.choices.fused_loss else "plain") + (
            " (vocab-parallel)" if run.dims.tp > 1 and (run.choices.fused_loss or run.plan.settings.loss_parallel) else ""),
    }


@dataclass
class RankEstimate:
    """The estimate for one group of ranks that hold the same things (all ranks, or one pipeline stage)."""

    ranks: str
    """Which ranks, in words."""
    simulated_rank: int
    """The rank whose step was simulated."""
    peak: Breakdown
    """Bytes at this rank's highest point of a steady-state step, by category."""
    peak_at: str
    """Where in the step that highest point is."""
    phase_peaks: dict[str, Breakdown]
    """Highest point of each phase: forward, backward, optimizer."""
    activations: list[ModuleActivations]
    """Activations kept for backward by module pattern, largest first (first micro-step)."""
    analytic: Breakdown | None = None
    """The closed-form model's peak breakdown for the same layout, for comparison: filled by the
    planner (kenotron/planner/closed_form_column.py), None where it is not asked or not priced."""


@dataclass
class MemoryReport:
    """What estimate_memory found for one configuration on `ngpu` GPUs."""

    model: str
    """Family, flavor and parameter count."""
    ngpu: int
    """World size."""
    layout: dict[str, int]
    """Parallel degrees (pp, dp_replicate, dp_shard, cp, tp)."""
    settings: dict[str, Any]
    """What else shapes memory: data-parallel kind, dtype, AC, batch, sequence, accumulation, loss."""
    ranks: list[RankEstimate]
    """One entry per group of ranks that differ."""
    gpu_memory_gib: float
    """The budget the verdict compares with."""
    method: str
    """How the numbers were obtained (full depth, or extrapolated from which depths)."""
    notes: list[str] = field(default_factory=list)
    """What the estimate leaves out or approximates for this configuration."""
    elapsed_s: float = 0.0
    """Wall time of the estimate."""

    @property
    def peak_bytes(self) -> int:
        return max(r.peak.total for r in self.ranks)

    @property
    def verdict(self) -> str:
        return verdict(self.peak_bytes, self.gpu_memory_gib)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "ngpu": self.ngpu,
            "layout": self.layout,
            "settings": self.settings,
            "gpu_memory_gib": self.gpu_memory_gib,
            "peak_gib": round(gib(self.peak_bytes), 3),
            "verdict": self.verdict,
            "method": self.method,
            "notes": self.notes,
            "elapsed_s": round(self.elapsed_s, 2),
            "ranks": [
                {
                    "ranks": r.ranks,
                    "simulated_rank": r.simulated_rank,
                    "peak_bytes": r.peak.total,
                    "peak_at": r.peak_at,
                    "breakdown_bytes": r.peak.as_dict(),
                    "phase_peak_bytes": {phase: b.total for phase, b in r.phase_peaks.items()},
                    "analytic_breakdown_bytes": r.analytic.as_dict() if r.analytic else None,
                    "activations_by_module": [
                        {"module": a.module, "instances": a.instances, "bytes_per_instance": a.bytes_per_instance,
                         "bytes": a.total}
                        for a in r.activations
                    ],
                }
                for r in self.ranks
            ],
        }

    def format(self, top_modules: int = 8) -> str:
        layout = " x ".join(f"{k} {v}" for k, v in self.layout.items() if v > 1) or "1 rank"
        settings = ", ".join(f"{k} {v}" for k, v in self.settings.items())
        lines = [
            f"{self.model} on {self.ngpu} GPU(s): {layout}",
            f"  {settings}",
            f"  method: {self.method} ({self.elapsed_s:.1f} s)",
        ]
        for r in self.ranks:
            lines += ["", f"{r.ranks} (simulated rank {r.simulated_rank}): peak {gib(r.peak.total):.2f} GiB at {r.peak_at}"]
            analytic = r.analytic.as_dict() if r.analytic else None
            header = f"  {'':44s}{'GiB':>9s}" + (f"{'analytic':>10s}" if analytic else "")
            lines.append(header)
            for c in CATEGORIES:
                row = f"  {CATEGORY_LABELS[c]:44s}{gib(getattr(r.peak, c)):9.2f}"
                lines.append(row + (f"{gib(analytic[c]):10.2f}" if analytic else ""))
            total = f"  {'total':44s}{gib(r.peak.total):9.2f}"
            lines.append(total + (f"{gib(r.analytic.total):10.2f}" if r.analytic else ""))
            phases = ", ".join(f"{p} {gib(b.total):.2f}" for p, b in r.phase_peaks.items())
            lines.append(f"  phase peaks (GiB): {phases}")
            lines.append("  activations kept for backward, by module (first micro-step):")
            for a in r.activations[:top_modules]:
                each = f" ({a.instances} x {gib(a.bytes_per_instance) * 1024:.1f} MiB)" if a.instances > 1 else ""
                lines.append(f"    {a.module:40s}{gib(a.total):9.2f} GiB{each}")
        budget = f"{self.gpu_memory_gib:g} GiB"
        kept = f"{100 * RESERVED_FRACTION:.0f}% kept for CUDA context, NCCL and fragmentation"
        lines += ["", f"verdict: {self.verdict} -- peak {gib(self.peak_bytes):.2f} GiB of {budget} ({kept})"]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)
