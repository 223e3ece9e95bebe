"""Closed-form per-rank memory of a decoder training step: the planner's fast first pass.

Notation (per rank): b local batch, s sequence, T = b·s tokens, t = tp, T_r = T/t under
sequence parallel (else T), d width, F FFN width, H / K query / kv heads of size h, V
vocabulary, L blocks, c = 2 (bf16 compute) or 4, c_r = bytes of the residual stream (4 under
autocast, else c). Every tensor is rounded up to 512 bytes as the CUDA allocator does.

MoE models replace the MLP terms by the MoE layer's (analytic_moe.py); leading dense blocks
(deepseek_v3) keep the MLP's, each kind weighted by its count. Multi-head latent attention
replaces the attention terms by its own (analytic_latent.py).

Static (exact, from `plan.describe`, i.e. the same per-parameter table the plan prints;
kenotron/estimate/static_memory.py):
  P = Σ local fp32 parameter shards (+ buffers);  G = the same bytes once gradients exist;
  O = AdamW: 2 · P + one 512-byte step counter per parameter (ZeRO-1: the partition's
      largest rank, from `Zero1Optimizer`'s own greedy partition); SGD: 0.
Gathered compute copies U (FSDP mixed precision): the root unit (embedding, final norm,
  output) stays gathered from forward to backward; one block is gathered while it runs (the
  last one stays gathered, `default` policy), two during backward (prefetch); `never` keeps
  all L; DDP / ZeRO-1 / one-GPU FSDP keep all L. Leading dense blocks (deepseek_v3) are the
  first block's size, the gathered ones and the rest (MTP modules too) an MoE block's; experts
  sharded over one rank (ep = dp_shard x cp) keep every MoE block's compute copies.
Activations kept per block (no AC), bytes:
  2·T_r·d·c_r (block input and mid-block residual, saved by the norms)
  + 2·T·d·c (the norms' outputs, or their sequence-parallel all-gathers, saved by the matmuls;
    under autocast each matmul casts its own copy: 5·T·d·2)
  + T·(2H + 2K)·h·c / t (RoPE'd q and k, v, attention output) + b·H·s·4/t (log-sum-exp)
  + 4·T·F·c / t (SwiGLU: w1 and w3 outputs, silu, product; 3 with the fused Triton gate of
    eager CUDA runs, which keeps no silu; 2 for a GELU MLP)
  + T·(H + K)·h·c / t with per-head q/k norms (Qwen3); LayerNorm in fp32 (StarCoder2) keeps
    2·T_r·d·4 instead of the residuals
  + T·H·h·c / t under context parallel where the attention output comes back contiguous in
    (batch, heads, seq, dim) (torch's load-balanced ring on rank 0, kenotron's ring): the
    output projection then keeps its own (batch, seq, heads·dim) copy
  full AC: T_r·d·c_r (the block input; compiled under Ulysses also T·(2H+2K')·h·c/t, the sizes
    of its all-to-alls' outputs, measured: step_shape.ulysses_checkpoint_bytes);  selective-op: the block input, matmul, attention and
  collective outputs: T_r·d·c_r + T·(H+2K)·h·c/t + T·H·h·c/t + 2·T·d·c + 2·T·F·c/t (+ SP
  all-gathers 2·T·d·c and reduce-scatters 2·T_r·d·c);  every-n-layers: 1 full + (n-1) none.
Multi-token prediction: its modules count as blocks; its heads' plain losses add their kept
  log-softmax and input maps, and their backward's temporaries (analytic_loss.py's mtp_loss_bytes).
Loss: fused chunked (C = min(chunk, T) tokens): keeps grad_h (T·d·c) and grad_w (V·d·c with
  one chunk, V·d·4 with several); temporaries max(2·C·V·c − V·d·c, C·V·c) with one chunk (grad_w
  is made after the logits' gradient), max(2·C·V·c, C·V·c + V·d·c) with several, or in the
  loss' backward (V + T)·d·c (·4 under autocast: fp32 weights and hidden states) if larger; with a second chunk of C' tokens
  C·V·c + 2·C'·V·c (the previous chunk's gradient is alive while the next one's logits and
  log-softmax are computed). The Triton chunk kernel (tuning.loss_kernel = triton, auto's choice
  on CUDA) and the vocab-parallel loss's compiled step (tp > 1, any kernel but torch) write the
  gradient over the logits: one C·V·c term less in each. Plain: keeps logits (T·V·c/t) and
  log-softmax (T·V·4/t); temporaries 2·T·V·4/t (fp32 copy and exp) -- the vocab-parallel
  loss adds one more T·V·4/t.
Peak = max of these moments:
  loss:      P + O + G_acc + U_fwd + L·A_block + A_edges + loss kept + loss temporaries
  backward:  P + O + G_acc + U_bwd + L·A_block + A_edges + block backward temporaries
             (2·T·F·c/t + 2·T·d·c + the block's gathered gradient in c and in fp32, plus
             the recomputed block under AC)
  optimizer: P + O + G (fused AdamW and the multi-tensor gradient norm need no scratch)
  embedding backward (TP with data parallel): P + O + G + the root's gathered copies + the
             embedding's whole gradient (DTensor returns it Replicate: V·d·c), its TP shard and
             two fp32 copies of that shard for the reduce-scatter
  tied embedding's last backward step (unsharded gradients, no TP): P + O + G + 2·V·d·4 (the
             output projection's gradient waiting in autograd's buffer and the embedding's own)
with G_acc the gradients accumulated by earlier micro-steps (FSDP: sharded; DDP/ZeRO-1: whole).
"""

from __future__ import annotations

import dataclasses

from kenotron.estimate.breakdown import Breakdown, allocated_bytes
from kenotron.estimate.static_memory import (
    FP32,
    ParameterBytes,
    data_parallel_kind,
    ddp_by_hooks,
    experts_outside_fsdp,
    experts_with_masters,
    held_parameter_bytes,
    leading_dense_blocks,
    master_weights,
    one_gpu_fsdp,
)
from kenotron.planner.analytic_latent import latent_attention_activations, latent_matmul_widths
from kenotron.planner.analytic_loss import loss_bytes, mtp_loss_bytes
from kenotron.planner.analytic_mamba import mamba_backward_scratch, mamba_block_activations
from kenotron.planner.analytic_moe import moe_activations, moe_backward_temporaries
from kenotron.planner.step_shape import StepShape
from kenotron.train.resolve import ResolvedRun


def block_activations(s: StepShape, mode: str, sp: bool, save_matmul_every: int = 1) -> int:
    """Bytes one block keeps for backward under AC `mode` (none, full, selective-op); under
    selective-op only one matmul output in every `save_matmul_every` is kept."""
    T, Tr, t, c = s.tokens, s.residual_tokens, s.tp, s.compute
    block_input = allocated_bytes(Tr * s.dim * s.residual)
    if mode == "full":
        return block_input + s.ulysses_kept
    q_width, kv_width = s.heads * s.head_dim // t, s.kv_heads * s.head_dim // t
    lse = allocated_bytes(s.batch * s.heads // t * s.seq * FP32)
    if s.moe is not None:
        mlp = moe_activations(s.moe, s.dim, c, s.fused_gate, s.fused_expert_gate, mode)
    else:
        mlp = ((3 if s.fused_gate else 4) if s.gated_mlp else 2) * allocated_bytes(T * s.ffn // t * c)
    if mode == "selective-op":
        # Matmul outputs in forward order: wq, wk, wv, wo (MLA's: analytic_latent.py), then w1, w3
        # (gated) or the up projection, then the down projection; the policy keeps indices 0, k, 2k, ...
        ffn = s.ffn // t
        dense = [] if s.moe is not None else ([ffn, ffn] if s.gated_mlp else [ffn]) + [s.dim]
        attention = (latent_matmul_widths(s.latent, s.heads // t)[:-1] if s.latent is not None
                     else [q_width, kv_width, kv_width]) + [s.dim]
        widths = attention + dense
        matmuls = sum(allocated_bytes(T * w * c) for w in widths[::save_matmul_every])
        attention_out = (latent_attention_activations(s.latent, s, mode) if s.latent is not None
                         else allocated_bytes(T * q_width * c) + lse)
        comms = 2 * allocated_bytes(T * s.dim * c) + 2 * allocated_bytes(Tr * s.dim * c) if sp else 0
        return block_input + matmuls + attention_out + comms + (mlp if s.moe is not None else 0)
    if s.fp32_norm:  # LayerNorm in fp32 keeps an fp32 copy of its input instead of the input itself
        residuals = 2 * allocated_bytes(Tr * s.dim * FP32) + 4 * allocated_bytes(Tr * FP32)
    else:
        residuals = 2 * block_input + 2 * allocated_bytes(Tr * FP32)
    matmul_inputs = 5 * allocated_bytes(T * s.dim * 2) if s.autocast else 2 * allocated_bytes(T * s.dim * c)
    if s.latent is not None:  # MLA, its RoPE tables included
        return residuals + matmul_inputs + latent_attention_activations(s.latent, s, mode) + mlp
    attention = 2 * allocated_bytes(T * q_width * c) + 2 * allocated_bytes(T * kv_width * c) + lse
    if s.cp_output_copy:
        attention += allocated_bytes(T * q_width * c)
    if s.qk_norm:  # the per-head norms keep their inputs (the projections' outputs)
        attention += allocated_bytes(T * q_width * c) + allocated_bytes(T * kv_width * c)
    rope_tables = 2 * allocated_bytes(s.seq * s.head_dim * c) if c != FP32 else 0
    return residuals + matmul_inputs + attention + rope_tables + mlp


def kinds_activations(s: StepShape, mode: str, sp: bool, save_matmul_every: int = 1) -> float:
    """Mean bytes per block under AC `mode` over the model's blocks: its attention blocks and
    its Mamba blocks (analytic_mamba.py), each kind's formula weighted by its count."""
    total = s.layers if s.layers else 1
    if s.moe is not None and s.dense_blocks:  # leading dense blocks (deepseek_v3) beside the MoE ones
        dense = min(s.dense_blocks, total)
        plain = block_activations(dataclasses.replace(s, moe=None), mode, sp, save_matmul_every)
        experts = block_activations(s, mode, sp, save_matmul_every)
        return (dense * plain + (total - dense) * experts) / total
    if s.mamba is None:
        return block_activations(s, mode, sp, save_matmul_every)
    mamba = mamba_block_activations(s, s.mamba, mode, sp, save_matmul_every)
    if s.mamba_blocks >= s.layers:
        return mamba
    attention = block_activations(s, mode, sp, save_matmul_every)
    return (s.mamba_blocks * mamba + (total - s.mamba_blocks) * attention) / total


def backward_scratch(s: StepShape) -> int:
    """A block's backward temporaries beyond its kept activations (the largest over the kinds of
    block the model has): an attention block's MLP (or MoE layer's) and residual gradients, a Mamba block's scan."""
    mlp = (moe_backward_temporaries(s.moe, s.dim, s.compute) if s.moe is not None
           else 2 * allocated_bytes(s.tokens * s.ffn // s.tp * s.compute))
    attention = mlp + 2 * allocated_bytes(s.tokens * s.dim * s.compute)
    if s.mamba is None:
        return attention
    mamba = mamba_backward_scratch(s, s.mamba)
    return mamba if s.mamba_blocks >= s.layers else max(mamba, attention)


def activations_per_block(run: ResolvedRun, s: StepShape) -> float:
    """Mean bytes per block over the AC pattern."""
    ac = run.plan.settings.ac_mode
    sp = s.tp > 1 and run.plan.settings.sequence_parallel
    if ac == "every-n-layers":
        n = run.plan.settings.ac_every_n
        return (kinds_activations(s, "full", sp) + (n - 1) * kinds_activations(s, "none", sp)) / n
    return kinds_activations(s, ac, sp, run.plan.settings.ac_save_matmul_every)


def gathered_bytes(run: ResolvedRun, params: ParameterBytes, layers: int, moment: str) -> int:
    """FSDP compute copies alive at the loss (`forward`) or during a block's backward (`backward`)."""
    kind = data_parallel_kind(run)
    if (kind == "none" and not one_gpu_fsdp(run)) or ddp_by_hooks(run):
        return 0
    # Dense blocks first (deepseek_v3): those are the first block's size, the others (and the MTP
    # modules) an MoE block's; the blocks kept gathered are the last ones, MoE blocks.
    dense = leading_dense_blocks(run, params)
    moe_block = params.moe_block
    if experts_outside_fsdp(run):  # FSDP gathers the rest of a block; the experts' copies are activations
        moe_block -= params.moe_experts
    keep_all = kind in ("ddp", "zero1") or one_gpu_fsdp(run) or run.plan.settings.reshard_after_forward == "never"
    root = params.root_gathered + tied_second_copy(run)
    if keep_all:
        return root + dense * params.block_gathered + (layers - dense) * moe_block
    blocks = 2 if moment == "backward" else (0 if run.plan.settings.reshard_after_forward == "always" else 1)
    return root + blocks * moe_block


def expert_copies(run: ResolvedRun, params: ParameterBytes, layers: int) -> int:
    """The compute copies of the routed experts outside FSDP (`experts_outside_fsdp`) that the
    blocks' forwards keep for backward: GroupedExperts casts its fp32 weights per forward, and the
    grouped GEMM saves the copy unless activation checkpointing recomputes the block."""
    if not experts_outside_fsdp(run) or experts_with_masters(run):  # bf16 weights: the GEMM saves the parameter
        return 0
    return round((layers - leading_dense_blocks(run, params)) * params.moe_experts * uncheckpointed_fraction(run))


def tied_second_copy(run: ResolvedRun) -> int:
    """Under FSDP × TP a tied embedding/output weight is two FSDPParams (TP gives each module its own
    DTensor before the model ties them again), gathered twice (docs/estimation.md, Findings): the
    second copy's bytes. It mattered little beside the plain loss's logits; the fused loss leaves it
    a few percent of the peak (1B at tp 2: 250 MiB)."""
    a = run.model_args
    if run.dims.tp == 1 or not getattr(a, "tie_embeddings", False) or data_parallel_kind(run) not in ("fsdp", "hsdp"):
        return 0
    return allocated_bytes(a.vocab_size // run.dims.tp * a.dim * run.choices.compute_dtype.itemsize)


def uncheckpointed_fraction(run: ResolvedRun) -> float:
    """Share of blocks whose forward is not recomputed (their autocast weight copies stay saved)."""
    mode = run.plan.settings.ac_mode
    if mode == "none":
        return 1.0
    if mode == "every-n-layers":
        return (run.plan.settings.ac_every_n - 1) / run.plan.settings.ac_every_n
    return 0.0


def replicated_embedding_gradient(run: ResolvedRun, s: StepShape) -> int:
    """Extra gradient bytes when TP runs without data parallel: DTensor's embedding backward
    returns the vocab-sharded table's gradient Replicate, i.e. whole on every TP rank."""
    if s.tp == 1 or data_parallel_kind(run) != "none" or "embedding" not in run.plan.layout.tp_styles.values():
        return 0
    return allocated_bytes(s.vocab * s.dim * FP32) - allocated_bytes(s.vocab // s.tp * s.dim * FP32)


def peak_breakdown(run: ResolvedRun, params: ParameterBytes, O: int, kind: dict[str, bool], fused: bool) -> Breakdown:
    """The highest moment (see the module doc), given the parameter table, the optimizer bytes,
    the block variant and whether the loss is the fused chunked one."""
    s = StepShape.of(run, kind)
    mw = master_weights(run)
    # Master weights: bf16 parameters and gradients (the fp32 masters are optimizer state, in O);
    # the routed experts' alone under experts_with_masters.
    local = held_parameter_bytes(run, params)
    P = local + params.buffers
    extra_grad = replicated_embedding_gradient(run, s)
    G = local + extra_grad
    sharded_grads = data_parallel_kind(run) in ("fsdp", "hsdp")
    accumulated = G if run.grad_accum_steps > 1 else 0
    # Offloaded blocks keep their saved tensors in host memory (only tensors under 1 MiB stay).
    blocks = round((s.layers - min(run.plan.settings.offload_blocks, s.layers)) * activations_per_block(run, s))
    if s.autocast:  # autocast keeps the bf16 copy of each matmul weight until its backward
        weights = params.blocks_gathered(s.layers, leading_dense_blocks(run, params))
        blocks += round(weights * uncheckpointed_fraction(run))
    else:
        blocks += expert_copies(run, params, s.layers)
    edges = 2 * allocated_bytes(s.residual_tokens * s.dim * s.residual)  # embedding output, final norm output
    kept, loss_temp = loss_bytes(run, s, fused)
    mtp_kept, mtp_temp = mtp_loss_bytes(run, s)
    # Under multi-token prediction the last block backward meets is the MTP module's (its loss came
    # last): the main head's loss still keeps its tensors there.
    main_kept = kept if mtp_kept else 0
    kept, loss_temp = kept + mtp_kept, max(loss_temp, mtp_temp)
    loss_moment = Breakdown(
        parameters=P, unsharded_parameters=gathered_bytes(run, params, s.layers, "forward"), gradients=accumulated,
        optimizer_state=O, activations=blocks + edges + kept, temporaries=loss_temp,
    )
    c, t = s.compute, s.tp
    # A block's weight gradients in the matmul dtype, and (autocast, FSDP) their fp32 conversions.
    block_grad = params.block_gathered * (1 + (FP32 // c if c != FP32 and not mw else 0))
    backward_temp = backward_scratch(s) + block_grad
    if run.plan.settings.ac_mode != "none":
        backward_temp += round(kinds_activations(s, "none", t > 1 and run.plan.settings.sequence_parallel))
    backward_moment = Breakdown(
        parameters=P, unsharded_parameters=gathered_bytes(run, params, s.layers, "backward"),
        gradients=accumulated if sharded_grads or not accumulated else G, optimizer_state=O,
        activations=blocks + edges + main_kept, temporaries=backward_temp,
    )
    # The optimizer updates a vocab-sharded parameter from a replicated gradient through a shard copy.
    optimizer_temp = allocated_bytes(s.vocab // s.tp * s.dim * FP32) if extra_grad else 0
    optimizer_moment = Breakdown(parameters=P, gradients=G, optimizer_state=O, temporaries=optimizer_temp)
    moments = [loss_moment, backward_moment, optimizer_moment]
    moe_layers = s.layers - leading_dense_blocks(run, params)
    if experts_outside_fsdp(run) and moe_layers > 1 and run.plan.settings.ac_mode != "none":
        # Experts outside FSDP keep their gradients whole (fp32, or bf16 under experts_with_masters) from their block's backward on:
        # late in the backward every MoE block's but the last one's are made, beside the blocks
        # still to come (the dense ones and that one) and the working block. Under recomputation
        # this is the backward's highest point (the blocks keep little); without, its start is.
        left = s.layers - moe_layers + 1
        done = (moe_layers - 1) * params.moe_experts * (1 if experts_with_masters(run) else FP32 // c)
        moments.append(dataclasses.replace(
            backward_moment, gradients=backward_moment.gradients + done,
            activations=round(blocks * left / s.layers) + edges))
    tied = getattr(run.model_args, "tie_embeddings", False)
    if tied and not sharded_grads and s.tp == 1:
        # The last backward step of a tied embedding: the output projection's gradient waits in
        # autograd's buffer while the embedding's own dense gradient is made, then the two are
        # summed into the parameter's gradient (in G): two (vocab, dim) tensors beside G, in the
        # dtype the loss saw the weight in (fp32 under autocast, else the compute dtype).
        tied = 2 * allocated_bytes(s.vocab * s.dim * (FP32 if s.autocast else c))
        moments.append(Breakdown(parameters=P, gradients=G, optimizer_state=O, temporaries=tied))
    if sharded_grads and run.dims.dp_shard * run.dims.cp > 1:
        # The root unit's reduce-scatter after the embedding's backward (the step's last op): the
        # root's gradients in the compute dtype and their copy in the reduce dtype, beside the
        # blocks' sharded gradients. Untied, the gathered root is already freed; tied, the
        # simulation of FSDP2's post-backward also holds it and the sharded result at that moment.
        shard = run.dims.dp_shard * run.dims.cp
        reduce_size = FP32 if run.plan.settings.reduce_dtypes()[0] == "float32" else 2  # the root holds no experts
        root = params.root_gathered - params.head_gathered  # the final norm and output: their own unit
        reduced = root * reduce_size // c
        root_local = root * (FP32 // c) // shard
        moments.append(Breakdown(
            parameters=P, unsharded_parameters=root if tied else 0,
            gradients=accumulated if accumulated else max(G - root_local, 0), optimizer_state=O,
            temporaries=root + reduced + (reduced // shard if tied else 0),
        ))
        if params.head_gathered:
            # The head unit's reduce-scatter right after the loss' backward, every activation
            # still alive: its gradients in the compute dtype and their copy in the reduce dtype
            # beside the hidden states' gradient; gathered are the head and the blocks forward
            # left so (the fake-tensor step holds no gathered embedding there, whatever the policy).
            head = params.head_gathered
            moments.append(dataclasses.replace(
                backward_moment, unsharded_parameters=gathered_bytes(run, params, s.layers, "forward") - root,
                gradients=backward_moment.gradients + head * (FP32 // c) // shard,
                temporaries=head + head * reduce_size // c + allocated_bytes(s.tokens * s.dim * c)))
    if s.tp > 1 and not extra_grad and "embedding" in run.plan.layout.tp_styles.values():
        # Data parallel takes the embedding's whole (Replicate) gradient, keeps its TP shard, casts it
        # to fp32 and reduce-scatters it: briefly the largest temporaries of the step for a big vocabulary.
        V, d = s.vocab, s.dim
        shard_temp = allocated_bytes(V * d * c) + allocated_bytes(V // t * d * c) + 2 * allocated_bytes(V // t * d * FP32)
        grads = G
        if sharded_grads:
            # Under FSDP the TP shard's gradient (parallel/tensor.py's VocabParallelEmbedding keeps it
            # Shard(0)) is cast to fp32 and reduce-scatterred into the embedding's sharded gradient, not
            # yet in G: the step's last moment, the peak once the fused loss leaves no logits.
            shard_fp32 = allocated_bytes(V // t * d * FP32)
            out = shard_fp32 // (run.dims.dp_shard * run.dims.cp)
            grads, shard_temp = max(G - out, 0), allocated_bytes(V // t * d * c) + shard_fp32 + out
        moments.append(Breakdown(parameters=P, unsharded_parameters=params.root_gathered, gradients=grads,
                                 optimizer_state=O, temporaries=shard_temp))
    return max(moments, key=lambda b: b.total)
