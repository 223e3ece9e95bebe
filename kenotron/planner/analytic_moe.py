"""The MoE layer in the closed-form memory model and the throughput model (analytic.py, throughput.py).

Per rank, an MoE layer sees Tm tokens: the micro-batch's (b·s/cp), or its sequence shard under
tensor parallelism (the layer runs on this rank's shard, parallel/expert.py). Each token makes
k copies; the layer's experts on this rank are E_l = E/ep; the grouped buffer has
P = Tm·k + E_l·(a − 1) rows (a: the grouped GEMM's row alignment, 16 bytes of the compute
dtype; 1 for the per-expert loop), planned for even routing as the fake-tensor estimate does
(moe_memory.py): under ep the copies a rank receives are as many as it sends. Under the even
split (parallel/expert_even_split.py, ep 2: every token to every rank, nothing read on the host)
the buffer is planned for the worst case instead, P = ep·Tm·min(k, E_l) + E_l·(a − 1) + 1 rows
rounded up to a. Bytes kept for backward, c the compute dtype's size:

  router       Tm·E·(c + 4) (logits, fp32 probabilities) + Tm·k·(8 + 4) (choices, weights)
  experts      P·D·c (the grouped rows, the first GEMM's input; with the grouped GEMM, which
               gathers them itself (experts.py's gather_grouped_mm), the rows it gathers from
               instead: ep·Tm·D·c received under ep, none of its own on one rank, where the
               router keeps the layer's input; float8's product takes grouped rows)
               + P·2F·c (its output, the gate's input) + P·F·c (the gate's
               output, the second GEMM's input); PyTorch's gate ops also keep silu(gate)·up:
               + P·F·c (not with the fused Triton gate)
  ep exchange  nothing: the all-to-alls keep nothing for backward, the combine its token ids
  shared       as a dense SwiGLU of width F_s on Tm tokens, + Tm·4 + Tm·D·c for its sigmoid gate
               (the sigmoid and the output it scales)

Backward temporaries of the layer: the gradients of its rows P·(D + 2F + F)·c, and under ep the
all-to-all's receive buffers of the gradients, 2·Tm·k·D·c (the even split's: 2·ep·Tm·D·c).

Time (throughput.py): under ep each MoE layer sends each token to other ranks, and the results
back, in forward and again in backward: 4·Tm·r·D·c bytes per micro-step, not overlapped, r the
remote ranks per token (`remote_rows_per_token`): ep − 1 under the even split; under the
deduplicated exchange those holding one of its experts, whose forward's host read of the split
sizes leaves the GPU idle a fitted `Hardware.ep_sync_s`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from kenotron.estimate.breakdown import allocated_bytes
from kenotron.models.common.experts import EXPERT_KERNELS
from kenotron.parallel.expert_even_split import pays_without_host_read, rank_fill, static_rows

FP32 = 4


@dataclass(frozen=True)
class MoEShape:
    """One MoE layer's sizes on one rank."""

    tokens: int
    """Tm: tokens the layer sees on this rank."""
    experts: int
    local_experts: int
    top_k: int
    ffn: int
    shared_ffn: int
    shared_gate: bool
    align: int
    """Rows each expert's group is padded to."""
    ep: int
    even_split: bool = False
    """Under ep: the exchange without a host read (every token to every rank, the grouped buffer
    planned for the worst case), else the deduplicated one planned for even routing."""
    gathers_in_first_product: bool = False
    """The first grouped GEMM gathers the token rows itself (the grouped GEMM but float8's) and
    keeps what it gathers from, not the grouped rows."""

    @property
    def copies(self) -> int:
        return self.tokens * self.top_k

    @property
    def received(self) -> int:
        """Rows the all-to-all brings under the even split: every rank's tokens."""
        return self.ep * self.tokens

    @property
    def kept_input_rows(self) -> int:
        """Rows the first grouped GEMM keeps for its weight gradient. Where it gathers its rows
        itself (models/common/experts.py's gather_grouped_mm: the grouped GEMM but float8's), the
        rows it gathers from: none of its own on one rank (the layer's input, which the router
        keeps), the received rows under ep (every rank's tokens, as the buffer is planned);
        else the grouped buffer's."""
        if not self.gathers_in_first_product:
            return self.rows
        return self.received if self.ep > 1 else 0

    @property
    def rows(self) -> int:
        if self.even_split:
            return static_rows(self.received, self.top_k, self.local_experts, self.align)
        return self.copies + self.local_experts * (self.align - 1)


def moe_shape(run: Any, tokens: int, tp: int, compute: int) -> MoEShape | None:
    """The MoE layer of `run`'s model for `tokens` tokens per micro-step on this rank (None: dense)."""
    moe = getattr(run.model_args, "moe", None)
    if moe is None:
        return None
    assert run.choices.expert_kernel in EXPERT_KERNELS
    align = 16 // compute if run.choices.expert_kernel == "grouped_mm" else 1
    ep = run.dims.ep
    float8 = run.plan.settings.float8_experts
    even = ep > 1 and pays_without_host_read(moe.n_experts, moe.top_k, ep, float8)
    return MoEShape(tokens // tp, moe.n_experts, moe.n_experts // ep, moe.top_k, moe.ffn_dim, moe.shared_ffn_dim,
                    moe.shared_gate, align, ep, even, gathers_in_first_product=align > 1 and not float8)


def moe_activations(m: MoEShape, dim: int, c: int, fused_gate: bool, fused_expert_gate: bool, mode: str) -> int:
    """Bytes one MoE layer keeps for backward (activation checkpointing `mode`: none or selective-op).
    `fused_gate`: the shared experts' SwiGLU is the fused Triton kernel; `fused_expert_gate`: the
    routed experts' gate is (neither keeps silu(gate))."""
    P, D, F, T = m.rows, dim, m.ffn, m.tokens
    if mode == "selective-op":  # the saved op outputs: router logits, both GEMMs, the all-to-alls
        kept = allocated_bytes(T * m.experts * c) + allocated_bytes(P * 2 * F * c) + allocated_bytes(P * D * c)
        if m.ep > 1:  # the all-to-alls' outputs: rows out and results back
            kept += 2 * allocated_bytes((m.received if m.even_split else m.copies) * D * c)
        return kept
    router = allocated_bytes(T * m.experts * c) + allocated_bytes(T * m.experts * FP32) + allocated_bytes(
        T * m.top_k * 8) + allocated_bytes(T * m.top_k * FP32)
    experts = allocated_bytes(m.kept_input_rows * D * c) + allocated_bytes(P * 2 * F * c) + allocated_bytes(P * F * c)
    if not fused_expert_gate:
        experts += allocated_bytes(P * F * c)
    shared = 0
    if m.shared_ffn:
        shared = (3 if fused_gate else 4) * allocated_bytes(T * m.shared_ffn * c)
        if m.shared_gate:  # its sigmoid, and the shared output the product scales
            shared += allocated_bytes(T * FP32) + allocated_bytes(T * D * c)
    return router + experts + shared


def elementwise_pricing(m: MoEShape, dim: int, c: int) -> tuple[MoEShape, int]:
    """What the throughput model's elementwise term (step_compute.py: κ times the bytes a block
    keeps) reads for an MoE layer: the layer as if it kept the grouped rows (its first product's
    gather writes them in forward and again in backward, kept or not), planned for even routing
    (the even split's rows past it pass through the row copies and the gate only:
    `all_to_all_seconds` prices them), and under ep the bytes of the results the exchange brings
    back, which the combine reads though it keeps nothing."""
    priced = dataclasses.replace(m, even_split=False, gathers_in_first_product=False)
    return priced, allocated_bytes(m.copies * dim * c) if m.ep > 1 else 0


def moe_backward_temporaries(m: MoEShape, dim: int, c: int) -> int:
    """The layer's largest backward temporaries: its rows' gradients (and the all-to-all's)."""
    temp = allocated_bytes(m.rows * (dim + 3 * m.ffn) * c)
    if m.ep > 1:
        temp += 2 * allocated_bytes((m.received if m.even_split else m.copies) * dim * c)
    return temp


def remote_rows_per_token(n_experts: int, top_k: int, ep: int, even_split: bool) -> float:
    """Rows a token sends to other ranks under ep: all ep − 1 under the even split; under the
    deduplicated exchange (parallel/expert_dispatch.py) one per rank that holds at least one of
    its k distinct experts, for uniform routing (ep − 1) times `rank_fill`."""
    return (ep - 1) * (1.0 if even_split else rank_fill(n_experts, top_k, ep))


def even_split_row_seconds(run: Any, local_tokens: int, c: int, memory_bytes_per_s: float) -> float:
    """Per MoE layer, the even split's row work past the deduplicated exchange's (`c` bytes a
    value): with the grouped GEMM, backward gathers the rows of the received slots again (2·D·c
    bytes a row: the first product keeps the received rows, not the gathered ones;
    models/common/experts.py's gather_grouped_mm). The worst-case buffer's rows past the last
    group's end cost nothing: the gathers and the gate stop there (models/common/grouped_tail.py)."""
    if run.choices.expert_kernel != "grouped_mm":
        return 0.0
    return local_tokens * run.model_args.moe.top_k * 2 * run.model_args.dim * c / memory_bytes_per_s


def all_to_all_seconds(run: Any, bandwidth: float, tokens: int, sync_seconds: float = 0.0,
                       memory_bytes_per_s: float = float("inf")) -> float:
    """Exposed all-to-all time of one optimizer step (0 without ep); `tokens` per micro-step on this
    rank. Each MoE layer sends every token's rows out and the results back, in forward and again
    in backward, not overlapped. Under the deduplicated exchange its forward also reads the split
    sizes on the host, after which the GPU waits `sync_seconds` for the host to launch the rest of
    the layer; under the even split its backward gathers rows again at `memory_bytes_per_s`
    (`even_split_row_seconds`)."""
    moe = getattr(run.model_args, "moe", None)
    ep = run.dims.ep
    if moe is None or ep == 1:
        return 0.0
    c = 2 if run.cfg.training.param_dtype == "bfloat16" else FP32
    local = tokens // run.dims.tp
    even = pays_without_host_read(moe.n_experts, moe.top_k, ep, run.plan.settings.float8_experts)
    rows = remote_rows_per_token(moe.n_experts, moe.top_k, ep, even)
    per_layer = 4 * local * rows * run.model_args.dim * c / bandwidth
    per_layer += even_split_row_seconds(run, local, c, memory_bytes_per_s) if even else sync_seconds
    layers = run.model_args.n_layers / run.dims.pp  # under pipeline parallel a rank runs its stages' blocks only
    return run.grad_accum_steps * layers * per_layer
