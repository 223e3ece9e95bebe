"""The routed experts of an MoE layer: their weights, their grouped computation, and how token
copies are grouped by expert and brought back.

Dropless routing: every token copy (a token and one of its top-k experts) is computed; none is
dropped and there is no capacity factor. The copies are grouped by expert with one stable sort,
laid out in one buffer where each expert's rows are contiguous (padded to `align` rows so
`torch._grouped_mm` sees aligned groups), computed by two grouped matrix products, and summed
back per token. No Python loop runs over tokens or experts, and every shape is static except
under expert parallelism (the all-to-all receives as many rows as were routed to this rank).

Two autograd functions move rows between the token side and the grouped side. Each one's
backward is the other's forward, so both directions are gathers (no scatter-add atomics) and
deterministic:

    gather_rows(x, grouping)  (tokens, dim) -> (padded rows, dim): row p holds the token of copy
                              grouping.src_copy[p] (padding rows hold zeros)
    sum_rows(y, grouping)     (padded rows, dim) -> (tokens, dim): each token sums its k rows

The "grouped_mm" kernel gathers the rows inside its first product (`gather_grouped_mm`, every
dispatcher): it keeps the tokens for the weight gradient, not the k-times larger grouped rows
(on one rank the layer's input, which the router keeps anyway; under expert parallelism the
received rows), and gathers them again in backward, where each token's k row gradients are
summed in one kernel. Under expert parallel's even split (parallel/expert_even_split.py) the
grouped buffer is planned for the worst case, ep·min(k, local) rows per received token: the rows
past the last group's end (about half that buffer) are in no group, and the gathers and the gate
stop there (`Grouping.end`, grouped_tail.py).

Expert compute (`kernel`): "grouped_mm" runs `torch._grouped_mm` (bf16 on Hopper GPUs; torch's
per-group fallback elsewhere); "for_loop" runs one matrix product per expert over the rows
torch.split gives it (the reference: exact in fp32, and the path of devices without grouped GEMM).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from kenotron.dtensor import local_tensor
from kenotron.models.common.grouped_tail import (
    gather_rows_until,
    gather_token_rows,
    sum_copy_rows_op,
    sum_token_copies,
    swiglu_rows,
    swiglu_rows_until,
)
from kenotron.models.common.init import InitSpec, trunc_normal

EXPERT_KERNELS = ("grouped_mm", "for_loop")


def grouped_mm_alignment(dtype: torch.dtype) -> int:
    """Rows each expert's group is padded to for torch._grouped_mm: 16 bytes of the dtype."""
    return max(1, 16 // torch.empty((), dtype=dtype).element_size())


@dataclass
class Grouping:
    """Where each token copy sits in the grouped (expert-major, padded) buffer."""

    src_copy: torch.Tensor
    """(rows,) int64: for each grouped row, the copy it holds (copy index = token * k + slot), or
    `copies` for a padding row."""
    dest_row: torch.Tensor
    """(copies,) int64: the grouped row of each copy."""
    offsets: torch.Tensor
    """(groups,) int32: cumulative end row of each group (the last one ends at `rows`)."""
    counts: torch.Tensor
    """(groups,) int64: copies per group (padding excluded)."""
    k: int
    """Copies per token (top-k); 1 for a grouping of single rows."""
    end: torch.Tensor | None = None
    """(1,) int32 on the device, the last group's end, where rows from it on belong to no group
    (the even split's worst-case buffer): the row gathers and the gate stop there
    (grouped_tail.py). None where the last group ends at `rows`."""

    @property
    def rows(self) -> int:
        return self.src_copy.shape[0]

    @property
    def copies(self) -> int:
        return self.dest_row.shape[0]


def padded_counts(counts: torch.Tensor, align: int) -> torch.Tensor:
    """Each group's rows in the grouped buffer: its copies rounded up to a multiple of `align`."""
    return (counts + align - 1) // align * align


def group_by_expert(expert_ids: torch.Tensor, n_groups: int, k: int, align: int = 1,
                    counts: torch.Tensor | None = None) -> Grouping:
    """Group the copies whose experts are `expert_ids` (copies,) by expert, each group padded to a
    multiple of `align` rows. The buffer has a static size, copies + n_groups * (align - 1) rounded
    up to a multiple of `align` (float8's grouped GEMM reads the buffer transposed in backward: its
    row count must be 16-byte aligned too): the last group takes the rows that the others' padding
    leaves over. `counts` (n_groups,), the copies per group, when the caller knows them; else
    each group's bounds in the sorted ids (a binary search per group: an accumulating index_add
    would run on CUDA's sorting index_put, which adds each run of equal ids serially)."""
    copies = expert_ids.shape[0]
    device = expert_ids.device
    order = torch.argsort(expert_ids, stable=True)  # grouped (unpadded) position -> copy
    sorted_ids = expert_ids[order]
    if counts is None:
        bounds = torch.searchsorted(sorted_ids, torch.arange(n_groups + 1, device=device, dtype=sorted_ids.dtype))
        counts = bounds[1:] - bounds[:-1]
    padded = padded_counts(counts, align)
    rows = -(-(copies + n_groups * (align - 1)) // align) * align
    ends = torch.cumsum(padded, 0)
    ends[-1] = rows  # the tail of the static buffer belongs to the last group
    starts = torch.cumsum(padded, 0) - padded
    unpadded_starts = torch.cumsum(counts, 0) - counts
    position = torch.arange(copies, device=device) + (starts - unpadded_starts)[sorted_ids]
    dest_row = torch.empty_like(order).scatter_(0, order, position)
    src_copy = torch.full((rows,), copies, dtype=torch.int64, device=device).scatter_(0, position, order)
    return Grouping(src_copy, dest_row, ends.to(torch.int32), counts, k)


class _GatherRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, src_copy: torch.Tensor, dest_row: torch.Tensor, k: int) -> torch.Tensor:
        ctx.save_for_backward(dest_row)
        ctx.k = k
        return gather_token_rows(x, src_copy, k)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (dest_row,) = ctx.saved_tensors
        return sum_token_copies(grad, dest_row, ctx.k), None, None, None


class _SumRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y: torch.Tensor, src_copy: torch.Tensor, dest_row: torch.Tensor, k: int,
                end: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(src_copy, end)
        ctx.k = k
        return sum_token_copies(y, dest_row, k)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        src_copy, end = ctx.saved_tensors
        rows = gather_token_rows(grad, src_copy, ctx.k) if end is None else gather_rows_until(grad, src_copy, end, ctx.k)
        return rows, None, None, None, None


def gather_rows(x: torch.Tensor, g: Grouping) -> torch.Tensor:
    """(tokens, ...) -> (g.rows, ...): each grouped row holds its copy's token; padding rows zero."""
    return _GatherRows.apply(x, g.src_copy, g.dest_row, g.k)


def sum_rows(y: torch.Tensor, g: Grouping) -> torch.Tensor:
    """(g.rows, ...) -> (tokens, ...): each token the sum of its k copies' rows (padding unread)."""
    return _SumRows.apply(y, g.src_copy, g.dest_row, g.k, g.end)


def copy_weights(weights: torch.Tensor, g: Grouping) -> torch.Tensor:
    """Per grouped row, the routing weight of its copy (0 on padding rows): (g.rows,)."""
    flat = weights.reshape(-1)
    return torch.cat([flat, flat.new_zeros(1)]).index_select(0, g.src_copy)


def grouped_mm(x: torch.Tensor, w_t: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """x (rows, K) grouped by expert (group e ends at offsets[e]) times each group's w_t[e] (K, N)."""
    return torch._grouped_mm(x, w_t, offs=offsets)


# A custom op (torch.library), not an autograd.Function: torch.compile traces an autograd.Function
# into the joint graph, where the backward's gather is merged with the forward's and the partitioner
# keeps the gathered rows again; a custom op is opaque to it, so only its inputs are kept.
def _gathered_product(x: torch.Tensor, w: torch.Tensor, src_copy: torch.Tensor, dest_row: torch.Tensor,
                      offsets: torch.Tensor, k: int) -> torch.Tensor:
    return torch._grouped_mm(gather_rows_until(x, src_copy, offsets[-1:], k), w.transpose(-2, -1), offs=offsets)


def _gathered_product_grads(grad: torch.Tensor, x: torch.Tensor, w: torch.Tensor, src_copy: torch.Tensor,
                            dest_row: torch.Tensor, offsets: torch.Tensor,
                            k: int) -> tuple[torch.Tensor, torch.Tensor]:
    # torch's own derivative of _grouped_mm (FunctionsManual's _grouped_mm_mat1/2_backward for a
    # row-major x and a transposed w), on the rows gathered again, then the gather's adjoint. The
    # weight's first: the gathered rows are freed before the rows' gradient exists.
    grad_w = torch._grouped_mm(grad.transpose(-2, -1), gather_rows_until(x, src_copy, offsets[-1:], k), offs=offsets)
    grad_x = sum_copy_rows_op(torch._grouped_mm(grad, w, offs=offsets), dest_row, k)
    return grad_x, grad_w


_gather_grouped_mm = torch.library.custom_op("kenotron::gather_grouped_mm", _gathered_product, mutates_args=())
_gather_grouped_mm_backward = torch.library.custom_op("kenotron::gather_grouped_mm_backward", _gathered_product_grads,
                                                      mutates_args=())
# The fake kernels run the same ops: torch._grouped_mm's own fake kernel gives the shapes and strides.
_gather_grouped_mm.register_fake(_gathered_product)
_gather_grouped_mm_backward.register_fake(_gathered_product_grads)


def _gather_grouped_mm_setup_context(ctx, inputs, output) -> None:
    x, w, src_copy, dest_row, offsets, k = inputs
    ctx.save_for_backward(x, w, src_copy, dest_row, offsets)
    ctx.k = k


def _gather_grouped_mm_autograd(ctx, grad: torch.Tensor):
    return *_gather_grouped_mm_backward(grad, *ctx.saved_tensors, ctx.k), None, None, None, None


_gather_grouped_mm.register_autograd(_gather_grouped_mm_autograd, setup_context=_gather_grouped_mm_setup_context)


def gather_grouped_mm(x: torch.Tensor, w: torch.Tensor, g: Grouping) -> torch.Tensor:
    """grouped_mm(gather_rows(x, g), w^T, g.offsets) for w (groups, N, K), keeping x (tokens, K)
    for backward instead of the (g.rows, K) gathered rows, which backward gathers again."""
    return _gather_grouped_mm(x, w, g.src_copy, g.dest_row, g.offsets, g.k)


class GroupedExperts(nn.Module):
    """`n_experts` SwiGLU experts stored as 3-D weights, as transformers keeps them in memory:
    w13 (experts, 2 * ffn_dim, dim) is [gate; up] of every expert, w2 (experts, dim, ffn_dim) its
    down projection. Under expert parallelism the weights are DTensors sharded on the expert
    dimension; compute reads the local experts."""

    def __init__(self, dim: int, ffn_dim: int, n_experts: int) -> None:
        super().__init__()
        self.n_experts = n_experts
        self.ffn_dim = ffn_dim
        self.w13 = nn.Parameter(torch.empty(n_experts, 2 * ffn_dim, dim))
        self.w2 = nn.Parameter(torch.empty(n_experts, dim, ffn_dim))
        self.kernel = "for_loop"
        """"grouped_mm" or "for_loop" (see the module docstring); the trainer sets it from its choices."""
        self.swiglu: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = swiglu_rows
        """(h, scale) -> silu(gate) * up * scale; a fused kernel may replace it (models/common/eager_kernels.py)."""
        self.gate = "torch"
        """"triton": the "grouped_mm" kernel's gate is kernels/expert_swiglu.py's, up to the last
        group's end (`swiglu_rows_until`), in compiled blocks too; the trainer sets it from its choices."""
        self.grouped_mm: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] = grouped_mm
        """The "grouped_mm" kernel's product (x, w_t, offsets); float8 experts swap in torchao's
        (kenotron/parallel/float8.py)."""
        self.row_alignment = 0
        """Rows each expert's group is padded to; 0: what torch._grouped_mm needs for the dtype."""
        self.weight_view: Callable[[torch.Tensor], torch.Tensor] = local_tensor
        """How compute reads a weight: its local shard (expert parallelism swaps in one that also
        marks the gradient as a partial sum over tensor-parallel ranks)."""

    def local_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.weight_view(self.w13), self.weight_view(self.w2)

    def gathers_in_first_product(self) -> bool:
        """Whether forward's `gather` runs inside the first product (`gather_grouped_mm`): the
        plain "grouped_mm" kernel; float8's product and the per-expert loop take gathered rows."""
        return self.kernel == "grouped_mm" and self.grouped_mm is grouped_mm

    def forward(self, x: torch.Tensor, offsets: torch.Tensor, counts: torch.Tensor, scale: torch.Tensor,
                gather: Grouping | None = None) -> torch.Tensor:
        """x (rows, dim) grouped by local expert (group e ends at offsets[e]; `counts` are its
        real rows), `scale` (rows,) each row's routing weight -> (rows, dim). Rows past the last
        group's end belong to no expert: "grouped_mm" leaves them unwritten, "for_loop" zero.
        With `gather`, x is the tokens (tokens, dim) whose rows are gather_rows(x, gather): the
        plain "grouped_mm" kernel gathers them in its first product (`gather_grouped_mm`)."""
        w13, w2 = self.local_weights()
        fused_gather = gather is not None and self.gathers_in_first_product()
        if gather is not None and not fused_gather:  # float8's product or the per-expert loop
            x = gather_rows(x, gather)
        if self.kernel == "grouped_mm":
            dtype = x.dtype
            if torch.is_autocast_enabled(x.device.type):
                # torch._grouped_mm has no autocast rule: cast as autocast would for a matmul.
                dtype = torch.get_autocast_dtype(x.device.type)
                x = x.to(dtype)
            if fused_gather:
                h = gather_grouped_mm(x, w13.to(dtype), gather)
            else:
                h = self.grouped_mm(x, w13.to(dtype).transpose(-2, -1), offsets)
            # The Triton gate up to the last group's end (gather.end is that end): always for the even
            # split's worst-case buffer, and under Choices.expert_gate (not before float8's product,
            # which quantizes every row).
            bounded = (fused_gather and gather.end is not None) or (self.gate == "triton" and self.grouped_mm is grouped_mm)
            gated = swiglu_rows_until(h, scale, offsets[-1:]) if bounded else self.swiglu(h, scale)
            return self.grouped_mm(gated, w2.to(dtype).transpose(-2, -1), offsets)
        return self._for_loop(x, w13, w2, offsets, scale)

    def _for_loop(self, x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, offsets: torch.Tensor,
                  scale: torch.Tensor) -> torch.Tensor:
        # The reference path reads the group sizes on the host (torch.split needs them).
        ends = offsets.tolist()
        sizes = [end - start for start, end in zip([0, *ends[:-1]], ends)]
        outs = []
        for e, (xs, ss) in enumerate(zip(torch.split(x[:ends[-1]], sizes), torch.split(scale[:ends[-1]], sizes))):
            # In x's dtype: experts outside FSDP (parallel/data_parallel.py) keep fp32 weights
            # beside bf16 activations; autocast, where on, casts both again.
            h = F.linear(xs, w13[e].to(xs.dtype))
            outs.append(F.linear(self.swiglu(h, ss), w2[e].to(xs.dtype)))
        # Rows in no group (none but under the even split), zero in the products' dtype (autocast's).
        # Appended also when there are none: under compile `ends` are unbacked, and a branch on
        # them would be a data-dependent guard.
        rest = x.shape[0] - ends[-1]
        torch._check(rest >= 0)
        outs.append(outs[0].new_zeros((rest, outs[0].shape[1])))
        return torch.cat(outs)

    def param_init_specs(self, init_std: float, out_std: float) -> dict[str, InitSpec]:
        return {"w13": trunc_normal(init_std), "w2": trunc_normal(out_std)}
