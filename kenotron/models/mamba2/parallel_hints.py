"""How Mamba-2 splits under tensor parallelism, as plain data for kenotron.parallel.

Llama's styles (llama3/parallel_hints.py) plus "channels": the module's own per-channel
parameters split along dim 0, each rank computing on its channels (the depthwise convolution,
the scan's per-head A_log / D / dt bias, the gated norm over whole groups). The in-projection
is split by rows into whole B/C groups (its rows are stored group by group: common/mamba.py),
so tp must divide the groups as well as the heads; a hybrid's attention blocks take Llama's
styles. Context parallel is not supported: the scan carries a state along the sequence.
"""

from __future__ import annotations

from typing import Any

from kenotron.models.llama3.parallel_hints import LLAMA3_TP_STYLES

MAMBA2_TP_STYLES: dict[str, str] = {
    "tok_embeddings": "embedding",
    "layers.*.norm": "norm",
    "layers.*.mixer": "block_input",
    "layers.*.mixer.in_proj": "colwise",
    "layers.*.mixer.conv1d": "channels",
    "layers.*.mixer.ssm": "channels",
    "layers.*.mixer.norm": "channels",
    "layers.*.mixer.out_proj": "rowwise",
    "norm": "norm",
    "output": "output",
}

NO_CONTEXT_PARALLEL = (
    "Mamba-2's scan carries a state from each position to the next, and kenotron has no scan that passes it "
    "between ranks holding different parts of a sequence"
)

NO_DOCUMENT_MASKING = (
    "Mamba-2's scan carries its state across document boundaries (kenotron's scan has no per-document reset)"
)


def mamba2_tp_styles(args: Any) -> dict[str, str]:
    """The styles of a flavor: Mamba's, plus Llama's attention and MLP styles in a hybrid."""
    if not args.attention_layers:
        return dict(MAMBA2_TP_STYLES)
    attention = {k: v for k, v in LLAMA3_TP_STYLES.items() if k.startswith("layers.")}
    return {**MAMBA2_TP_STYLES, **attention}


def mamba2_tp_divisors(args: Any) -> dict[str, int]:
    """Heads and B/C groups of the scan (the vocabulary too; a hybrid's attention dimensions)."""
    divisors = {"ssm heads (expand x dim / ssm_head_dim)": args.ssm_heads, "ssm_groups": args.ssm_groups,
                "vocab_size": args.vocab_size}
    if args.attention_layers:
        divisors.update({"n_heads": args.n_heads, "n_kv_heads": args.n_kv_heads, "ffn_dim": args.ffn_dim})
    return divisors


def ssd_training_flops_per_token(heads: int, head_dim: int, groups: int, state: int, chunk_size: int) -> float:
    """FLOPs of one layer's scan per trained token (forward + backward = 3 x forward), beyond the
    parameters' 6·N (docs in kenotron/train/flops.py); the scan itself is common/ssd.py.

    Forward, per token: C·B^T scores inside its chunk, 2·Q·N per group; the scores applied to
    dt·x, 2·Q·P per head; the chunk's state B^T (dt·x), 2·N·P per head; the output from the
    entering state C·S, 2·N·P per head. The Q x Q products are counted whole, not halved for
    causality, as attention's T x T are.
    """
    forward = 2 * chunk_size * state * groups + 2 * chunk_size * head_dim * heads + 4 * state * head_dim * heads
    return 3.0 * forward


def mamba2_mixing_flops(args: Any, seq_len: int) -> float:
    """The scan's FLOPs per token in every Mamba layer, attention's 12·H·d·T in a hybrid's attention layers."""
    attention = len(args.attention_layers)
    scan = ssd_training_flops_per_token(args.ssm_heads, args.ssm_head_dim, args.ssm_groups, args.ssm_state,
                                        args.chunk_size)
    return (args.n_layers - attention) * scan + 12.0 * attention * args.n_heads * args.head_dim * seq_len
