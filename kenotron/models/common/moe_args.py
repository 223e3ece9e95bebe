"""MoEArgs: the shape and routing of a family's MoE feed-forward, as plain data (no torch), so
that a family's args and the launcher's shape checks import it without the layer (moe.py)."""

from __future__ import annotations

from dataclasses import dataclass

SCORE_FUNCS = ("softmax", "sigmoid")
"""The router's score functions (router.py): softmax over the experts, or sigmoid per expert."""


@dataclass(frozen=True)
class MoEArgs:
    """The MoE feed-forward of a family (HF names in brackets)."""

    n_experts: int = 8
    """Routed experts per layer (num_experts, num_local_experts)."""
    top_k: int = 2
    """Experts each token is routed to (num_experts_per_tok)."""
    ffn_dim: int = 768
    """Hidden width of each routed expert's SwiGLU (moe_intermediate_size, intermediate_size for Mixtral)."""
    score_func: str = "softmax"
    """Router scores: softmax over the experts, or sigmoid per expert."""
    norm_topk: bool = True
    """Renormalize the top-k weights to sum to 1 (norm_topk_prob)."""
    route_scale: float = 1.0
    """Factor on the routing weights."""
    shared_ffn_dim: int = 0
    """Hidden width of the shared expert every token also goes through (shared_expert_intermediate_size); 0: none."""
    shared_gate: bool = False
    """Scale the shared expert's output by sigmoid(a linear map of the input) (Qwen2-MoE's shared_expert_gate)."""
    n_groups: int = 1
    """Expert groups of group-limited routing (n_group); 1: none."""
    topk_groups: int = 1
    """Groups a token's experts are chosen among (topk_group)."""
    aux_per_sequence: bool = False
    """moe.aux_loss_coef weighs DeepSeek-V3's sequence-wise balance loss instead of the micro-batch's."""
