"""The cluster the throughput model assumes (throughput.py): peak rates, fitted efficiencies and
bandwidths (docs/estimation.md, Throughput model, says where each figure comes from)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class Hardware:
    """The cluster the throughput model assumes (one H200 SXM per GPU; `for_gpu` gives the H100's)."""

    gpu: str = "H200"
    """The GPU's name, as the prediction states it."""
    peak_flops: float = 989e12
    """Dense bf16 FLOP/s of one GPU (H100 / H200 SXM)."""
    matmul_efficiency: float = 0.705
    """Share of the peak the matmuls reach (fitted: docs/estimation.md, Throughput model)."""
    attention_efficiency: float = 0.715
    """Share of the peak attention reaches, its FLOPs counted as train/flops.py counts them (the
    whole score matrix, twice what a causal kernel computes; fitted)."""
    ulysses_attention_gain: float = 1.16
    """How much faster attention runs under Ulysses (parallelism.cp_scheme='ulysses', plain causal)
    than e_attn prices it: the kernel runs unsplit over the whole sequence, where the ring's
    (whose rows pin e_attn) runs per chunk pair and merges partial outputs. Fitted to the 1B pair
    at cp 2 on 2 x H100 (the rows and their fit: docs/parallelism.md, "Ring or all-to-all")."""
    flash_attention_gain: float = 1.25
    """How much faster FlashAttention-3/4 (`model.attention_backend = "flash_attn"`) runs attention
    than e_attn prices cuDNN's: fitted to the FA4 / cuDNN pairs on H100 and H200 (1B, 8B width, 8B
    FSDP 4, 1B cp 2 at 32k and 64k), each pair's modelled ratio within 2% of the measured one."""
    document_tile_cost: float = 1.4
    """Cost of one 128 x 128 tile that FlexAttention's document-masked kernel keeps, in causal
    attention's tiles at e_attn (fitted to the document-masked CP rows: docs/estimation.md)."""
    scan_efficiency: float = 0.0764
    """Share of the peak Mamba-2's scan reaches, with the memory-bound work around it (fitted)."""
    elementwise_passes: float = 7.49
    """Bytes the elementwise kernels of a block move (norms, SwiGLU, RoPE, residual adds, forward
    and backward), in units of the bytes the block keeps for backward without AC (fitted)."""
    memory_bytes_per_s: float = 4.0e12
    """Bandwidth a streaming kernel reaches (the Triton AdamW's, docs/estimation.md)."""
    gpus_per_node: int = 8
    """GPUs joined by NVLink."""
    nvlink_bytes_per_s: float = 360e9
    """Bus bandwidth of a collective inside a node, per GPU."""
    network_bytes_per_s: float = 45e9
    """Bus bandwidth of a collective across nodes, per GPU (400 Gb/s InfiniBand)."""
    collective_sm_share: float = 0.25
    """Compute time lost per second of communication that runs beside it (NCCL's kernels take SMs
    and memory bandwidth from the matmuls; fitted over the throughput rows, docs/estimation.md)."""
    ep_sync_s: float = 2.5e-3
    """GPU idle per MoE layer's forward under expert parallelism: the host reads the split sizes
    (a synchronization), then launches the rest of the layer (fitted to the 2 × H200 EP row)."""


HBM_BYTES_PER_S = {"h200": 4.8e12, "h100": 3.35e12}
"""The SXM parts' memory bandwidth on their spec sheets. Both have the same bf16 peak and NVLink:
the model's H100 keeps the H200's fitted constants and scales B_mem by the ratio (how well that
holds: docs/estimation.md, Throughput model; tests/planner/test_throughput_rows.py)."""


GPU_MEMORY_GIB = {"h200": 139.8, "h100": 79.1}
"""Each kind's memory as torch reports it (`total_memory`; docs/performance.md): the estimate's
budget for a named GPU."""


def for_gpu(kind: str) -> Hardware:
    """The default cluster with `kind`'s GPUs ("h100" or "h200")."""
    if kind not in HBM_BYTES_PER_S:
        raise ValueError(f"unknown GPU kind {kind!r}; use one of {', '.join(sorted(HBM_BYTES_PER_S))}")
    h200 = Hardware()
    return dataclasses.replace(h200, gpu=kind.upper(),
                               memory_bytes_per_s=h200.memory_bytes_per_s * HBM_BYTES_PER_S[kind] / HBM_BYTES_PER_S["h200"])


def gpu_kind(device_name: str) -> str | None:
    """The kind `for_gpu` knows in a CUDA device's name ("NVIDIA H100 80GB HBM3" -> "h100"), else None."""
    return next((kind for kind in HBM_BYTES_PER_S if kind.upper() in device_name.upper()), None)
