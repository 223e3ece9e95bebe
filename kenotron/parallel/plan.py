"""Plans are data: how one model is parallelized, built without a process group.

A `Plan` is the model's structure (`layout`, a ModelLayout: tensor-parallel style per module
pattern, the blocks, the FSDP units, the attention modules; from the family's parallel hints)
and the run's parallel settings (`settings`, a ParallelSettings: sequence/loss parallel, the
data-parallel mode, activation checkpointing, compile, float8, context parallel; from the job
config), kept apart and each printable, plus the pipeline split when there is one. Print it,
compare two (`plan.diff(other)`), edit it (dataclasses: change a field, add or drop a style),
ask what it does to each parameter on a given mesh shape (`plan.describe(model, {...})`, no
process group needed), then `plan.apply(model, meshes)`, on each of this rank's model parts:

    pipeline split -> float8 -> TP/SP -> EP -> CP -> activation checkpointing -> compile
        -> data parallel (FSDP, HSDP, DDP or ZeRO-1) -> activation offloading

With MoE layers (`layout.moe_modules`), the EP step places them on the ep and tp dimensions
(kenotron/parallel/expert.py): experts sharded over ep with an all-to-all dispatcher, the rest
replicated over tp; FSDP then makes each `layout.experts` module its own unit over the
data-parallel ranks ep leaves.

With context parallel (a `cp` mesh dimension), the CP step replaces the `attention_fn` of the
modules `layout.attention_modules` names (kenotron/parallel/context/apply.py), and the applied
plan's `sequence_sharder` slices each batch for this rank. Pipeline stages get their RoPE
positions from a hook (`feed_positions`): the schedule hands them one tensor only.

With pipeline parallel, `plan.pipeline` (a `PipelineSplit`) lists the modules of every stage;
`apply` cuts this rank's stages out of the model first and runs the rest on each of them.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from kenotron.parallel.activation_checkpoint import apply_activation_checkpointing
from kenotron.parallel.activation_offload import ActivationOffloader, apply_activation_offloading
from kenotron.parallel.context.apply import SequenceSharder, apply_context_parallel, cp_attention_kind
from kenotron.parallel.data_parallel import DataParallelState, apply_data_parallel, experts_are_fsdp_units
from kenotron.parallel.describe import describe_parameters, format_description
from kenotron.parallel.dims import Meshes
from kenotron.parallel.expert import apply_expert_parallel
from kenotron.parallel.float8 import convert_experts_to_float8, convert_to_float8
from kenotron.parallel.model_layout import ModelLayout, PlanError, matching_modules
from kenotron.parallel.parallel_settings import ParallelSettings
from kenotron.parallel.pipeline import PipelineSplit, feed_positions, stage_module
from kenotron.parallel.tensor import apply_tensor_parallel

__all__ = ["AppliedPlan", "Plan", "layout_for", "plan_for"]


@dataclass
class Plan:
    """How a model is split across a mesh: its layout and the run's settings. Edit freely, then apply."""

    layout: ModelLayout = field(default_factory=ModelLayout)
    """The model's structure (from its family's parallel hints)."""
    settings: ParallelSettings = field(default_factory=ParallelSettings)
    """The run's parallel settings (from the job config)."""
    pipeline: PipelineSplit | None = None
    """Pipeline stages (module FQNs per stage), schedule and microbatches; None without pipeline parallel."""

    def check(self, model: nn.Module, degrees: Mapping[str, int] | None = None) -> None:
        """The layout fits the model and the settings are valid for these mesh degrees; raises PlanError."""
        self.layout.check(model)
        self.settings.check(self.layout.count_blocks(model), degrees)

    def sp_for(self, fqn: str) -> bool:
        """Whether sequence parallel applies where `fqn` lives."""
        return self.layout.sequence_parallel_at(fqn, self.settings.sequence_parallel)

    # -- views ------------------------------------------------------------------------------

    def diff(self, other: Plan) -> list[str]:
        """Human-readable differences `self -> other`, one line each (empty when equal)."""
        out: list[str] = []
        for part in ("layout", "settings"):
            mine, theirs = getattr(self, part), getattr(other, part)
            for f in dataclasses.fields(mine):
                a, b = getattr(mine, f.name), getattr(theirs, f.name)
                if f.name == "tp_styles":
                    for key in sorted(set(a) | set(b)):
                        if a.get(key) != b.get(key):
                            out.append(f"{part}.tp_styles[{key!r}]: {a.get(key)} -> {b.get(key)}")
                elif a != b:
                    out.append(f"{part}.{f.name}: {a!r} -> {b!r}")
        if self.pipeline != other.pipeline:
            out.append(f"pipeline: {self.pipeline} -> {other.pipeline}")
        return out

    def copy(self) -> Plan:
        return copy.deepcopy(self)

    def describe(self, model: nn.Module, mesh_shape: dict[str, int]) -> list[dict[str, Any]]:
        """Per parameter: global shape, placement per mesh dim, local shape and bytes on rank 0.

        `mesh_shape` maps dimension names (dp_replicate, dp_shard, cp, tp) to degrees; works on a
        meta-device model and needs no process group.
        """
        return describe_parameters(self.layout, self.settings, model, mesh_shape)

    def format_description(self, model: nn.Module, mesh_shape: dict[str, int]) -> str:
        return format_description(self.describe(model, mesh_shape), mesh_shape)

    def __str__(self) -> str:
        rows = [("module pattern", "TP style", "sequence parallel")]
        for pattern, style in self.layout.tp_styles.items():
            rows.append((pattern, style, "on" if self.sp_for(pattern.replace("*", "0")) else "off"))
        width = [max(len(r[i]) for r in rows) for i in range(3)]
        lines = ["Plan", "  layout (the model's structure)"]
        lines += ["    " + "  ".join(cell.ljust(w) for cell, w in zip(r, width)) for r in rows[:1]]
        lines += ["    " + "  ".join("-" * w for w in width)]
        lines += ["    " + "  ".join(cell.ljust(w) for cell, w in zip(r, width)) for r in rows[1:]]
        lay = self.layout
        lines.append(f"    blocks: {lay.blocks}   FSDP units: {lay.fsdp_units} + root   attention: "
                     f"{lay.attention_modules}"
                     + (f"   sequence parallel flipped in: {lay.sequence_parallel_off}" if lay.sequence_parallel_off
                        else ""))
        if lay.moe_modules:
            lines.append(f"    {lay.moe_summary()}")
        lines.append("  settings (the run's)")
        lines += ["  " + line for line in str(self.settings).splitlines()[1:]]
        if self.pipeline is not None:
            lines.append("  " + str(self.pipeline))
        return "\n".join(lines)

    # -- application ------------------------------------------------------------------------

    def apply(self, model: nn.Module, meshes: Meshes) -> AppliedPlan:
        """Parallelize `model` (pipeline split, then on each part float8 -> TP/SP -> EP -> CP -> AC ->
        compile -> data parallel -> offloading).

        Without pipeline parallel the model is changed in place and is the only model part;
        with it, the returned parts are this rank's stages (copies of `model` cut down to their
        modules, so build `model` on the meta device) and `model` itself is left unused.
        """
        self.check(model, meshes.dims.degrees())
        lay = self.layout
        pp_mesh = meshes.get("pp")
        if pp_mesh is None:
            stage_ids: list[int] = []
            parts = [model]
        else:
            if self.pipeline is None:
                raise PlanError("the mesh has a pp dimension but plan.pipeline is None; set a PipelineSplit")
            self.pipeline.check(model, lay.blocks)
            stage_ids = self.pipeline.local_stages(pp_mesh.get_local_rank())
            parts = [stage_module(model, self.pipeline.units_of(s), lay.blocks) for s in stage_ids]
        data_parallel = sharder = None
        offloaders = []
        for index, part in enumerate(parts):
            data_parallel, sharder, offloader = self._apply_to_part(part, meshes)
            if offloader is not None:
                offloaders.append(offloader)
            if stage_ids:
                # The schedule gives a stage one tensor: its RoPE positions come from a hook when
                # sequence parallel split a later stage's input or context parallel shards the sequence.
                split_input = stage_ids[index] > 0 and self._sequence_sharded(meshes)
                if split_input or sharder is not None:
                    feed_positions(part, meshes.size("tp") if split_input else 1, sharder)
        return AppliedPlan(parts, data_parallel, meshes, self, stage_ids, sharder, offloaders)

    def _sequence_sharded(self, meshes: Meshes) -> bool:
        """Whether the residual stream between blocks (and stages) is split along the sequence."""
        return meshes.get("tp") is not None and bool(self.layout.tp_styles) and self.settings.sequence_parallel

    def _apply_to_part(self, model: nn.Module, meshes: Meshes
                       ) -> tuple[DataParallelState, SequenceSharder | None, ActivationOffloader | None]:
        """float8 -> TP/SP -> EP -> CP -> AC -> compile -> data parallel -> offload on one model part; returns
        the DataParallelState, under context parallel how to slice batches, and the part's
        ActivationOffloader (None without offloading)."""
        lay, st = self.layout, self.settings
        if st.float8:
            convert_to_float8(model, st.float8, fsdp_float8_all_gather=st.float8_all_gather)
        if st.float8_experts:
            convert_experts_to_float8(model)
        tp_mesh = meshes.get("tp")
        if tp_mesh is not None and lay.tp_styles:
            apply_tensor_parallel(model, tp_mesh, lay, st)
            if st.compile and st.sequence_parallel:
                # Compiled blocks under SP fail in backward when their input is a view of the
                # embedding's output ("'Tensor' object has no attribute '_local_tensor'");
                # handing them a fresh tensor avoids it.
                for _name, module, style in lay.iter_tp_modules(model):
                    if style == "embedding":
                        module.register_forward_hook(lambda _m, _i, out: out.clone())
        apply_expert_parallel(model, meshes, lay, st)
        cp_mesh = meshes.get("cp")
        sharder = apply_context_parallel(model, meshes, lay, st) if cp_mesh is not None else None
        blocks = matching_modules(model, lay.blocks)
        offloaded = min(st.offload_blocks, len(blocks))
        # Offloaded blocks keep nothing on the device, so recomputing them would save nothing.
        apply_activation_checkpointing(
            [b for _, b in blocks[offloaded:]], st.ac_mode, st.ac_every_n, st.ac_save_matmul_every
        )
        if st.compile:
            # Dynamo cannot trace kenotron's ring attention (point-to-point sends) nor the flex
            # one's all-gather and mask building: blocks that hold them compile around them.
            # Ulysses' functional all-to-alls are traceable; its compiled GPU rows (2026-11-27,
            # docs/performance.md) ran with the graph allowed to break, and a full graph is untried.
            ring = cp_mesh is not None and (st.cp_scheme == "ulysses" or cp_attention_kind(
                st.cp_attention, cp_mesh.device_type) in ("ring", "flex"))
            # Neither can the all-to-all of expert parallelism (its splits are read on the host),
            # nor the FSDP hooks of experts that are units of their own inside a block.
            all_to_all = bool(lay.moe_modules) and meshes.get("ep") is not None
            expert_units = experts_are_fsdp_units(meshes, lay, st)
            for _, block in blocks:
                block.compile(fullgraph=not (ring or all_to_all or expert_units))
        data_parallel = apply_data_parallel(model, meshes, lay, st, self.pipeline)
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
    data_parallel: DataParallelState | None
    """The FSDP/HSDP/DDP/ZeRO-1 wrapping (None only for an AppliedPlan of no model part)."""
    meshes: Meshes
    plan: Plan
    stage_ids: list[int] = field(default_factory=list)
    """Pipeline stage index of each model part (empty without pipeline parallel)."""
    sequence_sharder: SequenceSharder | None = None
    """Under context parallel: slices each (batch, seq) micro-batch for this rank (None otherwise)."""
    offloaders: list[ActivationOffloader] = field(default_factory=list)
    """The ActivationOffloader of each model part that offloads."""

    @property
    def loss_parallel(self) -> bool:
        """Whether logits come out vocabulary-sharded (compute the loss under loss_parallel())."""
        plan = self.plan
        return plan.settings.loss_parallel and bool(plan.layout.tp_styles) and self.meshes.get("tp") is not None


def layout_for(spec: Any, args: Any = None) -> ModelLayout:
    """A family's layout, from its ModelSpec (and the args of the model, for families whose
    modules depend on them; None: the spec's default styles)."""
    styles = spec.tp_styles_of(args) if args is not None else dict(spec.tp_styles)
    return ModelLayout(tp_styles=styles, blocks=spec.blocks, fsdp_units=[spec.blocks],
                       attention_modules=spec.attention_modules, moe_modules=spec.moe_modules, experts=spec.experts)


def plan_for(spec: Any, settings: ParallelSettings | None = None, args: Any = None, **setting_fields: Any) -> Plan:
    """The family's default plan (its layout for `args`) with `settings`, or default settings with fields overridden."""
    settings = settings or ParallelSettings()
    return Plan(layout_for(spec, args), dataclasses.replace(settings, **setting_fields))
