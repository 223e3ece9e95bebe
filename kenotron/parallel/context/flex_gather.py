"""Context-parallel attention through FlexAttention: the fused path for document masking on CUDA.

Each rank gathers the keys and values of the whole sequence (one all-gather per layer, as the
ring's "allgather" rotation does) and runs FlexAttention of its own queries against them under
a block mask that places its queries at their *global* positions (`SequenceLayout`, head-tail
balanced or contiguous): key j is visible to local query i iff j <= position(i) and, with
document masking, both lie in the same document. The block mask marks which 128 x 128 tiles are
empty, full or partial, so the kernel skips the tiles the document mask empties (documents.py's
`masked_work` counts them). Backward is flex's own (autograd), and the gradients of the gathered
keys/values go back to the ranks that own them through one all-to-all, summed there.

Why not torch's own CP with flex: torch 2.13's (`_context_parallel._attention`, read for this)
does the same thing, an all-gather of keys/values (`flex_cp_allgather`, reduce-scatter in
backward) and a block mask for the local queries (`create_cp_block_mask`), but through a
parallel style's hook, its own load balancer's rearranged order and private names, and it
refuses a sequence that cp x 128 does not divide; torch 2.11's was not read here. This module
uses flex_attention's public API only, kenotron's layout as it is, and any length the layout
takes. Why not flex per chunk pair with log-sum-exp merges (the ring's structure): one kernel
call per rank and layer instead of per pair, and flex's own backward, with no lse gradient.

Cost: the gathered keys/values (cp x the local ones) are kept for backward by flex, per layer,
where the ring keeps only the local ones; the estimator counts it (estimate/cp_ring_memory.py).
The block mask is built once per micro-batch and rank and shared by every layer
(`SequenceDocuments.cache`); the causal one once per sequence length.

On CPU the same code runs (flex_attend computes a dense mask from the block mask's mask_mod
when gradients are needed, since torch has no flex backward there); the CPU tests run it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.attention.flex_attention import BlockMask

from kenotron.models.common.flex_attention import MaskMod, build_block_mask, flex_attend
from kenotron.parallel.collectives import all_gather_single
from kenotron.parallel.context.documents import SequenceDocuments, check_documents
from kenotron.parallel.context.layout import SequenceLayout


class _GatherSequence(torch.autograd.Function):
    """This rank's (batch, heads, local_len, dim) shard -> the whole sequence in global order;
    backward: each rank's slice of the gradient, summed over the ranks that used it."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup, layout: SequenceLayout):  # type: ignore[override]
        ctx.group, ctx.layout = group, layout
        gathered = x.new_empty(layout.cp * x.numel())  # flat: gloo's all-gather takes no leading rank dim
        all_gather_single(gathered, x.contiguous().view(-1), group=group)
        return layout.unshard(list(gathered.view(layout.cp, *x.shape).unbind(0)), dim=2)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        layout, group = ctx.layout, ctx.group
        per_rank = torch.stack([layout.shard(grad, r, dim=2) for r in range(layout.cp)])
        received = torch.empty_like(per_rank)
        dist.all_to_all_single(received.view(layout.cp, -1), per_rank.reshape(layout.cp, -1), group=group)
        return received.sum(dim=0), None, None


def global_mask_mod(positions: torch.Tensor, documents: torch.Tensor | None) -> MaskMod:
    """mask_mod of local queries (at global `positions`) against the whole sequence's keys:
    causal in global positions, and within one document when `documents` (batch, seq) is given."""

    def mask_mod(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        q_pos = positions[q_idx]
        allowed = kv_idx <= q_pos
        if documents is not None:
            allowed = allowed & (documents[b, q_pos] == documents[b, kv_idx])
        return allowed

    return mask_mod


class FlexContextAttention(nn.Module):
    """Drop-in `attention_fn` under context parallel: FlexAttention against the gathered sequence."""

    takes_documents = True
    """The model's attention may hand it the batch's SequenceDocuments (models/common/attention.py)."""

    def __init__(self, group: dist.ProcessGroup, load_balance: bool = True) -> None:
        super().__init__()
        self.group = group
        self.load_balance = load_balance
        self.cp = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self._causal: dict[tuple[int, str], BlockMask] = {}
        # None: FlexAttention under this rank's block mask. The memory estimator puts a kernel
        # here that allocates what flex's does on CUDA, without the mask (estimate/cp_ring_memory.py).
        self.kernel: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None

    def block_mask(self, layout: SequenceLayout, device: torch.device,
                   documents: SequenceDocuments | None) -> BlockMask:
        """This rank's (local_len x seq_len) mask, built once per micro-batch (or per length)."""
        # The ids' address and rows: a pipeline's microbatches share the micro-batch's cache.
        ids_key = (documents.ids.data_ptr(), documents.ids.shape[0]) if documents is not None else None
        key = ("flex_context", self.rank, layout.seq_len, layout.load_balance, ids_key)
        cache = documents.cache if documents is not None else self._causal
        if key not in cache:
            positions = layout.positions(self.rank, device=device)
            ids = documents.ids if documents is not None else None
            batch = ids.shape[0] if ids is not None else None
            mod = global_mask_mod(positions, ids)
            cache[key] = build_block_mask(mod, batch, layout.local_len, layout.seq_len, device)
        return cache[key]

    # The all-gather and the mask's construction stay out of dynamo's graph; flex_attend compiles
    # the kernel itself on CUDA.
    @torch.compiler.disable
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                documents: SequenceDocuments | None = None) -> torch.Tensor:
        """q (batch, heads, local_len, dim), k/v (batch, kv_heads, local_len, dim) -> like q."""
        documents = check_documents(documents)
        layout = SequenceLayout(q.shape[2] * self.cp, self.cp, self.load_balance)
        if documents is not None and documents.ids.shape != (q.shape[0], layout.seq_len):
            raise ValueError(f"document ids of shape {tuple(documents.ids.shape)} are not the whole sequence's "
                             f"({q.shape[0]}, {layout.seq_len}) for q of shape {tuple(q.shape)} on {self.cp} ranks")
        k_all = _GatherSequence.apply(k, self.group, layout)
        v_all = _GatherSequence.apply(v, self.group, layout)
        if self.kernel is not None:
            return self.kernel(q, k_all, v_all)
        return flex_attend(q, k_all, v_all, self.block_mask(layout, q.device, documents))

    def extra_repr(self) -> str:
        return f"cp={self.cp}, load_balance={self.load_balance}, flex"
