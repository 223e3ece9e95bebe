"""The planner: layouts that fit a memory budget, ranked by modelled throughput.

1. Enumerate: tp (a divisor of the world that divides the heads, kv heads, FFN width and
   vocabulary, within one node), cp (context parallel: a divisor of what tp and pp leave, with
   seq_len a multiple of 2·cp·tp and no sliding window shorter than seq_len; both schemes,
   the ring and Ulysses' all-to-all where the heads split over cp, each row marked measured
   or modelled: cp_scheme_choice.MEASURED_CP), the split of the
   rest into dp_replicate x dp_shard, the data-parallel mode (FSDP/HSDP/DDP, and ZeRO-1 over
   dp x cp), for MoE models the expert-parallel degree (every ep that dp_shard x cp and the expert
   count allow, under FSDP), activation checkpointing (none, selective-op, full) and the local
   batch (powers of two). The global batch stays the config's (training.global_batch_size, or local_batch_size
   x the data-parallel degree of the config's own layout), so every candidate trains the same
   way; accumulation makes up the rest. Pipeline parallel (pp, a divisor of what tp leaves; cp
   then runs inside its stages) is searched with each schedule of PIPELINE_SCHEDULES (1F1B, the
   looped schedules at 2 and 4 stages per rank, the V schedules), one sequence per microbatch
   (pp_microbatches = local batch, the trainer's default), at least pp of them, and the trainer's
   balanced split; the schedules that split the backward run without AC (selective-op is refused
   by the trainer, and under full AC the fake runs keep more than without it). The trainer's own
   checks (build_pipeline_split: layers >= stages, microbatches per schedule, compile, the loss)
   drop what it would refuse.
2. Price each with the analytic model (analytic.py) and keep those under the budget (the
   verdict's 90%).
3. Rank by modelled tokens/s per GPU (throughput.py).
4. Confirm the best few with the FakeTensor estimate (kenotron/estimate/memory.py), through the trainer's own
   resolve_run; a candidate the fake run finds too large is dropped and the next one checked.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

from kenotron.config import ConfigError, JobConfig
from kenotron.degrees import (
    CP_SCHEMES,
    ZERO_BUBBLE_SCHEDULES,
    ParallelConfigError,
    ParallelDims,
    check_compile,
    check_split_backward,
    expert_parallel_degrees,
)
from kenotron.estimate.memory import estimate_run
from kenotron.estimate.report import RESERVED_FRACTION, describe_model, gib
from kenotron.kernel_choice.target import Target
from kenotron.planner.analytic_model import AnalyticModel
from kenotron.planner.cp_scheme_choice import cp_row_kind
from kenotron.planner.hardware import Hardware
from kenotron.planner.masked_attention import describe_priced
from kenotron.planner.reshard_choice import settle_reshard_after_forward
from kenotron.planner.throughput import StepTime, step_time
from kenotron.progress import progress_bar
from kenotron.train.resolve import ResolvedRun, resolve_layout, resolve_run

AC_CHOICES = ("none", "selective-op", "full")
MAX_LOCAL_BATCH = 16
PIPELINE_SCHEDULES = (("1F1B", 1), ("Interleaved1F1B", 2), ("Interleaved1F1B", 4), ("InterleavedZeroBubble", 2),
                      ("InterleavedZeroBubble", 4), ("ZBVZeroBubble", 2), ("DualPipeV", 2))
"""(parallelism.pp_schedule, pp_stages_per_rank) pairs searched under pp: the closed form
(analytic_pipeline.py) and the timeline (pipeline_timeline.py) price each in its own order. Not
searched: GPipe and LoopedBFS, which keep every microbatch in flight for the bubble of 1F1B and
Interleaved1F1B."""


@dataclass
class Candidate:
    """One layout the planner considered."""

    degrees: dict[str, int]
    """dp_replicate, dp_shard, tp, pp, cp, ep."""
    dp_mode: str
    """fsdp or zero1 (parallelism.dp_mode)."""
    ac_mode: str
    """activation_checkpoint.mode."""
    local_batch: int
    """training.local_batch_size."""
    micro_steps: int
    """Gradient accumulation steps that make up the global batch."""
    analytic_peak: int
    """Per-rank peak bytes from the analytic model."""
    step: StepTime
    """The throughput model's step time."""
    cp_scheme: str = "ring"
    """parallelism.cp_scheme (under cp > 1): ring or ulysses."""
    cp_row: str = ""
    """"measured" where GPUs measured this scheme at this cp, "modelled" where only the throughput
    model prices it, "" without cp (cp_scheme_choice.cp_row_kind)."""
    confirmed_peak: int | None = None
    """Per-rank peak bytes from the FakeTensor estimate (for the confirmed ones)."""
    pp_schedule: str = ""
    """parallelism.pp_schedule under pp > 1 ("" without a pipeline)."""
    pp_stages_per_rank: int = 0
    """parallelism.pp_stages_per_rank under pp > 1 (0 without a pipeline)."""

    def parallelism(self) -> dict[str, Any]:
        """The [parallelism] values that select this candidate."""
        return candidate_parallelism(self.degrees, self.dp_mode, self.cp_scheme, self.pp_schedule,
                                     self.pp_stages_per_rank)

    def schedule(self) -> str:
        """The pipeline schedule in words: its name, and its stages per rank where several."""
        if not self.pp_schedule:
            return ""
        return self.pp_schedule + (f" x{self.pp_stages_per_rank}" if self.pp_stages_per_rank > 1 else "")

    def overrides(self) -> list[str]:
        """The command-line overrides that select this candidate."""
        order = ("dp_replicate", "dp_shard", "tp", "pp", "cp", "ep")
        out = [f"--parallelism.{k} {self.degrees[k]}" for k in order
               if self.degrees.get(k, 1) > 1 or k not in ("pp", "cp", "ep")]
        out.append(f"--parallelism.dp_mode {self.dp_mode}")
        if self.degrees["cp"] > 1:  # named: the config's "auto" settles by its own rule
            out.append(f"--parallelism.cp_scheme {self.cp_scheme}")
        if self.degrees["pp"] > 1:  # pp_microbatches 0: one sequence each
            out += [f"--parallelism.pp_schedule {self.pp_schedule}",
                    f"--parallelism.pp_stages_per_rank {self.pp_stages_per_rank}"]
        out += [f"--activation_checkpoint.mode {self.ac_mode}", f"--training.local_batch_size {self.local_batch}"]
        return out

    def label(self) -> str:
        d = self.degrees
        parts = [f"{k}{v}" for k, v in (("r", d["dp_replicate"]), ("s", d["dp_shard"]), ("tp", d["tp"]),
                                          ("pp", d["pp"]), ("cp", d["cp"]), ("ep", d.get("ep", 1))) if v > 1]
        if self.cp_scheme == "ulysses":
            parts = [p + "-ulysses" if p.startswith("cp") else p for p in parts]
        return (" ".join(parts) or "1 GPU") + (" zero1" if self.dp_mode == "zero1" else "")


@dataclass
class SearchResult:
    """The planner's answer."""

    model: str
    """Family, flavor and parameter count."""
    ngpu: int
    """World size searched."""
    gpu_memory_gib: float
    """Budget per GPU."""
    global_batch: int
    """Sequences per optimizer step (kept fixed)."""
    ranked: list[Candidate]
    """Candidates that fit (analytic), best modelled throughput first."""
    considered: int
    """How many valid candidates were priced."""
    notes: list[str] = field(default_factory=list)
    """What was not searched, and why."""
    elapsed_s: float = 0.0
    """Wall time."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "ngpu": self.ngpu, "gpu_memory_gib": self.gpu_memory_gib,
            "global_batch": self.global_batch, "considered": self.considered, "notes": self.notes,
            "elapsed_s": round(self.elapsed_s, 2),
            "candidates": [
                {"layout": c.degrees, "dp_mode": c.dp_mode, "cp_scheme": c.cp_scheme, "pp_schedule": c.pp_schedule,
                 "pp_stages_per_rank": c.pp_stages_per_rank, "cp_row": c.cp_row, "ac_mode": c.ac_mode, "local_batch": c.local_batch,
                 "micro_steps": c.micro_steps, "analytic_peak_gib": round(gib(c.analytic_peak), 3),
                 "confirmed_peak_gib": None if c.confirmed_peak is None else round(gib(c.confirmed_peak), 3),
                 "tokens_per_s_per_gpu": round(c.step.tokens_per_s_per_gpu), "step_s": round(c.step.seconds, 4),
                 "overrides": " ".join(c.overrides())}
                for c in self.ranked
            ],
        }


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidate_parallelism(degrees: dict[str, int], dp_mode: str, cp_scheme: str = "ring", pp_schedule: str = "1F1B",
                          pp_stages_per_rank: int = 1) -> dict[str, Any]:
    """[parallelism] of a candidate: its degrees, CP scheme and, under pp, its schedule and stages
    per rank with the trainer's defaults for the rest (one sequence per microbatch, its balanced split)."""
    out: dict[str, Any] = {**degrees, "dp_mode": dp_mode, "cp_scheme": cp_scheme}
    if degrees.get("pp", 1) > 1:
        out.update(pp_schedule=pp_schedule, pp_microbatches=0, pp_stages_per_rank=pp_stages_per_rank,
                   pp_layers_per_stage=[], pp_stage_modules=[])
    return out


def target_global_batch(cfg: JobConfig, ngpu: int) -> int:
    """The config's global batch: explicit, or local batch x the dp degree of its own layout."""
    t, p = cfg.training, cfg.parallelism
    if t.global_batch_size != -1:
        return t.global_batch_size
    try:
        dims = ParallelDims.from_degrees(ngpu, dp_replicate=p.dp_replicate, dp_shard=p.dp_shard, cp=p.cp, tp=p.tp, pp=p.pp)
        return t.local_batch_size * dims.dp
    except ParallelConfigError:
        return t.local_batch_size * ngpu


def _with(cfg: JobConfig, **sections: dict[str, Any]) -> JobConfig:
    for name, values in sections.items():
        cfg = dataclasses.replace(cfg, **{name: dataclasses.replace(getattr(cfg, name), **values)})
    return cfg


def _candidate_run(base: ResolvedRun, cfg: JobConfig, meta_model: Any, splits: dict) -> ResolvedRun | None:
    """The resolved run of one candidate (resolve_run's layout half), or None where it refuses it;
    `splits` keeps the pipeline splits built (one per pp, schedule and batch, whatever the rest)."""
    try:
        return resolve_layout(cfg, base.dims.world_size, base.spec, base.model_args, meta_model, base.tokenizer,
                              Target.planned(cfg), splits)
    except ConfigError:
        return None


def pipeline_schedules(pp: int, ac: str, local_batch: int, layers: int, compile_blocks: bool,
                       moe: bool = False) -> list[tuple[str, int]]:
    """The (schedule, stages per rank) pairs searched for a pipeline of `pp` ranks (module doc):
    at least pp microbatches (one sequence each), a block per stage, and the schedules that split
    the backward without AC and without compile; [("", 0)] without a pipeline."""
    if pp == 1:
        return [("", 0)]
    out = []
    for schedule, v in PIPELINE_SCHEDULES:
        try:  # the trainer's own refusals, checked before the layout is resolved
            check_compile(schedule, compile_blocks)
            check_split_backward(schedule, ac, moe)
        except ParallelConfigError:
            continue
        if local_batch >= pp and pp * v <= layers and (ac == "none" or schedule not in ZERO_BUBBLE_SCHEDULES):
            out.append((schedule, v))
    return out


def _trials(
    base: ResolvedRun, ngpu: int, global_batch: int, hw: Hardware
) -> list[tuple[ParallelDims, str, int, str, int, str, str, int]]:
    """Every (dims, dp_mode, ep, AC mode, local batch, cp scheme, pp schedule, stages per rank) the
    search prices, before any is priced: the count is the progress bar's total."""
    moe = getattr(base.model_args, "moe", None)
    layers = base.model_args.n_layers
    out = []
    # Every tp x pp x cp that divides the world (cp inside pipeline stages too); the trainer's own
    # checks (resolve_layout) drop what it would refuse.
    splits = [(tp, pp, cp) for tp in _divisors(ngpu) if tp <= hw.gpus_per_node for pp in _divisors(ngpu // tp)
              for cp in _divisors(ngpu // (tp * pp))]
    for tp, pp, cp in splits:
        rest = ngpu // (tp * pp * cp)
        zero1 = [(1, rest, "zero1")] if rest * cp > 1 else []  # ZeRO-1 shares optimizer state over dp x cp
        layouts = [(r, rest // r, "fsdp") for r in _divisors(rest)] + zero1
        for dp_replicate, dp_shard, dp_mode in layouts:
            dims = ParallelDims.from_degrees(ngpu, dp_replicate=dp_replicate, dp_shard=dp_shard, tp=tp, cp=cp, pp=pp)
            if global_batch % dims.dp:
                continue
            per_rank = global_batch // dims.dp
            eps = expert_parallel_degrees(dp_shard, cp, moe.n_experts) if moe is not None and dp_mode == "fsdp" else [1]
            schemes = CP_SCHEMES if cp > 1 else ("ring",)
            out += [(dims, dp_mode, ep, ac, local, scheme, schedule, v) for ep in eps for ac in AC_CHOICES
                    for local in (1, 2, 4, 8, MAX_LOCAL_BATCH) if per_rank % local == 0 for scheme in schemes
                    for schedule, v in pipeline_schedules(pp, ac, local, layers, base.cfg.compile.enable,
                                                          base.spec.is_moe)]
    return out


def enumerate_candidates(
    base: ResolvedRun, model: AnalyticModel, ngpu: int, global_batch: int, hw: Hardware, gpu_memory_gib: float,
    document_tokens: float | None = None,
) -> list[Candidate]:
    """Every valid candidate, priced (analytic memory, modelled step time; `document_tokens`: the
    mean document length under data.document_masking, step_time's) with the reshard policy
    the trainer would settle on GPUs of `gpu_memory_gib` (reshard_choice.py). On a terminal a bar
    counts the layouts priced out of all to price (stderr; nothing when it is a file or a pipe)."""
    trials = _trials(base, ngpu, global_batch, hw)
    out: list[Candidate] = []
    splits: dict = {}
    bar = progress_bar(len(trials), desc="pricing layouts", unit="layout")
    try:
        for dims, dp_mode, ep, ac, local, scheme, schedule, v in trials:
            bar.update()
            degrees = {"dp_replicate": dims.dp_replicate, "dp_shard": dims.dp_shard, "tp": dims.tp, "pp": dims.pp,
                       "cp": dims.cp, "ep": ep}
            cfg = _with(
                base.cfg,
                parallelism=candidate_parallelism(degrees, dp_mode, scheme, schedule, v),
                activation_checkpoint={"mode": ac},
                training={"local_batch_size": local, "global_batch_size": global_batch},
            )
            run = _candidate_run(base, cfg, model.model, splits)
            if run is None:
                continue
            settle_reshard_after_forward(run, gpu_memory_gib, model)
            out.append(Candidate(
                {**dims.degrees(), "ep": ep}, dp_mode, ac, local, run.grad_accum_steps, model.peak(run).total,
                step_time(run, model, hw, document_tokens), scheme, cp_row_kind(scheme, dims.cp, cfg.data.document_masking),
                pp_schedule=schedule, pp_stages_per_rank=v,
            ))
    finally:
        bar.close()
    return out


def search_layouts(
    cfg: JobConfig, ngpu: int, gpu_memory_gib: float, *, top: int = 10, confirm: int = 3, hw: Hardware | None = None,
    document_tokens: float | None = None,
) -> SearchResult:
    """Fitting layouts for `cfg`'s model on `ngpu` GPUs, best modelled throughput first
    (`document_tokens`: the mean document length under data.document_masking, step_time's)."""
    start = time.perf_counter()
    hw = hw or Hardware()
    global_batch = target_global_batch(cfg, ngpu)
    defaults = {"dp_replicate": 1, "dp_shard": -1, "tp": 1, "pp": 1, "cp": 1, "ep": 1}
    # The config's other values get the trainer's checks once, on a plain data-parallel layout.
    base = resolve_run(_with(cfg, parallelism=defaults, training={"global_batch_size": -1}), ngpu, check_data=False)
    model = AnalyticModel(base)
    candidates = enumerate_candidates(base, model, ngpu, global_batch, hw, gpu_memory_gib, document_tokens)
    budget = gpu_memory_gib * (1 - RESERVED_FRACTION) * 2**30
    fitting = sorted((c for c in candidates if c.analytic_peak <= budget),
                     key=lambda c: (-c.step.tokens_per_s_per_gpu, c.analytic_peak))
    notes = [("pipeline parallel: searched with 1F1B, Interleaved1F1B and InterleavedZeroBubble (2 and 4 stages per "
              "rank), ZBVZeroBubble and DualPipeV, one sequence per microbatch (pp_microbatches = local batch, at "
              "least pp) and the trainer's balanced split; the zero-bubble and V schedules without AC")]
    if cfg.compile.enable:
        notes.append("pipeline parallel: the zero-bubble and V schedules need compile.enable=false (the trainer "
                     "refuses them with compiled blocks); pass it to have them searched")
    if any(c.cp_row == "modelled" for c in fitting[:top]):
        notes.append("CP column 'modelled': no GPU measured that scheme at that cp degree (GPUs measured the ring at "
                     "cp 2 and 4, Ulysses at cp 2, both with document masking at cp 2: docs/parallelism.md); "
                     "the model fitted to those prices it")
    if cfg.tuning.loss == "fused":
        notes.append("pipeline parallel is not searched: tuning.loss='fused' does not combine with it")
    if not candidates:
        notes.append(f"no layout of {ngpu} GPUs divides the global batch {global_batch} and the model's dimensions")
    confirmed, ranked = 0, []
    bar = progress_bar(min(confirm, len(fitting)), desc="checking the best layouts on fake tensors", unit="layout")
    for c in fitting:
        if confirmed < confirm:
            c_cfg = _with(cfg, parallelism=c.parallelism(), activation_checkpoint={"mode": c.ac_mode},
                          training={"local_batch_size": c.local_batch, "global_batch_size": global_batch})
            try:
                c_run = resolve_run(c_cfg, ngpu, check_data=False)
                settle_reshard_after_forward(c_run, gpu_memory_gib, model)
                report = estimate_run(c_run, gpu_memory_gib)
            except ConfigError as e:
                notes.append(f"{c.label()}: refused by resolve_run: {e}")
                continue
            c.confirmed_peak = report.peak_bytes
            if c.confirmed_peak > budget:
                notes.append(f"{c.label()} {c.ac_mode} b{c.local_batch}: the fake-tensor estimate "
                             f"({gib(c.confirmed_peak):.1f} GiB) is over the budget; dropped")
                continue
            confirmed += 1
            bar.update()
        ranked.append(c)
        if len(ranked) >= top and confirmed >= min(confirm, len(fitting)):
            break
    bar.close()
    priced = [c.step.documents for c in ranked if c.step.documents is not None]
    if priced:
        notes.append(describe_priced(priced))
    return SearchResult(describe_model(base, model.parameter_count), ngpu, gpu_memory_gib, global_batch, ranked, len(candidates), notes,
                        time.perf_counter() - start)


def format_search(result: SearchResult) -> str:
    title = (f"{result.model} on {result.ngpu} GPU(s), {result.gpu_memory_gib:g} GiB each, global batch "
             f"{result.global_batch}: {len(result.ranked)} shown of {result.considered} layouts priced "
             f"({result.elapsed_s:.1f} s)")
    header = (f"  {'#':>2} {'layout':22s} {'schedule':24s} {'AC':13s} {'batch':>5s} {'accum':>5s} "
              f"{'analytic GiB':>12s} {'fake GiB':>9s} {'tok/s/GPU':>10s}  CP")
    lines = [title, header]
    for i, c in enumerate(result.ranked, 1):
        fake = f"{gib(c.confirmed_peak):9.2f}" if c.confirmed_peak is not None else f"{'-':>9s}"
        lines.append(f"  {i:>2} {c.label():22s} {c.schedule():24s} {c.ac_mode:13s} {c.local_batch:>5d} {c.micro_steps:>5d} "
                     f"{gib(c.analytic_peak):12.2f} {fake} {c.step.tokens_per_s_per_gpu:10.0f}  {c.cp_row}".rstrip())
    if result.ranked:
        lines.append(f"best: {' '.join(result.ranked[0].overrides())}")
    else:
        lines.append("no layout fits: use more GPUs, a shorter sequence or a smaller model")
    lines += [f"note: {n}" for n in result.notes]
    return "\n".join(lines + SEARCH_LEGEND)


SEARCH_LEGEND = [
    "columns: layout = the parallel degrees above 1 (r dp_replicate, s dp_shard (FSDP), tp, pp, cp (the ring;",
    "  cp-ulysses: the all-to-all, parallelism.cp_scheme='ulysses'); zero1: only the optimizer state sharded; 1 GPU:",
    "  none); schedule = parallelism.pp_schedule under pp (x N: pp_stages_per_rank N); AC = activation_checkpoint.mode;",
    "  batch = training.local_batch_size",
    "  (sequences per rank per micro-step); accum = micro-steps per optimizer step; analytic GiB = per-rank peak of the",
    "  analytic model (what ranks the layouts); fake GiB = the peak of the fake-tensor dry run, for the best",
    "  --confirm layouts only (- = not run); tok/s/GPU = modelled throughput; CP = measured where GPUs measured",
    "  that CP scheme at that cp degree (the model is fitted to it), modelled where not. `best:` is the first row",
    "  as overrides.",
]
