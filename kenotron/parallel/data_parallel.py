"""Data parallel through FSDP2: FSDP, HSDP, DDP, and ZeRO-1 (sharded optimizer state only).

What each mode keeps on a rank (dp = the data-parallel degree of that mode):

| mode  | when                                   | parameters | gradients | optimizer state |
|-------|----------------------------------------|------------|-----------|-----------------|
| FSDP  | dp_shard x cp > 1                      | 1/dp_shard·cp (gathered per block for compute) | 1/dp_shard·cp | 1/dp_shard·cp |
| HSDP  | FSDP with dp_replicate > 1 too         | as FSDP, replicated over dp_replicate | as FSDP | as FSDP |
| DDP   | dp_shard x cp = 1, dp_replicate > 1    | whole      | whole (all-reduced) | whole |
| ZeRO-1| parallelism.dp_mode = "zero1"          | whole      | whole (all-reduced) | 1/dp·cp (each rank steps the parameters it owns, then broadcasts them) |

The loss is a sum over tokens divided by the global token count, so the right gradient is
the *sum* over ranks, while FSDP and DDP average: the trainer multiplies the loss it
back-propagates by `DataParallelState.averaging_size` (keeping the backends' native averaging
collectives; gloo has no pre-multiplied sum).
Gradients are reduced in `reduce_dtype` (auto: bf16 for the routed experts, each expert module an
FSDP unit of its own, fp32 for the rest) and accumulated in fp32 in the sharded gradient even
when compute runs in bf16. Under expert parallelism with ep = dp_shard x cp, no dp_replicate and no
pp the experts' FSDP mesh would be one rank: they stay outside FSDP (`experts_outside_fsdp`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed._composable.replicate_with_fsdp import replicate
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from kenotron.degrees import ddp_alone
from kenotron.parallel.dims import Meshes
from kenotron.parallel.fsdp_gradient_pool import install_reduce_scatters
from kenotron.parallel.fsdp_wire import wire_dtype
from kenotron.parallel.gradient_all_reduce import GradientAllReduce
from kenotron.parallel.model_layout import ModelLayout, matching_modules
from kenotron.parallel.parallel_settings import ParallelSettings
from kenotron.parallel.pipeline import PipelineSplit

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class DataParallelState:
    """What apply_data_parallel did, for the trainer's micro-step and optimizer logic."""

    kind: str | None
    """"fsdp", "hsdp", "ddp", "zero1", or None (no data parallelism)."""
    mesh: DeviceMesh | None
    """The mesh the parameters are sharded or replicated over."""
    gradient_hooks: GradientAllReduce | None = None
    """Under DDP alone (its mesh is the whole job's): the hooks that all-reduce the plain
    parameters' gradients (no FSDP module, no cast of the parameters by FSDP)."""

    @property
    def averaging_size(self) -> int:
        """Ranks the gradient reduction averages over (1 without data parallelism)."""
        return self.mesh.size() if self.mesh is not None else 1

    @property
    def casts_params(self) -> bool:
        """True when FSDP's mixed precision casts parameters (so no autocast is needed)."""
        return self.kind is not None and self.gradient_hooks is None

    def set_microstep(self, model: nn.Module, is_last: bool) -> None:
        """Skip gradient all-reduce across replicas on non-final micro-steps.

        FSDP keeps its per-micro-step reduce-scatter (so gradients stay sharded); the
        replicate dimension (HSDP, DDP, ZeRO-1) accumulates locally and reduces once.
        """
        if self.gradient_hooks is not None:
            self.gradient_hooks.sync = is_last
        elif self.kind in ("hsdp",):
            _set_on_all(model, lambda m: m.set_requires_all_reduce(is_last, recurse=False))
        elif self.kind in ("ddp", "zero1"):
            _set_on_all(model, lambda m: m.set_requires_gradient_sync(is_last, recurse=False))


def _set_on_all(model: nn.Module, fn) -> None:
    for module in model.modules():
        if isinstance(module, FSDPModule):
            fn(module)


def fsdp_mesh(meshes: Meshes) -> DeviceMesh | None:
    """1-D mesh over dp_shard x cp, or 2-D (dp_replicate, shard) for HSDP; None if no sharding."""
    shard = meshes.get("dp_shard_cp")
    if shard is None:
        return None
    replicate = meshes.get("dp_replicate")
    if replicate is None:
        return shard
    assert meshes.root is not None
    return meshes.root[("dp_replicate", shard.mesh_dim_names[0])]


def _replicate(module: nn.Module, mesh: DeviceMesh, mp: MixedPrecisionPolicy) -> None:
    replicate(module, mesh=mesh, mp_policy=mp)


def apply_data_parallel(model: nn.Module, meshes: Meshes, layout: ModelLayout, settings: ParallelSettings,
                        pipeline: PipelineSplit | None) -> DataParallelState:
    """A plan's data-parallel step: wrap each unit, then the root, in FSDP (or its replicate-only variant)."""
    st = settings
    units = [m for pattern in layout.fsdp_units for _, m in matching_modules(model, pattern)]

    if st.dp_mode == "zero1":
        # Context-parallel ranks hold the same parameters and partial gradients of them (each
        # from its part of the sequences): they replicate, reduce and share optimizer state like
        # data-parallel ranks.
        mesh = meshes.get("dp_cp")
        if mesh is None:
            return DataParallelState(None, None)
        kind = "zero1"
    else:
        mesh = fsdp_mesh(meshes)
        kind = "hsdp" if mesh is not None and mesh.ndim == 2 else "fsdp"
        if mesh is None:
            mesh = meshes.get("dp_replicate")
            kind = "ddp"
        if mesh is None:
            return DataParallelState(None, None)

    # The dtype each unit's gradients are summed in, and the one FSDP sends them in (fsdp_wire.py).
    dense_reduce, expert_reduce = st.reduce_dtypes()
    has_hook = hasattr(FSDPModule, "set_custom_reduce_scatter")
    dense_wire, expert_wire = (wire_dtype(r, st.param_dtype, kind, mesh.device_type, has_hook)
                               for r in (dense_reduce, expert_reduce))
    mp = MixedPrecisionPolicy(param_dtype=DTYPES[st.param_dtype], reduce_dtype=DTYPES[dense_wire])
    expert_mp = MixedPrecisionPolicy(param_dtype=DTYPES[st.param_dtype], reduce_dtype=DTYPES[expert_wire])
    if kind == "ddp" and ddp_alone(st.dp_mode, meshes.dims.degrees()):
        # DDP alone: each gradient all-reduced in place as backward finishes it, in the precision
        # one GPU trains in (settle_precision reads the same ddp_alone), faster than FSDP's
        # replicate (docs/parallelism.md, "DDP engines"). With tp or pp beside it, FSDP's replicate.
        return DataParallelState(kind, mesh, GradientAllReduce(model, mesh))
    if kind in ("ddp", "zero1"):
        for unit in units:
            _replicate(unit, mesh, mp)
        _replicate(model, mesh, mp)
    else:
        # Under pipeline parallel a schedule step runs the forward of every microbatch through
        # the same blocks, and the backwards come later: resharding after each forward would
        # all-gather every block again per microbatch. A stage holds 1/pp of the blocks, so
        # keeping them gathered for the step (the schedule reshards after its last backward)
        # costs little memory.
        pipelined = pipeline is not None and meshes.get("pp") is not None
        experts = _shard_experts(model, meshes, layout, settings, expert_mp, pipelined, mesh)
        # Experts outside FSDP: no unit may take their parameters, neither the block nor the root.
        ignored = unsharded_expert_params(model, meshes, layout, settings) or None
        head = [] if pipelined or mesh.size() == 1 else head_modules(model, layout)
        for i, unit in enumerate(units):
            if st.reshard_after_forward == "default":
                # The last unit's parameters are needed again right away by backward; on a
                # 1-device mesh resharding saves only the bf16 copy, at the price of a second cast.
                reshard = i < len(units) - 1 and mesh.size() > 1 and not pipelined
            else:
                reshard = st.reshard_after_forward == "always"
            fully_shard(unit, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard, ignored_params=ignored)
        if head:
            # The final norm and the output layer as one unit: its gradients are complete after the
            # norm's backward, the first of the step, so their reduce-scatter runs under the blocks'
            # backward instead of at the tail with the root's (the embedding's, complete only after
            # the last op). Kept gathered after forward: backward needs it at once, and the fused
            # loss reads the output weight without calling the output layer.
            fully_shard(head, mesh=mesh, mp_policy=mp, reshard_after_forward=False, ignored_params=ignored)
        # Left unset, the root keeps its parameters gathered after forward (backward needs them at
        # once, and a loss that reads the output weight after forward relies on it).
        root_kwargs = {"reshard_after_forward": False} if st.reshard_after_forward == "never" else {}
        fully_shard(model, mesh=mesh, mp_policy=mp, ignored_params=ignored, **root_kwargs)
        dense_sums = DTYPES[dense_reduce] if dense_wire != dense_reduce else None
        expert_sums = DTYPES[expert_reduce] if expert_wire != expert_reduce else None
        if kind == "fsdp" and mesh.device_type == "cuda" and (st.gradients_in_compute_pool or dense_sums or expert_sums):
            device = torch.device("cuda", torch.cuda.current_device())
            wrapped = [(e, expert_sums) for e in experts] + [(u, dense_sums) for u in [*units, *([head] if head else []), model]]
            if not install_reduce_scatters(wrapped, device, st.gradients_in_compute_pool, ignored or set()):
                warnings.warn(
                    f"torch {torch.__version__} has no FSDPModule.set_custom_reduce_scatter: the sharded "
                    "gradients stay in the reduce-scatter stream's memory pool; set "
                    "tuning.fsdp_gradients_in_compute_pool false to silence this", stacklevel=2)
    return DataParallelState(kind, mesh)


def head_modules(model: nn.Module, layout: ModelLayout) -> list[nn.Module]:
    """The model's final norm and output layer (the top-level modules of style "norm" and
    "output"), to be one FSDP unit of their own; empty where they cannot be: either is missing,
    the output weight is tied to the embedding (one parameter belongs to one unit, the root's),
    or multi-token prediction calls the output layer again after its own blocks (`mtp`)."""
    styles = {style: name for name, style in layout.tp_styles.items() if "." not in name}
    names = [styles.get("norm"), styles.get("output")]
    modules = [getattr(model, name, None) if name else None for name in names]
    if any(m is None for m in modules) or getattr(model, "mtp", None) is not None:
        return []
    # Declared ties count too: tensor parallel gives the embedding and the output a DTensor each,
    # and the model ties them again after (its _apply on to_empty), once FSDP has wrapped them.
    if getattr(getattr(model, "args", None), "tie_embeddings", False):
        return []
    own = {id(p) for m in modules for p in m.parameters()}
    others = {id(p) for name, p in model.named_parameters(remove_duplicate=False)
              if not name.startswith(tuple(f"{n}." for n in names))}
    return [] if own & others else modules


def expert_fsdp_mesh(meshes: Meshes) -> DeviceMesh | None:
    """Under expert parallelism: the mesh the expert weights are FSDP-sharded over (efsdp, with
    dp_replicate for HSDP), else None."""
    if meshes.get("ep") is None:
        return None
    assert meshes.root is not None
    names = meshes.root.mesh_dim_names or ()
    return meshes.root[("dp_replicate", "efsdp")] if "dp_replicate" in names else meshes.root["efsdp"]


def experts_outside_fsdp(meshes: Meshes, layout: ModelLayout, settings: ParallelSettings) -> bool:
    """Whether the routed experts stay outside FSDP: under expert parallelism where their FSDP
    mesh is one rank (ep = dp_shard x cp, no dp_replicate), without pipeline parallel (degrees.py
    says why). A unit there would shard nothing, yet cost each step and MoE layer a cast
    copy-in, a 1-rank all-gather, its copy-out, the reduce-scatter's copies and the cast of the
    sum (docs/performance.md has what that cost EP 2). Left out, the weights stay DTensors sharded
    over ep (parallel/expert.py): bf16 with fp32 masters in AdamW where Choices.expert_masters, else
    fp32 weights which compute casts (`GroupedExperts.forward`); their
    gradients need no reduction: each rank holds its experts whole and received every token routed
    to them through the all-to-all, and the 1/ep gradient scale of `weight_view` undoes the loss'
    scaling by the data-parallel size (ep ranks here)."""
    if not layout.experts or settings.dp_mode == "zero1" or fsdp_mesh(meshes) is None:
        return False
    return meshes.dims.experts_outside_fsdp  # the estimators read the same rule off the degrees


def unsharded_expert_params(model: nn.Module, meshes: Meshes, layout: ModelLayout,
                            settings: ParallelSettings) -> set[nn.Parameter]:
    """The routed experts' parameters no FSDP unit may take (`experts_outside_fsdp`), else empty."""
    if not experts_outside_fsdp(meshes, layout, settings):
        return set()
    return {p for _, experts in matching_modules(model, layout.experts) for p in experts.parameters()}


def experts_are_fsdp_units(meshes: Meshes, layout: ModelLayout, settings: ParallelSettings) -> bool:
    """Whether the data-parallel step makes each routed-expert module an FSDP unit of its own
    (`_shard_experts`): under expert parallelism (but where its FSDP mesh is one rank:
    `experts_outside_fsdp`), or where the experts reduce in another dtype than the rest over a
    sharded mesh. A compiled block must then let Dynamo break its graph around the experts' FSDP
    hooks (torch 2.11 refuses them inside a full graph)."""
    if not layout.experts or settings.dp_mode == "zero1":
        return False
    dense = fsdp_mesh(meshes)
    if dense is None:  # replicated (DDP) or no data parallel: nothing is sharded
        return False
    if expert_fsdp_mesh(meshes) is not None:
        return not experts_outside_fsdp(meshes, layout, settings)
    return dense.size() > 1 and len(set(settings.reduce_dtypes())) > 1


def _shard_experts(model: nn.Module, meshes: Meshes, layout: ModelLayout, settings: ParallelSettings,
                   mp: MixedPrecisionPolicy, pipelined: bool, dense_mesh: DeviceMesh) -> list[nn.Module]:
    """Each routed-expert module becomes its own FSDP unit (resharded after forward as the blocks
    are) under expert parallelism, over the ranks ep leaves where they are more than one (else the
    experts stay outside FSDP: `experts_outside_fsdp`), and without it where the experts
    reduce in another dtype than the rest (`mp`, fsdp_reduce_dtype auto), over the blocks' mesh.
    Averaging over the ep-left mesh, 1/ep the size of the dense parameters', is right because
    compute scales the experts' gradients by 1/ep (parallel/expert.py). Returns the modules wrapped."""
    if not experts_are_fsdp_units(meshes, layout, settings):
        return []
    mesh = expert_fsdp_mesh(meshes) or dense_mesh
    policy = settings.reshard_after_forward
    reshard = policy == "always" or (policy == "default" and mesh.size() > 1 and not pipelined)
    wrapped = [experts for _, experts in matching_modules(model, layout.experts)]
    for i, experts in enumerate(wrapped):
        # As the blocks: under `default` the last block's experts stay gathered for its backward.
        last = policy == "default" and i == len(wrapped) - 1
        fully_shard(experts, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard and not last)
    return wrapped
