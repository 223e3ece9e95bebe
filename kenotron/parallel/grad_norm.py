"""Global gradient norm and clipping over any mix of DTensor placements and meshes.

Parameters of one model can live on different meshes (TP x FSDP for most weights, FSDP only
for a norm outside TP, plain tensors without data parallelism) and pipeline stages hold
different parameters. The squared norm is summed per group of gradients sharing a mesh and
placements: the local shards' sums of squares are all-reduced over the mesh dimensions where
the gradient is sharded (replicated dimensions hold copies, which must count once), then the
groups are added and, with pipeline parallel, summed over the stages.
"""

from __future__ import annotations

from collections import defaultdict

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import is_fake
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

from kenotron.dtensor import local_tensor


@torch.no_grad()
def reduce_partial_grads_(params: list[torch.nn.Parameter]) -> None:
    """Turn Partial DTensor gradients into Replicate ones, in place.

    A replicated weight used on sequence shards (a norm under sequence parallel) gets a
    gradient that is a partial sum on each tp rank; norms and optimizers need the sum.
    """
    for p in params:
        g = p.grad
        if isinstance(g, DTensor) and any(isinstance(pl, Partial) for pl in g.placements):
            placements = [Replicate() if isinstance(pl, Partial) else pl for pl in g.placements]
            p.grad = g.redistribute(g.device_mesh, placements)


def _sum_of_squares(tensors: list[torch.Tensor], kernel: str) -> torch.Tensor:
    if tensors[0].device.type == "cuda":
        if kernel == "triton" and all(t.is_contiguous() for t in tensors) and not is_fake(tensors[0]):
            # Importing it imports triton (an optional dependency): only when chosen. Faster than
            # _foreach_norm (docs/performance.md).
            from kenotron.kernels.sum_of_squares import sum_of_squares

            return sum_of_squares(tensors)
        # One multi-tensor kernel for all norms instead of three kernels per tensor; fp32 results
        # for bf16 gradients too (master weights), whose norms would otherwise be rounded to bf16.
        return torch.stack(torch._foreach_norm(tensors, 2, dtype=torch.float32)).pow(2).sum()
    # CPU's norm kernel accumulates a long fp32 reduction sequentially (2e-4 relative error
    # on a 1M-element gradient, measured); sum() reduces pairwise and stays accurate.
    return torch.stack([t.float().pow(2).sum() for t in tensors]).sum()


@torch.no_grad()
def total_grad_norm(grads: list[torch.Tensor], pp_mesh: DeviceMesh | None = None, kernel: str = "torch") -> torch.Tensor:
    """L2 norm of all gradients as one vector, identical on every rank (fp32, plain tensor).
    `kernel`: a resolved `tuning.grad_norm_kernel` (triton on CUDA, else torch's ops)."""
    groups: dict[tuple, list[torch.Tensor]] = defaultdict(list)
    for g in grads:
        key = (g.device_mesh, tuple(g.placements)) if isinstance(g, DTensor) else (None, ())
        groups[key].append(g)
    device = grads[0].device if grads else torch.device("cpu")
    total = torch.zeros((), dtype=torch.float32, device=device)
    for (mesh, placements), group in groups.items():
        sq = _sum_of_squares([local_tensor(g) for g in group], kernel)
        for dim, placement in enumerate(placements):
            if isinstance(placement, Partial):
                # A state error, not a type error: the gradient is a valid DTensor whose
                # pending reduction the caller skipped (reduce_partial_grads_).
                raise RuntimeError("gradient norm of a Partial DTensor gradient: reduce gradients before clipping")  # noqa: TRY004
            if isinstance(placement, Shard) or type(placement).__name__ == "_StridedShard":
                dist.all_reduce(sq, group=mesh.get_group(dim))
        total += sq.to(device)
    if pp_mesh is not None:
        dist.all_reduce(total, group=pp_mesh.get_group())
    return total.sqrt()


@torch.no_grad()
def clip_grads_(grads: list[torch.Tensor], max_norm: float, total_norm: torch.Tensor) -> None:
    """Scale gradients in place so their global norm is at most max_norm."""
    coef = torch.clamp(max_norm / (total_norm + 1e-6), max=1.0)
    locals_ = [local_tensor(g) for g in grads]
    by_device: dict[torch.device, list[torch.Tensor]] = defaultdict(list)
    for t in locals_:
        by_device[t.device].append(t)
    for dev, tensors in by_device.items():
        torch._foreach_mul_(tensors, coef.to(dev))


def optimizer_unscales_gradients(optimizer: object) -> bool:
    """Whether `optimizer.step()` divides gradients by `optimizer.grad_scale` inside its kernel.

    torch's fused Adam/AdamW take the divisor of the AMP GradScaler protocol: setting it to
    the clipping divisor clips inside the update kernel, saving the separate multiply that
    reads and writes every gradient once.
    """
    if getattr(optimizer, "divides_by_grad_scale", False):  # kenotron's TritonAdamW
        return True
    groups = getattr(optimizer, "param_groups", [])
    return bool(getattr(optimizer, "_step_supports_amp_scaling", False)) and all(g.get("fused") for g in groups)


def clip_divisor(max_norm: float, total_norm: torch.Tensor) -> torch.Tensor:
    """What `clip_grads_` multiplies by, as a divisor: max(1, (norm + 1e-6) / max_norm), fp32."""
    return torch.clamp((total_norm.float() + 1e-6) / max_norm, min=1.0)
