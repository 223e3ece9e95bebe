"""The token-choice router of an MoE layer and its load-balancing terms.

Scores: softmax over the experts (Mixtral, Qwen) or an independent sigmoid per expert
(DeepSeek-V3). Each token picks the top-k experts by score + `expert_bias`; its routing weights
are the picked scores (without the bias), optionally renormalized to sum to 1, times
`route_scale`. Group-limited routing (DeepSeek-V3, `n_groups` > 1): the experts form
`n_groups` equal groups, each scored by the sum of its two best biased scores, and a token
picks its k experts among the `topk_groups` best groups only.

Load balancing (weights set by the trainer's step, train/expert_balance.py):

- auxiliary loss (Switch Transformer's form, as transformers' `load_balancing_loss_func`
  computes it for Mixtral and Qwen-MoE): E * sum_e f_e * P_e, with f_e the share of the
  batch's token copies routed to expert e (summing to k) and P_e the batch's mean probability
  of e. The batch is one micro-batch of every rank that holds other tokens of it (data, context
  and sequence parallel ranks): f is all-reduced over them, and each rank back-propagates its
  own tokens' part of P, so the gradients summed by data parallel are those of the loss over
  the whole micro-batch. Per layer; the step averages the layers.
  Sequence-wise (DeepSeek-V3's complementary loss, `per_sequence`): the same sum per sequence,
  (E / k) * sum_e f_e * P_e with f_e the sequence's share of copies routed to e (summing to k),
  averaged over the sequences; a sequence's statistics are summed over the ranks holding parts
  of it (context parallel, and tensor parallel's sequence shards) before its loss is taken.
- router z-loss (ST-MoE): the mean over tokens of logsumexp(logits)^2.
- auxiliary-loss-free balancing (DeepSeek-V3): `expert_bias`, a persistent buffer added to the
  scores for the choice only, moved after each optimizer step by bias_update_rate *
  sign(mean load - load_e) from the step's expert loads summed over all ranks.

The terms enter backward through `attach_loss`, an identity on the routing weights whose
backward also feeds the term its gradient: the loss reaches the router wherever the layer runs,
in any pipeline stage, without changing what the model returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._functional_collectives import all_reduce

from kenotron.models.common.init import InitSpec, trunc_normal
from kenotron.models.common.moe_args import SCORE_FUNCS


@dataclass
class RouterOutput:
    weights: torch.Tensor
    """(tokens, k) fp32 routing weights."""
    experts: torch.Tensor
    """(tokens, k) int64 chosen experts."""
    logits: torch.Tensor
    """(tokens, experts) gate outputs."""
    probs: torch.Tensor
    """(tokens, experts) fp32 scores normalized to sum to 1 per token (the P of the auxiliary loss)."""
    counts: torch.Tensor
    """(experts,) fp32 token copies per expert."""


@dataclass
class BalanceWeights:
    """How much the layer's balancing terms weigh in the back-propagated loss, and over which
    ranks a micro-batch's routing is counted (set by the trainer's step)."""

    aux: float = 0.0
    """Multiplies each micro-batch's auxiliary loss (coefficient x data-parallel averaging size / (micro-batches x MoE layers))."""
    z: float = 0.0
    """Multiplies the layer's sum of logsumexp^2 over a micro-batch's tokens / the micro-batch's tokens
    (coefficient x averaging size / (micro-batches x MoE layers))."""
    group: Any = None
    """Process group of the ranks holding the other tokens of a micro-batch (None: this rank alone)."""
    group_size: int = 1
    """Ranks in `group`."""
    sequence_ranks: int = 1
    """Consecutive ranks of `group` that hold parts of the same sequences (context x tensor parallel)."""


def _in_recomputation() -> bool:
    """Whether this forward is activation checkpointing's recomputation (it runs inside backward)."""
    if torch.compiler.is_compiling():
        return False
    return torch._C._current_graph_task_id() != -1


class _AttachLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, out: torch.Tensor, term: torch.Tensor) -> torch.Tensor:
        ctx.term_shape = term.shape
        # The forward reads the term (adding zero): compiled, an input the forward does not read
        # gets no gradient, and a block whose graph breaks at the experts (FSDP units of their own
        # under expert parallel or bf16 expert reduction) trained with no balancing loss at all
        # (docs/performance.md, run 121; tests/models/test_moe.py).
        return out + (term * 0).to(out.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, grad.new_ones(ctx.term_shape, dtype=torch.float32)


def attach_loss(out: torch.Tensor, term: torch.Tensor) -> torch.Tensor:
    """`out` unchanged (plus 0 x term); in backward, `term` gets gradient 1 (it joins the loss)."""
    return _AttachLoss.apply(out, term)


class TopKRouter(nn.Module):
    """x (tokens, dim) -> RouterOutput; see the module docstring."""

    def __init__(self, dim: int, n_experts: int, top_k: int, score_func: str = "softmax", norm_topk: bool = True,
                 route_scale: float = 1.0, n_groups: int = 1, topk_groups: int = 1,
                 per_sequence: bool = False) -> None:
        super().__init__()
        if score_func not in SCORE_FUNCS:
            raise ValueError(f"score_func={score_func!r} is not one of {', '.join(SCORE_FUNCS)}")
        if not 1 <= top_k <= n_experts:
            raise ValueError(f"top_k={top_k} must lie in [1, n_experts={n_experts}]")
        if n_experts % n_groups or not 1 <= topk_groups <= n_groups:
            raise ValueError(f"n_groups={n_groups} must divide n_experts={n_experts} and topk_groups={topk_groups} "
                             f"lie in [1, n_groups]")
        self.n_experts, self.top_k = n_experts, top_k
        self.score_func, self.norm_topk, self.route_scale = score_func, norm_topk, route_scale
        self.n_groups, self.topk_groups, self.per_sequence = n_groups, topk_groups, per_sequence
        self.gate = nn.Linear(dim, n_experts, bias=False)
        self.register_buffer("expert_bias", torch.zeros(n_experts))
        # Step statistics (not saved): local token copies per expert, the micro-batches' auxiliary
        # losses (already over the whole micro-batch), the local sum of logsumexp^2, micro-batches.
        self.register_buffer("load", torch.zeros(n_experts), persistent=False)
        self.register_buffer("aux_sum", torch.zeros(()), persistent=False)
        self.register_buffer("z_sum", torch.zeros(()), persistent=False)
        self.register_buffer("units", torch.zeros(()), persistent=False)
        self.balance = BalanceWeights()
        self.counting = True
        """Whether forwards add to the step statistics (off while a pipeline stage infers its shapes)."""

    def _apply(self, fn, recurse=True):  # type: ignore[override]
        # The bias and the statistics stay fp32 whatever dtype the model is cast to: bf16 counts
        # stop at 256 and a bf16 bias would round its small steps away.
        out = super()._apply(fn, recurse)
        for name, buffer in self.named_buffers(recurse=False):
            if buffer.is_floating_point() and buffer.dtype != torch.float32:
                setattr(self, name, buffer.float())
        return out

    def forward(self, x: torch.Tensor) -> RouterOutput:
        logits = self.gate(x)
        scores = logits.float().softmax(-1) if self.score_func == "softmax" else logits.float().sigmoid()
        choice = scores + self.expert_bias
        if self.n_groups > 1:
            choice = self._within_best_groups(choice)
        _, experts = torch.topk(choice, self.top_k, dim=-1)
        weights = scores.gather(-1, experts)
        if self.norm_topk:
            weights = weights / (weights.sum(-1, keepdim=True) + (1e-20 if self.score_func == "sigmoid" else 0.0))
        if self.route_scale != 1.0:
            weights = weights * self.route_scale
        probs = scores if self.score_func == "softmax" else scores / scores.sum(-1, keepdim=True)
        counts = torch.zeros(self.n_experts, device=x.device).index_add_(
            0, experts.reshape(-1), torch.ones(experts.numel(), device=x.device))
        return RouterOutput(weights, experts, logits, probs, counts)

    def _within_best_groups(self, choice: torch.Tensor) -> torch.Tensor:
        """`choice` (tokens, experts) with the experts outside each token's `topk_groups` best
        groups (by the sum of their two best scores) set to -inf."""
        grouped = choice.view(choice.shape[0], self.n_groups, -1)
        group_scores = grouped.topk(min(2, grouped.shape[-1]), dim=-1)[0].sum(-1)
        best = group_scores.topk(self.topk_groups, dim=-1)[1]
        keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best, True)
        return grouped.masked_fill(~keep[..., None], float("-inf")).view_as(choice)

    def _sequence_aux(self, r: RouterOutput, sequences: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(this rank's share of the micro-batch's sum over sequences of the sequence-wise loss,
        the mean over this rank's sequences of that loss, detached). A sequence's counts and
        scores are summed over the ranks holding parts of it (`balance.sequence_ranks` consecutive
        ranks of the group) before its loss is taken; each rank back-propagates its tokens' scores."""
        k, e, w = self.top_k, self.n_experts, self.balance
        ids = r.experts.view(sequences, -1)
        counts = torch.zeros(sequences, e, device=ids.device).scatter_add_(1, ids, torch.ones_like(ids, dtype=torch.float32))
        probs_sum = r.probs.view(sequences, -1, e).sum(1)
        stats = torch.cat([counts, probs_sum.detach(), counts.new_full((sequences, 1), ids.shape[1] // k)], 1)
        if w.group is not None and w.sequence_ranks > 1:
            # Every holder of other sequences (a data-parallel rank) gets its own rows, so the sum
            # adds up only the parts of the same sequence.
            slots, slot = w.group_size // w.sequence_ranks, dist.get_rank(w.group) // w.sequence_ranks
            table = stats.new_zeros(slots, *stats.shape)
            table[slot] = stats
            stats = all_reduce(table, "sum", w.group)[slot]
        counts, probs, tokens = stats[:, :e], stats[:, e:2 * e], stats[:, 2 * e:]
        share = (e / k) * counts / tokens
        local = (share * probs_sum / tokens).sum()
        return local, (share * probs / tokens).sum(-1).mean()

    def balance_term(self, r: RouterOutput, sequences: int = 1) -> torch.Tensor | None:
        """This rank's share of the layer's weighted balancing losses (None when both are off),
        after adding the micro-batch to the step statistics. `sequences`: how many sequences the
        tokens are, in order (for the sequence-wise loss)."""
        w = self.balance
        tokens = r.logits.shape[0] * w.group_size
        track = self.counting and self.training and torch.is_grad_enabled() and not _in_recomputation()
        terms = []
        if track:
            self.load.add_(r.counts)
            self.units.add_(1.0)
        if w.aux and self.per_sequence:
            local, mean = self._sequence_aux(r, sequences)
            if track:
                self.aux_sum.add_(mean)
            terms.append((w.aux / (sequences * w.group_size // w.sequence_ranks)) * local)
        elif w.aux:
            probs_sum = r.probs.sum(0)
            stats = torch.stack([r.counts, probs_sum.detach()])
            if w.group is not None:
                stats = all_reduce(stats, "sum", w.group)
            share = stats[0] / tokens
            if track:
                self.aux_sum.add_(self.n_experts * (share * stats[1]).sum() / tokens)
            terms.append((w.aux * self.n_experts / tokens) * (share * probs_sum).sum())
        if w.z:
            lse = torch.logsumexp(r.logits.float(), dim=-1)
            z_sum = (lse * lse).sum()
            if track:
                self.z_sum.add_(z_sum.detach())
            terms.append((w.z / tokens) * z_sum)
        if not terms:
            return None
        return terms[0] if len(terms) == 1 else terms[0] + terms[1]

    def reset_statistics(self) -> None:
        for buffer in (self.load, self.aux_sum, self.z_sum, self.units):
            buffer.zero_()

    def init_buffers(self) -> None:
        """A fresh router: no bias, no statistics (the bias is then trained or loaded)."""
        self.expert_bias.zero_()
        self.reset_statistics()

    def param_init_specs(self, init_std: float) -> dict[str, InitSpec]:
        return {"gate.weight": trunc_normal(init_std)}
