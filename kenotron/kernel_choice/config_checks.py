"""The kernel choices settled from the config, the mesh degrees, the model's args and the
`Target`, with every refusal they make: no torch, so that the launcher runs them before it
imports torch (runtime/preflight.py), and resolve_run runs the same functions on every rank.

    kernels = settle_kernels(cfg, dims, spec, args, target, accum)

What needs the built model or an imported package is decided after, by resolve_choices
(choices.py, attention_backend.py): the fused loss of a model without an output layer, Mamba
sizes the Triton scan does not take, flash-attn's import and version, auto's pick of flash-attn.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kenotron.config import ConfigError, JobConfig
from kenotron.degrees import ParallelDims, attention_heads, check_ulysses_heads, ddp_alone, model_ulysses_degree
from kenotron.kernel_choice.target import Target
from kenotron.kernel_choice.tuning import (
    resolve_adamw_implementation,
    resolve_eager_kernels,
    resolve_expert_gate,
    resolve_expert_kernel,
    resolve_grad_norm_kernel,
    resolve_loss_kernel,
    resolve_ssm_kernel,
)

if TYPE_CHECKING:
    from kenotron.models import ModelSpec

CUDA_ONLY_SDPA = ("cudnn", "efficient")
"""SDPA kernels with no CPU implementation (torch has flash and math on CPU)."""
NOT_SDPA = ("flex", "flash_attn")
FLASH_ATTN_MISSING = (
    "model.attention_backend='flash_attn' needs the flash-attn package, which is not installed here: pip install "
    "flash-attn (or pip install -e '.[flash]'); on Hopper or Blackwell also pip install flash-attn-4; or use "
    "model.attention_backend='auto' (torch's fused SDPA kernels)"
)


@dataclass(frozen=True)
class Kernels:
    """The choices settled without the built model; resolve_choices completes them into Choices."""

    attention_backend: str
    """The requested backend after resolve_attention_backend (auto may still become flash_attn)."""
    eager_kernels: str
    ssm_kernel: str
    """For scan sizes the Triton kernels take; resolve_choices falls back for others."""
    loss_kernel: str
    grad_norm_kernel: str
    adamw: str
    precision: str
    expert_kernel: str
    expert_masters: bool = False
    expert_gate: str = "torch"
    """The routed experts' gate: "triton" (kernels/expert_swiglu.py) or "torch" (tuning.py's resolve_expert_gate)."""


def resolve_attention_backend(backend: str, document_masking: bool) -> str:
    """The backend that runs: "auto" becomes "flex" when documents are masked."""
    if backend == "auto" and document_masking:
        return "flex"
    return backend


def window_shorter_than(model_or_args: Any, seq_len: int) -> int | None:
    """The sliding window of a model (or of its args, which carry the same `sliding_window`) when
    it is shorter than `seq_len`, else None: then attention over a training window is not plain
    causal attention (what flash_attn and context parallel run)."""
    window = getattr(model_or_args, "sliding_window", None)
    return window if window is not None and seq_len > window else None


def flash_attn_installed(target: Target) -> bool:
    """Whether a FlashAttention package that load_flash_attention may load for `target` is
    installed, found without importing it (FlashAttention-3's flash_attn_interface on SM90 or an
    unknown GPU; flash_attn, which holds FlashAttention-2 and -4, everywhere)."""
    names = ["flash_attn"]
    if target.device_type == "cuda" and target.cuda_major in (0, 9):
        names.append("flash_attn_interface")
    return any(_installed(name) for name in names)


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ValueError:  # imported already, as a module without a spec (a stand-in put there by a test)
        return True


def flash_attn_cp_problem(cfg: JobConfig, dims: ParallelDims, args: Any) -> str:
    """Why flash_attn cannot run under context parallel ("" when it can). Only the all-to-all
    (parallelism.cp_scheme='ulysses') runs an ordinary kernel, on the whole sequence of its share
    of the heads; the ring replaces the kernel with its own over chunk pairs, and so does a ring
    over the part of cp that the heads do not split over. With the fix in the words."""
    scheme = cfg.parallelism.cp_scheme
    if scheme != "ulysses":
        return (f"parallelism.cp_scheme={scheme!r} may run the ring, which replaces the attention kernel with its "
                "own over chunk pairs of the sharded sequence; use parallelism.cp_scheme='ulysses' (the all-to-all "
                "runs the kernel on the whole sequence of its heads), cp=1 or model.attention_backend='auto'")
    degree = model_ulysses_degree(args, dims)
    if degree != dims.cp:
        return (f"the {args.n_heads // dims.tp} query heads per tensor-parallel rank split over {degree} of the "
                f"{dims.cp} cp ranks, and the ring over the other {dims.cp // degree} replaces the kernel; use a cp "
                "that the heads divide, or model.attention_backend='auto'")
    return ""


def check_attention(cfg: JobConfig, dims: ParallelDims, args: Any, target: Target, backend: str) -> None:
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
    if dims.cp > 1 and backend == "flash_attn":
        problem = flash_attn_cp_problem(cfg, dims, args)
        if problem:
            raise ConfigError(f"{name} does not combine with context parallel (parallelism.cp={dims.cp}) here: {problem}")
    if backend == "flex":
        # Under context parallel the document ids travel to every stage with the schedule's inputs.
        if dims.pp > 1 and dims.cp == 1:
            raise ConfigError(
                f"{name} does not combine with pipeline parallel (parallelism.pp={dims.pp}) without context parallel "
                f"yet: the block mask is built from the token ids, which the stages after the first never see; use "
                f"pp=1 or parallelism.cp > 1" + (", or turn data.document_masking off" if cfg.data.document_masking else "")
            )
        return
    _check_flash_attn(cfg, args, target)


def _check_flash_attn(cfg: JobConfig, args: Any, target: Target) -> None:
    t = cfg.training
    if target.packages_here and not flash_attn_installed(target):
        raise ConfigError(FLASH_ATTN_MISSING)
    if target.device_type != "cuda":
        raise ConfigError("model.attention_backend='flash_attn' needs CUDA (flash-attn has no CPU kernel); "
                          "use model.attention_backend='auto' on CPU")
    if t.param_dtype != "bfloat16":
        raise ConfigError(f"model.attention_backend='flash_attn' computes in bf16/fp16 only, but training.param_dtype="
                          f"{t.param_dtype!r}; set training.param_dtype='bfloat16' or use model.attention_backend='auto'")
    window = window_shorter_than(args, t.seq_len)
    if window is not None:
        raise ConfigError(
            f"model.attention_backend='flash_attn' runs plain causal attention here, but model {cfg.model.name} "
            f"{cfg.model.flavor} attends through a {window}-token sliding window, shorter than training.seq_len="
            f"{t.seq_len}; use model.attention_backend='flex' (which applies the window) or 'auto', or "
            f"training.seq_len <= {window}"
        )


def check_context_parallel(cfg: JobConfig, dims: ParallelDims, spec: ModelSpec, args: Any, target: Target) -> None:
    """What context parallel (cp > 1) cannot run: families whose sequence mixing it cannot split,
    anything but causal or block-causal (document-masked) attention over the whole sequence;
    torch's ring runs the fused CUDA kernels only, without a document mask."""
    if dims.cp == 1:
        return
    if spec.no_context_parallel:
        raise ConfigError(f"parallelism.cp={dims.cp} is not supported by model.name={spec.name!r}: "
                          f"{spec.no_context_parallel}; use parallelism.cp=1")
    t, u = cfg.training, cfg.tuning
    window = window_shorter_than(args, t.seq_len)
    if window is not None:
        raise ConfigError(
            f"parallelism.cp={dims.cp} supports plain causal attention only, but model {cfg.model.name} "
            f"{cfg.model.flavor} attends through a {window}-token sliding window, shorter than training.seq_len="
            f"{t.seq_len}; use training.seq_len <= {window}, a flavor without a window, or cp=1"
        )
    if cfg.parallelism.cp_scheme == "ulysses":
        check_ulysses_heads(dims, *attention_heads(args))
        if model_ulysses_degree(args, dims) == dims.cp:
            return  # the all-to-all alone: the ring's own settings below do not apply
    on_cuda = target.device_type == "cuda"
    if u.cp_attention == "torch" and not on_cuda:
        raise ConfigError("tuning.cp_attention='torch' needs CUDA (torch has no context-parallel CPU kernel); "
                          "use 'auto' or 'ring'")
    if u.cp_attention == "torch" and cfg.data.document_masking:
        raise ConfigError("data.document_masking=true under context parallel needs a document mask per chunk pair, but "
                          "tuning.cp_attention='torch' runs torch's ring of plain causal SDPA; use 'auto' (FlexAttention "
                          "on CUDA), 'flex' or 'ring'")
    if u.cp_attention != "ring" and on_cuda and cfg.model.attention_backend == "math":
        raise ConfigError("torch's context-parallel attention runs only the fused SDPA kernels, not "
                          "model.attention_backend='math'; choose another backend or tuning.cp_attention='ring'")


def check_fused_loss_layout(choice: str, pipeline: bool) -> None:
    """tuning.loss='fused' under pipeline parallel (the last stage computes the plain loss per
    microbatch). Under tensor parallel it runs vocabulary-parallel (train/vocab_parallel_loss.py)."""
    if choice == "fused" and pipeline:
        raise ConfigError("tuning.loss='fused' does not combine with pipeline parallel; use 'auto' or 'plain'")


def settle_precision(cfg: JobConfig, dims: ParallelDims, target: Target, accum: int) -> str:
    """How bf16 runs: "float32" (no bf16), "master_weights", "fsdp" or "autocast" (choices.py's
    Choices.precision)."""
    t, mp = cfg.training, cfg.tuning.mixed_precision
    if t.param_dtype != "bfloat16":
        return "float32"
    # DDP alone runs by gradient hooks, each replica trained as one device trains it
    # (parallel/gradient_all_reduce.py); FSDP's replicate casts the weights under DDP with more.
    hooks_ddp = ddp_alone(cfg.parallelism.dp_mode, dims.degrees())
    data_parallel = dims.dp_replicate * dims.dp_shard * dims.cp > 1 and not hooks_ddp
    if mp == "master_weights":
        if (dims.world_size > 1 and not hooks_ddp) or accum > 1:
            raise ConfigError(
                f"tuning.mixed_precision='master_weights' runs on one device without gradient accumulation (its "
                f"gradients are bf16), but this job has {dims.world_size} ranks and {accum} micro-steps per step; use "
                f"mixed_precision='auto' (FSDP's mixed precision casts the weights with several ranks)"
                + (f" or global_batch_size={t.local_batch_size}" if dims.world_size == 1 else "")
            )
        return "master_weights"
    if data_parallel:
        return "fsdp"  # FSDP (or its replicate-only variant) casts the weights whatever was asked
    if (dims.world_size > 1 and not hooks_ddp) or mp == "autocast":
        return "autocast"
    if mp == "fsdp" and not hooks_ddp:
        return "fsdp"
    if target.device_type == "cuda" and accum == 1 and cfg.optimizer.name == "adamw":
        return "master_weights"
    # Eager single-device CUDA runs: FSDP's 1-device mesh casts the weights once per step (no
    # FSDP mesh under DDP by gradient hooks: autocast).
    return "fsdp" if target.device_type == "cuda" and not cfg.compile.enable and not hooks_ddp else "autocast"


def settle_kernels(cfg: JobConfig, dims: ParallelDims, spec: ModelSpec, args: Any, target: Target,
                   accum: int) -> Kernels:
    """Every choice and refusal that needs no built model (module docstring); ConfigError naming
    the config key and the fix."""
    u, device_type = cfg.tuning, target.device_type
    check_context_parallel(cfg, dims, spec, args, target)
    attention = resolve_attention_backend(cfg.model.attention_backend, cfg.data.document_masking)
    check_attention(cfg, dims, args, target, attention)
    check_fused_loss_layout(u.loss, dims.pp > 1)
    precision = settle_precision(cfg, dims, target, accum)
    expert_kernel = resolve_expert_kernel(u.expert_kernel, device_type, target.cuda_major, precision != "float32")
    return Kernels(
        attention_backend=attention,
        eager_kernels=resolve_eager_kernels(u.eager_kernels, device_type, cfg.compile.enable, target.triton),
        ssm_kernel=resolve_ssm_kernel(u.ssm_kernel, device_type, "", target.triton),
        loss_kernel=resolve_loss_kernel(u.loss_kernel, device_type, cfg.compile.enable, target.triton),
        grad_norm_kernel=resolve_grad_norm_kernel(u.grad_norm_kernel, device_type, target.triton),
        adamw=resolve_adamw_implementation(u.adamw_implementation, device_type, target.triton),
        precision=precision,
        expert_kernel=expert_kernel,
        expert_masters=expert_masters(cfg, dims, precision, accum),
        expert_gate=resolve_expert_gate(expert_kernel, device_type, target.triton),
    )


def expert_masters(cfg: JobConfig, dims: ParallelDims, precision: str, accum: int) -> bool:
    """Whether the routed experts outside FSDP (degrees.py's experts_outside_fsdp) train in bf16
    with fp32 masters in AdamW (train/master_weights.py), as one GPU trains every weight: under
    FSDP's mixed precision with AdamW, without accumulation (bf16 gradients would be summed in
    bf16) and without ZeRO-1 (no FSDP). Otherwise they are fp32 and cast for each forward."""
    return (precision == "fsdp" and cfg.optimizer.name == "adamw" and accum == 1 and dims.experts_outside_fsdp
            and cfg.parallelism.dp_mode != "zero1")
