"""The sizes of one micro-step on one rank that the closed-form formulas read (analytic.py), and
which variant of the decoder block the family uses."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from kenotron.estimate.cp_ring_memory import attention_output_copy, ulysses_checkpoint_bytes
from kenotron.estimate.static_memory import FP32
from kenotron.models.common.mamba import MambaBlock
from kenotron.models.common.norms import LayerNorm
from kenotron.parallel.model_layout import matching_modules
from kenotron.planner.analytic_latent import LatentDims
from kenotron.planner.analytic_mamba import MambaDims
from kenotron.planner.analytic_moe import MoEShape, moe_shape
from kenotron.train.resolve import ResolvedRun


@dataclass(frozen=True)
class StepShape:
    """Sizes of one micro-step on one rank."""

    tokens: int
    residual_tokens: int
    batch: int
    seq: int
    tp: int
    dim: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    layers: int
    compute: int
    residual: int
    autocast: bool
    gated_mlp: bool
    qk_norm: bool
    fp32_norm: bool
    cp_output_copy: bool = False
    """Context parallel: the output projection keeps a copy of the attention output (cp_ring_memory.py)."""
    ulysses_kept: int = 0
    """Bytes per block that a compiled, fully checkpointed block keeps under Ulysses beyond its
    input (cp_ring_memory.py's `ulysses_checkpoint_bytes`); 0 otherwise."""
    fused_gate: bool = False
    """SwiGLU's gate is the fused Triton kernel (eager CUDA runs): silu(a) is not kept."""
    fused_expert_gate: bool = False
    """The routed experts' gate is the Triton kernel (eager CUDA runs, or Choices.expert_gate)."""
    moe: MoEShape | None = None
    """The MoE feed-forward in place of the dense MLP (analytic_moe.py); None for a dense model."""
    mamba_blocks: int = 0
    """How many of the model's blocks are Mamba-2 blocks (analytic_mamba.py); the rest are attention blocks."""
    mamba: MambaDims | None = None
    """One rank's share of a Mamba mixer, when the model has Mamba blocks."""
    latent: LatentDims | None = None
    """Multi-head latent attention's sizes (analytic_latent.py); None for the other attention."""
    dense_blocks: int = 0
    """Leading blocks with a dense MLP in an MoE model (deepseek_v3's n_dense_layers)."""

    @classmethod
    def of(cls, run: ResolvedRun, block_kind: dict[str, bool]) -> StepShape:
        a, t, tp = run.model_args, run.cfg.training, run.dims.tp
        sp = tp > 1 and run.plan.settings.sequence_parallel
        bf16 = t.param_dtype == "bfloat16"
        autocast = run.choices.precision == "autocast"
        seq = t.seq_len // run.dims.cp  # context parallel: this rank's share of every sequence
        tokens = t.local_batch_size * seq
        compute = 2 if bf16 else FP32
        moe = moe_shape(run, tokens, tp, compute)
        return cls(
            tokens=tokens, residual_tokens=tokens // tp if sp else tokens, batch=t.local_batch_size, seq=seq,
            tp=tp, dim=a.dim, ffn=getattr(a, "ffn_dim", 0), heads=a.n_heads, kv_heads=a.n_kv_heads,
            # MLA (deepseek_v3): every head's keys are qk wide (its RoPE tables only rope_dim);
            # multi-token prediction adds its blocks.
            head_dim=a.qk_dim if hasattr(a, "qk_dim") else a.head_dim, vocab=a.vocab_size,
            layers=a.n_layers + getattr(a, "mtp_depth", 0), compute=compute,
            residual=FP32 if autocast else compute, autocast=autocast, cp_output_copy=attention_output_copy(run),
            ulysses_kept=ulysses_checkpoint_bytes(run, tokens, compute),
            fused_gate=(block_kind["gated_mlp"] or moe is not None) and run.choices.eager_kernels == "triton",
            fused_expert_gate=moe is not None and run.choices.fused_expert_gate,
            moe=moe, mamba=MambaDims.of(a, tp) if block_kind["mamba_blocks"] else None,
            latent=LatentDims.of(a, run.choices.narrow_values),
            dense_blocks=getattr(a, "n_dense_layers", 0) if moe is not None else 0, **block_kind,
        )


def block_kind(model: nn.Module, blocks: str) -> dict:
    """Which variant of the decoder block the family uses (what the activation formula reads),
    and how many blocks are Mamba-2 blocks (the others' variant is read from the first of them)."""
    found = [m for _, m in matching_modules(model, blocks)]
    mamba = sum(isinstance(b, MambaBlock) for b in found)
    block = next((b for b in found if not isinstance(b, MambaBlock)), found[0])
    return {
        "gated_mlp": hasattr(getattr(block, "ffn", getattr(block, "feed_forward", None)), "w3"),  # a dense MLP's
        "qk_norm": getattr(getattr(block, "attention", None), "q_norm", None) is not None,
        "fp32_norm": isinstance(getattr(block, "attention_norm", None), LayerNorm),
        "mamba_blocks": mamba,
    }
