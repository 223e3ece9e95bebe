"""A first-order model of step time, to rank the layouts the planner finds.

Per optimizer step, on one rank (G global batch, s sequence, dp = dp_replicate·dp_shard,
m micro-steps, t = tp, p = cp, q = pp, f = the trainer's FLOPs per token 6·N + M, train/flops.py):

  compute  = f · G·s / (dp · t · p · q) · r / (peak · e)   (f counts an MoE layer's active experts)
             r: recomputation factor of activation checkpointing (none 1, selective-op 1.05,
             full 4/3, every-n-layers 1 + 1/(3n)); e: share of peak the matmuls reach.
  tp       = m · L/q · k · 2·(t-1)/t · T·d·c / B_tp        (not overlapped; k = 8 collectives per
             block per micro-step: 2 all-gathers + 2 reduce-scatters forward and backward, 12 with
             full AC's recomputation; B_tp the bandwidth of the TP group)
  cp       = m · L/q · (2·(p-1)·2·c + 2·p·4) · b·s/p·K·h / t / B_cp   (not overlapped; torch's ring
             per block and micro-step: the k/v all-gather in forward and again in backward, (p-1)
             blocks of b·s/p tokens, and the fp32 k/v gradients passed on at each of its p steps;
             the same volume with the alltoall rotation. The attention kernels' lower efficiency
             on split blocks, which costs more than this traffic on H200, is not modelled)
  bubble   = compute · (q-1)/µ    (pipeline parallel, 1F1B with µ microbatches per schedule step:
             a step lasts µ + q − 1 microbatch slots of which µ compute, so (q−1)/(µ+q−1) of it idle)
  p2p      = m · (µ + q − 1) · 2 · b_µ·s/p·d·c_r / B_pp   (pipeline parallel: each slot of the critical
             path waits for one activation sent forward and one gradient sent back, b_µ·s/p·d·c_r
             bytes each (c_r: 4 under autocast's fp32 residual stream; s/p: the rank's context-parallel
             share), taken as exposed: torch's schedule posts them between the compute of consecutive
             slots; / t under sequence parallel)
  fsdp     = m · (n-1)/n · (a·U + P_full) / B_fsdp   (a = 2 all-gathers of the compute copies U
             per micro-step, 1 with reshard `never` or under pipeline parallel, whose stages stay
             gathered through the schedule step; one reduce-scatter of the fp32 gradients, P_full
             bytes; n = dp_shard·cp; under pipeline parallel U and P_full are a stage's, the model's / q)
  replicas = 2·(r-1)/r · P_local / B_dp once per step      (HSDP / DDP all-reduce of the rank's
             fp32 gradients; ZeRO-1, r = dp·cp, adds its broadcast of the updated parameters)
  ep       = m · L/q · 4·(e-1)/e · T·k·d·c / B_ep   (expert parallel, e = ep: each MoE layer's k
             copies of the rank's tokens go out to their experts and back, in forward and again in
             backward; not overlapped; analytic_moe.py)
  step     = compute + bubble + p2p + tp + cp + ep + max(0, fsdp + replicas - compute)  (data-parallel
             traffic overlaps compute)
  tokens/s per GPU = G·s / step / world

A group's bandwidth is the NVLink figure while it fits in one node (its size times the
product of the inner mesh dimensions is at most gpus_per_node), the network's otherwise.
The constants are ballpark figures for H100/H200 nodes; the ranking, not the absolute
numbers, is what the planner uses.
"""

from __future__ import annotations

from dataclasses import dataclass

from kenotron.estimate.analytic import ParameterBytes, data_parallel_kind, zero1_ranks
from kenotron.estimate.analytic_moe import all_to_all_seconds
from kenotron.train.flops import flops_per_token
from kenotron.train.resolve import ResolvedRun

RECOMPUTE_FACTOR = {"none": 1.0, "selective-op": 1.05, "full": 4 / 3}
"""Extra compute of activation checkpointing: full AC reruns each block's forward (a third of
its forward + backward FLOPs); selective-op reruns only element-wise ops and norms."""


@dataclass(frozen=True)
class Hardware:
    """The cluster the throughput model assumes."""

    peak_flops: float = 989e12
    """Dense bf16 FLOP/s of one GPU (H100 / H200 SXM)."""
    matmul_efficiency: float = 0.55
    """Share of the peak the model's step reaches (docs/performance.md)."""
    gpus_per_node: int = 8
    """GPUs joined by NVLink."""
    nvlink_bytes_per_s: float = 360e9
    """Bus bandwidth of a collective inside a node, per GPU."""
    network_bytes_per_s: float = 45e9
    """Bus bandwidth of a collective across nodes, per GPU (400 Gb/s InfiniBand)."""


@dataclass(frozen=True)
class StepTime:
    """Modelled seconds of one optimizer step and what they are made of."""

    compute: float
    """Matmul time including recomputation."""
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
    """1F1B's idle time: the fill and drain slots of every schedule step."""
    pipeline_p2p: float = 0.0
    """Activations and gradients passed between pipeline stages (on the critical path)."""
    expert_parallel: float = 0.0
    """Expert parallelism's all-to-alls (on the critical path)."""

    @property
    def seconds(self) -> float:
        return (self.compute + self.pipeline_bubble + self.pipeline_p2p + self.tensor_parallel + self.context_parallel
                + self.expert_parallel + max(0.0, self.data_parallel - self.compute))

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.tokens / self.seconds / self.world


def _bandwidth(group_size: int, inner: int, hw: Hardware) -> float:
    """NVLink if the group (with `inner` ranks between its members) stays inside a node."""
    return hw.nvlink_bytes_per_s if group_size * inner <= hw.gpus_per_node else hw.network_bytes_per_s


def recompute_factor(run: ResolvedRun) -> float:
    mode = run.plan.settings.ac_mode
    if mode == "every-n-layers":
        return 1 + (RECOMPUTE_FACTOR["full"] - 1) / run.plan.settings.ac_every_n
    if mode == "selective-op" and run.plan.settings.ac_save_matmul_every > 1:
        # Recomputed matmuls: (k-1)/k of the forward's matmul FLOPs (a third of forward+backward).
        k = run.plan.settings.ac_save_matmul_every
        return RECOMPUTE_FACTOR[mode] + (RECOMPUTE_FACTOR["full"] - 1) * (k - 1) / k
    return RECOMPUTE_FACTOR[mode]


def step_time(run: ResolvedRun, params: ParameterBytes, matmul_params: int, hw: Hardware | None = None) -> StepTime:
    """The model above for one resolved run; `matmul_params` is N of the FLOP formula."""
    hw = hw or Hardware()
    a, t, d = run.model_args, run.cfg.training, run.dims
    tokens = run.global_batch_size * t.seq_len
    c = 2 if t.param_dtype == "bfloat16" else 4
    per_token = flops_per_token(matmul_params, run.spec.mixing_flops(a, t.seq_len))
    compute = (per_token * tokens / (d.dp * d.tp * d.cp * d.pp) * recompute_factor(run)
               / (hw.peak_flops * hw.matmul_efficiency))
    bubble, p2p = pipeline_time(run, compute, c, hw)

    micro_tokens = t.local_batch_size * t.seq_len
    layers = a.n_layers / d.pp  # under pipeline parallel a rank runs its stages' blocks only
    tp_time = 0.0
    if d.tp > 1:
        collectives = 12 if run.plan.settings.ac_mode == "full" else 8
        volume = run.grad_accum_steps * layers * collectives * 2 * (d.tp - 1) / d.tp * micro_tokens * a.dim * c
        tp_time = volume / _bandwidth(d.tp, 1, hw)

    cp_time = 0.0
    if d.cp > 1:
        kv_block = micro_tokens // d.cp * a.n_kv_heads * a.head_dim // d.tp  # one rank's keys (or values)
        per_block = (d.cp - 1) * 2 * kv_block * c * 2 + d.cp * 2 * kv_block * 4
        cp_time = run.grad_accum_steps * layers * per_block / _bandwidth(d.cp, d.tp, hw)

    kind = data_parallel_kind(run)
    dp_time = 0.0
    reduce_scale = 0.5 if run.plan.settings.reduce_dtype == "bfloat16" else 1.0  # params.local counts fp32 bytes
    shard = d.dp_shard * d.cp
    stage = 1 / d.pp  # under pipeline parallel a rank holds one stage: about 1/pp of the model's bytes
    if kind in ("fsdp", "hsdp") and shard > 1:
        gathers = 1 if run.plan.settings.reshard_after_forward == "never" or d.pp > 1 else 2
        gathered = params.root_gathered + a.n_layers * params.block_gathered
        reduced = params.local * shard * reduce_scale
        per_micro = (shard - 1) / shard * (gathers * gathered + reduced) * stage
        dp_time += run.grad_accum_steps * per_micro / _bandwidth(shard, d.tp, hw)
    replicas = d.dp_replicate if kind in ("hsdp", "ddp") else (zero1_ranks(run) if kind == "zero1" else 1)
    if replicas > 1:
        inner = d.tp * (shard if kind == "hsdp" else 1)
        all_reduce = 2 * (replicas - 1) / replicas * params.local * reduce_scale
        if kind == "zero1":
            all_reduce += (replicas - 1) / replicas * params.local
        dp_time += all_reduce * stage / _bandwidth(replicas, inner, hw)
    # ep is taken from dp_shard x cp, inside tp: its group spans ep x tp ranks.
    ep_time = all_to_all_seconds(run, _bandwidth(d.ep, d.tp, hw), micro_tokens // d.cp)
    return StepTime(compute, tp_time, dp_time, cp_time, tokens, d.world_size, bubble, p2p, ep_time)


def pipeline_time(run: ResolvedRun, compute: float, c: int, hw: Hardware) -> tuple[float, float]:
    """(bubble, point-to-point) seconds of a 1F1B pipeline per optimizer step (0, 0 without pp). Other
    schedules are priced as 1F1B (the planner searches 1F1B only)."""
    d, t, split = run.dims, run.cfg.training, run.plan.pipeline
    if d.pp == 1 or split is None:
        return 0.0, 0.0
    mu = split.microbatches
    bubble = compute * (d.pp - 1) / mu
    residual = 4 if c == 2 and data_parallel_kind(run) == "none" else c  # autocast keeps the residual in fp32
    message = t.local_batch_size // mu * (t.seq_len // d.cp) * run.model_args.dim * residual
    if d.tp > 1 and run.plan.settings.sequence_parallel:
        message //= d.tp
    # pp is the outermost mesh dimension: neighbouring stages are world/pp ranks apart.
    bandwidth = _bandwidth(d.pp, d.world_size // d.pp, hw)
    p2p = run.grad_accum_steps * (mu + d.pp - 1) * 2 * message / bandwidth
    return bubble, p2p
