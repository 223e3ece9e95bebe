"""The flat all-gather and reduce-scatter under the names of the torch that runs.

torch 2.13 renames `all_gather_into_tensor` and `reduce_scatter_tensor` to `all_gather_single` and
`reduce_scatter_single` (the old names warn on every call); torch 2.11 has only the old names.
Their large buffer is flat, `ranks ×` the other's size along dim 0: gloo refuses a leading rank
dimension.
"""

from __future__ import annotations

import torch.distributed as dist

all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
