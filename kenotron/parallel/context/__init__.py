"""Context parallel: a sequence sharded over the `cp` mesh dimension.

- layout.py: which tokens each rank holds (head-tail load balancing or contiguous), their RoPE
  positions, slicing a micro-batch;
- ring.py: kenotron's ring attention (CPU/gloo, and the fallback on CUDA) with its backward;
- block_math.py: the fp32 chunk-pair attention and log-sum-exp merge it is built from;
- torch_ring.py: torch's own context-parallel attention over the fused SDPA kernels (CUDA);
- documents.py: document masking under CP: each chunk pair's slice of the block-causal mask,
  and how much work the mask skips;
- flex_gather.py: FlexAttention against the gathered keys/values (CUDA, document masking);
- ulysses.py: the all-to-all scheme (parallelism.cp_scheme='ulysses'): heads scattered over the
  cp ranks around the ordinary attention kernel on the whole sequence, or, where the heads split
  over part of cp only, over that part around one of the rings above over the rest;
- apply.py: the plan's CP step (swap each attention's attention_fn) and the batch slicer.
"""

from kenotron.parallel.context.documents import MaskedWork, SequenceDocuments, masked_work
from kenotron.parallel.context.flex_gather import FlexContextAttention
from kenotron.parallel.context.layout import ContextShard, SequenceLayout, shard_batch
from kenotron.parallel.context.ring import ROTATE_METHODS, RingAttention, ring_attention
from kenotron.parallel.context.ulysses import UlyssesAttention, ulysses_attention

__all__ = [
    "ROTATE_METHODS", "ContextShard", "FlexContextAttention", "MaskedWork", "RingAttention", "SequenceDocuments",
    "SequenceLayout", "UlyssesAttention", "masked_work", "ring_attention", "shard_batch", "ulysses_attention",
]
