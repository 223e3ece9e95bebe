"""FSDP's sharded gradients allocated from the compute stream's memory (`parallelism.fsdp_gradients_in_compute_pool`).

FSDP allocates each reduce-scatter's output, which then becomes the sharded gradients, on its
reduce-scatter stream. The caching allocator keeps one pool per stream, so when the gradients
are freed after the optimizer step their memory stays in that stream's pool: the next forward,
whose activations run on the compute stream, cannot use it, and the step reserves the
gradients' bytes on top of the forward's peak (all the fp32 sharded gradients: 15.0 GiB per GPU
for the 8B model on 2 GPUs, measured per pool). Allocating that output from the compute
stream's pool lets the forward reuse it, as in a run without a second stream.

Safety: FSDP makes the reduce-scatter stream wait for the compute stream just before it
allocates the output, so the reduce-scatter writes after every earlier use of that memory; and
`record_stream` on the reduce-scatter stream keeps the allocator from handing the memory back
to the compute stream while reduce-scatter-stream work on it is pending (a cast to the
parameters' dtype, or an accumulation into existing gradients, frees it there). Plain FSDP
only: HSDP also works on the output on an all-reduce stream.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

try:  # public in newer torch builds, private in 2.11
    from torch.distributed.fsdp import ReduceScatter
except ImportError:
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter


class ComputePoolReduceScatter(ReduceScatter):
    """FSDP's reduce-scatter with its buffers allocated from `compute`'s pool."""

    def __init__(self, compute: torch.cuda.Stream) -> None:
        self.compute = compute

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        current = torch.cuda.current_stream(device)
        if current == self.compute:  # the input buffer: FSDP fills it on the compute stream
            return torch.empty(*size, dtype=dtype, device=device)
        with torch.cuda.stream(self.compute):
            tensor = torch.empty(*size, dtype=dtype, device=device)
        tensor.record_stream(current)
        return tensor

    def __call__(self, output_tensor, input_tensor, group, op, async_op: bool = False):
        return dist.reduce_scatter_tensor(output_tensor, input_tensor, op=op, group=group, async_op=async_op)


def allocate_gradients_in_compute_pool(modules: list, device: torch.device) -> bool:
    """Install the compute-pool reduce-scatter on every FSDP module (the compute stream is the
    current one); False where this torch build has no custom reduce-scatter hook."""
    if not all(hasattr(m, "set_custom_reduce_scatter") for m in modules):
        return False
    comm = ComputePoolReduceScatter(torch.cuda.current_stream(device))
    for module in modules:
        module.set_custom_reduce_scatter(comm)
    return True
