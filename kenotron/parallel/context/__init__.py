"""Context parallel: a sequence sharded over the `cp` mesh dimension.

- layout.py: which tokens each rank holds (head-tail load balancing or contiguous), their RoPE
  positions, slicing a micro-batch;
- ring.py: kenotron's ring attention (CPU/gloo, and the fallback on CUDA) with its backward;
- block_math.py: the fp32 chunk-pair attention and log-sum-exp merge it is built from;
- torch_ring.py: torch's own context-parallel attention over the fused SDPA kernels (CUDA);
- ulysses.py: the all-to-all scheme (parallelism.cp_scheme='ulysses'): heads scattered over the
  cp ranks around the ordinary attention kernel on the whole sequence;
- apply.py: the plan's CP step (swap each attention's attention_fn) and the batch slicer.
"""

from kenotron.parallel.context.layout import ContextShard, SequenceLayout, shard_batch
from kenotron.parallel.context.ring import ROTATE_METHODS, RingAttention, ring_attention
from kenotron.parallel.context.ulysses import UlyssesAttention, ulysses_attention

__all__ = [
    "ROTATE_METHODS", "ContextShard", "RingAttention", "SequenceLayout", "UlyssesAttention", "ring_attention",
    "shard_batch", "ulysses_attention",
]
