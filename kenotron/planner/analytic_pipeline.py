"""Closed-form memory of one pipeline rank under any schedule kenotron runs (parallelism.pp_schedule):
the planner's first pass for pp layouts, checked against the fake-tensor simulation (pipeline_memory.py).

Notation as in analytic.py, per microbatch: b_m = local batch / microbatches, T = b_m·s tokens;
stage s holds k_s blocks (the trainer's own split), the embedding on the first stage and the
final norm and output on the last (a tied embedding is on both: TiedAcrossStages). A rank runs
its local stages (split.local_stages: one under GPipe and 1F1B, v under the looped schedules, the
two arms of a V under ZBVZeroBubble and DualPipeV), and every term below is summed over them.

Static (exact, from plan.describe on the stage cut out of the meta model as plan.apply cuts it):
  P_s = the stage's local fp32 shards + buffers;  O_s = AdamW on them.
Gradients G_s: FSDP under PP keeps the stage's gradients unsharded (TP-local, in the reduce
  dtype: fp32, the routed experts' bf16 under fsdp_reduce_dtype auto) until the schedule's
  reduction; without data parallel (or with DDP / ZeRO-1) G_s = P_s. They appear at the stage's
  first backward of the step (weight gradients are made anew each step). With accumulation, data
  parallel adds the earlier micro-steps' P_s (FSDP's sharded accumulation; DDP's / ZeRO-1's whole).
Compute copies U_s: under data parallel every block of the stage (a leading dense block at its
  size, the others an MoE block's) and its root, for the whole step. Without data parallel the
  step runs under one autocast context, whose cache keeps one bf16 copy of every matmul weight of
  the stage (under any AC) for all microbatches; the routed experts' grouped GEMM saves its bf16
  copy of their weights with each microbatch instead.
In flight: the schedule's own order (pipeline_order.schedule_orders: 1F1B's warm-up of min(m, pp − s)
  forwards, the looped and V schedules' orders as torch computes them) says at each action how
  many microbatches each local stage holds: A_s = k_s·A_block(T) (analytic.block_activations,
  the MoE layer at a microbatch's tokens) and the stage's output (torch's fwd_cache), the first
  stage also the embedding's output, the last its loss's logits and log-softmax, from a
  microbatch's forward to its backward. The zero-bubble schedules split the backward: after the
  input pass (I) a microbatch keeps its saved tensors (torch's retain_graph) and the gradients of
  its weights' outputs (the intermediates torch's param groups hold) until the weight pass (W),
  the loss's graph freed; the first stage runs its whole backward in the weight pass.
Receive buffers (temporaries): a non-first stage one input buffer per microbatch (m·T·d·c_r), a
  non-last stage one output-gradient buffer per microbatch, allocated once.
Peak = max of these moments, the in-flight bytes and gradients read at the action where each happens:
  backward (B, I or W of any local stage): P + O + G (of the stages whose backward ran) + U + in
             flight + buffers + the MLP's and residual's gradients (2·T·F·c/t + 2·T·d·c), the
             recomputed block under AC, and an MoE block's stacked expert weight gradient (its
             saved bf16 copy gone by then)
  loss backward (B or I of the last stage): + one more logits-sized tensor the simulation keeps
             (fp32 under autocast); temporaries the loss's (analytic_loss.loss_bytes)
  embedding backward (B or W of the first stage): that microbatch's activations gone, the stage's
             gradients made, the embedding's dense gradient V·d (fp32 without data parallel, else
             the compute dtype)
  gradient reduction (FSDP/HSDP): the largest root's gradient copied for the reduce-scatter,
             its new shard beside the unsharded gradients, the blocks still gathered
The zero-bubble schedules under full AC are priced low (their weight pass holds more than this
counts; docs/estimation.md). Agreement with the simulation: tests/planner/test_analytic.py and
test_analytic_pipeline.py (docs/estimation.md).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from torch import nn

from kenotron.estimate.breakdown import Breakdown, allocated_bytes
from kenotron.estimate.pipeline_order import Action, schedule_orders
from kenotron.estimate.static_memory import (
    FP32,
    ParameterBytes,
    data_parallel_kind,
    optimizer_state_bytes,
    parameter_bytes,
)
from kenotron.parallel.pipeline import PipelineSplit, stage_module
from kenotron.planner.analytic import activations_per_block, backward_scratch, kinds_activations
from kenotron.planner.analytic_loss import loss_bytes, mtp_loss_bytes
from kenotron.planner.step_shape import StepShape
from kenotron.train.resolve import ResolvedRun


def _structure(model: nn.Module, units: list[str], blocks: str, cache: dict) -> tuple:
    """What a stage's static bytes depend on: its edge units by name, and each block by its
    parameters' names within the block and shapes (blocks alike under other indices are one)."""
    container = blocks.split(".")[0]
    out = []
    for unit in units:
        if not unit.startswith(container + "."):
            out.append(unit)
            continue
        if ("structure", unit) not in cache:
            cache[("structure", unit)] = tuple((n, tuple(p.shape)) for n, p in model.get_submodule(unit).named_parameters())
        out.append(cache[("structure", unit)])
    return tuple(out)


def stage_static(run: ResolvedRun, model: nn.Module, units: list[str], cache: dict) -> tuple[ParameterBytes, int]:
    """(parameter bytes, optimizer bytes) of the stage holding `units`, cut as plan.apply cuts it
    (cached by the stage's structure: the planner prices many layouts whose stages hold blocks
    alike, under other indices and other splits)."""
    key = (_structure(model, units, run.plan.layout.blocks, cache), tuple(run.dims.degrees().items()),
           run.plan.settings.dp_mode, run.cfg.training.param_dtype, run.cfg.optimizer.name)
    if key not in cache:
        if ("module", tuple(units)) not in cache:  # the copy depends on the units only: made once
            cache[("module", tuple(units))] = stage_module(model, units, run.plan.layout.blocks)
        part = cache[("module", tuple(units))]
        params = parameter_bytes(run, part)
        cache[key] = (params, optimizer_state_bytes(run, part, params))
    return cache[key]


def rank_orders(split: PipelineSplit, cache: dict) -> list[list[Action]]:
    """Every pipeline rank's actions (cached by schedule, ranks, stages and microbatches: the
    looped schedules' orders come from torch's classes, a few ms each)."""
    key = ("orders", split.schedule, split.pp, split.n_stages, split.microbatches)
    if key not in cache:
        cache[key] = schedule_orders(split)
    return cache[key]


@dataclass(frozen=True)
class StageMemory:
    """One stage's closed-form terms (the module doc's), in bytes."""

    first: bool
    last: bool
    static: Breakdown
    """P, O, G and U of the stage (plus the autocast cache of its weights, in activations) and its
    receive buffers (temporaries)."""
    per_micro: int
    """A microbatch in flight: its blocks' activations and the stage's output (and the embedding's)."""
    weight_pending: int
    """A microbatch between its input pass and its weight pass (zero-bubble schedules)."""
    root_fp32: int
    """The stage root's gradient in fp32 (what the schedule's reduction copies)."""
    blocks_gathered: int
    """The stage's blocks' compute copies."""
    loss: Breakdown | None
    """On the last stage: what its loss adds (activations and temporaries)."""
    embedding_grad: int
    """On the first stage: the embedding's dense gradient, a temporary of its backward."""
    experts_grad: int
    """An MoE block's routed experts' weight gradient, made whole (one stacked tensor per weight)
    before it is added to .grad: a temporary of the block's backward (0 without experts); under
    autocast the bf16 copy of the weights its microbatch saved (in per_micro) is gone by then."""
    experts_copy: int
    """Under autocast, one MoE block's bf16 copy of its experts' weights saved with a microbatch."""


def _weight_output_grads(s: StepShape) -> int:
    """Per block, the gradients of its matmuls' outputs that torch's input pass keeps for the
    weight pass: q, k, v, the attention output projection, and the MLP's (MoE: its dense share)."""
    T, t, c = s.tokens, s.tp, s.compute
    attention = T * (s.heads + 2 * s.kv_heads) * s.head_dim // t + T * s.dim
    mlp = (3 if s.gated_mlp else 2) * T * s.ffn // t if s.moe is None else 2 * T * s.dim
    return allocated_bytes(attention * c) + allocated_bytes(mlp * c)


def microbatch_shape(run: ResolvedRun, kind: dict[str, bool], blocks: int, dense: int = 0) -> StepShape:
    """The sizes of one microbatch on a stage of `blocks` blocks, `dense` of them leading dense
    blocks: StepShape's micro-step cut into microbatches, the MoE layer's tokens too."""
    split = run.plan.pipeline
    assert split is not None
    s = StepShape.of(run, kind)
    batch = run.cfg.training.local_batch_size // split.microbatches
    tokens = batch * s.seq
    sp = s.tp > 1 and run.plan.settings.sequence_parallel
    moe = dataclasses.replace(s.moe, tokens=tokens // s.tp) if s.moe is not None else None
    return dataclasses.replace(s, batch=batch, tokens=tokens, residual_tokens=tokens // s.tp if sp else tokens,
                               layers=blocks, dense_blocks=dense if s.dense_blocks else 0, moe=moe)


def stage_memory(run: ResolvedRun, model: nn.Module, kind: dict[str, bool], stage: int, cache: dict) -> StageMemory:
    """The closed-form terms of `stage`."""
    split = run.plan.pipeline
    assert split is not None
    params, O = stage_static(run, model, split.units_of(stage), cache)
    P = params.local + params.buffers
    first, last = stage == 0, stage == split.n_stages - 1
    block_units = [u for u in split.stages[stage] if run.plan.layout.block_of(u + ".x") is not None]
    blocks = len(block_units)
    # Leading dense blocks (deepseek_v3) are the first stages' only: count this stage's own.
    n_dense = getattr(run.model_args, "n_dense_layers", 0)
    dense = sum(1 for u in block_units if int(u.rpartition(".")[2]) < n_dense)
    m = split.microbatches
    s = microbatch_shape(run, kind, blocks, dense)
    tokens, tp, sp = s.tokens, s.tp, s.tp > 1 and run.plan.settings.sequence_parallel
    dp = data_parallel_kind(run)
    c = s.compute
    # The stage's blocks gathered: a leading dense block is the first block's size, the others an
    # MoE block's (static_memory's moe_block_gathered where the first block is a dense one).
    moe_experts = params.moe_experts
    blocks_gathered = params.blocks_gathered(blocks, dense)
    # FSDP under PP: gradients stay unsharded until the step's reduction, in the reduce dtype (fp32;
    # the routed experts in bf16 under fsdp_reduce_dtype auto); gathered blocks stay gathered.
    reduce_size = [FP32 if dtype == "float32" else 2 for dtype in run.plan.settings.reduce_dtypes()]
    experts = (blocks - dense) * moe_experts
    full = ((blocks_gathered - experts + params.root_gathered) * reduce_size[0] + experts * reduce_size[1]) // c
    G = full if dp in ("fsdp", "hsdp") else params.local
    if run.grad_accum_steps > 1 and dp != "none":
        # Earlier micro-steps' gradients: FSDP's sharded accumulation beside the unsharded buffers;
        # ZeRO-1 and DDP keep the whole accumulated gradient beside the new one (without data
        # parallel the schedule accumulates into .grad in place).
        G += params.local
    # FSDP keeps the stage gathered through the step; DDP / ZeRO-1 cast the whole stage once.
    U = blocks_gathered + params.root_gathered if dp != "none" else 0
    hidden = allocated_bytes(s.residual_tokens * s.dim * s.residual)
    per_micro = round(blocks * activations_per_block(run, s)) + hidden  # blocks + the stage's output (fwd_cache)
    if first:
        per_micro += hidden  # the embedding's output
    # The whole schedule step runs in one autocast context, whose cache keeps one bf16 copy of each
    # matmul weight for every microbatch (not one per microbatch in flight), under any AC (the
    # checkpointed forward runs with grad enabled, so its casts are cached too); the routed
    # experts' grouped GEMM casts its weights itself and saves the copies with each microbatch.
    autocast_cache = blocks_gathered - experts if s.autocast else 0
    if s.autocast:
        per_micro += experts
    buffers = (0 if first else m * hidden) + (0 if last else m * hidden)
    static = Breakdown(parameters=P, unsharded_parameters=U, gradients=G, optimizer_state=O,
                       activations=autocast_cache, temporaries=buffers)
    V = s.vocab // tp
    loss = None
    if last:
        logits, fp32 = allocated_bytes(tokens * V * c), allocated_bytes(tokens * V * FP32)
        loss_kept, loss_temp = loss_bytes(run, s, fused=False)  # the plain loss (vocab-parallel under TP)
        mtp_kept, mtp_temp = mtp_loss_bytes(run, s)  # the MTP heads' losses, on this stage with their modules
        # The final norm's output, the logits and log-softmax, and at the loss's backward one more
        # logits-sized tensor the simulation keeps (fp32 under autocast, whose logits are upcast).
        # Every microbatch in flight on the last stage keeps its loss's graph until its backward.
        per_micro += hidden + loss_kept + mtp_kept
        loss = Breakdown(activations=fp32 if s.autocast else logits, temporaries=max(loss_temp, mtp_temp))
    # The embedding's dense gradient (fp32 without data parallel; the compute dtype under data
    # parallel's mixed precision).
    embedding_grad = allocated_bytes(V * s.dim * (FP32 if dp == "none" else c)) if first else 0
    # Between the input and the weight pass a microbatch keeps its saved tensors and the gradients
    # of its weights' outputs; torch detaches the stage's output there, which frees the loss's graph
    # (its kept tensors) but for the logits' gradient, the output weight's.
    # Under activation checkpointing the input pass recomputes the blocks' forward, and the graph it
    # retains for the weight pass keeps the recomputed tensors too.
    recomputed = 0
    if run.plan.settings.ac_mode != "none":
        recomputed = round(blocks * kinds_activations(s, "none", sp))
    pending = per_micro + recomputed + blocks * _weight_output_grads(s)
    if last:
        pending += allocated_bytes(tokens * V * c) - loss_kept - mtp_kept
    # The gradient has the parameters' dtype: fp32 without data parallel (autocast), else the compute dtype.
    experts_grad = moe_experts * (FP32 // c if dp == "none" else 1) if blocks > dense else 0
    experts_copy = moe_experts if s.autocast and blocks > dense else 0
    return StageMemory(first, last, static, per_micro, pending, params.root_gathered * reduce_size[0] // c,
                       blocks_gathered, loss, embedding_grad, experts_grad, experts_copy)


def _plus(a: Breakdown, b: Breakdown) -> Breakdown:
    return Breakdown(**{k: v + getattr(b, k) for k, v in a.as_dict().items()})


@dataclass(frozen=True)
class FlightPoint:
    """The in-flight state of a rank at one compute action of its order."""

    action: Action
    before: int
    """Bytes in flight when the action starts."""
    after: int
    """Bytes in flight when it ends."""
    gradients: int
    """Gradient bytes present when it starts: the stages that ran a backward already this step
    (weight gradients are made anew each step; with accumulation they are there throughout)."""
    stage_graded: bool
    """The action's stage has its gradients already."""


def in_flight_bytes(actions: list[Action], stages: dict[int, StageMemory], accumulating: bool = False) -> list[FlightPoint]:
    """Each compute action of a rank's order with the bytes in flight: each local stage's
    microbatches between forward and backward (per_micro each), and under the zero-bubble
    schedules those between their input and weight passes (weight_pending each)."""
    graded = set(stages) if accumulating else set()
    kept = 0
    gradients = sum(stages[s].static.gradients for s in graded)
    out = []
    for a in actions:
        if a.kind not in ("F", "B", "I", "W"):
            continue
        m = stages[a.stage]
        before, stage_graded = kept, a.stage in graded
        if a.kind == "F":
            kept += m.per_micro
        elif a.kind == "B" or (a.kind == "W" and m.first):  # the first stage's I is empty: its W runs it all
            kept -= m.per_micro
        elif a.kind == "I" and not m.first:
            kept += m.weight_pending - m.per_micro
        elif a.kind == "W":
            kept -= m.weight_pending
        out.append(FlightPoint(a, before, kept, gradients, stage_graded))
        if not stage_graded and (a.kind in ("B", "W") or (a.kind == "I" and m.first)):  # its gradients made
            graded.add(a.stage)
            gradients += m.static.gradients
    return out


def rank_peak(run: ResolvedRun, model: nn.Module, kind: dict[str, bool], pp_rank: int, cache: dict) -> Breakdown:
    """The closed-form peak of pipeline rank `pp_rank` (its local stages, in its schedule's order)."""
    split = run.plan.pipeline
    assert split is not None
    stages = {s: stage_memory(run, model, kind, s, cache) for s in split.local_stages(pp_rank)}
    static = Breakdown()
    for m in stages.values():
        static = _plus(static, m.static)
    profile = in_flight_bytes(rank_orders(split, cache)[pp_rank], stages, run.grad_accum_steps > 1)
    s = microbatch_shape(run, kind, StepShape.of(run, kind).layers)
    sp = s.tp > 1 and run.plan.settings.sequence_parallel
    # Gradients are accumulated into the (whole) .grad that exists since the stage's first backward:
    # no per-block gradient temporaries beyond the MLP's and the residual's activation gradients.
    backward_temp = backward_scratch(s)
    if run.plan.settings.ac_mode != "none":
        backward_temp += round(kinds_activations(s, "none", sp))

    # Each moment as (gradients, bytes in flight, temporaries beside the buffers): a block's backward
    # (with the gradients of the stages whose backward ran already: at a stage's first backward its
    # own are being made), the last stage's loss backward, the first stage's embedding backward (the
    # last of a microbatch's: its activations are gone, the stage's gradients made, the embedding's
    # dense gradient a temporary).
    moments: list[tuple[int, int, int]] = []
    for p in profile:
        if p.action.kind == "F":
            continue
        m = stages[p.action.stage]
        moments.append((p.gradients, p.before - m.experts_copy, backward_temp + m.experts_grad))
        if m.loss is not None and p.action.kind in ("B", "I"):
            moments.append((p.gradients, p.before + m.loss.activations, m.loss.temporaries))
        if m.first and p.action.kind in ("B", "W"):
            own = 0 if p.stage_graded else m.static.gradients
            moments.append((p.gradients + own, p.before - m.per_micro, m.embedding_grad))
    gradients, kept, temporaries = max(moments, key=sum)
    peak = dataclasses.replace(static, gradients=gradients, activations=static.activations + kept,
                               temporaries=static.temporaries + temporaries)
    if data_parallel_kind(run) in ("fsdp", "hsdp"):
        # The schedule's gradient reduction, at a root's unit (the largest): its fp32 gradient is
        # copied for the reduce-scatter and its new shard sits beside the unsharded gradients; the
        # root's compute copy is resharded, the blocks' are not yet.
        root_fp32 = max(m.root_fp32 for m in stages.values())
        reduction = Breakdown(
            parameters=static.parameters, optimizer_state=static.optimizer_state,
            unsharded_parameters=sum(m.blocks_gathered for m in stages.values()),
            gradients=static.gradients + root_fp32 // (run.dims.dp_shard * run.dims.cp), temporaries=root_fp32)
        peak = max(peak, reduction, key=lambda b: b.total)
    return peak


def pipeline_peaks(
    run: ResolvedRun, model: nn.Module, kind: dict[str, bool], cache: dict | None = None
) -> list[Breakdown] | None:
    """One closed-form peak per pipeline rank, or None without a pipeline."""
    split = run.plan.pipeline
    if split is None:
        return None
    cache = {} if cache is None else cache
    return [rank_peak(run, model, kind, r, cache) for r in range(split.pp)]
