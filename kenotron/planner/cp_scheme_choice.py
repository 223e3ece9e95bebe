"""`parallelism.cp_scheme = "auto"`: the ring or the all-to-all (Ulysses), settled by one rule.

The rule: **Ulysses where it can run and was measured to win, else the ring** -- that is, on a
GPU, with the ring's attention not named (tuning.cp_attention auto),
with the heads splitting over cp or over a divisor u > 1 of it (kenotron/degrees.py's
`ulysses_degree`: the all-to-all over u, a ring over cp / u) and with the closed-form peak under
Ulysses (planner/analytic.py) fitting the GPU with the estimator's headroom (as reshard_choice.py
decides `never`).

Why (the GPU rows: docs/parallelism.md, "Ring or all-to-all"): at cp 2 Ulysses ran faster than
the ring for more memory per GPU, plain causal and document-masked alike (under the ring the
documents leave the ranks uneven work, under Ulysses every rank computes every query of its
heads). On CPU the ring stays: kenotron's exact ring is what the CPU parity tests run, and host memory is not what
a GPU plan is sized for. Left unsettled (a plan built by hand), "auto" runs the ring.

The trainer (every `Trainer(cfg)`, before any process group), `kenotron estimate` and the
planner's search settle it here, before the reshard policy (whose memory comparison then
prices the chosen scheme). The search prices both schemes at every cp and marks which of its
rows a GPU measured (`MEASURED_CP`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kenotron.degrees import attention_heads, model_ulysses_degree, ulysses_head_problem
from kenotron.kernel_choice.attention_backend import auto_picks_flash_attn
from kenotron.planner.analytic_model import AnalyticModel
from kenotron.planner.reshard_choice import compare_with_gpu, with_settings
from kenotron.train.resolve import ResolvedRun

MEASURED_CP: frozenset[tuple[str, int, bool]] = frozenset({
    ("ring", 2, False), ("ring", 4, False),  # 4 x H200 cp sweep (1B and 8B width; docs/parallelism.md)
    ("ulysses", 2, False),  # 2 x H100, scripts/bench_cp_schemes.py (1B, 32k and 64k)
    ("ring", 2, True),  # 2 x H100, scripts/bench_cp_documents.py (1B, 4096-token mean documents)
    ("ulysses", 2, True),  # 2 x H200, run 99 of docs/performance.md (1B, 64k, 4096-token mean documents)
    ("ulysses", 4, False),  # 4 x H200, runs 100-105: all-to-all 2 x ring 2 (18 heads) against the ring, 64k
    ("ulysses", 4, True),  # 4 x H200, runs 100-105: 1B, 64k, cp 4 (all-to-all over 4), 4096-token mean documents
})
"""(scheme, cp, document masking) that GPU runs measured; the search marks its rows of them."""


def cp_row_kind(scheme: str, cp: int, document_masking: bool) -> str:
    """"measured" where a GPU measured this scheme at this cp (MEASURED_CP), "modelled" where
    only the throughput model prices it, "" without context parallel."""
    if cp == 1:
        return ""
    return "measured" if (scheme, cp, document_masking) in MEASURED_CP else "modelled"


@dataclass(frozen=True)
class CpSchemeChoice:
    """What `parallelism.cp_scheme` resolved to for a run, and why."""

    scheme: str
    """The scheme the plan applies: "ring" or "ulysses"."""
    why: str
    """The reason in words: the config's own value, the condition that keeps the ring, or the
    memory comparison."""
    peak_ulysses: int | None = None
    """The closed-form peak bytes per rank under Ulysses (None where it was not priced)."""

    def __str__(self) -> str:
        return f"context-parallel scheme: {self.scheme} ({self.why})"


def _ring_reason(run: ResolvedRun, gpu_memory_gib: float | None) -> str:
    """Why `run` keeps the ring before any memory is priced ("" when nothing does)."""
    cfg, d, a = run.cfg, run.dims, run.model_args
    if gpu_memory_gib is None or cfg.training.device == "cpu":
        return "no GPU: kenotron's exact ring, as the CPU parity tests run it"
    if cfg.tuning.cp_attention != "auto":
        return f"tuning.cp_attention={cfg.tuning.cp_attention!r} names the ring's attention"
    if model_ulysses_degree(a, d) == 1:  # the heads split over no divisor > 1 of cp
        heads, kv_heads = attention_heads(a)
        return f"Ulysses cannot split the heads: {ulysses_head_problem(heads // d.tp, kv_heads // d.tp, d.cp)}"
    return ""


def choose_cp_scheme(run: ResolvedRun, gpu_memory_gib: float | None,
                     model: AnalyticModel | None = None) -> CpSchemeChoice:
    """The scheme `run` applies on GPUs of `gpu_memory_gib` (None: a run without a GPU; `model`:
    the planner's cached closed form for this family and size, else one is built)."""
    scheme = run.plan.settings.cp_scheme
    if scheme != "auto":
        return CpSchemeChoice(scheme, "parallelism.cp_scheme in the config")
    if run.dims.cp == 1:
        return CpSchemeChoice("ring", "auto: cp=1, no context parallel")
    reason = _ring_reason(run, gpu_memory_gib)
    if reason:
        return CpSchemeChoice("ring", f"auto: {reason}")
    assert gpu_memory_gib is not None  # _ring_reason keeps the ring without a GPU
    peak = (model or AnalyticModel(run)).peak(with_settings(run, cp_scheme="ulysses")).total
    fits, against_gpu = compare_with_gpu(peak, gpu_memory_gib)
    compared = f"the peak with Ulysses, {against_gpu}"
    if fits:
        u = model_ulysses_degree(run.model_args, run.dims)
        if u < run.dims.cp:
            measured = (f"1.155x the ring's tokens/s at cp 4 for all-to-all 2 x ring 2; here all-to-all over {u} x "
                        f"ring over {run.dims.cp // u}")
        elif run.cfg.data.document_masking:
            measured = "1.076x the ring's tokens/s at cp 2 with document masking"
        else:
            measured = "1.09x the ring's tokens/s at cp 2"
        return CpSchemeChoice("ulysses", f"auto: measured {measured}; {compared}", peak)
    return CpSchemeChoice("ring", f"auto: {compared}", peak)


def settle_cp_scheme(run: ResolvedRun, gpu_memory_gib: float | None,
                     model: AnalyticModel | None = None) -> CpSchemeChoice:
    """Choose the scheme (choose_cp_scheme) and write it into `run`'s plan settings, which the
    plan applies, the estimator simulates and the throughput model prices."""
    choice = choose_cp_scheme(run, gpu_memory_gib, model)
    run.plan.settings.cp_scheme = choice.scheme
    return choice


def with_attention_for_scheme(run: ResolvedRun, cuda_major: int) -> ResolvedRun:
    """`run` once its scheme is settled (settle_cp_scheme): where it is the all-to-all over all of
    cp, `model.attention_backend = "auto"` gets FlashAttention as it would without context
    parallel (kernel_choice/attention_backend.py's auto_picks_flash_attn, SM `cuda_major`), faster
    than cuDNN there too (docs/parallelism.md, "Two schemes")."""
    d, c = run.dims, run.choices
    if (d.cp > 1 and run.plan.settings.cp_scheme == "ulysses" and run.cfg.model.attention_backend == "auto"
            and c.attention_backend != "flash_attn"
            and auto_picks_flash_attn(run.cfg, d.cp, run.model_args, cuda_major, model_ulysses_degree(run.model_args, d))):
        return replace(run, choices=replace(c, attention_backend="flash_attn"))
    return run
