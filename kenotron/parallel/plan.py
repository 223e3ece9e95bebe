"""Plans are data: how one model is parallelized, built without a process group.

A `Plan` holds, as plain fields, the tensor-parallel style of each module (by FQN pattern),
where sequence parallel applies, whether the loss is vocab-parallel, the data-parallel mode
and its units, activation checkpointing and compile. Print it (a table), compare two
(`plan.diff(other)`), edit it (it is a dataclass: change a field, add or drop a style),
ask what it does to each parameter on a given mesh shape (`plan.describe(model, {...})`,
no process group needed), then `plan.apply(model, meshes)`:

    pipeline split -> TP/SP -> CP -> activation checkpointing -> compile -> FSDP

With context parallel (a `cp` mesh dimension), the CP step replaces the `attention_fn` of the
modules `attention_modules` names (kenotron/parallel/context/apply.py), and the applied plan's
`sequence_sharder` slices each batch for this rank.

With pipeline parallel, `plan.pipeline` (a `PipelineSplit`) lists the modules of every stage;
`apply` cuts this rank's stages out of the model first and runs the rest on each of them.

FQN patterns use `*` for exactly one name component: `layers.*.attention.wq`.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torch import nn

from kenotron.parallel.activation_checkpoint import AC_MODES
from kenotron.parallel.context.apply import (
    CP_ATTENTION_CHOICES,
    SequenceSharder,
    resolve_cp_attention,
)
from kenotron.parallel.context.ring import ROTATE_METHODS
from kenotron.parallel.describe import describe_parameters, format_description
from kenotron.parallel.pipeline import PipelineSplit

if TYPE_CHECKING:
    from kenotron.parallel.dims import Meshes

TP_STYLES = ("embedding", "colwise", "rowwise", "norm", "block_input", "output", "head_norm")
DP_MODES = ("fsdp", "zero1")
RESHARD_POLICIES = ("default", "always", "never")


class PlanError(ValueError):
    """A plan that does not fit its model (unknown module, bad style); raised before training."""


def fqn_matches(pattern: str, fqn: str) -> bool:
    """`*` matches exactly one dotted component."""
    p, f = pattern.split("."), fqn.split(".")
    return len(p) == len(f) and all(a == "*" or a == b for a, b in zip(p, f))


def matching_modules(model: nn.Module, pattern: str) -> list[tuple[str, nn.Module]]:
    return [(name, m) for name, m in model.named_modules() if name and fqn_matches(pattern, name)]


def _generalize(fqn: str) -> str:
    return re.sub(r"(?<=\.)\d+(?=\.|$)", "*", fqn)


@dataclass
class Plan:
    """How a model is split across a mesh. Every field is plain data; edit freely, then apply."""

    tp_styles: dict[str, str] = field(default_factory=dict)
    """Tensor-parallel style per module FQN pattern (styles: embedding, colwise, rowwise, norm, block_input, output)."""
    blocks: str = "layers.*"
    """FQN pattern of the transformer blocks: the units of FSDP, activation checkpointing and compile."""
    sequence_parallel: bool = True
    """Shard activations along the sequence between the TP regions (norms, residual stream)."""
    sequence_parallel_off: list[str] = field(default_factory=list)
    """Block FQN patterns that run without sequence parallel although it is on (or with it, if off)."""
    loss_parallel: bool = True
    """Compute the cross-entropy on vocabulary shards: no full-vocabulary logits are gathered."""
    async_tp: bool = False
    """Overlap TP collectives with matmuls (CUDA + compile only)."""
    dp_mode: str = "fsdp"
    """fsdp: shard params, grads and optimizer state over dp_shard (HSDP with dp_replicate; DDP if
    dp_shard is 1). zero1: replicate params and grads over all dp ranks, shard only optimizer state."""
    fsdp_units: list[str] = field(default_factory=lambda: ["layers.*"])
    """Module FQN patterns that each become one FSDP unit (the root module is always the last unit)."""
    reshard_after_forward: str = "default"
    """default: free gathered params after forward except the last block; always; never (ZeRO-2-like)."""
    param_dtype: str = "float32"
    """Compute dtype of parameters (FSDP mixed precision, or autocast without FSDP)."""
    reduce_dtype: str = "float32"
    """Dtype of the data-parallel gradient reduction (the sharded gradient accumulates in the
    parameters' own dtype)."""
    fsdp_gradients_in_compute_pool: bool = True
    """Under FSDP on CUDA: allocate the sharded gradients from the compute stream's memory pool
    (kenotron/parallel/fsdp_gradient_pool.py)."""
    ac_mode: str = "none"
    """Activation checkpointing of blocks: none, full, selective-op, every-n-layers."""
    ac_every_n: int = 2
    """For every-n-layers: checkpoint one block in every this many."""
    ac_save_matmul_every: int = 1
    """For selective-op: keep one matmul output in every this many (the rest are recomputed)."""
    offload_blocks: int = 0
    """Activation offloading: the first this many blocks of each model part keep what they save
    for backward in pinned host memory (kenotron/parallel/activation_offload.py) and are not
    checkpointed (ac_mode applies to the other blocks); 0 = off."""
    compile: bool = False
    """torch.compile each block."""
    float8: str = ""
    """torchao float8 recipe for the linear layers ("tensorwise" or "rowwise"); empty keeps bf16/fp32."""
    float8_all_gather: bool = False
    """With the tensorwise recipe under FSDP, all-gather weights in float8."""
    pipeline: PipelineSplit | None = None
    """Pipeline stages (module FQNs per stage), schedule and microbatches; None without pipeline parallel."""
    attention_modules: str = "layers.*.attention"
    """FQN pattern of the attention modules whose `attention_fn` context parallel replaces."""
    cp_load_balance: bool = True
    """Context parallel: rank r holds chunks r and 2*cp-1-r of 2*cp (even causal work); False: contiguous chunk r."""
    cp_rotate_method: str = "allgather"
    """Context parallel: keys/values reach every rank by one all-gather ("allgather") or a ring of sends ("alltoall")."""
    cp_attention: str = "auto"
    """Context-parallel attention: auto (torch's ring over fused SDPA on CUDA, kenotron's elsewhere), torch, ring."""

    # -- checks -----------------------------------------------------------------------------

    def check(self, model: nn.Module) -> None:
        """Every pattern names existing modules and every value is valid; raises PlanError."""
        known = sorted({_generalize(n) for n, _ in model.named_modules() if n})
        for label, patterns in (
            ("tp_styles", list(self.tp_styles)),
            ("fsdp_units", self.fsdp_units),
            ("sequence_parallel_off", self.sequence_parallel_off),
            ("blocks", [self.blocks]),
            ("attention_modules", [self.attention_modules]),
        ):
            for pattern in patterns:
                if not matching_modules(model, pattern):
                    close = difflib.get_close_matches(pattern, known, n=1, cutoff=0.5)
                    hint = f"; did you mean {close[0]!r}?" if close else ""
                    raise PlanError(f"plan.{label} names module {pattern!r}, which the model does not have{hint}")
        for pattern, style in self.tp_styles.items():
            if style not in TP_STYLES:
                raise PlanError(f"plan.tp_styles[{pattern!r}]={style!r} is not one of {', '.join(TP_STYLES)}")
        for name, value, valid in (
            ("dp_mode", self.dp_mode, DP_MODES),
            ("reshard_after_forward", self.reshard_after_forward, RESHARD_POLICIES),
            ("ac_mode", self.ac_mode, AC_MODES),
            ("param_dtype", self.param_dtype, ("float32", "bfloat16")),
            ("reduce_dtype", self.reduce_dtype, ("float32", "bfloat16")),
            ("cp_rotate_method", self.cp_rotate_method, ROTATE_METHODS),
            ("cp_attention", self.cp_attention, CP_ATTENTION_CHOICES),
        ):
            if value not in valid:
                raise PlanError(f"plan.{name}={value!r} is not one of {', '.join(valid)}")
        if self.ac_save_matmul_every < 1:
            raise PlanError(
                f"plan.ac_save_matmul_every={self.ac_save_matmul_every} must be >= 1 (1 keeps every matmul output)"
            )
        n_blocks = len(matching_modules(model, self.blocks))
        if not 0 <= self.offload_blocks <= n_blocks:
            raise PlanError(f"plan.offload_blocks={self.offload_blocks} must lie in [0, {n_blocks}] (the model's blocks)")
        for name, _ in model.named_modules():
            styles = [p for p in self.tp_styles if name and fqn_matches(p, name)]
            if len(styles) > 1:
                raise PlanError(f"module {name!r} matches several tp_styles patterns: {styles}; keep one")

    # -- queries ----------------------------------------------------------------------------

    def style_of(self, fqn: str) -> str | None:
        for pattern, style in self.tp_styles.items():
            if fqn_matches(pattern, fqn):
                return style
        return None

    def block_of(self, fqn: str) -> str | None:
        """The block FQN containing `fqn` (itself included), or None for edge modules."""
        parts = fqn.split(".")
        depth = len(self.blocks.split("."))
        if len(parts) >= depth and fqn_matches(self.blocks, ".".join(parts[:depth])):
            return ".".join(parts[:depth])
        return None

    def sp_for(self, fqn: str) -> bool:
        """Whether sequence parallel applies where `fqn` lives."""
        block = self.block_of(fqn)
        if block is not None and any(fqn_matches(p, block) for p in self.sequence_parallel_off):
            return not self.sequence_parallel
        return self.sequence_parallel

    def iter_tp_modules(self, model: nn.Module) -> Iterator[tuple[str, nn.Module, str]]:
        for name, module in model.named_modules():
            style = self.style_of(name) if name else None
            if style is not None:
                yield name, module, style

    # -- views ------------------------------------------------------------------------------

    def diff(self, other: Plan) -> list[str]:
        """Human-readable differences `self -> other`, one line each (empty when equal)."""
        out: list[str] = []
        for f in dataclasses.fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if f.name == "tp_styles":
                for key in sorted(set(a) | set(b)):
                    if a.get(key) != b.get(key):
                        out.append(f"tp_styles[{key!r}]: {a.get(key)} -> {b.get(key)}")
            elif a != b:
                out.append(f"{f.name}: {a!r} -> {b!r}")
        return out

    def copy(self) -> Plan:
        return copy.deepcopy(self)

    def describe(self, model: nn.Module, mesh_shape: dict[str, int]) -> list[dict[str, Any]]:
        """Per parameter: global shape, placement per mesh dim, local shape and bytes on rank 0.

        `mesh_shape` maps dimension names (dp_replicate, dp_shard, cp, tp) to degrees; works on a
        meta-device model and needs no process group.
        """
        return describe_parameters(self, model, mesh_shape)

    def format_description(self, model: nn.Module, mesh_shape: dict[str, int]) -> str:
        return format_description(self.describe(model, mesh_shape), mesh_shape)

    def __str__(self) -> str:
        rows = [("module pattern", "TP style", "sequence parallel")]
        for pattern, style in self.tp_styles.items():
            rows.append((pattern, style, "on" if self.sp_for(pattern.replace("*", "0")) else "off"))
        width = [max(len(r[i]) for r in rows) for i in range(3)]
        lines = ["Plan"]
        lines += ["  " + "  ".join(cell.ljust(w) for cell, w in zip(r, width)) for r in rows[:1]]
        lines += ["  " + "  ".join("-" * w for w in width)]
        lines += ["  " + "  ".join(cell.ljust(w) for cell, w in zip(r, width)) for r in rows[1:]]
        lines += [
            f"  blocks: {self.blocks}   sequence_parallel: {self.sequence_parallel}"
            + (f" (off in {self.sequence_parallel_off})" if self.sequence_parallel_off else "")
            + f"   loss_parallel: {self.loss_parallel}   async_tp: {self.async_tp}",
            (f"  data parallel: {self.dp_mode}, units {self.fsdp_units} + root, reshard_after_forward "
             f"{self.reshard_after_forward}, params {self.param_dtype}, reduce {self.reduce_dtype}"),
            f"  activation checkpointing: {self.ac_mode}"
            + (f" (every {self.ac_every_n})" if self.ac_mode == "every-n-layers" else "")
            + (f" (one matmul output kept in {self.ac_save_matmul_every})"
               if self.ac_mode == "selective-op" and self.ac_save_matmul_every > 1 else "")
            + (f"   offload: first {self.offload_blocks} blocks" if self.offload_blocks else "")
            + f"   compile: {self.compile}   float8: {self.float8 or 'off'}",
        ]
        lines.append(
            f"  context parallel (when cp > 1): attention {self.cp_attention} in {self.attention_modules}, "
            f"load_balance {self.cp_load_balance}, rotate {self.cp_rotate_method}"
        )
        if self.pipeline is not None:
            lines.append("  " + str(self.pipeline))
        return "\n".join(lines)

    # -- application ------------------------------------------------------------------------

    def apply(self, model: nn.Module, meshes: Meshes) -> AppliedPlan:
        """Parallelize `model` (pipeline split -> TP/SP -> CP -> AC -> compile -> data parallel).

        Without pipeline parallel the model is changed in place and is the only model part;
        with it, the returned parts are this rank's stages (copies of `model` cut down to their
        modules, so build `model` on the meta device) and `model` itself is left unused.
        """
        from kenotron.parallel.pipeline import feed_full_positions, stage_module

        self.check(model)
        pp_mesh = meshes.get("pp")
        if pp_mesh is None:
            stage_ids: list[int] = []
            parts = [model]
        else:
            if self.pipeline is None:
                raise PlanError("the mesh has a pp dimension but plan.pipeline is None; set a PipelineSplit")
            self.pipeline.check(model, self.blocks)
            stage_ids = self.pipeline.local_stages(pp_mesh.get_local_rank())
            if meshes.get("cp") is not None:
                raise PlanError("context parallel does not combine with pipeline parallel yet; use cp=1 or pp=1")
            parts = [stage_module(model, self.pipeline.stages[s], self.blocks) for s in stage_ids]
        data_parallel = sharder = None
        offloaders = []
        for index, part in enumerate(parts):
            data_parallel, sharder, offloader = self._apply_to_part(part, meshes)
            if offloader is not None:
                offloaders.append(offloader)
            if stage_ids and stage_ids[index] > 0 and self._sequence_sharded(meshes):
                feed_full_positions(part, meshes.size("tp"))
        return AppliedPlan(parts, data_parallel, meshes, self, stage_ids, sharder, offloaders)

    def _sequence_sharded(self, meshes: Meshes) -> bool:
        """Whether the residual stream between blocks (and stages) is split along the sequence."""
        return meshes.get("tp") is not None and bool(self.tp_styles) and self.sequence_parallel

    def _apply_to_part(self, model: nn.Module, meshes: Meshes) -> tuple[Any, SequenceSharder | None, Any]:
        """TP/SP -> CP -> AC -> compile -> data parallel -> offload on one model part; returns
        the DataParallelState, under context parallel how to slice batches, and the part's
        ActivationOffloader (None without offloading)."""
        from kenotron.parallel.activation_checkpoint import (
            apply_activation_checkpointing,
        )
        from kenotron.parallel.activation_offload import apply_activation_offloading
        from kenotron.parallel.context.apply import apply_context_parallel
        from kenotron.parallel.data import apply_data_parallel
        from kenotron.parallel.tensor import apply_tensor_parallel

        if self.float8:
            from kenotron.parallel.float8 import convert_to_float8

            convert_to_float8(model, self.float8, fsdp_float8_all_gather=self.float8_all_gather)
        tp_mesh = meshes.get("tp")
        if tp_mesh is not None and self.tp_styles:
            apply_tensor_parallel(model, tp_mesh, self)
            if self.compile and self.sequence_parallel:
                # Compiled blocks under SP fail in backward when their input is a view of the
                # embedding's output ("'Tensor' object has no attribute '_local_tensor'");
                # handing them a fresh tensor avoids it.
                for name, module, style in self.iter_tp_modules(model):
                    if style == "embedding":
                        module.register_forward_hook(lambda _m, _i, out: out.clone())
        cp_mesh = meshes.get("cp")
        sharder = apply_context_parallel(model, cp_mesh, self) if cp_mesh is not None else None
        blocks = matching_modules(model, self.blocks)
        offloaded = min(self.offload_blocks, len(blocks))
        # Offloaded blocks keep nothing on the device, so recomputing them would save nothing.
        apply_activation_checkpointing(
            [b for _, b in blocks[offloaded:]], self.ac_mode, self.ac_every_n, self.ac_save_matmul_every
        )
        if self.compile:
            # Dynamo cannot trace kenotron's ring attention (point-to-point sends): blocks that
            # hold it compile around it.
            ring = cp_mesh is not None and resolve_cp_attention(self.cp_attention, cp_mesh.device_type) == "ring"
            for _, block in blocks:
                block.compile(fullgraph=not ring)
        data_parallel = apply_data_parallel(model, meshes, self)
        # After compile (its hooks run outside the graphs) and after FSDP: FSDP's pre-forward
        # all-gather still runs first (it prepends its hook), and the offloader's backward hook
        # on each block's output runs after FSDP's pre-backward one, so its copies back queue
        # behind FSDP's small host-to-device copy (the all-gather's copy-out) instead of ahead.
        offloader = apply_activation_offloading([b for _, b in blocks], offloaded)
        return data_parallel, sharder, offloader


@dataclass
class AppliedPlan:
    """The result of Plan.apply: the model parts this rank runs and how they are wrapped."""

    model_parts: list[nn.Module]
    """One module per local pipeline stage (the whole model without pipeline parallel)."""
    data_parallel: Any
    """kenotron.parallel.data.DataParallelState: the FSDP/HSDP/DDP/ZeRO-1 wrapping."""
    meshes: Meshes
    plan: Plan
    stage_ids: list[int] = field(default_factory=list)
    """Pipeline stage index of each model part (empty without pipeline parallel)."""
    sequence_sharder: SequenceSharder | None = None
    """Under context parallel: slices each (batch, seq) micro-batch for this rank (None otherwise)."""
    offloaders: list[Any] = field(default_factory=list)
    """kenotron.parallel.activation_offload.ActivationOffloader of each model part that offloads."""

    @property
    def loss_parallel(self) -> bool:
        """Whether logits come out vocabulary-sharded (compute the loss under loss_parallel())."""
        return self.plan.loss_parallel and bool(self.plan.tp_styles) and self.meshes.get("tp") is not None


def plan_for(spec: Any, **fields: Any) -> Plan:
    """The family's default plan (from its ModelSpec), with fields overridden."""
    plan = Plan(tp_styles=dict(spec.tp_styles), blocks=spec.blocks, fsdp_units=[spec.blocks])
    return dataclasses.replace(plan, **fields)
