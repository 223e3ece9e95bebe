"""Multi-token prediction (DeepSeek-V3 report, section 2.2): `mtp_depth` sequential modules, module k
predicting the token k + 1 positions ahead.

    h_0 = the main model's last hidden states (before its final norm)
    h_k = block_k(eh_proj([enorm(embed(token t + k)) | hnorm(h_{k-1})]))       per position t
    loss_k = cross-entropy(output(head_norm(h_k)), token t + k + 1)

The embedding and the output head are the main model's. Module k is block `n_layers + k - 1`
of the model's `layers` (HF's `model.layers.{n_layers + k - 1}`), so every plan written for
`layers.*` (FSDP units, activation checkpointing, compile, tensor and expert parallel) covers
it, and its keys convert as HF's MTP layers.

The inputs and targets come from the window itself: `future_tokens(tokens, depth)`
(models/common/future_tokens.py) holds, at
position t, tokens t + 1 .. t + depth + 1 (IGNORE_INDEX past the window's end); module k reads
column k - 1 (token t + k) and predicts column k, so the last k + 1 positions of a window have no
target. The model builds them from its token ids; where it gets no ids (a pipeline's last stage)
or a shard of the sequence (context parallel), the trainer builds them from the whole sequence
and cuts them as the tokens are cut (train/mtp.py). The loss joins backward through
`attach_to_output` on the model's output, weighted by
`loss_scale` which the trainer sets each step (train/mtp.py: model.mtp_loss_weight / depth over
the global batch's label tokens); the summed losses and target counts per module are kept for
the metrics. The trainer gives the heads its fused chunked loss (`MTPLoss.head_loss`), so that
no module holds [tokens, vocab] logits, except under tensor parallel.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import BlockMask

from kenotron.degrees import ParallelConfigError
from kenotron.dtensor import local_tensor
from kenotron.models.common.future_tokens import IGNORE_INDEX
from kenotron.models.common.init import InitSpec, prefixed, trunc_normal
from kenotron.models.common.norms import RMSNorm
from kenotron.models.deepseek_v3.args import DeepSeekV3Args
from kenotron.models.deepseek_v3.block import DeepSeekV3Block


class MTPBlock(DeepSeekV3Block):
    """One MTP module: the projections of the report's equation (21) around an MoE block."""

    def __init__(self, layer_id: int, args: DeepSeekV3Args) -> None:
        super().__init__(layer_id, args, moe=args.n_dense_layers < args.n_layers)
        self.enorm = RMSNorm(args.dim, args.norm_eps)
        self.hnorm = RMSNorm(args.dim, args.norm_eps)
        self.eh_proj = nn.Linear(2 * args.dim, args.dim, bias=False)
        self.head_norm = RMSNorm(args.dim, args.norm_eps)
        self.out_std = 0.02 / math.sqrt(2 * (args.n_layers + 1))

    def forward(  # type: ignore[override]
        self, embedded: torch.Tensor, previous: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
        **attention: object,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(h_k, head_norm(h_k)) from the embeddings of the shifted tokens and h_{k-1} (both (batch,
        seq, dim)). Called as the module (not a method) so FSDP's and checkpointing's hooks run."""
        # Local tensors, as the residual stream is (under sequence parallel these parts output
        # sequence-sharded DTensors).
        x = local_tensor(self.eh_proj(torch.cat([self.enorm(embedded), self.hnorm(previous)], dim=-1)))
        h = super().forward(x, cos, sin, **attention)
        return h, self.head_norm(h)

    def param_init_specs(self) -> dict[str, InitSpec]:
        return {
            **super().param_init_specs(),
            **prefixed("enorm", self.enorm.param_init_specs()),
            **prefixed("hnorm", self.hnorm.param_init_specs()),
            **prefixed("head_norm", self.head_norm.param_init_specs()),
            "eh_proj.weight": trunc_normal(0.02),
        }


def mtp_stage_copies(args: DeepSeekV3Args, units: list[str]) -> list[str]:
    """The units a pipeline stage holding `units` needs a copy of (parallel/pipeline.py): the MTP
    modules' stage the embedding, which they read. They must share the output head's stage."""
    mtp = [u for u in units if u.startswith("layers.") and int(u.split(".")[1]) >= args.n_layers]
    if not mtp:
        return []
    if "output" not in units:
        raise ParallelConfigError(
            f"the pipeline split puts MTP module {mtp[0]} on a stage without the output head; the "
            f"model.mtp_depth={args.mtp_depth} MTP modules (the last blocks) run on the last stage: give it at "
            f"least {args.mtp_depth + 1} blocks in parallelism.pp_layers_per_stage / pp_stage_modules")
    return [] if "tok_embeddings" in units else ["tok_embeddings"]


class _JoinEmbeddings(torch.autograd.Function):
    """(h, *embedded) as they are, through one autograd node: the embedding reaches the graph
    that depends on h at this node only.

    Why: a zero-bubble schedule's weight pass (torch.distributed.pipelining's
    stage_backward_weight) runs backward from the first nodes where a weight meets the graph of
    the stage's input, one parameter group at a time, each freeing what it walks. Looked up
    module by module, the embedding would meet that graph at every module's input (its cat); the
    walk from module k's to the embedding weight then runs back through module k - 1 (whose
    input h_{k-1} also reads the embedding), freeing that module's graph before its own weights'
    passes (torch 2.13: "Trying to backward through the graph a second time"). Joined here, the
    walk starts at this node and reaches the embedding without entering any module."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, *embedded: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (h.view_as(h), *(e.view_as(e) for e in embedded))

    @staticmethod
    def backward(ctx, *grads: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return grads


class _AttachToOutput(torch.autograd.Function):
    """The model's output unchanged; in backward the MTP loss gets gradient 1 (it joins the loss).
    As models/common/router.py's attach_loss, but an alias of the output, not a view of it (FSDP
    warns when its module returns a view), and the loss's gradient a plain tensor where the output
    is a DTensor (the logits under loss parallel)."""

    @staticmethod
    def forward(ctx, out: torch.Tensor, term: torch.Tensor) -> torch.Tensor:
        ctx.term_shape, ctx.term_device = term.shape, term.device
        return out.detach()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return grad, torch.ones(ctx.term_shape, dtype=torch.float32, device=ctx.term_device)


def attach_to_output(out: torch.Tensor, term: torch.Tensor) -> torch.Tensor:
    """`out` (the model's output: logits, or the normed states the fused loss reads) joined by the
    MTP modules' loss `term`. At the output, after the final norm and the head: a zero-bubble
    schedule's weight pass of the head then walks from the main logits to its weight only, not
    back through the norm into the MTP modules' graph, which another weight pass frees first
    (docs/parallelism.md, multi-token prediction)."""
    return _AttachToOutput.apply(out, term)


class MTPLoss(nn.Module):
    """The modules' statistics and loss weight (no parameters): `loss_scale` per target token's
    cross-entropy, and per module the step's summed losses and target counts (not saved)."""

    def __init__(self, depth: int) -> None:
        super().__init__()
        self.loss_scale = 0.0
        self.counting = True
        """Whether term() adds to the statistics (off while torch's pipeline stages infer shapes)."""
        self.head_loss: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None
        """(normed, output weight, targets) -> the summed cross-entropy without the whole logits (the
        trainer's fused chunked loss, set by train/mtp.py); None: the output head, then plain
        cross-entropy over its logits (what tensor parallel's vocabulary-sharded logits need)."""
        self.register_buffer("loss_sum", torch.zeros(depth), persistent=False)
        self.register_buffer("targets", torch.zeros(depth), persistent=False)

    def _apply(self, fn, recurse=True):  # type: ignore[override]
        out = super()._apply(fn, recurse)
        for name, buffer in self.named_buffers(recurse=False):  # sums stay fp32 (as the routers' statistics)
            if buffer.is_floating_point() and buffer.dtype != torch.float32:
                setattr(self, name, buffer.float())
        return out

    @property
    def head_calls(self) -> int:
        """Calls of the output head per forward, one per module (the planner prices them: step_compute.py)."""
        return len(self.loss_sum)

    def reset(self) -> None:
        self.loss_sum.zero_()
        self.targets.zero_()

    def loss(self, blocks: list[nn.Module], embedding: nn.Module, output: nn.Module, future: torch.Tensor,
             h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, block_mask: BlockMask | None) -> torch.Tensor:
        """The weighted losses of the MTP modules `blocks` (in order) from the main blocks' last
        hidden states `h` and `future` (future_tokens), with the model's embedding and output head."""
        attention = {"block_mask": block_mask} if block_mask is not None else {}
        total = h.new_zeros((), dtype=torch.float32)
        # Past the window: any token (its position has no target).
        embedded = [embedding(future[..., k - 1].clamp(min=0)) for k in range(1, len(blocks) + 1)]
        h, *embedded = _JoinEmbeddings.apply(h, *embedded)
        for k, block in enumerate(blocks, start=1):
            h, normed = block(embedded[k - 1], h, cos, sin, **attention)
            total = total + self.term(k, output, normed, future[..., k])
        return total

    def term(self, k: int, output: nn.Module, normed: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Module k's (1-based) weighted loss through the output head from its normed hidden states
        (batch, seq, dim) to its `targets` (batch, seq; IGNORE_INDEX where none); adds to the statistics."""
        if self.head_loss is not None:
            loss = self.head_loss(normed, output.weight, targets)
        else:
            # Under tensor parallel's loss parallel the logits are vocabulary shards and the loss a
            # replicated DTensor: its local value is the whole loss.
            loss = local_tensor(F.cross_entropy(output(normed).flatten(0, -2).float(), targets.flatten(),
                                                reduction="sum", ignore_index=IGNORE_INDEX))
        if self.counting:
            with torch.no_grad():
                self.loss_sum[k - 1] += loss.detach()
                self.targets[k - 1] += (targets != IGNORE_INDEX).sum()
        return loss * self.loss_scale
