"""Which attention kernel runs, chosen once per run (`model.attention_backend`).

SDPA backends. On Hopper GPUs cuDNN's attention runs forward+backward much faster than the
flash kernel torch picks by default (docs/performance.md). "auto" therefore puts cuDNN first on CUDA, then flash, efficient and
math, with torch trying them in that order; a named backend is used alone (and torch errors
if it cannot run the shapes). On CPU "auto" leaves the choice to torch. The choice is made by
a context around the model's forward: the kernel picked in forward also runs the backward.

"flex": FlexAttention (models/common/flex_attention.py). The trainer builds one BlockMask per
micro-batch (`BlockMasks`): causal, or block-causal over the documents of the packed windows
with `data.document_masking` (for which "auto" means flex), plus the model's sliding window;
the model hands it to every layer. Under context parallel the trainer hands the model the
document ids of the whole sequence instead (`BlockMasks.documents`), which the cp attention
masks each of its chunk pairs by (kenotron/parallel/context/documents.py).

"flash_attn": the flash-attn package (models/common/flash_attention.py) becomes every attention
module's `attention_fn` (`use_attention_kernel`), before the plan is applied.

What these cannot run is refused before torch is imported (config_checks.py's check_attention);
`check_flash_attn_kernel` refuses, before any process group exists, what only importing
flash-attn tells.
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Any

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import BlockMask

from kenotron.config import ConfigError, JobConfig
from kenotron.data import document_ids
from kenotron.kernel_choice.config_checks import FLASH_ATTN_MISSING, NOT_SDPA, window_shorter_than
from kenotron.kernel_choice.target import Target
from kenotron.models.common.attention import GQAttention, causal_attention
from kenotron.models.common.flash_attention import (
    MIN_COMPILE_VERSION,
    FlashAttnUnavailable,
    cuda_major,
    flash_attn_version,
    load_flash_attention,
)
from kenotron.models.common.flex_attention import causal_block_mask, document_block_mask
from kenotron.models.common.latent_attention import LatentAttention
from kenotron.parallel.context.documents import SequenceDocuments

NAMED = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}
CUDA_AUTO_ORDER = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def auto_picks_flash_attn(cfg: JobConfig, cp: int, model_or_args: Any, device_major: int,
                          all_to_all_degree: int = 1) -> bool:
    """Whether "auto" runs FlashAttention-3/4 instead of SDPA: when one is installed for this GPU
    (SM90 and later) and the run is what it computes exactly, plain causal attention in bf16 (no
    document masking, no sliding window shorter than the sequence, no ring: cp 1, or the
    all-to-all over all of cp, `all_to_all_degree` == cp, which runs the kernel on the whole
    sequence of its heads) and not `training.deterministic` (their backward accumulates in any
    order); faster than cuDNN's SDPA wherever measured, under the all-to-all too (docs/performance.md)."""
    t = cfg.training
    if (device_major < 9 or t.device == "cpu" or t.param_dtype != "bfloat16" or t.deterministic
            or cfg.data.document_masking or (cp > 1 and all_to_all_degree != cp)
            or window_shorter_than(model_or_args, t.seq_len) is not None):
        return False
    try:
        kernel = load_flash_attention(device_major)
    except FlashAttnUnavailable:
        return False
    return kernel.version >= 3  # FlashAttention-2 is slower than cuDNN on Hopper


def attention_context(backend: str, device: torch.device) -> contextlib.AbstractContextManager:
    """The SDPA kernel choice around forward: nothing for flex; for flash_attn, SDPA's order of
    "auto" on CUDA for the attention modules flash-attn does not replace (MLA's, see
    use_attention_kernel)."""
    if backend == "flex":
        return contextlib.nullcontext()
    if backend in ("auto", "flash_attn"):
        if device.type != "cuda":
            return contextlib.nullcontext()
        return sdpa_kernel(CUDA_AUTO_ORDER, set_priority=True)
    if backend not in NAMED:
        raise ValueError(f"model.attention_backend={backend!r} is not one of auto, {', '.join([*NAMED, *NOT_SDPA])}")
    return sdpa_kernel([NAMED[backend]])


def use_attention_kernel(model: nn.Module, backend: str, device: torch.device) -> None:
    """For flash_attn, make every grouped-query attention module's `attention_fn` flash-attn's kernel
    (the best one installed for the GPU, see load_flash_attention). Call it on the (meta) model before
    `plan.apply`, so pipeline stages, which are copies, keep it. Other backends: no change. MLA
    (LatentAttention) keeps SDPA: cuDNN takes its values at their own width (use_narrow_values),
    where flash-attn would take them zero-padded to the keys' width."""
    if backend != "flash_attn":
        return
    kernel = load_flash_attention(cuda_major(device))
    for module in model.modules():
        if isinstance(module, GQAttention):
            module.attention_fn = kernel


def takes_narrow_values(backend: str, target: Target, meta_model: nn.Module, seq_len: int,
                        dtype: torch.dtype) -> bool:
    """Whether MLA's values, narrower than its keys, go to the attention kernel at their own width
    (LatentAttention's `narrow_value_attention`) rather than zero-padded, on CUDA: under "flex",
    whose compiled kernel takes two head sizes, and under "auto" or "flash_attn" (SDPA with cuDNN
    first, attention_context) or "cudnn", where cuDNN does; either is faster than with the values
    padded (docs/performance.md, "MLA's values at their own width"). For cuDNN, torch is asked on this
    process's GPU with the model's head sizes (a cuDNN that refuses them would leave SDPA its slow
    kernel); a GPU machine planned from elsewhere is taken to be one where cuDNN takes them."""
    widths = {(m.shape.qk_dim, m.shape.v_dim) for m in model_latent_attentions(meta_model)}
    if (target.device_type != "cuda" or backend not in ("auto", "flash_attn", "cudnn", "flex")
            or not any(qk != v for qk, v in widths)):
        return False
    if backend == "flex" or not target.packages_here:
        return True
    return all(cudnn_takes(qk, v, seq_len, dtype) for qk, v in widths if qk != v)


def model_latent_attentions(model: nn.Module) -> list[LatentAttention]:
    return [m for m in model.modules() if isinstance(m, LatentAttention)]


def cudnn_takes(qk_dim: int, v_dim: int, seq_len: int, dtype: torch.dtype) -> bool:
    """Whether cuDNN's SDPA runs causal attention of one head over `seq_len` tokens with keys
    `qk_dim` and values `v_dim` wide on the current CUDA device (torch's own check, nothing run)."""
    device = torch.device("cuda", torch.cuda.current_device())
    q = torch.empty(1, 1, seq_len, qk_dim, device=device, dtype=dtype)
    v = torch.empty(1, 1, seq_len, v_dim, device=device, dtype=dtype)
    params = torch.backends.cuda.SDPAParams(q, q, v, None, 0.0, True, False)
    return bool(torch.backends.cuda.can_use_cudnn_attention(params))


def use_narrow_values(model: nn.Module, narrow: bool) -> None:
    """Where `narrow` (Choices.narrow_values): every MLA module gives its attention kernel (SDPA's
    causal path, or FlexAttention) the values unpadded."""
    if narrow:
        for module in model_latent_attentions(model):
            module.narrow_value_attention = causal_attention


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

    def documents(self, inputs: torch.Tensor) -> SequenceDocuments | None:
        """Under context parallel: the document ids of the whole micro-batch `inputs` (before the
        sequence is sliced), which the cp attention masks by; None without document masking
        (plain causal attention, which the cp attention runs without a mask)."""
        if self.eos_id is None:
            return None
        return SequenceDocuments(document_ids(inputs, self.eos_id))


def check_flash_attn_kernel(cfg: JobConfig, target: Target) -> None:
    """What importing the FlashAttention that will run tells (ConfigError): a package found but
    not importable, a FlashAttention-2 too old for torch.compile. The checks that need no import
    ran before (config_checks.py)."""
    try:
        kernel = load_flash_attention(target.cuda_major if target.device_type == "cuda" else 0)
    except FlashAttnUnavailable as e:
        raise ConfigError(FLASH_ATTN_MISSING) from e
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
