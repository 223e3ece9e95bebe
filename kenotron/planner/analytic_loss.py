"""The loss's bytes in the analytic estimate: what the fused chunked loss or the plain one keeps
for backward and the temporaries at its peak (see analytic.py for the notation)."""

from __future__ import annotations

from kenotron.estimate.breakdown import allocated_bytes
from kenotron.estimate.static_memory import FP32
from kenotron.planner.step_shape import StepShape
from kenotron.train.mtp import fused_heads
from kenotron.train.resolve import ResolvedRun
from kenotron.train.vocab_parallel_loss import writes_gradient_over_logits


def loss_bytes(run: ResolvedRun, s: StepShape, fused: bool) -> tuple[int, int]:
    """(kept for backward, temporaries at the loss' peak) of the fused chunked or the plain loss."""
    V, d, c = s.vocab // s.tp, s.dim, s.compute
    if fused:
        chunk = min(run.choices.loss_chunk_tokens, s.tokens)
        logits = allocated_bytes(chunk * V * c)
        # PyTorch's softmax and the one-device compiled step give the gradient a second buffer.
        in_place = writes_gradient_over_logits(run.choices.loss_kernel, vocab_parallel=s.tp > 1)
        gradient = 0 if in_place else logits
        if s.tokens <= chunk:
            # One chunk: the weight gradient is the chunk's product itself, kept in the matmul
            # dtype; it does not exist yet while the logits and their gradient are alive.
            grad_w = allocated_bytes(V * d * c)
            kept = allocated_bytes(s.tokens * d * c) + grad_w
            temp = max(logits + gradient - grad_w, logits)
        else:
            # Several: an fp32 accumulator (kept), and each chunk's product while it is added.
            kept = allocated_bytes(s.tokens * d * c) + allocated_bytes(V * d * FP32)
            temp = max(logits + gradient, logits + allocated_bytes(V * d * c))
        if s.tokens > chunk:  # the previous chunk's gradient outlives the next chunk's logits and log-softmax
            second = allocated_bytes(min(chunk, s.tokens - chunk) * V * c)
            temp = max(temp, allocated_bytes(chunk * V * c) + second + (0 if in_place else second))
        if s.autocast:  # the fp32 hidden states and output weight are cast for the chunks
            temp += allocated_bytes(s.tokens * d * 2) + allocated_bytes(V * d * 2)
        if s.residual_tokens < s.tokens:  # sequence parallel: the vocabulary-parallel loss gathers all the tokens' states
            temp += allocated_bytes(s.tokens * d * s.residual)
        # The loss' backward, with every activation still alive: the scaled weight and hidden-state
        # gradients, each written once in its parameter's / activation's dtype (one Triton pass
        # each on CUDA; fp32 under autocast). With few tokens this outweighs the forward.
        wide = FP32 if s.autocast else c
        backward = allocated_bytes(V * d * wide) + allocated_bytes(s.tokens * d * wide)
        return kept, max(temp, backward)
    logits = allocated_bytes(s.tokens * V * c)
    fp32 = allocated_bytes(s.tokens * V * FP32)
    vocab_parallel = s.tp > 1 and run.plan.settings.loss_parallel
    return logits + fp32, (3 if vocab_parallel else 2) * fp32


def mtp_loss_bytes(run: ResolvedRun, s: StepShape) -> tuple[int, int]:
    """(kept for backward, temporaries at their backward) of deepseek_v3's multi-token-prediction
    heads (models/deepseek_v3/mtp.py), beyond their blocks (counted as blocks), per module: the
    input maps (the two norms' inputs, the concatenation eh_proj keeps, the head norm's input),
    5·T·d·c, and the head's loss. The fused chunked one (train/mtp.py's fused_heads) keeps what
    the main head's fused loss keeps, its gradients of the hidden states and of the output weight,
    each module its own, and has its temporaries. The plain one keeps the head norm's output (the
    output layer's input, T·d·c) and the fp32 logits' log-softmax, T·V·4/t; its backward holds the
    log-softmax's gradient and its fp32 copy: 2·T·V·4/t."""
    depth = getattr(run.model_args, "mtp_depth", 0)
    if not depth:
        return 0, 0
    maps = 5 * allocated_bytes(s.tokens * s.dim * s.compute)
    if fused_heads(run):
        kept, temp = loss_bytes(run, s, fused=True)
        return depth * (maps + kept), temp
    fp32 = allocated_bytes(s.tokens * (s.vocab // s.tp) * FP32)
    return depth * (maps + allocated_bytes(s.tokens * s.dim * s.compute) + fp32), 2 * fp32
