"""The training loop, built from the pieces in the order DESIGN.md gives.

Every piece is a plain object a notebook can build by hand; `Trainer` only wires them:
config checks (before any process group) -> process group -> model on meta -> parallelize
-> materialize and init -> optimizer, LR schedule, data loader, metrics -> loop.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from kenotron.config import ConfigError, JobConfig, config_to_toml, validate_config
from kenotron.data import MicroBatch, build_text_loader, build_tokenizer
from kenotron.models import get_model_spec
from kenotron.parallel.activation_checkpoint import apply_activation_checkpointing
from kenotron.parallel.compile import compile_blocks
from kenotron.parallel.dims import ParallelDims
from kenotron.train.distributed import WorldInfo, destroy_distributed, init_distributed, pick_device
from kenotron.train.flops import flops_per_token, matmul_params
from kenotron.train.loss import IGNORE_INDEX, cross_entropy_sum
from kenotron.train.lr_schedule import LRSchedule, build_lr_scheduler
from kenotron.train.metrics import MetricsLogger
from kenotron.train.optim import build_optimizer

logger = logging.getLogger("kenotron")


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite; training stops rather than writing garbage."""


@dataclass(frozen=True)
class RunPlan:
    """What the config resolves to before any process group exists: checked, ready to build."""

    cfg: JobConfig
    dims: ParallelDims
    model_args: Any
    global_batch_size: int
    grad_accum_steps: int


def resolve_run(cfg: JobConfig, world_size: int) -> RunPlan:
    """Every check that needs only the config, the world size and the tokenizer file.

    Raises ConfigError / ParallelConfigError / UnknownModelError with the fix in the message.
    """
    validate_config(cfg)
    dims = ParallelDims.from_degrees(world_size, **asdict(cfg.parallelism))
    unsupported = {k: v for k, v in dims.degrees().items() if v > 1}
    if dims.ep > 1:
        unsupported["ep"] = dims.ep
    if unsupported:
        # Parallel plans land with their own issues; until then say so plainly.
        raise ConfigError(
            f"parallel degrees {unsupported} are not supported yet in this version; run with "
            f"world size 1 (NPROC=1) and all degrees 1"
        )
    spec = get_model_spec(cfg.model.name)
    t = cfg.training
    args = spec.model_args(
        cfg.model.flavor, vocab_size=cfg.model.vocab_size, n_layers=cfg.model.n_layers, max_seq_len=t.seq_len
    )
    tokenizer = build_tokenizer(cfg.tokenizer.path)
    if tokenizer.vocab_size > args.vocab_size:
        raise ConfigError(
            f"the tokenizer has {tokenizer.vocab_size} tokens but the model's vocabulary is {args.vocab_size}; "
            f"set --model.vocab_size {tokenizer.vocab_size} (or larger) or use a smaller tokenizer"
        )
    dims.check_model(
        n_heads=args.n_heads, n_kv_heads=args.n_kv_heads, ffn_dim=args.ffn_dim, vocab_size=args.vocab_size,
        n_layers=args.n_layers,
    )
    dims.check_seq_len(t.seq_len)
    global_batch = t.global_batch_size if t.global_batch_size != -1 else t.local_batch_size * dims.dp
    accum = dims.grad_accum_steps(global_batch, t.local_batch_size)
    if cfg.checkpoint.enable:
        raise ConfigError("checkpoint.enable=true is not supported yet in this version; leave it false")
    return RunPlan(cfg, dims, args, global_batch, accum)


class Trainer:
    """Owns the model, optimizer, schedule, loader and metrics of one run."""

    def __init__(self, run: RunPlan) -> None:
        self.run = run
        cfg = self.cfg = run.cfg
        self.world = WorldInfo.from_env()
        self.device = pick_device(cfg.training.device, self.world)
        if self.world.launched:
            init_distributed(self.device)
        self.is_rank0 = self.world.rank == 0
        if cfg.training.deterministic:
            torch.use_deterministic_algorithms(True)

        self.dump_folder = Path(cfg.job.dump_folder)
        if self.is_rank0:
            self.dump_folder.mkdir(parents=True, exist_ok=True)
            (self.dump_folder / "config.toml").write_text(config_to_toml(cfg))

        spec = get_model_spec(cfg.model.name)
        with torch.device("meta"):
            model = spec.build(run.model_args)
        self.n_params = sum(p.numel() for p in model.parameters())
        self.flops_per_token = flops_per_token(
            matmul_params(model), run.model_args.n_layers, run.model_args.n_heads, run.model_args.head_dim,
            cfg.training.seq_len,
        )
        apply_activation_checkpointing(model.layers, cfg.activation_checkpoint.mode)
        if cfg.compile.enable:
            compile_blocks(model.layers)
        model.to_empty(device=self.device)
        model.init_weights(buffer_device=self.device, seed=cfg.training.seed)
        model.train()
        self.model: nn.Module = model

        self.optimizer = build_optimizer(model, cfg.optimizer, self.device.type)
        self.schedule = LRSchedule(
            total_steps=cfg.training.steps, warmup_steps=cfg.lr_scheduler.warmup_steps, decay=cfg.lr_scheduler.decay,
            min_lr_ratio=cfg.lr_scheduler.min_lr_ratio, decay_ratio=cfg.lr_scheduler.decay_ratio,
        )
        self.lr_scheduler = build_lr_scheduler(self.optimizer, self.schedule)

        self.tokenizer = build_tokenizer(cfg.tokenizer.path)
        d = cfg.data
        self.loader = build_text_loader(
            self.tokenizer, d.dataset, d.path, seq_len=cfg.training.seq_len, global_batch_size=run.global_batch_size,
            local_batch_size=cfg.training.local_batch_size, dp_rank=0, dp_size=run.dims.dp, text_field=d.text_field,
            split=d.split, add_bos=d.add_bos,
        )
        self.metrics = MetricsLogger(
            self.dump_folder, self.flops_per_token, self.world.world_size, self.device, write=self.is_rank0,
            tensorboard=cfg.metrics.tensorboard,
        )
        self.step = 0
        self.tokens_seen = 0
        self.autocast = (
            torch.autocast(self.device.type, dtype=torch.bfloat16)
            if cfg.training.param_dtype == "bfloat16"
            else contextlib.nullcontext()
        )

    # -- one optimizer step -------------------------------------------------------------

    def forward_backward(self, microbatches: list[MicroBatch], global_label_tokens: int) -> torch.Tensor:
        """Accumulate gradients over this rank's micro-batches; returns the (detached) loss share."""
        total = torch.zeros((), device=self.device)
        for mb in microbatches:
            inputs = mb.inputs.to(self.device, non_blocking=True)
            labels = mb.labels.to(self.device, non_blocking=True)
            with self.autocast:
                logits = self.model(inputs)
            loss = cross_entropy_sum(logits, labels) / global_label_tokens
            loss.backward()
            total += loss.detach()
        return total

    def clip_gradients(self) -> torch.Tensor:
        """Global L2 norm of all gradients; scaled down to training.max_norm when above it."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        grads = [p.grad for p in params]
        norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
        if self.cfg.training.max_norm > 0:
            torch.nn.utils.clip_grads_with_norm_(params, self.cfg.training.max_norm, norm)
        return norm

    def train_step(self, microbatches: list[MicroBatch]) -> tuple[torch.Tensor, torch.Tensor]:
        label_tokens = self.run.global_batch_size * self.cfg.training.seq_len
        local = sum(int((mb.labels != IGNORE_INDEX).sum()) for mb in microbatches)
        if local != label_tokens // self.run.dims.dp:
            # Packed windows never hold ignored labels; anything else needs a global count.
            raise RuntimeError(f"expected {label_tokens // self.run.dims.dp} label tokens per rank, got {local}")
        loss = self.forward_backward(microbatches, label_tokens)
        grad_norm = self.clip_gradients()
        self.optimizer.step()
        self.lr_scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss, grad_norm

    # -- the loop -------------------------------------------------------------------------

    def _check_finite(self, losses: list[torch.Tensor], first_step: int) -> float:
        """Stop on the first non-finite loss of the window; returns the window's mean loss."""
        stacked = torch.stack(losses)
        finite = torch.isfinite(stacked)
        if not bool(finite.all()):
            bad = int((~finite).nonzero()[0, 0]) + first_step
            raise NonFiniteLossError(
                f"loss is {stacked[bad - first_step].item()} at step {bad}: training stopped. Lower optimizer.lr "
                f"(now {self.cfg.optimizer.lr}), lengthen lr_scheduler.warmup_steps (now "
                f"{self.cfg.lr_scheduler.warmup_steps}), or set training.max_norm > 0"
            )
        return stacked.mean().item()

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
        tokens_per_step = self.run.global_batch_size * cfg.training.seq_len
        self.metrics.reset_clock()
        while self.step < cfg.training.steps:
            microbatches = self.loader.next_step()
            loss, grad_norm = self.train_step(microbatches)
            self.step += 1
            self.tokens_seen += tokens_per_step
            self.metrics.count(tokens_per_step)
            window.append(loss)
            if self.step % cfg.metrics.log_freq == 0 or self.step == cfg.training.steps:
                loss_avg = self._check_finite(window, window_start)
                rec = self.metrics.record(
                    step=self.step, loss=loss.item(), loss_avg=loss_avg, grad_norm=grad_norm.item(),
                    lr=self._lr_of_step(self.step),
                    tokens_seen=self.tokens_seen,
                )
                records.append(rec)
                window, window_start = [], self.step + 1
        self.metrics.close()
        return records

    def _lr_of_step(self, step: int) -> float:
        """The LR that optimizer step `step` used."""
        return self.cfg.optimizer.lr * self.schedule.lr_factor(step)

    def close(self) -> None:
        destroy_distributed()


def setup_logging(rank: int) -> None:
    level = logging.INFO if rank == 0 else logging.WARNING
    logging.basicConfig(level=level, format="[kenotron %(asctime)s] %(message)s", datefmt="%H:%M:%S", force=True)
    torch._logging.set_logs()  # keep torch's own loggers at their defaults


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
