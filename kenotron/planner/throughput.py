"""A first-order model of step time, to rank the layouts the planner finds.

Per optimizer step, on one rank (G global batch, s sequence, dp = dp_replicate·dp_shard,
m micro-steps of b sequences, t = tp, p = cp, q = pp, T = b·s/p the rank's tokens per micro-step):

  compute  = m · (kernels + loss + accumulation) of a micro-step over the whole model
             (step_compute.py: matmuls at e_mm of the peak, attention at e_attn, Mamba's scan
             at e_scan, the elementwise kernels (κ times a block's saved activations), the loss
             and fp32 gradient accumulation at the memory bandwidth B_mem; activation
             checkpointing's reruns per kind of work: `recompute`); with data.document_masking
             the attention is the busiest rank's tiles under the mask, each at w times a causal
             tile's cost (masked_attention.py: the expected share of causal tiles the documents
             leave, times the ring's busiest rank over the mean; w = `Hardware.document_tile_cost`,
             FlexAttention's document-masked kernel against the causal one)
  pipeline = m · the schedule step in place of compute (pipeline parallel, µ microbatches of T/µ
             tokens): every rank's own order on a timeline (pipeline_timeline.py), each stage's
             forward, backward and the zero-bubble input and weight passes lasting their share
             of its seconds per microbatch; `compute` is the busiest rank's work, `pipeline_bubble`
             the rest of the step
  optimizer = P · (32 + 6 under autocast) / B_mem on the rank with the most parameters P
             (AdamW and the gradient norm; ZeRO-1: its partition, then its broadcast of the updated
             parameters, exposed; pipeline: its stages')
  tp       = m · L/q · k · 2·(t-1)/t · T·d·c / B_tp        (not overlapped; k = 8 collectives per
             block per micro-step: 2 all-gathers + 2 reduce-scatters forward and backward, 12 with
             full AC's recomputation; B_tp the bandwidth of the TP group)
  cp       = m · L/q · (2·(p-1)·2·c + 2·p·4) · b·s/p·K·h / t / B_cp   (not overlapped; torch's ring
             per block and micro-step: the k/v all-gather in forward and again in backward, (p-1)
             blocks of b·s/p tokens, and the fp32 k/v gradients passed on at each of its p steps;
             the same volume with the alltoall rotation. The ring's attention on split blocks
             runs at e_attn, which its rows pin; not split, under Ulysses, it runs faster: below)
  cp (ulysses) = m · L/q · 2·(p-1)/p · b·s/p·h·c·(2·H/t + 2·K') / B_cp   (parallelism.cp_scheme=
             'ulysses': all-to-alls of q, k, v and the output in forward, their gradients in
             backward, not overlapped; K' = K/t kv heads, or p when they are repeated). Its
             attention kernel runs unsplit over the whole sequence: plain causal attention is
             priced at e_attn · g (g = `Hardware.ulysses_attention_gain`, whose docstring says what
             it was fitted to; the ring's rows pin e_attn). FlashAttention-3/4
             (attention_backend 'flash_attn', under Ulysses or without CP) runs at
             e_attn · `Hardware.flash_attention_gain` more.
             Heads that split over part of cp only (u = plan.settings.cp_ulysses_degree < p):
             the all-to-all term with u for p, plus the ring's at r = p/u on the group's
             b·s/r tokens and K'/u kv heads (B_cp of a group u·t ranks apart); the attention
             runs split (the ring's), at e_attn. Unmeasured on GPUs.
  p2p      = m · (v·µ + q − 1) · 2 · b_µ·s/p·d·c_r / B_pp   (pipeline parallel: each slot of the
             critical path waits for one activation sent forward and one gradient sent back,
             b_µ·s/p·d·c_r bytes each (c_r: 4 under autocast's fp32 residual stream), taken as
             exposed: torch's schedule posts them between the compute of consecutive slots; / t
             under sequence parallel)
  fsdp     = m · (n-1)/n · (U + U' + P_full) / B_fsdp   (the forward's all-gather of the compute
             copies U and the backward's of U', what forward resharded: U less the root, the head
             unit and, under the default policy, the last block; 0 with reshard `never` or under
             pipeline parallel, whose stages stay gathered through the schedule step; one
             reduce-scatter of the fp32 gradients, P_full bytes; n = dp_shard·cp; under pipeline
             parallel U and P_full are a stage's, the model's / q);
             its copies (each all-gather's copy-in reads the fp32 shard and writes U/n, its
             copy-out reads and writes U; the reduce-scatter's copy-in reads the gradients and
             writes P_full) are added to compute at B_mem
  replicas = 2·(r-1)/r · P_local / B_dp once per step      (HSDP / DDP / ZeRO-1 all-reduce of the
             rank's fp32 gradients; ZeRO-1's r = dp·cp)
  ep       = m · L/q · (4·T·r·d·c / B_ep + s)   (expert parallel: each MoE layer sends each token
             to r other ranks and gets the results back, in forward and again in backward, not
             overlapped; by default r = ep − 1 and s the row copies over the worst-case grouped
             buffer at B_mem; under the deduplicated exchange r the ranks holding one of its
             experts and s the GPU's idle after the host reads the split sizes,
             `Hardware.ep_sync_s`; analytic_moe.py)
  tail     = the root unit's gradient reduction ((n-1)/n or 2(r-1)/r of its fp32 bytes / B): the
             last one of the backward, after the last matmul, exposed (the first all-gathers of
             a step run under the previous optimizer step, `parallelism.fsdp_early_all_gather`)
  compute += σ · (fsdp + replicas)   (the collectives beside the compute slow it: σ the share of
             their time lost, `Hardware.collective_sm_share`)
  step     = compute + bubble + p2p + tp + cp + ep + optimizer + max(tail, fsdp + replicas − compute)
             (data-parallel traffic overlaps compute but for its tail)
  tokens/s per GPU = G·s / step / world

A group's bandwidth is the NVLink figure while it fits in one node (its size times the
product of the inner mesh dimensions is at most gpus_per_node), the network's otherwise.
The constants are H200 figures (`Hardware`); e_mm, e_attn, e_scan and κ are fitted to the
measured rows of docs/performance.md and docs/parallelism.md (scripts/fit_throughput.py;
docs/estimation.md, Throughput model), and tests/planner/test_throughput_rows.py holds the
model to those rows.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kenotron.estimate.static_memory import (
    data_parallel_kind,
    ddp_by_hooks,
    experts_outside_fsdp,
    experts_with_masters,
    leading_dense_blocks,
    master_weights,
    zero1_ranks,
)
from kenotron.parallel.fsdp_wire import wire_dtype
from kenotron.planner.analytic import uncheckpointed_fraction
from kenotron.planner.analytic_model import AnalyticModel
from kenotron.planner.analytic_moe import all_to_all_seconds
from kenotron.planner.hardware import Hardware
from kenotron.planner.masked_attention import DocumentAttention, document_attention
from kenotron.planner.pipeline_timeline import step_seconds
from kenotron.planner.step_compute import (
    Rates,
    Recompute,
    Unit,
    accumulate_seconds,
    kernel_seconds,
    optimizer_seconds,
    rates,
)
from kenotron.train.resolve import ResolvedRun


@dataclass(frozen=True)
class StepTime:
    """Modelled seconds of one optimizer step and what they are made of."""

    compute: float
    """Kernel time including recomputation, the loss and gradient accumulation (under pipeline
    parallel: the slowest rank's)."""
    tensor_parallel: float
    """TP collectives (on the critical path)."""
    data_parallel: float
    """FSDP and replica traffic (overlaps compute; only the excess is exposed)."""
    context_parallel: float
    """Context-parallel k/v traffic (on the critical path)."""
    tokens: int
    """Tokens per optimizer step (G·s)."""
    world: int
    """GPUs."""
    pipeline_bubble: float = 0.0
    """The schedule's fill and drain through the ranks other than the slowest."""
    pipeline_p2p: float = 0.0
    """Activations and gradients passed between pipeline stages (on the critical path)."""
    expert_parallel: float = 0.0
    """Expert parallelism's all-to-alls (on the critical path)."""
    optimizer: float = 0.0
    """The optimizer step (after the backward, on the critical path), with ZeRO-1's broadcast of
    the updated parameters."""

    data_parallel_tail: float = 0.0
    """The last gradient reduction of the backward (the root unit's), which nothing overlaps."""
    documents: DocumentAttention | None = None
    """Under data.document_masking: the documents and the masked attention work priced."""

    @property
    def seconds(self) -> float:
        exposed = max(self.data_parallel_tail, self.data_parallel - self.compute)
        return (self.compute + self.pipeline_bubble + self.pipeline_p2p + self.tensor_parallel + self.context_parallel
                + self.expert_parallel + self.optimizer + exposed)

    def parts(self) -> dict[str, float]:
        """Seconds per part of the step, as `seconds` adds them (data parallel: its exposed part)."""
        return {"compute": self.compute, "pipeline bubble": self.pipeline_bubble, "pipeline p2p": self.pipeline_p2p,
                "tensor parallel": self.tensor_parallel, "context parallel": self.context_parallel,
                "expert parallel": self.expert_parallel, "optimizer": self.optimizer,
                "data parallel (exposed)": max(self.data_parallel_tail, self.data_parallel - self.compute)}

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.tokens / self.seconds / self.world


def _bandwidth(group_size: int, inner: int, hw: Hardware) -> float:
    """NVLink if the group (with `inner` ranks between its members) stays inside a node."""
    return hw.nvlink_bytes_per_s if group_size * inner <= hw.gpus_per_node else hw.network_bytes_per_s


def cp_block_seconds(run: ResolvedRun, micro_tokens: int, c: int, hw: Hardware) -> float:
    """Context parallel's traffic of one block and micro-step (module docstring, cp): the ring's
    k/v blocks, or Ulysses' all-to-alls of q, k, v and the output, forward and backward."""
    a, d = run.model_args, run.dims
    if d.cp == 1:
        return 0.0
    kv_heads = getattr(a, "n_kv_heads", None) or a.n_heads  # MLA: keys and values per query head
    if run.plan.settings.cp_scheme == "ulysses":
        heads, kv = a.n_heads // d.tp, kv_heads // d.tp
        u = run.plan.settings.cp_ulysses_degree or d.cp  # the all-to-all's ranks; a ring spans cp / u
        kv_sent = kv if kv % u == 0 else u  # each kv head repeated over u/kv ranks
        shard = micro_tokens // d.cp * a.head_dim * c * (2 * heads + 2 * kv_sent)  # q, k, v, out of one rank
        seconds = 2 * (u - 1) / u * shard / _bandwidth(u, d.tp, hw)
        r = d.cp // u
        if r > 1:  # the ring inside: one rank's keys (or values) after the all-to-all, kv_sent / u heads
            kv_block = micro_tokens // r * (kv_sent // u) * a.head_dim
            seconds += ((r - 1) * 2 * kv_block * c * 2 + r * 2 * kv_block * 4) / _bandwidth(r, d.tp * u, hw)
        return seconds
    kv_block = micro_tokens // d.cp * kv_heads * a.head_dim // d.tp  # one rank's keys (or values)
    per_block = (d.cp - 1) * 2 * kv_block * c * 2 + d.cp * 2 * kv_block * 4
    return per_block / _bandwidth(d.cp, d.tp, hw)


def unsplit_attention_gain(run: ResolvedRun, hw: Hardware) -> float:
    """Attention's speed-up under Ulysses over the ring-fitted e_attn (module docstring): plain
    causal only (the pair measured); a document-masked run's flex kernel gets none (under both
    schemes it is one flex call per layer; the ring's is priced by its busiest rank instead)."""
    st = run.plan.settings
    whole = (st.cp_ulysses_degree or run.dims.cp) == run.dims.cp  # a ring inside splits the attention
    unsplit = run.dims.cp > 1 and st.cp_scheme == "ulysses" and whole and not run.cfg.data.document_masking
    return hw.ulysses_attention_gain if unsplit else 1.0


def recompute(run: ResolvedRun) -> Recompute:
    """What activation checkpointing reruns: full AC each block's forward (a third of its forward
    and backward work); selective-op the elementwise kernels' forward, and with save_matmul_every
    k also (k-1)/k of the forward's matmuls; every-n-layers full AC on one block in n."""
    mode, settings = run.plan.settings.ac_mode, run.plan.settings
    if mode == "full":
        return Recompute(4 / 3, 4 / 3, 4 / 3)
    if mode == "every-n-layers":
        share = 1 + 1 / (3 * settings.ac_every_n)
        return Recompute(share, share, share)
    if mode == "selective-op":
        k = settings.ac_save_matmul_every
        return Recompute(1 + (k - 1) / (3 * k), 1.0, 4 / 3)
    return Recompute(1.0, 1.0, 1.0)


def step_time(run: ResolvedRun, model: AnalyticModel, hw: Hardware | None = None,
              document_tokens: float | None = None) -> StepTime:
    """The model above for one resolved run of `model`'s family and size. `document_tokens`: under
    data.document_masking, the packed documents' mean length (masked_attention.document_lengths:
    else the packed-documents loader's, else its default)."""
    hw = hw or Hardware()
    params = model.parameters(run)
    a, t, d = run.model_args, run.cfg.training, run.dims
    tokens = run.global_batch_size * t.seq_len
    c = 2 if t.param_dtype == "bfloat16" else 4
    micro_tokens = t.local_batch_size * t.seq_len
    units = model.units(run)
    r = rates(run, units, model.kind, recompute(run), hw)
    documents = document_attention(run, document_tokens)
    share = 1.0 if documents is None else documents.busiest_share * hw.document_tile_cost
    flash = hw.flash_attention_gain if run.choices.attention_backend == "flash_attn" else 1.0
    r = dataclasses.replace(r, attention=r.attention * share / (unsplit_attention_gain(run, hw) * flash))
    local = params.local / 4  # this rank's parameters (params.local counts fp32 bytes)
    if run.plan.pipeline is not None and d.pp > 1:
        compute, bubble, optimizer = pipeline_compute(run, model, units, r, local / model.parameter_count, hw)
        p2p = pipeline_p2p(run, c, hw)
    else:
        compute = run.grad_accum_steps * kernel_seconds(run, units, r, micro_tokens // d.cp, hw)
        compute += (run.grad_accum_steps - 1) * accumulate_seconds(local, hw)
        updated = local / zero1_ranks(run) if data_parallel_kind(run) == "zero1" else local
        bubble, p2p, optimizer = 0.0, 0.0, optimizer_seconds(run, updated, hw)

    layers = a.n_layers / d.pp  # under pipeline parallel a rank runs its stages' blocks only
    tp_time = 0.0
    if d.tp > 1:
        collectives = 12 if run.plan.settings.ac_mode == "full" else 8
        volume = run.grad_accum_steps * layers * collectives * 2 * (d.tp - 1) / d.tp * micro_tokens * a.dim * c
        tp_time = volume / _bandwidth(d.tp, 1, hw)

    cp_time = run.grad_accum_steps * layers * cp_block_seconds(run, micro_tokens, c, hw)

    kind = data_parallel_kind(run)
    dp_time, tail = 0.0, 0.0
    # params.local counts fp32 bytes; under fsdp_reduce_dtype auto the routed experts reduce in bf16,
    # and under plain FSDP bf16 gradients summed in fp32 travel as bf16 (parallel/fsdp_wire.py).
    st = run.plan.settings
    sums = st.reduce_dtypes()
    wires = [wire_dtype(dtype, st.param_dtype, kind, "cuda", True) for dtype in sums]
    reduce_scale, expert_scale = (0.5 if dtype == "bfloat16" else 1.0 for dtype in wires)
    summed_apart = wires[0] != sums[0]  # the all-to-all's chunks summed by a kernel of their own
    if ddp_by_hooks(run):  # DDP alone all-reduces the gradients in their own dtype: bf16 under master weights
        reduce_scale = expert_scale = 0.5 if master_weights(run) else 1.0
    # The last gradients of the backward: the root's (the embedding; the final norm and output are
    # a unit of their own, reduced under the blocks' backward).
    root_reduced = (params.root_gathered - params.head_gathered) * (4 // c) * reduce_scale
    shard = d.dp_shard * d.cp
    stage = 1 / d.pp  # under pipeline parallel a rank holds one stage: about 1/pp of the model's bytes
    if kind in ("fsdp", "hsdp") and shard > 1:
        policy = run.plan.settings.reshard_after_forward
        # Backward gathers again what forward resharded (data_parallel.py): nothing under `never`
        # or pipeline parallel, else every unit but the root and the head unit, and under the
        # default policy not the last block and its experts either.
        regathers = policy != "never" and d.pp == 1
        last_kept = policy == "default"
        # Under expert parallelism the routed experts are FSDP units of their own over the ranks
        # ep leaves (efsdp = shard / ep; outside FSDP where that is one rank without dp_replicate):
        # a rank gathers only its experts, from fewer ranks; so are they over the blocks' ranks
        # where they reduce in another dtype than the rest.
        split = d.ep > 1 or expert_scale != reduce_scale
        # Leading dense blocks (deepseek_v3's n_dense_layers) count as what they are, the MoE
        # blocks as an MoE block (static_memory).
        dense = leading_dense_blocks(run, params)
        experts = (a.n_layers - dense) * params.moe_experts if split else 0
        last_block = params.moe_block if a.n_layers > dense else params.block_gathered
        last_experts = params.moe_experts if a.n_layers > dense else 0
        if split:  # the last block's experts are a unit of their own (or no unit)
            last_block -= last_experts
        gathered = params.root_gathered + params.blocks_gathered(a.n_layers, dense) - experts
        again = gathered - params.root_gathered - (last_block if last_kept else 0) if regathers else 0
        groups = [(gathered, shard, again, reduce_scale)]
        if experts and experts_outside_fsdp(run):
            # Where ep = dp_shard x cp (no PP) the experts are no FSDP unit: with fp32 weights each
            # forward (and recomputation) casts them to the compute dtype, the backward casts the
            # gradient back; bf16 weights with fp32 masters (experts_with_masters) cast nothing.
            forwards = 1 + (1 - uncheckpointed_fraction(run))
            casts = 0 if experts_with_masters(run) else (forwards + 1) * experts * (1 + 4 // c)
            compute += run.grad_accum_steps * casts / hw.memory_bytes_per_s
        elif experts:
            efsdp = shard // d.ep
            again = experts - (last_experts if last_kept else 0) if regathers and efsdp > 1 else 0
            groups.append((experts, efsdp, again, expert_scale))
        for gathered, ranks, again, scale in groups:
            reduced = gathered * (4 // c) * scale  # the fp32 gradients, in the reduce dtype
            if ranks > 1:
                per_micro = (ranks - 1) / ranks * (gathered + again + reduced) * stage
                dp_time += run.grad_accum_steps * per_micro / _bandwidth(ranks, d.tp, hw)
            # Copies beside the compute: each all-gather's copy-in reads the fp32 shard and writes
            # it in the compute dtype, its copy-out reads and writes the gathered weights; the
            # reduce-scatter's copy-in reads the gradients and writes them in the reduce dtype.
            copies = ((gathered + again) * (2 + (1 + 4 // c) / ranks) + gathered
                      + reduced * (2 if summed_apart else 1))
            compute += run.grad_accum_steps * copies * stage / hw.memory_bytes_per_s
        # The first block's gradients are complete only after its own backward, the last but the
        # embedding's: its reduction runs after the last matmul too (docs/performance.md: the
        # MoE FSDP 2 trace shows layer 0's and the root's reduce-scatters exposed).
        experts_reduced = d.ep < shard  # under ep = dp_shard x cp each rank holds its experts whole
        first_block = ((params.block_gathered - params.block_experts) * reduce_scale
                       + (params.block_experts * expert_scale if experts_reduced else 0)) * (4 // c)
        tail = (shard - 1) / shard * (root_reduced + first_block) * stage / _bandwidth(shard, d.tp, hw)
    replicas = d.dp_replicate if kind in ("hsdp", "ddp") else (zero1_ranks(run) if kind == "zero1" else 1)
    if replicas > 1:
        inner = d.tp * (shard if kind == "hsdp" else 1)
        all_reduce = 2 * (replicas - 1) / replicas * params.local * reduce_scale
        dp_time += all_reduce * stage / _bandwidth(replicas, inner, hw)
        if kind != "zero1":  # the replicas' last bucket: the root unit's gradients
            tail += 2 * (replicas - 1) / replicas * root_reduced * stage / _bandwidth(replicas, inner, hw)
        if kind == "zero1":  # the owners' broadcast of the updated parameters follows the optimizer step
            optimizer += (replicas - 1) / replicas * params.local / _bandwidth(replicas, inner, hw)
    # ep is taken from dp_shard x cp, inside tp: its group spans ep x tp ranks.
    ep_time = all_to_all_seconds(run, _bandwidth(d.ep, d.tp, hw), micro_tokens // d.cp, hw.ep_sync_s,
                                 hw.memory_bytes_per_s)
    compute += hw.collective_sm_share * dp_time
    return StepTime(compute, tp_time, dp_time, cp_time, tokens, d.world_size, bubble, p2p, ep_time, optimizer, tail,
                    documents)


def pipeline_compute(run: ResolvedRun, model: AnalyticModel, units: list[Unit], r: Rates, held: float,
                     hw: Hardware) -> tuple[float, float, float]:
    """(the slowest rank's busy seconds, the rest of the schedule step, the optimizer) of a pipeline
    step: every rank runs its stages' units on each microbatch, adds each microbatch's weight
    gradients to its fp32 ones, and updates its stages' parameters; the schedule's own order on a
    timeline (pipeline_timeline.py) gives the step; `held` is the share of each parameter a rank
    holds (1 / its data-parallel and TP sharding)."""
    split, d, t = run.plan.pipeline, run.dims, run.cfg.training
    by_name = {u.name: u for u in units}
    tokens = t.local_batch_size // split.microbatches * t.seq_len // d.cp
    stage_seconds, accumulate = {}, {}
    for stage in range(split.n_stages):
        stage_units = [by_name[n] for n in split.stages[stage]]
        stage_seconds[stage] = kernel_seconds(run, stage_units, r, tokens, hw)
        # A tied embedding is on both ends: each stage accumulates and updates its own copy.
        accumulate[stage] = accumulate_seconds(held * sum(u.params for u in stage_units), hw)
    busy = split.microbatches * max(sum(stage_seconds[s] + accumulate[s] for s in split.local_stages(rank))
                                    for rank in range(split.pp))
    schedule = step_seconds(model.timeline(split), stage_seconds, accumulate, split.pp)
    optimizer = max(optimizer_seconds(run, held * sum(by_name[n].params for s in split.local_stages(rank)
                                                        for n in split.stages[s]), hw) for rank in range(split.pp))
    return run.grad_accum_steps * busy, run.grad_accum_steps * (schedule - busy), optimizer


def pipeline_p2p(run: ResolvedRun, c: int, hw: Hardware) -> float:
    """Point-to-point seconds of a pipeline step: (v·µ + q − 1) slots, each waiting for one
    activation and one gradient."""
    d, t, split = run.dims, run.cfg.training, run.plan.pipeline
    mu = split.microbatches
    residual = 4 if c == 2 and data_parallel_kind(run) == "none" else c  # autocast keeps the residual in fp32
    message = t.local_batch_size // mu * (t.seq_len // d.cp) * run.model_args.dim * residual
    if d.tp > 1 and run.plan.settings.sequence_parallel:
        message //= d.tp
    # pp is the outermost mesh dimension: neighbouring stages are world/pp ranks apart.
    bandwidth = _bandwidth(d.pp, d.world_size // d.pp, hw)
    slots = split.n_stages // split.pp * mu + d.pp - 1
    return run.grad_accum_steps * slots * 2 * message / bandwidth
