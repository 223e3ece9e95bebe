"""torch's own context-parallel attention, over the fused SDPA kernels (the CUDA path).

`TorchRingAttention` is a parameterless module whose forward is plain causal SDPA. torch's
`_ContextParallel` style wraps it: its inputs become DTensors sharded along the sequence
(dim 2) over the cp mesh, and with torch's context-parallel dispatcher enabled, SDPA on such
DTensors runs torch's ring (`_templated_ring_attention`) around whichever fused kernel SDPA
picks: flash, cuDNN or memory-efficient. Keys/values rotate by all-gather or by a ring of
all-to-all permutes (`rotate_method`); grouped kv heads rotate unrepeated (flash and cuDNN
take grouped heads; the memory-efficient kernel does not).

torch keeps these settings in process-wide state (`_cp_options`, the DTensor dispatcher),
not per module: every TorchRingAttention of a process must agree, and each one checks at
every call that nobody changed them, because a load-balance flag that disagrees with the
data layout would give wrong attention without any error.

torch has no context-parallel kernel for CPU tensors; there kenotron uses its own ring
attention (ring.py). Names checked against torch 2.11 and 2.13, where these APIs are
private (`torch.distributed.tensor.experimental._context_parallel`).
"""

from __future__ import annotations

from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import parallelize_module

from kenotron.parallel.context.ring import ROTATE_METHODS


def torch_cp_api() -> ModuleType:
    """torch's context-parallel attention module (moved into a package after torch 2.9).

    Imported on first use, not with this module: torch's module keeps the DTensor op handlers
    present when it is imported and its dispatcher installs those (`existing_custom_ops`), so
    handlers added before the first use, as the CPU tests add the CPU flash kernel's
    (tests/parallel/test_context_torch_ring.py), must exist when it is imported."""
    try:
        from torch.distributed.tensor.experimental._context_parallel import _attention
    except ImportError:  # older layout: one file
        from torch.distributed.tensor.experimental import _attention  # type: ignore[no-redef]
    return _attention


def configure_torch_context_parallel(load_balance: bool, rotate_method: str) -> None:
    """Set torch's process-wide context-parallel options and enable its SDPA dispatcher."""
    if rotate_method not in ROTATE_METHODS:
        raise ValueError(f"rotate_method={rotate_method!r} is not one of {', '.join(ROTATE_METHODS)}")
    api = torch_cp_api()
    api._cp_options.enable_load_balance = load_balance
    api.set_rotate_method(rotate_method)
    api._enable_context_parallel_dispatcher()


def current_torch_options() -> tuple[bool, str]:
    """(load_balance, rotate_method) torch's ring will use now."""
    api = torch_cp_api()
    options = api._cp_options
    method = "allgather" if options.rotate_method == api._RotateMethod.ALL_GATHER else "alltoall"
    return bool(options.enable_load_balance), method


class TorchRingAttention(nn.Module):
    """Drop-in `attention_fn` under context parallel that runs torch's ring over fused kernels."""

    def __init__(self, cp_mesh: DeviceMesh, load_balance: bool = True, rotate_method: str = "allgather") -> None:
        super().__init__()
        if cp_mesh.ndim != 1:
            raise ValueError(f"TorchRingAttention needs the 1-D cp mesh, got a {cp_mesh.ndim}-D mesh {cp_mesh}")
        configure_torch_context_parallel(load_balance, rotate_method)
        self.cp_size = cp_mesh.size()
        self.load_balance = load_balance
        self.rotate_method = rotate_method
        api = torch_cp_api()
        style = api._ContextParallel(seq_dim=2, attention_type=api._ContextParallel.AttentionType.SDPA)
        parallelize_module(self, cp_mesh, style)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # q/k/v arrive here as DTensors sharded on the sequence (the style's input hook); the
        # output hook hands the local shard back.
        if current_torch_options() != (self.load_balance, self.rotate_method):
            raise RuntimeError(
                f"torch's context-parallel options changed to (load_balance, rotate_method) = "
                f"{current_torch_options()} but this attention was built for "
                f"{(self.load_balance, self.rotate_method)}; all context-parallel attention in one "
                f"process must use the same settings"
            )
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=k.shape[1] != q.shape[1])

    def extra_repr(self) -> str:
        return f"cp={self.cp_size}, load_balance={self.load_balance}, rotate={self.rotate_method}"
