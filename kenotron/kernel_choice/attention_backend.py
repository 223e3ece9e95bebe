"""Which attention kernel runs, chosen once per run (`model.attention_backend`).

SDPA backends. On Hopper GPUs cuDNN's attention runs forward+backward much faster than the
flash kernel torch picks by default (docs/performance.md). "auto" therefore puts cuDNN first on CUDA, then flash, efficient and
math, with torch trying them in that order; a named backend is used alone (and torch errors
if it cannot run the shapes). On CPU "auto" leaves the choice to torch. The choice is made by
a context around the model's forward: the kernel picked in forward also runs the backward.

"flex": FlexAttention (models/common/flex_attention.py). The trainer builds one BlockMask per
micro-batch (`BlockMasks`): causal, or block-causal over the documents of the packed windows
with `data.document_masking` (for which "auto" means flex), plus the model's sliding window;
the model hands it to every layer.

"flash_attn": the flash-attn package (models/common/flash_attention.py) becomes every attention
module's `attention_fn` (`use_attention_kernel`), before the plan is applied.

`check_attention` refuses, before any process group exists, what these cannot run.
"""

from __future__ import annotations

import contextlib
import importlib

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import BlockMask

from kenotron.config import ConfigError, JobConfig
from kenotron.data import document_ids
from kenotron.degrees import ParallelDims
from kenotron.kernel_choice.target import Target
from kenotron.models.common.attention import GQAttention
from kenotron.models.common.flash_attention import (
    INSTALL_HINT,
    MIN_COMPILE_VERSION,
    FlashAttnUnavailable,
    cuda_major,
    flash_attn_version,
    load_flash_attention,
)
from kenotron.models.common.flex_attention import causal_block_mask, document_block_mask

NAMED = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}
CUDA_AUTO_ORDER = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
CUDA_ONLY_SDPA = ("cudnn", "efficient")
"""SDPA kernels with no CPU implementation (torch has flash and math on CPU)."""
NOT_SDPA = ("flex", "flash_attn")


def resolve_attention_backend(backend: str, document_masking: bool) -> str:
    """The backend that runs: "auto" becomes "flex" when documents are masked."""
    if backend == "auto" and document_masking:
        return "flex"
    return backend


def auto_picks_flash_attn(cfg: JobConfig, cp: int, meta_model: nn.Module, device_major: int) -> bool:
    """Whether "auto" runs FlashAttention-3/4 instead of SDPA: when one is installed for this GPU
    (SM90 and later) and the run is what it computes exactly, plain causal attention in bf16 (no
    document masking, no sliding window shorter than the sequence, no context parallel) and not
    `training.deterministic` (their backward accumulates in any order); faster than cuDNN's SDPA
    wherever measured (docs/performance.md)."""
    t = cfg.training
    if (device_major < 9 or t.device == "cpu" or t.param_dtype != "bfloat16" or t.deterministic
            or cfg.data.document_masking or cp > 1 or window_shorter_than(meta_model, t.seq_len) is not None):
        return False
    try:
        kernel = load_flash_attention(device_major)
    except FlashAttnUnavailable:
        return False
    return kernel.version >= 3  # FlashAttention-2 is slower than cuDNN on Hopper


def attention_context(backend: str, device: torch.device) -> contextlib.AbstractContextManager:
    """The SDPA kernel choice around forward (nothing for flex and flash_attn, which skip SDPA)."""
    if backend in NOT_SDPA:
        return contextlib.nullcontext()
    if backend == "auto":
        if device.type != "cuda":
            return contextlib.nullcontext()
        return sdpa_kernel(CUDA_AUTO_ORDER, set_priority=True)
    if backend not in NAMED:
        raise ValueError(f"model.attention_backend={backend!r} is not one of auto, {', '.join([*NAMED, *NOT_SDPA])}")
    return sdpa_kernel([NAMED[backend]])


def use_attention_kernel(model: nn.Module, backend: str, device: torch.device) -> None:
    """For flash_attn, make every attention module's `attention_fn` flash-attn's kernel
    (the best one installed for the GPU, see load_flash_attention). Call it on the (meta) model before
    `plan.apply`, so pipeline stages, which are copies, keep it. Other backends: no change."""
    if backend != "flash_attn":
        return
    kernel = load_flash_attention(cuda_major(device))
    for module in model.modules():
        if isinstance(module, GQAttention):
            module.attention_fn = kernel


class BlockMasks:
    """The FlexAttention BlockMask of each micro-batch, built once and shared by every layer.

    `eos_id` None: causal masks, which depend only on the length and are kept. Otherwise
    block-causal masks over the documents the EOS tokens of each batch delimit
    (kenotron.data.packing.document_ids: an EOS belongs to the document it ends).
    """

    def __init__(self, eos_id: int | None, sliding_window: int | None) -> None:
        self.eos_id = eos_id
        self.sliding_window = sliding_window
        self._causal: dict[tuple[int, str], BlockMask] = {}

    def __call__(self, inputs: torch.Tensor) -> BlockMask:
        """The mask for token ids `inputs` (batch, seq), on their device."""
        if self.eos_id is not None:
            return document_block_mask(document_ids(inputs, self.eos_id), self.sliding_window)
        key = (inputs.shape[1], str(inputs.device))
        if key not in self._causal:
            self._causal[key] = causal_block_mask(inputs.shape[1], inputs.device, self.sliding_window)
        return self._causal[key]


def window_shorter_than(meta_model: nn.Module, seq_len: int) -> int | None:
    """The model's sliding window when it is shorter than `seq_len`, else None: then attention
    over a training window is not plain causal attention (what flash_attn and context parallel run)."""
    window = getattr(meta_model, "sliding_window", None)
    return window if window is not None and seq_len > window else None


def check_attention(cfg: JobConfig, dims: ParallelDims, meta_model: nn.Module, target: Target, backend: str) -> None:
    """What flex and flash_attn cannot run, refused with the fix in the message (ConfigError).
    `backend`: the requested one, after resolve_attention_backend. A CUDA-only SDPA kernel is
    refused on another device."""
    if backend in CUDA_ONLY_SDPA and target.device_type != "cuda":
        raise ConfigError(f"model.attention_backend={backend!r} is a CUDA kernel and this run is on "
                          f"{target.device_type}; use 'auto', 'flash' or 'math' there")
    if backend not in NOT_SDPA:
        return
    name = f"model.attention_backend={backend!r}"
    if cfg.data.document_masking:
        name = f"data.document_masking=true ({name})"
    if dims.cp > 1:
        raise ConfigError(
            f"{name} does not combine with context parallel (parallelism.cp={dims.cp}): context parallel "
            f"replaces the attention with its own ring of plain causal SDPA; use cp=1"
            + (", or turn data.document_masking off" if cfg.data.document_masking else ", or model.attention_backend='auto'")
        )
    if backend == "flex":
        if dims.pp > 1:
            raise ConfigError(
                f"{name} does not combine with pipeline parallel (parallelism.pp={dims.pp}) yet: the block mask is "
                f"built from the token ids, which the stages after the first never see; use pp=1"
                + (", or turn data.document_masking off" if cfg.data.document_masking else "")
            )
        return
    _check_flash_attn(cfg, meta_model, target)


def _check_flash_attn(cfg: JobConfig, meta_model: nn.Module, target: Target) -> None:
    t = cfg.training
    cuda = target.device_type == "cuda"
    try:
        kernel = load_flash_attention(target.cuda_major if cuda else 0)
    except FlashAttnUnavailable as e:
        raise ConfigError(
            f"model.attention_backend='flash_attn' needs the flash-attn package, which is not installed here: "
            f"{INSTALL_HINT}; or use model.attention_backend='auto' (torch's fused SDPA kernels)"
        ) from e
    if not cuda:
        raise ConfigError("model.attention_backend='flash_attn' needs CUDA (flash-attn has no CPU kernel); "
                          "use model.attention_backend='auto' on CPU")
    if t.param_dtype != "bfloat16":
        raise ConfigError(f"model.attention_backend='flash_attn' computes in bf16/fp16 only, but training.param_dtype="
                          f"{t.param_dtype!r}; set training.param_dtype='bfloat16' or use model.attention_backend='auto'")
    window = window_shorter_than(meta_model, t.seq_len)
    if window is not None:
        raise ConfigError(
            f"model.attention_backend='flash_attn' runs plain causal attention here, but model {cfg.model.name} "
            f"{cfg.model.flavor} attends through a {window}-token sliding window, shorter than training.seq_len="
            f"{t.seq_len}; use model.attention_backend='flex' (which applies the window) or 'auto', or "
            f"training.seq_len <= {window}"
        )
    if kernel.version != 2:
        return  # FlashAttention-3 and kenotron's FlashAttention-4 ops are traceable
    module = importlib.import_module("flash_attn")
    version = flash_attn_version(module)
    if cfg.compile.enable and version < MIN_COMPILE_VERSION:
        wanted = ".".join(map(str, MIN_COMPILE_VERSION))
        raise ConfigError(
            f"flash-attn {getattr(module, '__version__', '?')} is not traceable by torch.compile (its kernels became "
            f"torch custom ops in {wanted}); pip install 'flash-attn>={wanted}', or set compile.enable=false"
        )
