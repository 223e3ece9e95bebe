"""Activation checkpointing applied per transformer block, keeping parameter names.

Modes (`activation_checkpoint.mode`):
- none:            keep every activation.
- full:            keep only each block's input; recompute the whole block in backward.
- selective-op:    recompute only cheap ops: matmul outputs, attention outputs, Mamba's scan
                   outputs and collectives are saved, elementwise ops and norms are recomputed
                   (roughly half of full AC's recompute is avoided for a fraction of the memory).
- every-n-layers:  full checkpointing of one block in every `every_n`.

Instead of wrapping a block in another module (which renames every parameter under a
`_checkpoint_wrapped_module.` prefix and breaks state-dict keys), the block's own `forward` is
replaced by a checkpointed call of the original. FSDP's hooks sit on the block's `__call__`
and torch.compile traces through `torch.utils.checkpoint`, so the order AC -> compile -> FSDP
works unchanged.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.utils.checkpoint as ckpt
from torch import nn

# Register kenotron::gather_grouped_mm (the experts' first GEMM) and kenotron::fa4_forward
# (FlashAttention-4, model.attention_backend = "flash_attn"), whose outputs the selective policy keeps
# like _grouped_mm's and SDPA's; the FA4 module imports no FA4 code until it runs.
from kenotron.models.common import experts, flash_attention4  # noqa: F401

AC_MODES = ("none", "full", "selective-op", "every-n-layers")


_MATMUL_OPS = ("mm", "addmm", "bmm", "_grouped_mm")  # _grouped_mm: the MoE experts' GEMMs
_SAVED_ATEN_OPS = (
    *_MATMUL_OPS,
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
)
# all_to_all_single: expert parallelism's dispatch and combine, not sent twice.
_SAVED_COLLECTIVES = ("reduce_scatter_tensor", "all_gather_into_tensor", "all_reduce", "all_to_all_single")
# flash-attn's forward (model.attention_backend = "flash_attn"), a custom op once the package is imported.
_SAVED_FLASH_ATTN_OPS = ("_flash_attn_forward",)
# mamba_mixer: registered when a model runs it (models/common/mamba.py's use_scan_kernel, before plan.apply).
# gather_grouped_mm: the experts' first GEMM, which gathers its rows itself (experts.py).
_SAVED_KENOTRON_OPS = ("fa4_forward", "mamba_mixer", "gather_grouped_mm")


def _ops_to_save() -> set:
    """Matmuls, attention kernels and collectives: expensive to redo, so their outputs are kept."""
    ops = set()
    for namespace, names in (
        (torch.ops.aten, _SAVED_ATEN_OPS),
        (torch.ops._c10d_functional, _SAVED_COLLECTIVES),
        (torch.ops.flash_attn, _SAVED_FLASH_ATTN_OPS),
        (torch.ops.kenotron, _SAVED_KENOTRON_OPS),
    ):
        for name in names:
            try:  # not every op exists on every build (nor without the package)
                ops.add(getattr(namespace, name).default)
            except AttributeError:
                continue
    # FlexAttention is a higher-order op: it has no overloads, the op itself is what the policy sees.
    flex = getattr(torch.ops.higher_order, "flex_attention", None)
    if flex is not None:
        ops.add(flex)
    return ops


def _selective_policy(ops: set, matmuls: set, save_matmul_every: int = 1) -> Callable:
    """Save `ops`' outputs, recompute the rest; of the `matmuls`, save only one in every
    `save_matmul_every` (counted in forward order). The count is kept separately for the
    forward and for the recompute, so both pick the same matmuls; a fresh policy is made for
    every checkpointed call (see `checkpoint_module`)."""
    counts = {False: 0, True: 0}

    def policy(ctx, op, *args, **kwargs):
        if op in matmuls and save_matmul_every > 1:
            index = counts[ctx.is_recompute]
            counts[ctx.is_recompute] += 1
            if index % save_matmul_every != 0:
                return ckpt.CheckpointPolicy.PREFER_RECOMPUTE
        if op in ops:
            return ckpt.CheckpointPolicy.MUST_SAVE
        return ckpt.CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def _ignore_profiler_ranges() -> None:
    """FSDP's hooks open profiler ranges (record_function ops) inside a checkpointed block, and
    more of them during its recompute than during forward when the block holds an FSDP unit of
    its own (an MoE layer's experts under expert parallelism): selective checkpointing, which
    replays ops by their count, must not count them."""
    profiler = torch.ops.profiler
    for name, overload in (("_record_function_enter_new", "default"), ("_record_function_exit", "_RecordFunction")):
        op = getattr(getattr(profiler, name, None), overload, None)
        if op is not None:
            ckpt.SAC_IGNORED_OPS.add(op)


def checkpoint_module(module: nn.Module, selective: bool = False, save_matmul_every: int = 1) -> None:
    """Recompute `module`'s forward in backward (all of it, or only cheap ops if `selective`;
    with `save_matmul_every` > 1 also all but one matmul in every that many)."""
    inner = module.forward
    extra: dict = {}
    if selective:
        _ignore_profiler_ranges()
        ops = _ops_to_save()
        matmuls = {getattr(torch.ops.aten, name).default for name in _MATMUL_OPS} | {
            torch.ops.kenotron.gather_grouped_mm.default}

        def context_fn():
            # A new policy per call: its matmul count starts at zero for each block's forward.
            return ckpt.create_selective_checkpoint_contexts(_selective_policy(ops, matmuls, save_matmul_every))

        extra["context_fn"] = context_fn

    @functools.wraps(inner)
    def forward(*args, **kwargs):
        return ckpt.checkpoint(inner, *args, use_reentrant=False, preserve_rng_state=False, **extra, **kwargs)

    module.forward = forward  # type: ignore[method-assign]


def apply_activation_checkpointing(
    blocks: list[nn.Module], mode: str, every_n: int = 2, save_matmul_every: int = 1
) -> None:
    """Checkpoint `blocks` (in model order) according to `mode`."""
    if mode not in AC_MODES:
        raise ValueError(f"activation_checkpoint.mode={mode!r} is not one of {', '.join(AC_MODES)}")
    if mode == "every-n-layers" and every_n < 1:
        raise ValueError(f"activation_checkpoint.every_n={every_n} must be >= 1")
    for i, block in enumerate(blocks):
        if mode == "full" or (mode == "every-n-layers" and i % every_n == 0):
            checkpoint_module(block)
        elif mode == "selective-op":
            checkpoint_module(block, selective=True, save_matmul_every=save_matmul_every)
