"""Tensor and sequence parallel: a Plan's style names -> torch ParallelStyle objects.

Activations between the TP regions (the residual stream, the norms) are split along the
sequence when sequence parallel is on, else replicated. Inside a region they are plain local
tensors: colwise projections take the whole sequence and produce a slice of the heads or
hidden features; rowwise projections reduce (all-reduce, or reduce-scatter along the
sequence under SP) back to the residual layout. A block whose SP setting differs from the
plan's gets its input and output converted at its boundary, so SP can be turned off for a
single block.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed._symmetric_memory import enable_symm_mem_for_group
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import (
    DTensor,
    Partial,
    Replicate,
    Shard,
    distribute_module,
    distribute_tensor,
)
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.distributed.tensor.parallel.style import ParallelStyle

from kenotron.dtensor import local_tensor
from kenotron.parallel.model_layout import ModelLayout, matching_modules
from kenotron.parallel.parallel_settings import ParallelSettings

SEQ = Shard(1)


def _positional_arity(module: nn.Module) -> int:
    """Number of positional parameters of module.forward (the layouts tuple must match)."""
    params = inspect.signature(module.forward).parameters.values()
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


def _first_input(layout, arity: int) -> tuple:
    # Only the hidden states are converted; RoPE tables and other inputs pass as they are.
    return (layout,) + (None,) * (arity - 1)


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, factor: float) -> torch.Tensor:
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad * ctx.factor, None


def local_view(grad_placements: tuple, grad_scale: float = 1.0) -> Callable[[torch.Tensor], torch.Tensor]:
    """How compute reads a DTensor weight: its local shard, whose gradient has `grad_placements`
    (Partial on tp: each tp rank computed with other tokens), times `grad_scale`."""

    def view(weight: torch.Tensor) -> torch.Tensor:
        local = weight.to_local(grad_placements=grad_placements) if isinstance(weight, DTensor) else weight
        return _ScaleGrad.apply(local, grad_scale) if grad_scale != 1.0 else local

    return view


def linear_on_local_weight(linear: nn.Linear, view: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """`linear` computes on its weights as `view` reads them (`local_view`)."""

    def forward(x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, view(linear.weight), None if linear.bias is None else view(linear.bias))

    linear.forward = forward  # type: ignore[method-assign]


class ReplicatedOverShards(ParallelStyle):
    """A module with replicated weights applied to a tensor sharded along `shard_dim`.

    Per-head norms (Qwen3's q/k RMSNorm) see only this rank's heads; each rank's weight
    gradient is then a partial sum over its heads. Making the weights Replicate DTensors and
    the input a Shard(shard_dim) DTensor lets autograd mark that gradient Partial, so it is
    summed over tp before clipping and the optimizer step.
    """

    def __init__(self, shard_dim: int) -> None:
        super().__init__()
        self.shard_dim = shard_dim

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        placements = [Shard(self.shard_dim)]

        def to_dtensor(_module, inputs, mesh):
            first = DTensor.from_local(inputs[0], mesh, placements, run_check=False)
            return (first, *inputs[1:])

        def to_local(_module, output, mesh):
            return output.to_local()

        # Without a partition_fn, distribute_module replicates every parameter over the mesh.
        return distribute_module(module, device_mesh, input_fn=to_dtensor, output_fn=to_local)


class LinearOnSequenceShards(ParallelStyle):
    """A Linear applied token by token to this rank's sequence shard under sequence parallel (the
    residual stream's layout), with its weights replicated over tp: DeepSeek-V3's MTP projection.

    The product runs on local tensors, the weights read as their local copies whose gradients are
    marked Partial (each rank saw other tokens), so they are summed over tp before clipping and
    the optimizer step, as `ReplicatedOverShards` gets them. The input may come as a
    sequence-sharded DTensor (the norms' output); the output is the local shard. F.linear on a
    sequence-sharded (batch, seq, dim) DTensor would flatten a sharded dimension, which torch
    2.11's view rule refuses.
    """

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not isinstance(module, nn.Linear):
            raise TypeError(f"the 'token_linear' style takes an nn.Linear, got {type(module).__name__}")

        def local_inputs(_module, inputs, _mesh):
            return tuple(local_tensor(x) for x in inputs)

        # Every parameter Replicate over tp; a sequence-sharded DTensor input read as its shard.
        distribute_module(module, device_mesh, input_fn=local_inputs)
        linear_on_local_weight(module, local_view((Partial(),)))
        return module


class ShardedChannels(ParallelStyle):
    """A module's own per-channel parameters split along dim 0 over tp, each rank computing on its
    channels only (local tensors in and out, no communication).

    For what sits between a colwise and a rowwise projection and acts channel by channel: a
    depthwise convolution, the Mamba scan's per-head A_log / D / dt bias, a norm over groups of
    channels. The module reads its parameters through `kenotron.dtensor.local_tensor`; their
    gradients come back as Shard(0) DTensors like the parameters. Children keep their own styles.
    """

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        for name, param in list(module.named_parameters(recurse=False)):
            if param.shape[0] % device_mesh.size():
                raise ValueError(f"tp={device_mesh.size()} does not divide {name}'s {param.shape[0]} channels")
            sharded = distribute_tensor(param, device_mesh, [Shard(0)], src_data_rank=None)
            module.register_parameter(name, nn.Parameter(sharded, requires_grad=param.requires_grad))
        return module


class LatentAttentionInput(ParallelStyle):
    """An MLA module (models/common/latent_attention.py): "block_input" under SP, and its shared
    RoPE key's gradient, which each rank computes from its heads only, summed over tp (an
    identity forward whose backward all-reduces)."""

    def __init__(self, sp: bool) -> None:
        super().__init__()
        self.sp = sp

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if self.sp:
            arity = _positional_arity(module)
            PrepareModuleInput(input_layouts=_first_input(SEQ, arity), desired_input_layouts=_first_input(
                Replicate(), arity), use_local_output=True)._apply(module, device_mesh)

        def sum_grad_over_tp(x: torch.Tensor) -> torch.Tensor:
            shared = DTensor.from_local(x, device_mesh, [Replicate()], run_check=False)
            return shared.to_local(grad_placements=[Partial()])

        module.rope_key_grad = sum_grad_over_tp
        return module


class VocabParallelEmbedding(ParallelStyle):
    """Embedding rows split over tp; each rank looks up the ids it holds, the partial rows are summed.

    Written out rather than left to DTensor's embedding rule, whose backward returns the
    weight gradient Replicate: the whole vocab x dim table on every tp rank (2 GiB for 8B,
    8 GiB for 405B). Here the gradient is computed from the local lookup only and stays a
    Shard(0) DTensor like the weight. The sum of the partial rows is a reduce-scatter along
    the sequence under SP (an all-reduce without), so the output is what RowwiseParallel gives.
    """

    def __init__(self, output_layout: Shard | Replicate) -> None:
        super().__init__()
        self.output_layout = output_layout

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not isinstance(module, nn.Embedding):
            raise TypeError(f"the 'embedding' style needs an nn.Embedding, got {type(module).__name__}")
        rows = module.num_embeddings
        tp, rank = device_mesh.size(), device_mesh.get_local_rank()
        if rows % tp != 0:
            raise ValueError(f"tp={tp} does not divide the vocabulary ({rows} rows)")
        start, stop = rank * rows // tp, (rank + 1) * rows // tp
        module.weight = nn.Parameter(distribute_tensor(module.weight, device_mesh, [Shard(0)], src_data_rank=None))
        output_layout = self.output_layout

        def forward(ids):
            outside = (ids < start) | (ids >= stop)
            local = F.embedding((ids - start).masked_fill(outside, 0), module.weight.to_local())
            local = local.masked_fill(outside[..., None], 0.0)
            partial = DTensor.from_local(local, device_mesh, [Partial()], run_check=False)
            return partial.redistribute(device_mesh, [output_layout]).to_local()

        module.forward = forward  # type: ignore[method-assign]
        return module


def style_object(style: str, module: nn.Module, *, sp: bool, loss_parallel: bool) -> ParallelStyle | None:
    """The torch ParallelStyle for one module, or None when the style is a no-op here."""
    if style == "embedding":
        return VocabParallelEmbedding(SEQ if sp else Replicate())
    if style == "colwise":
        return ColwiseParallel()
    if style == "rowwise":
        return RowwiseParallel(output_layouts=SEQ if sp else Replicate())
    if style == "norm":
        return SequenceParallel() if sp else None
    if style == "token_linear":
        return LinearOnSequenceShards() if sp else None
    if style == "block_input":
        # The colwise projections read the input as a Replicate DTensor, so that each one's input
        # gradient stays a partial sum: autograd adds them, and the input's conversion reduces the
        # total once (a reduce-scatter under SP, an all-reduce without). Given a local tensor,
        # each projection would all-reduce its own gradient: 3 all-reduces of the block's
        # activations for attention's q, k, v instead of one reduce-scatter (docs/parallelism.md).
        arity = _positional_arity(module)
        return PrepareModuleInput(
            input_layouts=_first_input(SEQ if sp else Replicate(), arity),
            desired_input_layouts=_first_input(Replicate(), arity),
            use_local_output=False,
        )
    if style == "channels":
        return ShardedChannels()
    if style == "latent_attention":
        return LatentAttentionInput(sp)
    if style == "head_norm":
        # Applied to (batch, seq, heads, head_dim) with the heads split over tp.
        return ReplicatedOverShards(shard_dim=2)
    if style == "output":
        return ColwiseParallel(
            input_layouts=SEQ if sp else Replicate(),
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel,
        )
    raise ValueError(f"unknown tensor-parallel style {style!r}")


def apply_tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh, layout: ModelLayout, settings: ParallelSettings) -> None:
    """A plan's TP/SP step: the layout's styles on `tp_mesh`, sequence parallel as the settings say."""
    styles: dict[str, ParallelStyle] = {}
    for name, module, style in layout.iter_tp_modules(model):
        sp = layout.sequence_parallel_at(name, settings.sequence_parallel)
        obj = style_object(style, module, sp=sp, loss_parallel=settings.loss_parallel)
        if obj is not None:
            styles[name] = obj
    parallelize_module(model, tp_mesh, styles)

    # Blocks whose SP differs from the residual stream's: convert at the block boundary.
    for name, block in matching_modules(model, layout.blocks):
        inside, outside = layout.sequence_parallel_at(name, settings.sequence_parallel), settings.sequence_parallel
        if inside == outside:
            continue
        out_layout, in_layout = (SEQ, Replicate()) if outside else (Replicate(), SEQ)
        arity = _positional_arity(block)
        parallelize_module(
            block, tp_mesh,
            PrepareModuleInput(
                input_layouts=_first_input(out_layout, arity),
                desired_input_layouts=_first_input(in_layout, arity),
                use_local_output=True,
            ),
        )
        parallelize_module(
            block, tp_mesh,
            PrepareModuleOutput(output_layouts=in_layout, desired_output_layouts=out_layout, use_local_output=True),
        )

    if settings.async_tp:
        _enable_async_tp(tp_mesh)


def _enable_async_tp(tp_mesh: DeviceMesh) -> None:
    """Fuse TP all-gather/reduce-scatter with the matmuls (needs CUDA and torch.compile)."""
    if tp_mesh.device_type != "cuda":
        raise ValueError("parallelism.async_tp needs CUDA; turn it off on CPU")
    torch._inductor.config._micro_pipeline_tp = True
    enable_symm_mem_for_group(tp_mesh.get_group().group_name)
