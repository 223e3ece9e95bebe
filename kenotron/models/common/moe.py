"""The mixture-of-experts feed-forward layer: router -> dispatch -> experts -> combine (+ shared).

    x (batch, seq, dim) -> router picks k experts per token (router.py)
                        -> the dispatcher groups the token copies by expert and hands them to
                           the experts (one rank: LocalDispatcher below; expert parallel: an
                           all-to-all, kenotron/parallel/expert.py)
                        -> the experts compute them (experts.py) scaled by the routing weights
                        -> each token sums its k results
                        -> + the shared experts' output (Qwen2-MoE: through a sigmoid gate)

Parameter names follow transformers' in-memory layout where one exists (`router.gate` is HF's
`mlp.gate`, `experts.w13` its `gate_up_proj`); families map them in their hf.py.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from kenotron.models.common.experts import (
    GroupedExperts,
    copy_weights,
    group_by_expert,
    grouped_mm_alignment,
    sum_rows,
)
from kenotron.models.common.init import InitSpec, prefixed, trunc_normal
from kenotron.models.common.mlp import SwiGLU
from kenotron.models.common.moe_args import MoEArgs
from kenotron.models.common.router import RouterOutput, TopKRouter, attach_loss


class TokenDispatcher(Protocol):
    """Runs the experts on the token copies the router chose: (tokens, dim) -> (tokens, dim),
    each token the routing-weighted sum of its k experts' outputs."""

    def __call__(self, x: torch.Tensor, r: RouterOutput, experts: GroupedExperts) -> torch.Tensor: ...


def expert_alignment(experts: GroupedExperts, x: torch.Tensor) -> int:
    """Rows per group the experts' kernel needs (grouped GEMM: 16 bytes of the compute dtype)."""
    if experts.kernel != "grouped_mm":
        return 1
    if experts.row_alignment:
        return experts.row_alignment
    dtype = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else x.dtype
    return grouped_mm_alignment(dtype)


class LocalDispatcher:
    """All experts on this rank: group the copies by expert, compute, sum back per token."""

    def __call__(self, x: torch.Tensor, r: RouterOutput, experts: GroupedExperts) -> torch.Tensor:
        g = group_by_expert(r.experts.reshape(-1), experts.n_experts, r.experts.shape[1], expert_alignment(experts, x))
        return sum_rows(experts(x, g.offsets, g.counts, copy_weights(r.weights, g), gather=g), g)


class MoE(nn.Module):
    """x (..., dim) -> (..., dim); see the module docstring."""

    def __init__(self, dim: int, args: MoEArgs) -> None:
        super().__init__()
        self.args = args
        self.router = TopKRouter(dim, args.n_experts, args.top_k, args.score_func, args.norm_topk, args.route_scale,
                                 args.n_groups, args.topk_groups, args.aux_per_sequence)
        self.experts = GroupedExperts(dim, args.ffn_dim, args.n_experts)
        self.shared_experts = SwiGLU(dim, args.shared_ffn_dim) if args.shared_ffn_dim else None
        self.shared_gate = nn.Linear(dim, 1, bias=False) if args.shared_gate else None
        self.dispatcher: TokenDispatcher = LocalDispatcher()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_meta:
            # Shape inference (a pipeline stage's first step runs on meta tensors): routing has no
            # values to act on, and the result has the input's shape.
            return torch.empty_like(x)
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        r = self.router(x)
        term = self.router.balance_term(r, shape[0] if len(shape) == 3 else 1)
        if term is not None:
            # Joined to the routing weights (tokens x k values) rather than the layer's output
            # (tokens x dim): attach_loss's forward reads the term (router.py says why), and this
            # is the smallest tensor on the path to the loss.
            r.weights = attach_loss(r.weights, term)
        out = self.dispatcher(x, r, self.experts)
        if self.shared_experts is not None:
            shared = self.shared_experts(x)
            if self.shared_gate is not None:
                shared = torch.sigmoid(self.shared_gate(x)) * shared
            out = out + shared
        return out.view(*shape[:-1], out.shape[-1])

    def param_init_specs(self, init_std: float, out_std: float) -> dict[str, InitSpec]:
        specs = {
            **prefixed("router", self.router.param_init_specs(init_std)),
            **prefixed("experts", self.experts.param_init_specs(init_std, out_std)),
        }
        if self.shared_experts is not None:
            specs.update(prefixed("shared_experts", self.shared_experts.param_init_specs(init_std, out_std)))
        if self.shared_gate is not None:
            specs["shared_gate.weight"] = trunc_normal(init_std)
        return specs
