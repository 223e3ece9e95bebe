"""The job configuration: one dataclass per TOML section, a docstring per field.

The string literal under each field is its documentation: `--help` prints it and the
reference in README.md is generated from it, so keep it to one or two sentences that say
what the value means and which values are valid.

These names are the public interface of kenotron: configs (the presets in `kenotron/presets/`), command-line
overrides (`--training.steps 20`) and later features all rely on them.

The data sections ([tokenizer], [data], [validation]) live in config/data_sections.py and [tuning]
in config/tuning.py, under the same rules; JobConfig gathers them all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from kenotron.config.data_sections import Data, Tokenizer, Validation
from kenotron.config.ranges import RANGE_KEY, above, at_least, between, ranged
from kenotron.config.tuning import Tuning


@dataclass
class Job:
    dump_folder: str = "./outputs"
    """Folder for everything a run writes: resolved config, metrics.jsonl, TensorBoard, checkpoints."""

    description: str = ""
    """Free text shown in the first log line, to tell runs apart; a config file's is dropped when command-line overrides change the data (data.dataset, path, sources, stages, weights_from or loader) without setting it."""


@dataclass
class Model:
    name: str = "llama3"
    """Model family, a key of the model registry (`python -m kenotron.train --list-models`)."""

    flavor: str = "debug"
    """Named size of the family, e.g. debug, 1B, 3B, 8B, 70B, 405B for llama3."""

    args: dict[str, Any] = field(default_factory=dict, metadata={"open": True})
    """Any field of the family's model args on top of the flavor, e.g. `--model.dim 512` or `n_layers = 8` under [model]; `--list-models` names them."""

    parametrization: Literal["standard", "spectral_mup"] = "standard"
    """standard, or spectral_mup (spectral µP: init and per-matrix AdamW learning rates scaled by fan-in and fan-out, so optimizer.lr transfers across widths; docs/mup.md)."""

    attention_backend: Literal["auto", "cudnn", "flash", "efficient", "math", "flex", "flash_attn"] = "auto"
    """Attention kernel: auto (the fastest exact one for the run), an SDPA kernel (cudnn, flash, efficient, math), flex (FlexAttention, for data.document_masking) or flash_attn (the installed FlashAttention; CUDA, bf16)."""


@dataclass
class Training:
    steps: int = ranged(200, at_least(1))
    """Number of optimizer steps to run."""

    seq_len: int = ranged(256, at_least(1))
    """Tokens per sequence (each packed window holds seq_len + 1 tokens)."""

    local_batch_size: int = ranged(8, at_least(1))
    """Sequences per rank per micro-step."""

    global_batch_size: int = ranged(-1, at_least(1, (-1, "local_batch_size x dp")))
    """Sequences per optimizer step over all ranks; -1 = local_batch_size x data-parallel degree. Gradient accumulation makes up the rest."""

    seed: int = ranged(42, at_least(0))
    """Seed for weight init and dropout-free training randomness; identical on every rank."""

    deterministic: bool = False
    """Use deterministic algorithms (slower on GPU); the CPU path is deterministic anyway."""

    param_dtype: Literal["float32", "bfloat16"] = "float32"
    """Compute dtype. bfloat16 keeps fp32 master weights, gradients and optimizer state and computes in bf16."""


    max_norm: float = ranged(1.0, above(0, (0, "no clipping")))
    """Clip the global gradient norm to this value; 0 disables clipping (the norm is still reported)."""

    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where to train; auto picks CUDA when available."""


@dataclass
class Optimizer:
    name: Literal["adamw", "muon", "sgd"] = "adamw"
    """AdamW with decoupled weight decay (none on norms and biases); muon: Muon for the hidden matrices and AdamW for the rest, at AdamW's lr and weight decay (docs/optimizers.md); or plain SGD (used by parity tests)."""

    lr: float = ranged(3e-3, above(0))
    """Peak learning rate, reached at the end of warmup."""

    weight_decay: float = ranged(0.1, at_least(0))
    """Decoupled weight decay for matrices and embeddings."""

    beta1: float = ranged(0.9, between(0, 1, high_open=True))
    """AdamW first-moment decay."""

    beta2: float = ranged(0.95, between(0, 1, high_open=True))
    """AdamW second-moment decay."""

    eps: float = ranged(1e-8, above(0))
    """AdamW epsilon."""

    muon_momentum: float = ranged(0.95, between(0, 1, high_open=True))
    """Muon's momentum (the buffer's decay, as torch.optim.Muon's)."""

    muon_nesterov: bool = True
    """Muon orthogonalizes the Nesterov look-ahead of its momentum (true) or the momentum itself."""

    muon_ns_steps: int = ranged(5, between(1, 20))
    """Newton–Schulz iterations per Muon update."""

    muon_lr_rule: Literal["auto", "match_rms_adamw", "spectral"] = "auto"
    """A Muon matrix's step size: match_rms_adamw (Moonlight's lr * 0.2 * sqrt(max(m, n))) or spectral (lr * 3.2 * sqrt(fan_out / fan_in)); auto: spectral under model.parametrization='spectral_mup', else match_rms_adamw."""

    muon_include: list[str] = field(default_factory=list)
    """Parameter-name patterns (fnmatch) Muon also steps, beyond the hidden Linear weights and the MoE experts; each must be a matrix or a 3-D batch of matrices."""

    muon_exclude: list[str] = field(default_factory=list)
    """Parameter-name patterns (fnmatch) that AdamW steps even where Muon would."""


@dataclass
class LRScheduler:
    warmup_steps: int = ranged(20, at_least(0))
    """Steps of linear warmup from 0 to optimizer.lr; at or above training.steps the run ends in warmup, never decaying (kept as set, with a warning at the start)."""

    decay: Literal["linear", "cosine", "wsd", "1-sqrt", "constant"] = "cosine"
    """Shape after warmup: linear or cosine down to min_lr; wsd and 1-sqrt hold the peak, then decay over the last decay_ratio of steps; constant holds the peak."""

    decay_ratio: float = ranged(0.2, between(0, 1, low_open=True))
    """For wsd and 1-sqrt: fraction of training steps spent decaying at the end."""

    min_lr_ratio: float = ranged(0.1, between(0, 1))
    """Final learning rate as a fraction of optimizer.lr."""


@dataclass
class Parallelism:
    dp_replicate: int = ranged(1, at_least(1))
    """Data-parallel replicas (DDP, or the replicate dimension of HSDP)."""

    dp_shard: int = ranged(-1, at_least(1, (-1, "what the other degrees leave")))
    """FSDP sharding degree; -1 fills what the other degrees leave of the world size."""

    tp: int = ranged(1, at_least(1))
    """Tensor-parallel degree (with sequence parallel)."""

    pp: int = ranged(1, at_least(1))
    """Pipeline-parallel degree: ranks along the pipeline (each holds one stage, or several with looped/V schedules)."""

    pp_schedule: Literal[
        "GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"
    ] = "1F1B"
    """torch.distributed.pipelining schedule. GPipe and 1F1B run one stage per rank; the looped schedules several (stage s on rank s mod pp); ZBVZeroBubble and DualPipeV two per rank in a V."""

    pp_microbatches: int = ranged(0, at_least(1, (0, "one sequence each")))
    """Pipeline microbatches per micro-step (they split training.local_batch_size; must divide it); 0 = one sequence each. 1F1B needs >= pp, DualPipeV >= 2·pp."""

    pp_stages_per_rank: int = ranged(0, at_least(1, (0, "the schedule's own")))
    """Stages per pipeline rank for the automatic split: 0 = the schedule's own (1 for GPipe/1F1B, 2 for the looped and V schedules)."""

    pp_layers_per_stage: list[int] = field(default_factory=list, metadata={RANGE_KEY: at_least(1)})
    """Explicit blocks per stage, in order (e.g. `3,5,5,3`); must add up to the model's layers. Empty = balanced automatically."""

    pp_stage_modules: list[str] = field(default_factory=list)
    """Explicit modules of each stage in forward order, one entry per stage (e.g. `tok_embeddings layers.0 layers.1, layers.2 layers.3 norm output`); overrides pp_layers_per_stage."""


    cp: int = ranged(1, at_least(1))
    """Context-parallel degree: each sequence is split over this many ranks; training.seq_len must be a multiple of 2·cp·tp."""
    cp_scheme: Literal["auto", "ring", "ulysses"] = "auto"
    """ring (keys/values pass around the cp ranks), ulysses (heads all-to-all over the largest divisor of cp they split over, a ring over the rest) or auto: ulysses on GPUs where heads split over cp, no document mask, if it fits; else ring."""
    ep: int = ranged(1, at_least(1))
    """Expert-parallel degree (MoE models): each MoE layer's experts are split over this many of the dp_shard × cp ranks, tokens reach them by all-to-all, and expert weights are FSDP-sharded over the rest."""


    dp_mode: Literal["fsdp", "zero1"] = "fsdp"
    """fsdp: shard parameters, gradients and optimizer state (HSDP with dp_replicate, DDP when dp_shard is 1); zero1: replicate parameters and gradients, shard only the optimizer state."""

    fsdp_reshard_after_forward: Literal["default", "always", "never"] = "default"
    """Free gathered parameters after each block's forward: default (all but the last block; none under pipeline parallel), always, or never (faster, more memory)."""


    fsdp_reduce_dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Dtype of FSDP's gradient sums: float32 (bf16 gradients still sent as bf16 on CUDA), bfloat16, or auto: with bf16 params, bf16 for the routed experts, float32 for the rest. DDP alone reduces gradients in their own dtype."""

    sequence_parallel: bool = True
    """With tp > 1, also split norms and the residual stream along the sequence."""


    async_tp: bool = False
    """With tp > 1 on CUDA and compile on: overlap TP communication with the matmuls."""

    collective_timeout_s: float = ranged(600.0, above(0))
    """Seconds a collective waits for the other ranks before the job fails (every process group of the job). A watchdog names a rank that stopped making progress after a quarter of this (at most 60 s)."""


@dataclass
class MoE:
    """How MoE families train (load balancing). The experts' shape is the model's: model.moe.n_experts, model.moe.top_k, model.moe.ffn_dim."""

    aux_loss_coef: float = ranged(0.001, above(0, (0, "off")))
    """Weight of the load-balancing auxiliary loss (Switch/Mixtral/Qwen form, over each micro-batch of all data-parallel ranks, averaged over layers); 0 turns it off."""

    z_loss_coef: float = ranged(0.0, above(0, (0, "off")))
    """Weight of the router z-loss (mean over tokens of logsumexp(router logits)², averaged over layers); 0 turns it off."""

    bias_update_rate: float = ranged(0.0, above(0, (0, "off")))
    """Auxiliary-loss-free balancing (DeepSeek-V3): after each step every expert's routing bias moves by this much toward balance (sign of mean load − its load); 0 turns it off."""


CHECKPOINT_PARTS = ("model", "optimizer", "lr_scheduler", "dataloader", "train_state")
"""Names of a checkpoint's parts, in save order; `checkpoint.exclude_from_loading` takes these."""
CHECKPOINT_ASYNC_MODES = ("disabled", "async", "async_with_pinned_mem")
"""The values of `checkpoint.async_mode` (checkpoint/saver.py)."""


@dataclass
class Checkpoint:
    enable: bool = False
    """Save checkpoints (and resume from the latest one found in checkpoint.folder)."""

    folder: str = "checkpoints"
    """Checkpoint folder, relative to job.dump_folder unless absolute."""

    interval: int = ranged(500, at_least(1))
    """Save every this many steps (and at the last step)."""

    keep_latest_k: int = ranged(0, at_least(1, (0, "keep all")))
    """Keep only the newest k complete checkpoints, deleting older ones after each save; 0 keeps all."""

    load_step: int = ranged(-1, at_least(0, (-1, "the latest")))
    """Step to resume from: -1 the latest complete checkpoint (local or remote), 0 start fresh, N that step."""

    exclude_from_loading: list[str] = field(default_factory=list)
    """Parts not restored on resume, among model, optimizer, lr_scheduler, dataloader, train_state (e.g. `optimizer,lr_scheduler` to restart the schedule)."""

    async_mode: Literal["disabled", "async", "async_with_pinned_mem"] = "disabled"
    """disabled: training waits for the write. async: copy to CPU memory, write from a thread. async_with_pinned_mem: copy to pinned shared memory in the background and write from another process (needs torchrun)."""

    initial_load_path: str = ""
    """A checkpoint step folder (local or s3://) to start from when checkpoint.folder holds none, e.g. one made by scripts/convert_hf.py."""

    initial_load_model_only: bool = True
    """Take only the model weights from checkpoint.initial_load_path (fresh optimizer, schedule and data position)."""

    last_save_model_only: bool = False
    """At the last step save only the model weights, cast to checkpoint.export_dtype (for export, not for resuming)."""

    export_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Weight dtype of model-only saves (checkpoint.last_save_model_only)."""

    remote_folder: str = ""
    """`s3://bucket/prefix` to upload every complete checkpoint to (in the background) and to resume from; empty disables."""

    remote_endpoint_url: str = ""
    """Endpoint of an S3-compatible store (MinIO, Ceph, R2 ...); empty uses AWS. Credentials come from the usual AWS sources."""

    remote_delete_local: bool = False
    """Delete a local checkpoint once its upload succeeded (a failed upload always keeps it)."""

    checksums: bool = False
    """SHA-256 of every checkpoint file, recorded at each save (rank 0 reads them back) and verified before loading: catches files damaged in place. Costs 30-45% of a save and a load (docs/checkpointing.md)."""


@dataclass
class Float8:
    enable: bool = False
    """Train the linear layers in float8 through torchao (needs the float8 extra and a GPU with float8 matrix units, SM89 or later)."""

    recipe: Literal["tensorwise", "rowwise"] = "tensorwise"
    """Scaling granularity of the float8 casts: tensorwise (one scale per tensor) or rowwise (one per row, more accurate)."""

    experts: bool = False
    """Also run the MoE layers' routed experts in float8 (torchao's rowwise grouped GEMM; needs float8.enable and the grouped_mm expert kernel: CUDA, SM90+, bf16)."""


@dataclass
class Metrics:
    log_freq: int = ranged(10, at_least(1))
    """Print one progress line and append one record to metrics.jsonl every this many steps."""

    tensorboard: bool = False
    """Also write TensorBoard scalars under <dump_folder>/tb."""

    wandb: bool = False
    """Also send the same scalars to Weights & Biases (needs the wandb extra; WANDB_MODE=offline keeps them local)."""

    wandb_project: str = "kenotron"
    """Weights & Biases project of the run (with metrics.wandb)."""


@dataclass
class Compile:
    enable: bool = False
    """torch.compile each transformer block (and the loss)."""


@dataclass
class ActivationCheckpoint:
    mode: Literal["none", "full", "selective-op", "every-n-layers"] = "none"
    """none; full (recompute each block in backward); selective-op (save matmul/attention outputs, recompute the rest); every-n-layers (full on one block in every_n)."""

    every_n: int = ranged(2, at_least(1))
    """For every-n-layers: checkpoint one block in every this many."""


    offload_blocks: int = ranged(0, at_least(0))
    """Keep what the first this many blocks (of each pipeline stage) save for backward in pinned host memory instead of on the GPU, copied out and back beside the compute; those blocks are not checkpointed. 0 = off."""


@dataclass
class DoReMi:
    reference: str = ""
    """Checkpoint step folder of a reference model of the same shape, trained on data.sources; set, this run trains a DoReMi proxy that learns domain weights (docs/doremi.md)."""

    step_size: float = ranged(1.0, above(0))
    """η, the step size of the domain weights' exponentiated-gradient update (Xie et al. use 1)."""

    smoothing: float = ranged(1e-3, between(0, 1))
    """c, the share of the uniform weights mixed into the domain weights at every step (Xie et al. use 1e-3)."""


@dataclass
class FaultTolerance:
    enable: bool = False
    """Train as torchft replica groups (needs the ft extra): a group that dies drops out of the gradient all-reduce, the others go on, and a restarted group takes the live state from a peer (docs/fault-tolerance.md)."""

    replica_groups: int = ranged(2, at_least(1))
    """Replica groups the data is split into (torchft's replicate dimension); each is a job of its own over its ranks (FSDP, TP, PP inside)."""

    replica_id: int = ranged(0, at_least(0))
    """This group's index, 0 to replica_groups - 1 (the launcher's command line for each group sets it)."""

    min_replicas: int = ranged(1, at_least(1))
    """Groups that must be present for a step to commit; fewer, and the step is retried once enough are back."""

    lighthouse: str = ""
    """The torchft lighthouse, http://host:port; "start" = the launcher of this group starts one in its own process (one host); "" = the TORCHFT_LIGHTHOUSE variable."""

    lighthouse_port: int = ranged(29510, between(0, 65535))
    """Port of the lighthouse the launcher starts (fault_tolerance.lighthouse = "start"); 0 = a free one."""

    max_restarts: int = ranged(100, at_least(0))
    """Times the launcher restarts a group whose rank died (torchrun's --max-restarts); the restarted group rejoins at the next step."""

    timeout_s: float = ranged(10.0, above(0))
    """Seconds a warm step's cross-group all-reduce may wait (at least 5x the slowest seen) before giving the step up; steps where a group may be compiling, commits and recoveries get max(this, start_timeout_s)."""

    quorum_timeout_s: float = ranged(60.0, above(0))
    """Seconds a group waits for the lighthouse's quorum at the start of a step."""

    start_timeout_s: float = ranged(120.0, at_least(0))
    """At a start with no peer ahead (a fresh run, or every group restarted), seconds the groups wait for all replica_groups to join; then the run starts with the groups present."""

    sync_every: int = ranged(1, at_least(1))
    """1 = the groups all-reduce gradients every step; H > 1 = DiLoCo: each group steps alone and the groups average their progress every H steps through an outer Nesterov SGD."""

    outer_lr: float = ranged(0.7, above(0))
    """DiLoCo's outer learning rate (with sync_every > 1; DiLoCo's paper uses 0.7)."""

    outer_momentum: float = ranged(0.9, between(0, 1))
    """DiLoCo's outer Nesterov momentum (with sync_every > 1)."""


@dataclass
class JobConfig:
    """All sections of a kenotron job. Section names are the TOML tables and CLI prefixes."""

    job: Job = field(default_factory=Job)
    model: Model = field(default_factory=Model)
    tokenizer: Tokenizer = field(default_factory=Tokenizer)
    data: Data = field(default_factory=Data)
    validation: Validation = field(default_factory=Validation)
    training: Training = field(default_factory=Training)
    optimizer: Optimizer = field(default_factory=Optimizer)
    lr_scheduler: LRScheduler = field(default_factory=LRScheduler)
    parallelism: Parallelism = field(default_factory=Parallelism)
    moe: MoE = field(default_factory=MoE)
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    float8: Float8 = field(default_factory=Float8)
    metrics: Metrics = field(default_factory=Metrics)
    compile: Compile = field(default_factory=Compile)
    activation_checkpoint: ActivationCheckpoint = field(default_factory=ActivationCheckpoint)
    tuning: Tuning = field(default_factory=Tuning)
    doremi: DoReMi = field(default_factory=DoReMi)
    fault_tolerance: FaultTolerance = field(default_factory=FaultTolerance)
