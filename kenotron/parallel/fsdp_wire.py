"""fp32 sums of bf16 gradients, sent as bf16: FSDP's reduce-scatter at half the bytes, same values.

Under FSDP with bf16 compute each rank's gradients are bf16 (the unsharded parameters are), so a
reduction "in fp32" sends values that bf16 holds exactly in twice their bytes: FSDP casts them up
into its reduce-scatter input, and NCCL moves and sums 4 bytes each. Here FSDP is told to reduce
in bf16 (its copy-in writes 2 bytes a value, no rounding), and the reduce-scatter is an all-to-all
of the bf16 chunks followed by a local sum in fp32 of the ranks' chunks, written into the fp32
sharded gradient. The sums are those of an fp32 reduce-scatter up to the order of the additions;
a bf16 reduce-scatter (`fsdp_reduce_dtype bfloat16`) instead rounds each partial sum to bf16.

Where it runs: plain FSDP on CUDA with bf16 parameters, for the units whose gradients reduce in
fp32 (`wire_dtype`), through FSDP's custom reduce-scatter hook (fsdp_gradient_pool.py installs
one per unit). HSDP, CPU runs and fp32 training keep FSDP's own fp32 reduce-scatter.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

WIRE = {"float32": "bfloat16"}
"""The dtype a reduction summed in the key dtype travels in, when the gradients are bf16."""


def wire_dtype(sum_dtype: str, param_dtype: str, kind: str, device_type: str, has_hook: bool) -> str:
    """The dtype FSDP reduces in (its mixed-precision policy's reduce_dtype) for gradients summed in
    `sum_dtype`: bf16 where fp32 sums of bf16 gradients can travel as bf16 (module docstring),
    else `sum_dtype` itself."""
    if param_dtype == "bfloat16" and kind == "fsdp" and device_type == "cuda" and has_hook:
        return WIRE.get(sum_dtype, sum_dtype)
    return sum_dtype


def all_to_all_sum(output: torch.Tensor, input: torch.Tensor, group: dist.ProcessGroup, op) -> None:
    """Reduce-scatter `input` (the ranks' chunks back to back, as FSDP lays them out) into `output`
    by an all-to-all of the chunks in `input`'s dtype and a sum of them in `output`'s dtype; `op`
    SUM or AVG (what FSDP asks for without a gradient divide factor)."""
    ranks = dist.get_world_size(group)
    if op not in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
        raise ValueError(f"the bf16-wire reduce-scatter sums or averages; FSDP asked for {op} "
                         "(a gradient divide factor): set parallelism.fsdp_reduce_dtype bfloat16")
    if input.numel() != ranks * output.numel():
        raise ValueError(f"reduce-scatter input of {input.numel()} values for {ranks} ranks x {output.numel()}")
    chunks = torch.empty_like(input)  # the current (reduce-scatter) stream's, freed after its use there
    dist.all_to_all_single(chunks, input, group=group)
    torch.sum(chunks.view(ranks, -1), dim=0, dtype=output.dtype, out=output.view(-1))
    if op == dist.ReduceOp.AVG:
        output.div_(ranks)
