"""The training loop, built from the pieces in the order DESIGN.md gives.

Every piece is a plain object a notebook can build by hand; `Trainer` only wires them:
config checks (resolve_run, before any process group) -> process group -> mesh -> model on
meta -> plan.apply (pipeline split -> TP/SP -> CP -> AC -> compile -> FSDP) -> materialize and init
-> optimizer, LR schedule, data loader (dp-rank aware), metrics -> loop. With pipeline
parallel the model is a list of parts (this rank's stages) and a PipelineRunner
(train/pipeline_step.py) runs the schedule in place of forward/backward.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

from kenotron.checkpoint import CheckpointManager, TrainState
from kenotron.checkpoint.model_info import describe_model
from kenotron.config import JobConfig, config_to_toml
from kenotron.data import MicroBatch, build_data_loader, build_tokenizer
from kenotron.models.common.flash_attention import cuda_major
from kenotron.parallel.dims import Meshes
from kenotron.parallel.early_gather import EarlyGather
from kenotron.parallel.float8 import check_float8_available
from kenotron.parallel.grad_norm import (
    clip_divisor,
    clip_grads_,
    optimizer_unscales_gradients,
    reduce_partial_grads_,
    total_grad_norm,
)
from kenotron.parallel.zero1 import Zero1Optimizer
from kenotron.train.attention_backend import (
    BlockMasks,
    attention_context,
    auto_picks_flash_attn,
    resolve_attention_backend,
    use_attention_kernel,
)
from kenotron.train.distributed import (
    WorldInfo,
    destroy_distributed,
    init_distributed,
    pick_device,
)
from kenotron.train.eager_kernels import resolve_eager_kernels, use_eager_kernels
from kenotron.train.flops import flops_per_token, matmul_params
from kenotron.train.fused_loss import (
    chunk_fn_for,
    linear_cross_entropy_sum,
    resolve_loss_kernel,
)
from kenotron.train.loss import IGNORE_INDEX, cross_entropy_sum
from kenotron.train.lr_schedule import LRSchedule, build_lr_scheduler
from kenotron.train.metrics import MetricsLogger
from kenotron.train.optim import (
    optimizer_factory,
    param_groups,
    resolve_adamw_implementation,
    resolve_grad_norm_kernel,
)
from kenotron.train.pipeline_step import PipelineRunner
from kenotron.train.precision import single_device_fsdp, uses_master_weights
from kenotron.train.resolve import RunPlan, resolve_run

logger = logging.getLogger("kenotron")


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite; training stops rather than writing garbage."""


def _hidden_states(h: torch.Tensor) -> torch.Tensor:
    return h


def uses_fused_loss(choice: str, tensor_parallel: bool, model: nn.Module) -> bool:
    """auto -> fused, except under tensor parallel (whose vocab-parallel loss shards the logits)."""
    has_output = isinstance(getattr(model, "output", None), nn.Linear)
    if choice == "fused" and (tensor_parallel or not has_output):
        raise ValueError("training.loss='fused' does not combine with tensor parallel; use 'auto' or 'plain'")
    return choice == "fused" or (choice == "auto" and has_output and not tensor_parallel)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


class Trainer:
    """Owns the model, optimizer, schedule, loader and metrics of one run."""

    def __init__(self, run: RunPlan) -> None:
        self.run = run
        cfg = self.cfg = run.cfg
        self.world = WorldInfo.from_env()
        self.device = pick_device(cfg.training.device, self.world, cfg.training.expandable_segments)
        # training.empty_cache_after_first_step: the first step (compilation, autotuning) leaves the
        # allocator's cache laid out for itself; the later steps get a fresh one.
        self._empty_cache_pending = cfg.training.empty_cache_after_first_step and self.device.type == "cuda"
        # Checked before any process group exists: a bad choice fails fast on every rank.
        self.eager_kernels = resolve_eager_kernels(cfg.model.eager_kernels, self.device.type, cfg.compile.enable)
        self.loss_kernel = resolve_loss_kernel(cfg.training.loss_kernel, self.device.type, cfg.compile.enable)
        self.grad_norm_kernel = resolve_grad_norm_kernel(cfg.training.grad_norm_kernel, self.device.type)
        if cfg.optimizer.name == "adamw":
            resolve_adamw_implementation(cfg.optimizer.implementation, self.device.type)
        if cfg.float8.enable:
            check_float8_available()
        self._owns_process_group = False
        if self.world.world_size > 1 or self.world.launched:
            self._owns_process_group = init_distributed(self.device)
        self.is_rank0 = self.world.rank == 0
        if cfg.training.deterministic:
            torch.use_deterministic_algorithms(True)

        self.dump_folder = Path(cfg.job.dump_folder)
        if self.is_rank0:
            self.dump_folder.mkdir(parents=True, exist_ok=True)
            (self.dump_folder / "config.toml").write_text(config_to_toml(cfg))

        # bf16 parameters with fp32 masters in AdamW, or (otherwise) autocast / FSDP casts: train/precision.py.
        self.master_weights = uses_master_weights(run, self.device.type)
        self.meshes = self._build_meshes()
        self.attention_backend = resolve_attention_backend(cfg.model.attention_backend, cfg.data.document_masking)
        with torch.device("meta"):
            model = run.spec.build(run.model_args)
        if self.attention_backend == "auto" and auto_picks_flash_attn(cfg, run.dims.cp, model, cuda_major(self.device)):
            self.attention_backend = "flash_attn"
        if self.is_rank0:
            logger.info("attention: %s (model.attention_backend=%s)", self.attention_backend, cfg.model.attention_backend)
        use_attention_kernel(model, self.attention_backend, self.device)
        use_eager_kernels(model, self.eager_kernels)
        self.n_params = sum(p.numel() for p in model.parameters())
        args = run.model_args
        self.flops_per_token = flops_per_token(
            matmul_params(model), args.n_layers, args.n_heads, args.head_dim, cfg.training.seq_len
        )
        self.applied = run.plan.apply(model, self.meshes)
        # One part per local pipeline stage; without pipeline parallel, the model itself.
        self.model_parts: list[nn.Module] = self.applied.model_parts
        for part in self.model_parts:
            part.to_empty(device=self.device)
            part.init_weights(buffer_device=self.device, seed=cfg.training.seed)
            part.train()
        self.model: nn.Module = self.model_parts[0]  # the whole model, or this rank's first stage

        # One optimizer and LR scheduler per part: checkpoints key optimizer state by part.
        # With master weights, building the optimizer turns the parameters bf16 (fp32 masters in its state).
        factory = optimizer_factory(cfg.optimizer, self.device.type, master_weights=self.master_weights)
        self.optimizers: list[Any] = []
        for part in self.model_parts:
            groups = param_groups(part, cfg.optimizer.weight_decay)
            if self.applied.data_parallel.kind == "zero1":
                self.optimizers.append(Zero1Optimizer(groups, self.applied.data_parallel.mesh, factory))
            else:
                self.optimizers.append(factory(groups))
        scheduled = [o.inner if isinstance(o, Zero1Optimizer) else o for o in self.optimizers]
        self.schedule = LRSchedule(
            total_steps=cfg.training.steps, warmup_steps=cfg.lr_scheduler.warmup_steps, decay=cfg.lr_scheduler.decay,
            min_lr_ratio=cfg.lr_scheduler.min_lr_ratio, decay_ratio=cfg.lr_scheduler.decay_ratio,
        )
        self.lr_schedulers = [build_lr_scheduler(o, self.schedule) for o in scheduled]
        self.optimizer, self.lr_scheduler = self.optimizers[0], self.lr_schedulers[0]
        # Set by clip_gradients when the optimizers clip inside their kernel; used once by optimizer_step.
        self._grad_divisor: torch.Tensor | None = None

        self.tokenizer = build_tokenizer(cfg.tokenizer.path)
        d = cfg.data
        # Pipeline stages get only what they use: token ids on the first, labels on the last.
        stage_ids = self.applied.stage_ids
        n_stages = run.plan.pipeline.n_stages if stage_ids else 1
        self.loader = build_data_loader(
            cfg, self.tokenizer, vocab_size=run.model_args.vocab_size, global_batch_size=run.global_batch_size,
            dp_rank=self.meshes.coordinate("dp"), dp_size=run.dims.dp,
            feed_inputs=not stage_ids or 0 in stage_ids or d.document_masking,
            feed_labels=not stage_ids or n_stages - 1 in stage_ids,
        )
        # flex: one BlockMask per micro-batch (block-causal over documents, or causal), for every layer.
        self.block_masks: BlockMasks | None = None
        if self.attention_backend == "flex":
            eos_id = self.tokenizer.eos_id if d.document_masking else None
            self.block_masks = BlockMasks(eos_id, getattr(model, "sliding_window", None))
        self.metrics = MetricsLogger(
            self.dump_folder, self.flops_per_token, self.world.world_size, self.device, write=self.is_rank0,
            tensorboard=cfg.metrics.tensorboard,
        )
        self.train_state = TrainState()  # step and tokens_seen live here so checkpoints hold them
        bf16 = cfg.training.param_dtype == "bfloat16"
        # FSDP casts parameters itself and master weights leave them bf16; otherwise autocast gives
        # bf16 compute on fp32 weights.
        self.use_autocast = bf16 and not self.applied.data_parallel.casts_params and not self.master_weights
        self.compute_dtype = torch.bfloat16 if bf16 else torch.float32
        tensor_parallel = self.meshes.get("tp") is not None
        # -- pipeline parallel: the schedule runs forward and backward (train/pipeline_step.py) --
        self.pipeline: PipelineRunner | None = None
        if self.applied.stage_ids:
            label_tokens = run.global_batch_size * cfg.training.seq_len
            self.pipeline = PipelineRunner(self.applied, self.device, label_tokens, self._step_context)
            self.pipeline.after_init()
            if self.is_rank0:
                logger.info("%s", run.plan.pipeline)
        # -- end pipeline parallel --
        self.early_gather = self._early_gather(self.model)
        self.fused_loss = self.pipeline is None and uses_fused_loss(cfg.training.loss, tensor_parallel, model)
        if self.fused_loss:
            # The model stops at the final norm; the loss applies the output weight in chunks.
            model.output.forward = _hidden_states  # type: ignore[union-attr,method-assign]
            self.chunk_fn = chunk_fn_for(self.loss_kernel)

        # -- checkpointing: hand the stateful parts to the manager, resume if a checkpoint exists --
        self.checkpointer = CheckpointManager(
            cfg.checkpoint, self.dump_folder / cfg.checkpoint.folder, model_parts=self.model_parts,
            optimizers=scheduled, lr_schedulers=self.lr_schedulers, dataloader=self.loader,
            train_state=self.train_state, model_info=describe_model(run.spec, run.model_args, cfg.model.flavor),
        )
        self.checkpointer.load()
        # -- end checkpointing --

    @property
    def step(self) -> int:
        return self.train_state.step

    @step.setter
    def step(self, value: int) -> None:
        self.train_state.step = value

    @property
    def tokens_seen(self) -> int:
        return self.train_state.tokens_seen

    @tokens_seen.setter
    def tokens_seen(self, value: int) -> None:
        self.train_state.tokens_seen = value

    def _build_meshes(self) -> Meshes:
        """The job's meshes; on one device with FSDP mixed precision, a 1-device FSDP mesh."""
        if self.world.world_size > 1:
            return self.run.dims.build_meshes(self.device.type)
        if not single_device_fsdp(self.run, self.device):
            return Meshes(self.run.dims, None)
        if not dist.is_initialized():
            backend = "nccl" if self.device.type == "cuda" else "gloo"
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
            self._owns_process_group = True
        from torch.distributed.device_mesh import init_device_mesh

        return Meshes(self.run.dims, init_device_mesh(self.device.type, (1,), mesh_dim_names=("dp_shard",)))

    # -- one optimizer step -------------------------------------------------------------

    def _loss_context(self) -> contextlib.AbstractContextManager:
        return loss_parallel() if self.applied.loss_parallel else contextlib.nullcontext()

    @contextlib.contextmanager
    def _step_context(self) -> Iterator[None]:
        """Around a pipeline schedule step: what forward_backward enters around forward and backward."""
        autocast = torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.use_autocast)
        with self._loss_context(), attention_context(self.attention_backend, self.device), autocast:
            yield

    def forward_backward(self, microbatches: list[MicroBatch]) -> torch.Tensor:
        """Accumulate this rank's gradients over its micro-batches.

        Returns this rank's share of the step loss (sum of token losses / global token
        count), detached; summed over the data- and context-parallel ranks (each cp rank
        holds part of every sequence) it is the step's mean loss.
        """
        label_tokens = self.run.global_batch_size * self._step_seq_len()
        local = sum(int((mb.labels != IGNORE_INDEX).sum()) for mb in microbatches if mb.labels is not None)
        if microbatches[0].labels is not None and local != label_tokens // self.run.dims.dp:
            # Packed windows never hold ignored labels; anything else needs a global count.
            raise RuntimeError(f"expected {label_tokens // self.run.dims.dp} label tokens per rank, got {local}")
        if self.pipeline is not None:
            return self.pipeline.forward_backward(microbatches)
        total = torch.zeros((), device=self.device)
        autocast = torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.use_autocast)
        for i, mb in enumerate(microbatches):
            self.applied.data_parallel.set_microstep(self.model, is_last=i == len(microbatches) - 1)
            inputs = mb.inputs.to(self.device, non_blocking=True)
            labels = mb.labels.to(self.device, non_blocking=True)
            positions = None
            if self.applied.sequence_sharder is not None:
                # Context parallel: this rank's tokens and labels, and their global RoPE positions.
                shard = self.applied.sequence_sharder.shard(inputs, labels)
                inputs, labels, positions = shard.inputs, shard.labels, shard.positions
            block_mask = self.block_masks(inputs) if self.block_masks is not None else None
            with self._loss_context(), attention_context(self.attention_backend, self.device):
                with autocast:
                    if block_mask is not None:
                        out = self.model(inputs, block_mask=block_mask)
                    else:
                        out = self.model(inputs) if positions is None else self.model(inputs, positions)
                if self.fused_loss:
                    loss_sum = linear_cross_entropy_sum(
                        out, self.model.output.weight, labels, chunk_tokens=self.cfg.training.loss_chunk_tokens,
                        compute_dtype=self.compute_dtype, chunk_fn=self.chunk_fn,
                    )
                else:
                    loss_sum = cross_entropy_sum(out, labels)
                loss = loss_sum / label_tokens
                # Data parallel averages gradients over ranks; the loss wants their sum.
                (loss * self.applied.data_parallel.averaging_size).backward()
            total += _local(loss.detach())
        return total

    def _step_seq_len(self) -> int:
        """The sequence length of the step being run (a data stage may set its own)."""
        return getattr(self.loader, "last_seq_len", None) or self.cfg.training.seq_len

    def clip_gradients(self) -> torch.Tensor:
        """Global L2 norm of all gradients; scaled down to training.max_norm when above it."""
        params = [p for part in self.model_parts for p in part.parameters() if p.grad is not None]
        reduce_partial_grads_(params)
        grads = [p.grad for p in params]
        # A weight tied across pipeline stages has one copy per stage: its norm counts once.
        duplicates = self.pipeline.tied.norm_duplicates() if self.pipeline is not None else set()
        norm = total_grad_norm([p.grad for p in params if id(p) not in duplicates], pp_mesh=self.meshes.get("pp"),
                               kernel=self.grad_norm_kernel)
        max_norm = self.cfg.training.max_norm
        if max_norm > 0:
            if all(optimizer_unscales_gradients(o) for o in self.optimizers):
                # Fused AdamW divides the gradients inside its update kernel (optimizer_step).
                self._grad_divisor = clip_divisor(max_norm, norm)
            else:
                clip_grads_(grads, max_norm, norm)
        return norm

    def _early_gather(self, model: nn.Module) -> EarlyGather | None:
        """parallelism.fsdp_early_all_gather where it applies: FSDP / HSDP sharding over more than
        one rank, one model part, one optimizer of its own (not ZeRO-1's)."""
        dp = self.applied.data_parallel
        if (not self.cfg.parallelism.fsdp_early_all_gather or dp.kind not in ("fsdp", "hsdp") or dp.mesh is None
                or dp.mesh.size() == 1 or self.pipeline is not None or len(self.optimizers) != 1):
            return None
        return EarlyGather(model)

    def optimizer_step(self) -> None:
        self.checkpointer.wait_for_staging()  # a background copy of the weights must finish first
        divisor, self._grad_divisor = self._grad_divisor, None
        for optimizer, lr_scheduler in zip(self.optimizers, self.lr_schedulers):
            optimizer.grad_scale = divisor  # None: nothing to clip (torch's GradScaler protocol)
            if self.early_gather is not None:
                self.early_gather.step(optimizer)
            else:
                optimizer.step()
            optimizer.grad_scale = None
            lr_scheduler.step()
            optimizer.zero_grad(set_to_none=True)

    def train_step(self, microbatches: list[MicroBatch]) -> tuple[torch.Tensor, torch.Tensor]:
        loss = self.forward_backward(microbatches)
        grad_norm = self.clip_gradients()
        self.optimizer_step()
        if self._empty_cache_pending:
            self._empty_cache_pending = False
            torch.cuda.empty_cache()
        return loss, grad_norm

    def global_losses(self, local_losses: list[torch.Tensor]) -> torch.Tensor:
        """Per-step mean losses over the whole global batch (one all-reduce for the window)."""
        stacked = torch.stack(local_losses)
        dp_cp = self.meshes.get("dp_cp")
        if dp_cp is not None:
            dist.all_reduce(stacked, group=dp_cp.get_group())
        pp = self.meshes.get("pp")
        if pp is not None:
            # Only the last stage computed the loss (the others hold 0): every rank logs it.
            dist.all_reduce(stacked, group=pp.get_group())
        return stacked

    # -- the loop -------------------------------------------------------------------------

    def _check_finite(self, losses: torch.Tensor, first_step: int) -> None:
        finite = torch.isfinite(losses)
        if not bool(finite.all()):
            bad = int((~finite).nonzero()[0, 0]) + first_step
            raise NonFiniteLossError(
                f"loss is {losses[bad - first_step].item()} at step {bad}: training stopped. Lower optimizer.lr "
                f"(now {self.cfg.optimizer.lr}), lengthen lr_scheduler.warmup_steps (now "
                f"{self.cfg.lr_scheduler.warmup_steps}), or set training.max_norm > 0"
            )

    def train(self) -> list[dict[str, Any]]:
        cfg = self.cfg
        if self.is_rank0:
            logger.info(
                "kenotron: %s %s (%.1fM params, %.2f GFLOP/token) on %s | %s | global batch %d x %d tokens, "
                "%d micro-step(s) | %d steps%s",
                cfg.model.name, cfg.model.flavor, self.n_params / 1e6, self.flops_per_token / 1e9,
                self.metrics.device_name, self.run.dims, self.run.global_batch_size, cfg.training.seq_len,
                self.run.grad_accum_steps, cfg.training.steps,
                f" | {cfg.job.description}" if cfg.job.description else "",
            )
        records: list[dict[str, Any]] = []
        window: list[torch.Tensor] = []
        window_start = self.step + 1
        self.metrics.reset_clock()
        while self.step < cfg.training.steps:
            loss, grad_norm = self.train_step(self.loader.next_step())
            tokens_per_step = self.run.global_batch_size * self._step_seq_len()
            self.step += 1
            self.tokens_seen += tokens_per_step
            self.metrics.count(tokens_per_step)
            window.append(loss)
            if self.step % cfg.metrics.log_freq == 0 or self.step == cfg.training.steps:
                losses = self.global_losses(window)
                self._check_finite(losses, window_start)
                rec = self.metrics.record(
                    step=self.step, loss=losses[-1].item(), loss_avg=losses.mean().item(),
                    grad_norm=grad_norm.item(), lr=self._lr_of_step(self.step), tokens_seen=self.tokens_seen,
                    extra=self._data_metrics(len(window)),
                )
                records.append(rec)
                window, window_start = [], self.step + 1
            self.checkpointer.maybe_save(self.step, last=self.step == cfg.training.steps)
        self.checkpointer.close()  # the last save and uploads are complete when train() returns
        self.metrics.close()
        return records

    def _data_metrics(self, steps: int) -> dict[str, float]:
        """data_wait_s (seconds per step the loop waited for its batch) and tokens seen per dataset."""
        out: dict[str, float] = {}
        if hasattr(self.loader, "take_wait_seconds"):
            out["data_wait_s"] = self.loader.take_wait_seconds() / max(steps, 1)
        if hasattr(self.loader, "tokens_by_dataset"):
            out.update({f"tokens_seen/{name}": n for name, n in self.loader.tokens_by_dataset().items()})
        return out

    def _lr_of_step(self, step: int) -> float:
        """The LR that optimizer step `step` used."""
        return self.cfg.optimizer.lr * self.schedule.lr_factor(step)

    def close(self) -> None:
        self.loader.close()
        self.checkpointer.close()
        if self._owns_process_group:
            destroy_distributed()


def setup_logging(rank: int) -> None:
    level = logging.INFO if rank == 0 else logging.WARNING
    logging.basicConfig(level=level, format="[kenotron %(asctime)s] %(message)s", datefmt="%H:%M:%S", force=True)


def run_training(cfg: JobConfig) -> list[dict[str, Any]]:
    """Resolve, build and train; returns the metric records (rank 0's view)."""
    world = WorldInfo.from_env()
    setup_logging(world.rank)
    run = resolve_run(cfg, world.world_size)
    trainer = Trainer(run)
    try:
        return trainer.train()
    finally:
        trainer.close()
