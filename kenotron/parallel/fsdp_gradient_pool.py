"""FSDP's sharded gradients allocated from the compute stream's memory (`tuning.fsdp_gradients_in_compute_pool`).

FSDP allocates each reduce-scatter's output, which then becomes the sharded gradients, on its
reduce-scatter stream. The caching allocator keeps one pool per stream, so when the gradients
are freed after the optimizer step their memory stays in that stream's pool: the next forward,
whose activations run on the compute stream, cannot use it, and the step reserves the
gradients' bytes on top of the forward's peak (all the fp32 sharded gradients). Allocating that output from the compute
stream's pool lets the forward reuse it, as in a run without a second stream.

Safety: FSDP makes the reduce-scatter stream wait for the compute stream just before it
allocates the output, so the reduce-scatter writes after every earlier use of that memory. The
memory must then not go back to the compute stream while reduce-scatter-stream work on it is
pending. Two cases:
- The output becomes the gradients (its dtype is the parameters' and they have no gradient yet
  to accumulate into): it is held here until the end of the backward, where the compute stream
  waits for the reduce-scatter stream. When the gradients are freed later (after the optimizer
  step), the free is in the compute stream's order and the memory is reusable at once.
  `record_stream` would keep it out of reach until the allocator sees the reduce-scatter
  stream's event done, which, with the host running ahead of the GPU, is after the next
  forward has asked for memory: reserved memory grows instead.
- The output is freed during the backward (added into existing gradients on the
  reduce-scatter stream): `record_stream` on that stream, so the memory is reused as soon as
  that work is done rather than held to the end of the backward.
A reduction in a lower precision than the parameters' (bf16 gradients of fp32 parameters:
`fsdp_reduce_dtype` bfloat16, or auto's routed experts) would be cast by FSDP to the parameters'
dtype on its reduce-scatter stream, in a new tensor of that stream's pool: the gradients out of
reach again (docs/parallelism.md, fsdp_reduce_dtype). So the output is allocated in the
parameters' dtype, which FSDP then leaves as it is, and the reduce-scatter writes its reduce-dtype
result into a transient buffer and casts it into the output: the same values, one cast as before.
Plain FSDP only: HSDP also works on the output on an all-reduce stream.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule

from kenotron.parallel.collectives import reduce_scatter_single
from kenotron.parallel.fsdp_wire import all_to_all_sum

try:  # public in newer torch builds, private in 2.11
    from torch.distributed.fsdp import ReduceScatter
except ImportError:
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter


def own_parameters(module: nn.Module, ignored: set[nn.Parameter] | frozenset[nn.Parameter] = frozenset()) -> list[nn.Parameter]:
    """The parameters one FSDP module's reduce-scatter covers: its own, neither its nested FSDP
    modules' nor those FSDP was told to ignore (`ignored`: experts outside FSDP, whose gradients,
    made before the unit's reduce-scatter, would keep it from becoming the unit's gradients)."""
    nested = {id(p) for m in module.modules() if m is not module and isinstance(m, FSDPModule)
              for p in m.parameters()}
    nested |= {id(p) for p in ignored}
    return [p for p in module.parameters() if id(p) not in nested]


def becomes_gradients(dtype: torch.dtype, params: list[nn.Parameter]) -> bool:
    """Whether a reduce-scatter output of `dtype` is kept as `params`' gradients (viewed, neither
    cast nor added into existing gradients), so that nothing frees it during the backward."""
    return bool(params) and all(p.dtype == dtype and p.grad is None for p in params)


def output_dtype(reduce_dtype: torch.dtype, params: list[nn.Parameter]) -> torch.dtype:
    """The dtype to allocate a reduce-scatter's output in: the parameters' (all of one dtype),
    which FSDP would cast a lower-precision result to anyway; else the reduce dtype."""
    dtypes = {p.dtype for p in params}
    return dtypes.pop() if len(dtypes) == 1 else reduce_dtype


class UnitReduceScatter(ReduceScatter):
    """One FSDP unit's reduce-scatter: its output allocated in the parameters' dtype, from
    `compute`'s pool when `in_compute_pool`, and summed in `sum_dtype` where that differs from
    the dtype FSDP sends (fsdp_wire.py: fp32 sums of bf16 gradients sent as bf16)."""

    def __init__(self, compute: torch.cuda.Stream, params: list[nn.Parameter], *, in_compute_pool: bool = True,
                 sum_dtype: torch.dtype | None = None) -> None:
        self.compute = compute
        self.params = params
        self.in_compute_pool = in_compute_pool
        self.sum_dtype = sum_dtype
        self._held: list[torch.Tensor] = []
        self._streams: list[torch.cuda.Stream] = []

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        current = torch.cuda.current_stream(device)
        if current == self.compute:  # the input buffer: FSDP fills it on the compute stream
            return torch.empty(*size, dtype=dtype, device=device)
        dtype = self.sum_dtype or output_dtype(dtype, self.params)
        if not self.in_compute_pool:
            return torch.empty(*size, dtype=dtype, device=device)
        with torch.cuda.stream(self.compute):
            tensor = torch.empty(*size, dtype=dtype, device=device)
        if not (becomes_gradients(dtype, self.params) and self._hold(tensor, current)):
            tensor.record_stream(current)
        return tensor

    def _hold(self, tensor: torch.Tensor, stream: torch.cuda.Stream) -> bool:
        """Keep `tensor` to the end of this backward; False outside a backward."""
        if not self._held:
            try:
                # Runs after FSDP's own end-of-backward callback, queued earlier (root pre-backward).
                torch.autograd.Variable._execution_engine.queue_callback(self._release)
            except RuntimeError:  # not inside a backward: nothing would release it
                return False
        self._held.append(tensor)
        if stream not in self._streams:
            self._streams.append(stream)
        return True

    def _release(self) -> None:
        for stream in self._streams:
            self.compute.wait_stream(stream)
        self._held.clear()
        self._streams.clear()

    def __call__(self, output_tensor, input_tensor, group, op, async_op: bool = False):
        if self.sum_dtype is not None:  # allocate() gave the output the sum's dtype
            if async_op:
                raise ValueError("the bf16-wire reduce-scatter runs synchronously on its stream")
            return all_to_all_sum(output_tensor, input_tensor, group, op)
        return reduce_scatter_into(output_tensor, input_tensor, group, op, async_op)


def reduce_scatter_into(output: torch.Tensor, input: torch.Tensor, group: dist.ProcessGroup, op,
                        async_op: bool = False) -> dist.Work | None:
    """Reduce-scatter `input` in its own dtype into `output`, cast where `output`'s dtype differs
    (through a transient buffer of the current stream, freed after its use there)."""
    if output.dtype == input.dtype:
        return reduce_scatter_single(output, input, op=op, group=group, async_op=async_op)
    if async_op:
        raise ValueError(f"a reduce-scatter cast from {input.dtype} to {output.dtype} runs synchronously on its stream")
    reduced = torch.empty(output.shape, dtype=input.dtype, device=output.device)
    reduce_scatter_single(reduced, input, op=op, group=group)
    output.copy_(reduced)
    return None


def install_reduce_scatters(units: list[tuple[nn.Module | list[nn.Module], torch.dtype | None]],
                            device: torch.device, in_compute_pool: bool,
                            ignored: set[nn.Parameter] | frozenset[nn.Parameter] = frozenset()) -> bool:
    """Install a `UnitReduceScatter` on every FSDP unit (a module, or a list of modules wrapped as
    one unit), each with the dtype its gradients sum in where it is not the one FSDP sends (else
    None); the compute stream is the current one; `ignored`: the parameters no unit manages
    (`fully_shard`'s ignored_params). False where this torch build has no custom reduce-scatter hook."""
    groups = [(unit if isinstance(unit, list) else [unit], sums) for unit, sums in units]
    if not all(hasattr(m, "set_custom_reduce_scatter") for group, _ in groups for m in group):
        return False
    compute = torch.cuda.current_stream(device)
    for group, sums in groups:
        # The modules of one unit share its state: one hook covers all their parameters.
        params = [p for module in group for p in own_parameters(module, ignored)]
        group[0].set_custom_reduce_scatter(
            UnitReduceScatter(compute, params, in_compute_pool=in_compute_pool, sum_dtype=sums))
    return True
