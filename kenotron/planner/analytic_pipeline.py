"""Closed-form memory of one pipeline rank under 1F1B: the planner's
first pass for pp layouts, checked against the fake-tensor simulation (pipeline_memory.py).

Notation as in analytic.py, per microbatch: b_m = local batch / microbatches, T = b_m·s tokens;
stage s of p holds k_s blocks (the trainer's own split), the embedding on the first stage and the
final norm and output on the last (a tied embedding is on both: TiedAcrossStages).

Static (exact, from plan.describe on the stage cut out of the meta model as plan.apply cuts it):
  P_s = the stage's local fp32 shards + buffers;  O_s = AdamW on them.
Gradients G_s: FSDP under PP keeps the stage's gradients unsharded (fp32, TP-local) until the
  schedule's reduction, so once the first backward ran the whole stage's are there; without data
  parallel (or with DDP / ZeRO-1) G_s = P_s. With accumulation, data parallel adds the earlier
  micro-steps' P_s (FSDP's sharded accumulation; DDP's / ZeRO-1's whole one).
Compute copies U_s: under data parallel every block of the stage and its root, for the whole step.
  Without data parallel the step runs under one autocast context, whose cache keeps one bf16
  copy of every matmul weight of the stage (under any AC) for all microbatches.
In flight: stage s keeps n_s = min(m, p − s) microbatches (1F1B's warm-up), each with
  k_s·A_block(T) (analytic.block_activations) and the stage's output (torch's fwd_cache); the
  first stage also the embedding's output.
Receive buffers (temporaries): a non-first stage one input buffer per microbatch (m·T·d·c_r), a
  non-last stage one output-gradient buffer per microbatch, allocated once.
Peak = max of these moments, all after the first backward (gradients there):
  backward:  P + O + G + U + n_s in flight + buffers + the MLP's and residual's gradients
             (2·T·F·c/t + 2·T·d·c), and the recomputed block's activations under AC
  loss (last stage, n_s = 1): + the final norm's output, the plain loss's kept logits and
             log-softmax and one more logits-sized tensor the simulation keeps at the loss's
             backward (fp32 under autocast); temporaries the loss's (analytic_loss.loss_bytes)
  embedding backward (first stage): n_s − 1 microbatches in flight, and the embedding's dense
             gradient V·d (fp32 without data parallel, else the compute dtype) as a temporary
  gradient reduction (FSDP/HSDP): the root's fp32 gradient copied for the reduce-scatter, its
             new shard beside the unsharded gradients, the blocks still gathered
Agreement with the simulation: tests/estimate/test_analytic.py (docs/estimation.md).
"""

from __future__ import annotations

import dataclasses

from torch import nn

from kenotron.estimate.static_memory import (
    FP32,
    ParameterBytes,
    data_parallel_kind,
    optimizer_state_bytes,
    parameter_bytes,
)
from kenotron.estimate.tracker import Breakdown, allocated_bytes
from kenotron.parallel.pipeline import stage_module
from kenotron.planner.analytic import activations_per_block, backward_scratch, kinds_activations
from kenotron.planner.analytic_loss import loss_bytes, mtp_loss_bytes
from kenotron.planner.step_shape import StepShape
from kenotron.train.resolve import ResolvedRun


def in_flight(microbatches: int, pp: int, stage: int) -> int:
    """Microbatches whose activations stage `stage` keeps at once in torch's 1F1B order (its warm-up)."""
    return min(microbatches, pp - stage)


def stage_static(run: ResolvedRun, model: nn.Module, units: list[str], cache: dict) -> tuple[ParameterBytes, int]:
    """(parameter bytes, optimizer bytes) of the stage holding `units`, cut as plan.apply cuts it
    (cached: the planner prices many layouts with the same stages)."""
    key = (tuple(units), tuple(run.dims.degrees().items()), run.plan.settings.dp_mode, run.cfg.training.param_dtype,
           run.cfg.optimizer.name)
    if key not in cache:
        if ("module", tuple(units)) not in cache:  # the copy depends on the units only: made once
            cache[("module", tuple(units))] = stage_module(model, units, run.plan.layout.blocks)
        part = cache[("module", tuple(units))]
        params = parameter_bytes(run, part)
        cache[key] = (params, optimizer_state_bytes(run, part, params))
    return cache[key]


def stage_peak(run: ResolvedRun, model: nn.Module, kind: dict[str, bool], stage: int, cache: dict | None = None) -> Breakdown:
    """The closed-form peak of the pipeline rank running `stage` (1F1B)."""
    split = run.plan.pipeline
    assert split is not None and split.schedule == "1F1B"
    params, O = stage_static(run, model, split.units_of(stage), {} if cache is None else cache)
    P = params.local + params.buffers
    first, last = stage == 0, stage == split.n_stages - 1
    blocks = sum(1 for u in split.stages[stage] if run.plan.layout.block_of(u + ".x") is not None)
    m = split.microbatches
    s = StepShape.of(run, kind)
    batch = run.cfg.training.local_batch_size // m
    tokens = batch * s.seq
    tp = s.tp
    sp = tp > 1 and run.plan.settings.sequence_parallel
    s = dataclasses.replace(s, batch=batch, tokens=tokens, residual_tokens=tokens // tp if sp else tokens, layers=blocks)
    dp = data_parallel_kind(run)
    c = s.compute
    # FSDP under PP: gradients stay unsharded in fp32 until the step's reduction; gathered blocks stay gathered.
    full_fp32 = (blocks * params.block_gathered + params.root_gathered) * FP32 // c
    G = full_fp32 if dp in ("fsdp", "hsdp") else params.local
    # FSDP keeps the stage gathered through the step; DDP / ZeRO-1 cast the whole stage once.
    if run.grad_accum_steps > 1 and dp != "none":
        # Earlier micro-steps' gradients: FSDP's sharded accumulation beside the unsharded buffers;
        # ZeRO-1 and DDP keep the whole accumulated gradient beside the new one (without data
        # parallel the schedule accumulates into .grad in place).
        G += params.local
    U = blocks * params.block_gathered + params.root_gathered if dp != "none" else 0

    hidden = allocated_bytes(s.residual_tokens * s.dim * s.residual)
    per_micro = round(blocks * activations_per_block(run, s)) + hidden  # blocks + the stage's output (fwd_cache)
    if first:
        per_micro += hidden  # the embedding's output
    n = in_flight(m, split.pp, stage)
    kept = n * per_micro
    if s.autocast:
        # The whole schedule step runs in one autocast context, whose cache keeps one bf16 copy of
        # each matmul weight for every microbatch (not one per microbatch in flight), under any AC
        # (the checkpointed forward runs with grad enabled, so its casts are cached too).
        kept += blocks * params.block_gathered
    buffers = (0 if first else m * hidden) + (0 if last else m * hidden)
    V = s.vocab // tp
    moments = []
    if last:
        logits, fp32 = allocated_bytes(tokens * V * c), allocated_bytes(tokens * V * FP32)
        loss_kept, loss_temp = loss_bytes(run, s, fused=False)  # the plain loss (vocab-parallel under TP)
        mtp_kept, mtp_temp = mtp_loss_bytes(run, s)  # the MTP heads' losses, on this stage with their modules
        loss_kept, loss_temp = loss_kept + mtp_kept, max(loss_temp, mtp_temp)
        # The final norm's output, the logits and log-softmax, and at the loss's backward one more
        # logits-sized tensor the simulation keeps (fp32 under autocast, whose logits are upcast).
        kept_loss = hidden + loss_kept + (fp32 if s.autocast else logits)
        moments.append(Breakdown(parameters=P, unsharded_parameters=U, gradients=G, optimizer_state=O,
                                 activations=kept + kept_loss, temporaries=buffers + loss_temp))
    if first:
        # The embedding's backward, the last of a microbatch's: that microbatch's activations are
        # gone, the others' are not, and the embedding's dense gradient is a temporary (fp32
        # without data parallel; in the compute dtype under data parallel's mixed precision).
        emb_grad = allocated_bytes(V * s.dim * (FP32 if dp == "none" else c))
        moments.append(Breakdown(parameters=P, unsharded_parameters=U, gradients=G, optimizer_state=O,
                                 activations=kept - per_micro, temporaries=buffers + emb_grad))
    # Gradients are accumulated into the (whole) .grad that exists since the first backward: no
    # per-block gradient temporaries beyond the MLP's and the residual's activation gradients.
    backward_temp = backward_scratch(s)
    if run.plan.settings.ac_mode != "none":
        backward_temp += round(kinds_activations(s, "none", sp))
    moments.append(Breakdown(parameters=P, unsharded_parameters=U, gradients=G, optimizer_state=O,
                             activations=kept, temporaries=buffers + backward_temp))
    if dp in ("fsdp", "hsdp"):
        # The schedule's gradient reduction, at the root's unit (the largest): its fp32 gradient is
        # copied for the reduce-scatter and its new shard sits beside the unsharded gradients; the
        # root's compute copy is resharded, the blocks' are not yet.
        root_fp32 = params.root_gathered * FP32 // c
        moments.append(Breakdown(parameters=P, unsharded_parameters=blocks * params.block_gathered,
                                 gradients=G + root_fp32 // (run.dims.dp_shard * run.dims.cp), optimizer_state=O,
                                 temporaries=root_fp32))
    return max(moments, key=lambda b: b.total)


def pipeline_peaks(
    run: ResolvedRun, model: nn.Module, kind: dict[str, bool], cache: dict | None = None
) -> list[Breakdown] | None:
    """One closed-form peak per pipeline rank, or None for the schedules other than 1F1B (GPipe keeps
    every microbatch's logits on the last stage, the multi-stage schedules hold several stages:
    not priced here; the fake-tensor simulation covers them)."""
    split = run.plan.pipeline
    if split is None or split.schedule != "1F1B":
        return None
    cache = {} if cache is None else cache
    return [stage_peak(run, model, kind, s, cache) for s in range(split.n_stages)]
