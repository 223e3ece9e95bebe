"""The compute side of the step-time model (throughput.py): what one rank's kernels cost in an
optimizer step, unit by unit, and how the stages of a pipeline add up.

Work per token of a unit (a top-level module: the embedding, a block, the final norm, the output):
  6·N_u matmul FLOPs (N_u its matmul parameters, an MoE layer's routed experts at top_k /
  n_experts: train/flops.py), and per block its share of the family's mixing FLOPs, split into
  what grows with the sequence (attention's 12·H·h·s, on attention blocks) and what does not
  (Mamba-2's scan, on Mamba blocks).
Seconds of a micro-step of T tokens on one rank over a set of units U (tp splits every product
and the vocabulary; cp the tokens; r_* the reruns of activation checkpointing, Recompute):
  kernels  = T/tp · (6·N_U·r_mm / e_mm + (A_U / e_attn + S_U / e_scan)·r_attn) / peak
             + T · B_U · κ · E · r_elem / B_mem   (B_U the blocks in U, E the bytes a block keeps
             for backward without AC per token (analytic.py): the elementwise kernels between the
             products move κ times that)
  loss     = T · V/tp · β / B_mem where U holds the output layer (and once more per MTP head, whose
             output-layer products count in its unit's N_u): memory-bound, β bytes per logit
             (fused chunked loss 8: its Triton chunk kernel and scaling passes, read off their
             measured time, docs/estimation.md; plain loss 48: the fp32 copy of the logits,
             log-softmax, its backward and the cast back, each pass reading and writing them)
  accumulate = P_U · 18 / B_mem for every microbatch whose weight gradients are added in fp32 to
             unsharded ones (pipeline stages, accumulation without FSDP): the bf16 gradient cast
             to fp32 (6 bytes a parameter) and added (12)
Per step and rank: P · (32 + 6 under autocast) / B_mem: AdamW reads the parameter, gradient and
  both moments and writes three of them (28 bytes, docs/performance.md), the gradient norm reads
  the gradient again (4), autocast casts every weight to bf16 once (6).
A pipeline's step is its schedule's order on a timeline (pipeline_timeline.py), each stage's
actions lasting its share of C_s, the seconds per microbatch of stage s. Stages are priced unit
by unit, not as equal shares, because the output layer and the loss weigh several blocks while
the trainer's default split counts them as one: the last stage is then the slowest
(docs/estimation.md, Throughput model).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from torch import nn

from kenotron.models.common.mamba import MambaBlock
from kenotron.parallel.pipeline import pipeline_units
from kenotron.planner.analytic import kinds_activations
from kenotron.planner.analytic_moe import elementwise_pricing
from kenotron.planner.hardware import Hardware
from kenotron.planner.step_shape import StepShape
from kenotron.train.flops import active_matmul_params
from kenotron.train.mtp import fused_heads
from kenotron.train.resolve import ResolvedRun

FUSED_LOSS_BYTES = 8
"""Bytes moved per logit by the fused chunked loss (forward and backward): the Triton kernel's write,
two reads and the gradient written over the logits; the vocabulary-parallel loss's compiled step
moves as many (the write, its stats read, the gradient kernel's read and write) around one small
all-gather per chunk, left out."""
PLAIN_LOSS_BYTES = 48
"""Bytes moved per logit by the plain loss (fp32 copy, log-softmax, its backward, the cast back)."""
ACCUMULATE_BYTES = 18
"""Bytes per parameter and microbatch of adding a bf16 weight gradient to an fp32 one."""
OPTIMIZER_BYTES = 32
"""Bytes per parameter and step of AdamW (28) and the gradient norm (4)."""
AUTOCAST_CAST_BYTES = 6
"""Bytes per parameter and step of autocast's one bf16 copy of every weight."""


@dataclass(frozen=True)
class Unit:
    """One top-level module of the model, as the pipeline split names it."""

    name: str
    matmul_params: int
    """Parameters in matrix products (active ones for MoE: train/flops.py)."""
    params: int
    """All its parameters (what the optimizer updates)."""
    kind: str
    """attention (an attention block), mamba (a Mamba-2 block) or edge (embedding, norm, output)."""
    output: bool = False
    """Holds the output projection (the loss runs after it)."""
    head_calls: int = 0
    """Further calls of the output projection, each with its loss, that this unit makes (deepseek_v3's
    MTP modules' heads: its `mtp` unit); counted in matmul_params too."""


def model_units(model: nn.Module, blocks: str) -> list[Unit]:
    """The units of a (meta) model in forward order."""
    before, block_names, after = pipeline_units(model, blocks)
    # The last edge unit with parameters (deepseek_v3's `mtp`, after the output layer, has none).
    with_params = [name for name in after if any(True for _ in model.get_submodule(name).parameters())]
    output = with_params[-1] if with_params else block_names[-1]
    head_params = active_matmul_params(model.get_submodule(output))
    out = []
    for name in before + block_names + after:
        module = model.get_submodule(name)
        kind = "edge" if name not in block_names else "mamba" if isinstance(module, MambaBlock) else "attention"
        heads = getattr(module, "head_calls", 0)
        out.append(Unit(name, active_matmul_params(module) + heads * head_params,
                        sum(p.numel() for p in module.parameters()), kind, name == output, heads))
    return out


@dataclass(frozen=True)
class Recompute:
    """Factors on each kind of work from activation checkpointing's reruns (throughput.recompute)."""

    matmul: float
    attention: float
    """Attention and the scan."""
    elementwise: float


@dataclass(frozen=True)
class Rates:
    """Seconds per token of each kind of work on one rank (1/tp of every product)."""

    matmul: float
    """Per matmul parameter."""
    attention: float
    """Per attention block."""
    scan: float
    """Per Mamba block."""
    elementwise: float
    """Per block: the memory-bound kernels between the products."""


def rates(run: ResolvedRun, units: list[Unit], kind: dict, recompute: Recompute, hw: Hardware) -> Rates:
    """The rates of `run`'s layout; `kind` is analytic.block_kind's (what the activation formula reads)."""
    a, s = run.model_args, run.cfg.training.seq_len
    mixing = run.spec.mixing_flops(a, s)
    scan = run.spec.mixing_flops(a, 0)  # the part that does not grow with the sequence
    n_attention = sum(u.kind == "attention" for u in units) or 1
    n_mamba = sum(u.kind == "mamba" for u in units) or 1
    per_flop = 1 / (hw.peak_flops * run.dims.tp)
    shape = StepShape.of(run, kind)
    exchanged = 0.0  # per block, the MoE exchange's results (analytic_moe.elementwise_pricing)
    if shape.moe is not None:
        moe, results = elementwise_pricing(shape.moe, shape.dim, shape.compute)
        exchanged = results * (shape.layers - min(shape.dense_blocks, shape.layers)) / (shape.layers or 1)
        shape = dataclasses.replace(shape, moe=moe)
    sp = run.dims.tp > 1 and run.plan.settings.sequence_parallel
    # the bytes per token the elementwise kernels are priced on: what a block keeps without AC, and
    # the MoE exchange's results
    activations = (kinds_activations(shape, "none", sp) + exchanged) / shape.tokens
    return Rates(6 * per_flop * recompute.matmul / hw.matmul_efficiency,
                 (mixing - scan) / n_attention * per_flop * recompute.attention / hw.attention_efficiency,
                 scan / n_mamba * per_flop * recompute.attention / hw.scan_efficiency,
                 hw.elementwise_passes * activations * recompute.elementwise / hw.memory_bytes_per_s)


def kernel_seconds(run: ResolvedRun, units: list[Unit], r: Rates, tokens: int, hw: Hardware) -> float:
    """Seconds of one forward and backward of `tokens` (this rank's) through `units`."""
    per_token = sum(u.matmul_params * r.matmul + (r.attention if u.kind == "attention" else 0.0)
                    + (r.scan if u.kind == "mamba" else 0.0) + (r.elementwise if u.kind != "edge" else 0.0)
                    for u in units)
    seconds = tokens * per_token
    logits = tokens * run.model_args.vocab_size / run.dims.tp
    if any(u.output for u in units):
        per_logit = FUSED_LOSS_BYTES if run.choices.fused_loss else PLAIN_LOSS_BYTES
        seconds += logits * per_logit / hw.memory_bytes_per_s
    heads = sum(u.head_calls for u in units)
    if heads:  # the MTP heads' losses (train/mtp.py's fused_heads)
        seconds += heads * logits * (FUSED_LOSS_BYTES if fused_heads(run) else PLAIN_LOSS_BYTES) / hw.memory_bytes_per_s
    return seconds


def accumulate_seconds(params: float, hw: Hardware) -> float:
    """One microbatch's fp32 gradient accumulation over `params` (this rank's) parameters."""
    return params * ACCUMULATE_BYTES / hw.memory_bytes_per_s


def optimizer_seconds(run: ResolvedRun, params: float, hw: Hardware) -> float:
    """The optimizer step (and autocast's weight casts) over `params` (this rank's) parameters;
    Muon adds Newton–Schulz's matmuls: steps x ~6 m^2 n FLOPs for an m x n matrix, taken as
    6 * dim FLOPs per parameter per step (square matrices of the model's width; the owner
    redistribution splits the matrices over the ranks as FSDP splits the parameters)."""
    per_param = OPTIMIZER_BYTES + (AUTOCAST_CAST_BYTES if run.choices.precision == "autocast" else 0)
    seconds = params * per_param / hw.memory_bytes_per_s
    if run.cfg.optimizer.name == "muon":
        dim = getattr(run.model_args, "dim", 0)
        seconds += run.cfg.optimizer.muon_ns_steps * 6 * dim * params / (hw.peak_flops * hw.matmul_efficiency)
    return seconds
