"""The bytes a rank holds between steps, exactly, from the plan's own per-parameter table.

`plan.describe` gives every parameter's local shape on a layout without a process group, so
parameters, gradients and optimizer state need no simulation: the fake-tensor estimator takes
ZeRO-1's optimizer state from here (its shallow copies partition fewer parameters than the real
model), and the planner's closed form (kenotron/planner) prices every layout's static bytes with
the same functions. Also the run's data-parallel kind and bf16 mode, as the trainer decides them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from kenotron.degrees import ddp_alone
from kenotron.estimate.breakdown import allocated_bytes
from kenotron.models.common.router import TopKRouter
from kenotron.parallel.data_parallel import head_modules
from kenotron.parallel.model_layout import fqn_matches, matching_modules
from kenotron.parallel.zero1 import partition_params
from kenotron.train.muon_groups import muon_param_groups
from kenotron.train.resolve import ResolvedRun

FP32 = 4
STEP_COUNTER = 512
"""A fused AdamW step counter is a 0-d fp32 tensor on the GPU: one allocator block."""


def zero1_ranks(run: ResolvedRun) -> int:
    """Ranks ZeRO-1 replicates parameters over and shares optimizer state among: dp x cp (the
    context-parallel ranks hold the same parameters, kenotron.parallel.data_parallel)."""
    return run.dims.dp * run.dims.cp


def data_parallel_kind(run: ResolvedRun) -> str:
    """fsdp, hsdp, ddp, zero1 or none, as kenotron.parallel.data_parallel decides it."""
    d = run.dims
    if run.plan.settings.dp_mode == "zero1":
        return "zero1" if zero1_ranks(run) > 1 else "none"
    if d.dp_shard * d.cp > 1:
        return "hsdp" if d.dp_replicate > 1 else "fsdp"
    return "ddp" if d.dp_replicate > 1 else "none"


def ddp_by_hooks(run: ResolvedRun) -> bool:
    """DDP alone, which runs by gradient hooks on plain parameters (parallel/gradient_all_reduce.py):
    no FSDP compute copies, the precision one GPU trains in."""
    return ddp_alone(run.plan.settings.dp_mode, run.dims.degrees())


def experts_outside_fsdp(run: ResolvedRun) -> bool:
    """Whether the routed experts stay outside FSDP (ep = dp_shard x cp without dp_replicate,
    kenotron.parallel.data_parallel): fp32 weights and gradients, a compute copy cast per forward."""
    return bool(run.plan.layout.experts) and run.dims.experts_outside_fsdp and data_parallel_kind(run) == "fsdp"


def experts_with_masters(run: ResolvedRun) -> bool:
    """Whether this run's routed experts are outside FSDP and bf16 with fp32 masters in AdamW: the
    trainer's rule (Choices.expert_masters, kernel_choice/config_checks.py) where the model has
    routed experts and FSDP holds the rest. No compute copy, bf16 gradients, the masters'
    optimizer state."""
    return run.choices.expert_masters and experts_outside_fsdp(run)


def held_parameter_bytes(run: ResolvedRun, params: ParameterBytes) -> int:
    """The parameters (and as much again of gradients) a rank holds: bf16 under master weights,
    the routed experts alone in bf16 under `experts_with_masters`, else fp32 (`ParameterBytes.local`)."""
    if master_weights(run):
        return params.local_bf16
    if experts_with_masters(run):
        return params.local - params.experts_local + params.experts_local_bf16
    return params.local


def one_gpu_fsdp(run: ResolvedRun) -> bool:
    """The trainer's choice of FSDP mixed precision on a single GPU."""
    return run.dims.world_size == 1 and run.choices.precision == "fsdp"


def master_weights(run: ResolvedRun) -> bool:
    """The trainer's choice of bf16 parameters with fp32 masters in AdamW (kernel_choice/choices.py)."""
    return run.choices.precision == "master_weights"


def meta_model(run: ResolvedRun) -> nn.Module:
    """The run's model on the meta device (shapes only, built in milliseconds)."""
    with torch.device("meta"):
        return run.spec.build(run.model_args)


@dataclass(frozen=True)
class ParameterBytes:
    """Per-rank parameter sizes, from plan.describe."""

    local: int
    """Σ local fp32 shards (P)."""
    block_gathered: int
    """One block's parameters gathered over data parallel (TP-local), in the compute dtype."""
    root_gathered: int
    """The parameters outside the blocks, gathered, in the compute dtype."""
    count: int
    """Number of parameter tensors."""
    buffers: int
    """Buffers (RoPE tables)."""
    block_experts: int = 0
    """Of block_gathered, this rank's routed experts (under expert parallelism)."""
    local_bf16: int = 0
    """Σ local shards in bf16 (master weights), each rounded as allocated (small tensors: not half of `local`)."""
    head_gathered: int = 0
    """Of root_gathered, the final norm's and output layer's when FSDP makes them their own unit
    (kenotron.parallel.data_parallel.head_modules; 0 where they stay in the root)."""
    moe_block_gathered: int = 0
    """block_gathered of the first block with routed experts, where dense blocks lead (deepseek_v3's
    n_dense_layers, its MTP modules); 0 where the first block is representative."""
    moe_block_experts: int = 0
    """block_experts of that block (0 likewise)."""
    experts_local: int = 0
    """Of `local`, the routed experts of every layer (fp32, as allocated)."""
    experts_local_bf16: int = 0
    """The same tensors in bf16, as allocated (`experts_with_masters`)."""

    @property
    def moe_block(self) -> int:
        """block_gathered of an MoE block: the first MoE block's where dense blocks lead, else the first's."""
        return self.moe_block_gathered or self.block_gathered

    @property
    def moe_experts(self) -> int:
        """block_experts of an MoE block, likewise."""
        return self.moe_block_experts or self.block_experts

    def blocks_gathered(self, layers: int, dense: int) -> int:
        """`layers` blocks gathered, the first `dense` of them dense (`leading_dense_blocks`)."""
        return dense * self.block_gathered + (layers - dense) * self.moe_block


def leading_dense_blocks(run: ResolvedRun, params: ParameterBytes) -> int:
    """Dense blocks before the MoE ones (deepseek_v3's n_dense_layers) where the parameter table
    sizes an MoE block apart (moe_block_gathered); else 0, the first block standing for all."""
    return getattr(run.model_args, "n_dense_layers", 0) if params.moe_block_gathered else 0


def parameter_bytes(run: ResolvedRun, model: nn.Module) -> ParameterBytes:
    degrees = {k: v for k, v in run.dims.degrees().items() if k != "pp"}
    sharded = run.plan.describe(model, degrees)
    # One block gathered: TP-local and, under expert parallelism, only this rank's experts.
    tp_only = run.plan.describe(model, {"tp": run.dims.tp, "ep": run.dims.ep})
    c_p = 2 if run.cfg.training.param_dtype == "bfloat16" else FP32
    experts = run.plan.layout.experts

    def gathered(prefix: str, only_experts: bool = False) -> int:
        return sum(math.prod(r["local_shape"]) * c_p for r in tp_only if r["name"].startswith(prefix)
                   and (not only_experts or (experts and fqn_matches(experts, r["name"].rpartition(".")[0]))))

    block_names = [name + "." for name, _ in matching_modules(model, run.plan.layout.blocks)]
    first_block = block_names[0]
    block, block_experts = gathered(first_block), gathered(first_block, only_experts=True)
    root = sum(math.prod(r["local_shape"]) * c_p for r in tp_only if run.plan.layout.block_of(r["name"]) is None)
    # Dense blocks first (deepseek_v3): the first block with experts, for the MoE blocks.
    first_moe = next((b for b in block_names if gathered(b, only_experts=True)), first_block) if not block_experts else first_block
    head = [name for name, m in model.named_children() if any(m is h for h in head_modules(model, run.plan.layout))]
    split_head = (data_parallel_kind(run) in ("fsdp", "hsdp") and run.dims.dp_shard * run.dims.cp > 1
                  and run.dims.pp == 1 and head)
    head_bytes = sum(math.prod(r["local_shape"]) * c_p for r in tp_only if r["name"].split(".")[0] in head)
    sharded_experts = [r for r in sharded if experts and fqn_matches(experts, r["name"].rpartition(".")[0])]
    return ParameterBytes(
        head_gathered=head_bytes if split_head else 0,
        local=sum(allocated_bytes(r["bytes"]) for r in sharded),
        block_gathered=block, root_gathered=root, count=len(sharded),
        buffers=sum(allocated_bytes(b.numel() * b.element_size()) for b in model.buffers()) + _balance_state(model),
        block_experts=block_experts,
        moe_block_gathered=gathered(first_moe) if first_moe != first_block else 0,
        moe_block_experts=gathered(first_moe, only_experts=True) if first_moe != first_block else 0,
        local_bf16=sum(allocated_bytes(r["bytes"] // 2) for r in sharded),
        experts_local=sum(allocated_bytes(r["bytes"]) for r in sharded_experts),
        experts_local_bf16=sum(allocated_bytes(r["bytes"] // 2) for r in sharded_experts),
    )


def _balance_state(model: nn.Module) -> int:
    """The step's MoE statistics kept between steps (train/expert_balance.py): each MoE layer's
    collapse streak (int64) and last loads and losses (fp32)."""
    routers = [m for m in model.modules() if isinstance(m, TopKRouter)]
    if not routers:
        return 0
    return allocated_bytes(len(routers) * 8) + allocated_bytes(len(routers) * (routers[0].n_experts + 2) * FP32)


def _muon_state_bytes(run: ResolvedRun, model: nn.Module, params: ParameterBytes) -> int:
    """Muon's state (train/muon.py): one fp32 momentum buffer per Muon matrix, AdamW's two moments
    and step counter for the rest; ZeRO-1: the fullest rank of the partition of those groups.
    Newton–Schulz's gather buffers are transient: the estimator's simulated optimizer step holds
    them (its optimizer phase), this closed form does not."""
    groups = muon_param_groups(model, run.cfg.optimizer, run.cfg.model.parametrization)
    names = {id(p): n for n, p in model.named_parameters()}
    rows = {r["name"]: r for r in run.plan.describe(model, {"tp": run.dims.tp})}
    ordered = [(names[id(p)], g["muon"]) for g in groups for p in g["params"]]

    def state(name: str, muon: bool) -> int:
        return allocated_bytes(rows[name]["bytes"]) if muon else 2 * allocated_bytes(rows[name]["bytes"]) + STEP_COUNTER

    if data_parallel_kind(run) != "zero1":
        total = sum(rows[n]["bytes"] for n, _ in ordered)
        muon_share = sum(rows[n]["bytes"] for n, muon in ordered if muon) / max(total, 1)
        return round((2 - muon_share) * params.local) + STEP_COUNTER * sum(not muon for _, muon in ordered)
    named = dict(model.named_parameters())
    owner = partition_params([named[n] for n, _ in ordered], zero1_ranks(run))
    per_rank = [0] * zero1_ranks(run)
    for (name, muon), rank in zip(ordered, owner):
        per_rank[rank] += state(name, muon)
    return max(per_rank)


def optimizer_state_bytes(run: ResolvedRun, model: nn.Module, params: ParameterBytes) -> int:
    """AdamW moments + step counters on the rank holding the most (ZeRO-1: the partition's largest);
    Muon's momentum for its matrices and AdamW's state for the rest."""
    if run.cfg.optimizer.name == "muon":
        return _muon_state_bytes(run, model, params)
    if run.cfg.optimizer.name != "adamw":
        return 0
    if master_weights(run):  # the fp32 masters beside the moments (params.local counts fp32 bytes)
        return 3 * params.local + STEP_COUNTER * params.count
    if experts_with_masters(run):  # the routed experts' fp32 masters beside every parameter's moments
        return 2 * params.local + params.experts_local + STEP_COUNTER * params.count
    if data_parallel_kind(run) != "zero1":
        return 2 * params.local + STEP_COUNTER * params.count
    rows = {r["name"]: r for r in run.plan.describe(model, {"tp": run.dims.tp})}
    named = dict(model.named_parameters())
    ordered = [n for n, p in named.items() if p.ndim >= 2] + [n for n, p in named.items() if p.ndim < 2]
    owner = partition_params([named[n] for n in ordered], zero1_ranks(run))
    per_rank = [0] * zero1_ranks(run)
    for name, rank in zip(ordered, owner):
        per_rank[rank] += 2 * allocated_bytes(rows[name]["bytes"]) + STEP_COUNTER
    return max(per_rank)


def zero1_correction(run: ResolvedRun, model: nn.Module, simulated_optimizer_state: int) -> int:
    """ZeRO-1: bytes to add to a simulated rank's optimizer state to get the fullest rank's.

    The shallow simulated models partition fewer parameters than the real one (`model`, on meta),
    and rank 0 need not be the fullest, so the optimizer state is taken from the real partition.
    """
    if data_parallel_kind(run) != "zero1" or run.cfg.optimizer.name not in ("adamw", "muon"):
        return 0
    return optimizer_state_bytes(run, model, parameter_bytes(run, model)) - simulated_optimizer_state
