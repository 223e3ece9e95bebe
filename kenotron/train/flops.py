"""Model FLOPs per token and device peak FLOP/s, for TFLOP/s and MFU.

FLOPs per trained token (forward + backward) = 6·N + M, where
- N counts the parameters that take part in matrix products: every parameter except the
  input embedding table (a lookup). A tied embedding counts once, as the output projection.
  In an MoE layer a token goes through k of the E routed experts: they count k/E of their
  parameters (the active parameters; router and shared experts count whole).
  (Mamba-2's depthwise convolution, K multiply-adds per channel and token, is counted here
  through its weights, as are the small per-channel parameters of every family.)
- M is the sequence mixing that no parameter accounts for, the family's
  `ModelSpec.mixing_flops(args, T)`:
  - attention: 12·L·H·d·T, the score and value products (L layers, H query heads of size d,
    sequence length T), counted over the full T x T matrix as is customary (not halved for
    the causal mask), so figures compare with other trainers that use the same formula;
  - Mamba-2's SSD scan, per Mamba layer (Q chunk size, H heads of P channels, G groups, N
    state size; models/common/ssd.py): 3 x (2·Q·N·G + 2·Q·P·H + 4·N·P·H). Forward, per token:
    the C·B^T scores inside its chunk (2·Q·N per group), those scores applied to dt·x (2·Q·P
    per head), the chunk's state (2·N·P per head) and the output read from the entering state
    (2·N·P per head); backward twice that. The Q x Q products are counted whole, as attention's
    are. Independent of T: Mamba-2 1.3B (Q 256, H 64, P 64, G 1, N 128) adds 12.8 MFLOP per
    layer and token to 6·N = 8.1 GFLOP (48 layers: +7.6%).
  A hybrid adds each kind over its own layers.

MFU = achieved model FLOP/s / peak dense bf16 FLOP/s of the device. The peak comes from the
table below, matched on the device name; an unknown device has no peak and reports no MFU
rather than a wrong one.
"""

from __future__ import annotations

from torch import nn

from kenotron.models.common.moe import MoE

# Dense (no sparsity) bf16 tensor-core peaks in FLOP/s, from the vendors' datasheets.
# Order matters: the first entry whose key is in the device name wins, so specific
# names come before the general ones.
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("GH200", 989e12),
    ("H200", 989e12),
    ("H100", 989e12),
    ("H800", 989e12),
    ("H20", 148e12),
    ("B200", 2250e12),
    ("GB200", 2500e12),
    ("B100", 1750e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("A10G", 125e12),
    ("L40S", 362e12),
    ("L4", 121e12),
    ("MI300X", 1307e12),
    ("MI325X", 1307e12),
    ("MI250X", 383e12),
)


def peak_flops(device_name: str) -> float | None:
    """Peak dense bf16 FLOP/s of a device from its name, or None when not in the table."""
    for key, value in PEAK_BF16_FLOPS:
        if key in device_name:
            return value
    return None


def matmul_params(model: nn.Module) -> int:
    """N of the FLOP formula: parameters except the input embedding (tied ones counted once)."""
    embedding_ids = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    tied_ids: set[int] = set()
    for m in model.modules():
        if isinstance(m, nn.Linear) and id(m.weight) in embedding_ids:
            tied_ids.add(id(m.weight))
    total = 0
    for p in model.parameters():  # parameters() yields a shared tensor once
        if id(p) in embedding_ids and id(p) not in tied_ids:
            continue
        total += p.numel()
    return total


def active_matmul_params(model: nn.Module) -> int:
    """N for MoE models too: matmul_params with each layer's routed experts counted at top_k / n_experts."""
    total = matmul_params(model)
    for module in model.modules():
        if isinstance(module, MoE):
            routed = sum(p.numel() for p in module.experts.parameters())
            total -= routed - routed * module.args.top_k // module.args.n_experts
    return total


def flops_per_token(n_matmul_params: int, mixing_flops: float) -> float:
    """6·N + M: training FLOPs per token (M: the family's `ModelSpec.mixing_flops(args, seq_len)`)."""
    return 6.0 * n_matmul_params + mixing_flops
