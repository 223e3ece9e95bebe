"""The training loop: the recipe, then the loop.

    Trainer(cfg): check the run (folder, wandb, float8: check_before_start, unless the launcher
                  did), resolve (every check and choice, before any process group; the CP
                  scheme by rule: planner/cp_scheme_choice.py; FSDP's reshard-after-forward
                  by memory: planner/reshard_choice.py)
                  -> process group -> build the job (train/job.py)
                  -> loader, metrics, checkpoint manager (maybe resume)
    trainer.train(): batches -> train_step (train/step.py) -> log -> validate (eval_loss) -> save

A notebook follows the same recipe by hand with the same functions: resolve_run, build_meshes,
build_job, train_step (and settle_reshard_after_forward, where its plan should reshard as a Trainer's).
"""

from __future__ import annotations

import faulthandler
import logging
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from kenotron.checkpoint import CheckpointManager, TrainState
from kenotron.checkpoint.model_info import describe_model
from kenotron.config import ConfigError, JobConfig
from kenotron.data import MicroBatch, ValidationSet, build_data_loader
from kenotron.kernel_choice.target import Target
from kenotron.parallel.float8 import check_float8_available, use_fast_cpu_float8
from kenotron.parallel.plan import Plan
from kenotron.runtime.console import ensure_console_logging
from kenotron.runtime.distributed import WorldInfo, destroy_distributed, init_distributed, pick_device
from kenotron.runtime.divergence import DivergenceGuard, NonFiniteLossError, divergence_advice, warn_if_nothing_to_train
from kenotron.runtime.interrupt import stop_training
from kenotron.runtime.run_folder import check_run_folder, start_run_folder
from kenotron.runtime.run_lock import lock_run_folders
from kenotron.runtime.slow_ranks import SlowRankMeter
from kenotron.runtime.watchdog import WAITING_FOR_DATA, start_watchdog
from kenotron.train.extension import JobExtension
from kenotron.train.flops import flops_per_token
from kenotron.train.job import build_job, build_meshes
from kenotron.train.lr_schedule import warmup_outlasts_run
from kenotron.train.metrics import Deferred, MetricsLogger, read_on_host
from kenotron.train.muon_groups import group_table
from kenotron.train.optim import build_param_groups
from kenotron.train.resolve import ResolvedRun, resolve_run
from kenotron.train.resume_settings import apply_launch_settings, built_settings
from kenotron.train.step import check_label_tokens, eval_loss, train_step
from kenotron.train.training_job import TrainingJob
from kenotron.train.wandb_logger import check_wandb, wandb_sink

logger = logging.getLogger("kenotron")


def check_before_start(cfg: JobConfig) -> None:
    """The checks of a training run beyond resolve_run's (which the estimator shares): the run
    folder holds no other run (runtime/run_folder.py), wandb is installed when asked for, and
    this machine's torchao runs float8 (the estimator plans float8 jobs without it). The
    launcher runs them once before any rank starts; a Trainer made without it runs them itself."""
    check_run_folder(cfg)
    check_wandb(cfg)
    if cfg.float8.enable:
        check_float8_available()


class Trainer:
    """Owns the job, loader, metrics and checkpoints of one run."""

    def __init__(self, cfg: JobConfig, edit_plan: Callable[[Plan], None] | None = None, *,
                 checked_by_launcher: bool = False,
                 job_extensions: Callable[[TrainingJob], Sequence[JobExtension]] | None = None) -> None:
        """`edit_plan` changes the resolved plan before the job is built, as a notebook would; the
        choices that need the planner's memory model are made after it (`self.reshard`).
        `checked_by_launcher`: the launcher ran check_before_start before starting this process.
        `job_extensions` makes features built outside train/ (fault tolerance) for the built job;
        they go first, so that their step_optimizer decides before any other's."""
        if cfg.fault_tolerance.enable and job_extensions is None:  # kenotron/fault_tolerance/ is outside train/
            raise ConfigError("fault_tolerance.enable=true needs the launcher's rank program: start the group with "
                              "`kenotron train` (or python -m kenotron.launch.rank), not python -m kenotron.train")
        self.cfg = cfg
        self.world = WorldInfo.from_env()
        self.is_rank0 = self.world.rank == 0
        # -- resolve: every check and choice, on every rank, before any process group --
        if not checked_by_launcher:
            check_before_start(cfg)  # a notebook's Trainer(cfg), or ranks started by torchrun itself
        self.device = pick_device(cfg.training.device, self.world, cfg.tuning.expandable_segments)
        if cfg.float8.enable:
            use_fast_cpu_float8(self.device.type)
        self.run: ResolvedRun = resolve_run(cfg, self.world.world_size, Target.of(self.device))
        if edit_plan is not None:
            edit_plan(self.run.plan)
        # parallelism.cp_scheme "auto", then fsdp_reshard_after_forward "default" (priced with the chosen
        # scheme), settled by the planner's rules for this rank's GPU, as `kenotron train`, the estimate and
        # the search settle them. Imported here: the planner imports train/'s modules, so it loads once
        # train/ has (tests/architecture_rules.py, UPWARD_ON_PURPOSE).
        from kenotron.planner.cp_scheme_choice import settle_cp_scheme, with_attention_for_scheme
        from kenotron.planner.reshard_choice import device_memory_gib, settle_reshard_after_forward

        gpu_memory_gib = device_memory_gib(self.device)
        self.cp_scheme = settle_cp_scheme(self.run, gpu_memory_gib)
        self.run = with_attention_for_scheme(self.run, Target.of(self.device).cuda_major)
        self.reshard = settle_reshard_after_forward(self.run, gpu_memory_gib)
        # One live job per run folder (runtime/run_lock.py), before any process group: a busy folder fails at once.
        self._locks = lock_run_folders(cfg.job.dump_folder, Path(cfg.job.dump_folder) / cfg.checkpoint.folder
                                       if cfg.checkpoint.enable else None) if self.is_rank0 else []
        # -- process group --
        self._owns_process_group = self._init_process_group()
        self._finished = False  # every rank ended together: close() tears the groups down with a barrier
        self.activity = "start"  # "data" while the loop waits for its loader (named by the watchdog), else "step"
        self.watchdog = start_watchdog(self.world.rank, self.world.world_size, cfg.parallelism.collective_timeout_s,
                                       lambda: self.train_state.step, activity=lambda: self.activity,
                                       loader=f"data.loader={cfg.data.loader}" if cfg.data.loader else
                                       f"kenotron's loader of data.dataset={cfg.data.dataset}")
        if cfg.training.deterministic:
            torch.use_deterministic_algorithms(True)
        self.dump_folder = Path(cfg.job.dump_folder)  # config.toml and records: runtime/run_folder.py
        if self.is_rank0:
            logger.info("attention: %s (model.attention_backend=%s)%s", self.run.choices.attention_backend,
                        cfg.model.attention_backend,
                        ", MLA's values unpadded" if self.run.choices.narrow_values else "")
            if self.run.dims.cp > 1:
                logger.info("%s", self.cp_scheme)
            logger.info("%s", self.reshard)
        # -- build: meshes, model, plan.apply, init, optimizers and schedules --
        self.job: TrainingJob = build_job(self.run, self.device, build_meshes(self.run, self.device.type))
        if job_extensions is not None:
            self.job.extensions[:0] = job_extensions(self.job)
        if self.run.plan.pipeline is not None and self.is_rank0:
            logger.info("%s", self.run.plan.pipeline)
        if cfg.optimizer.name == "muon" and self.is_rank0:  # which parameters get Muon, which AdamW
            for part in self.job.model_parts:  # the whole part's groups (ZeRO-1's rank holds a partition of them)
                logger.info("optimizer groups:\n%s",
                            group_table(part, build_param_groups(part, cfg.optimizer, cfg.model.parametrization)))
        args = self.run.model_args
        self.flops_per_token = flops_per_token(self.job.matmul_params,
                                               self.run.spec.mixing_flops(args, cfg.training.seq_len))
        # -- loader, metrics, checkpoints --
        self.loader = build_data_loader(cfg, self.run.tokenizer, vocab_size=args.vocab_size, **self._data_layout())
        self.validation = (
            ValidationSet(cfg, self.run.tokenizer, vocab_size=args.vocab_size, **self._data_layout())
            if cfg.validation.every else None
        )
        self.metrics = MetricsLogger(self.dump_folder, self.flops_per_token, self.world.world_size, self.device,
                                     write=self.is_rank0, tensorboard=cfg.metrics.tensorboard,
                                     total_steps=cfg.training.steps, log_freq=cfg.metrics.log_freq,
                                     wandb=wandb_sink(cfg, self.world.rank))
        self.train_state = TrainState()  # step and tokens_seen live here so checkpoints hold them
        self.checkpointer = CheckpointManager(
            cfg.checkpoint, self.dump_folder / cfg.checkpoint.folder, model_parts=self.job.model_parts,
            optimizers=self.job.torch_optimizers, lr_schedulers=self.job.lr_schedulers, dataloader=self.loader,
            train_state=self.train_state, model_info=describe_model(self.run.spec, args, cfg.model.flavor),
            json_states={k: v for ext in self.job.extensions for k, v in ext.checkpoint_state().items()} or None,
        )
        built = built_settings(self.job.torch_optimizers)

        def resume() -> int | None:
            loaded = self.checkpointer.load()
            if loaded is not None:
                # The checkpoint's optimizer settings give way to this launch's (train/resume_settings.py).
                changed = apply_launch_settings(self.job.torch_optimizers, self.job.lr_schedulers, built,
                                                cfg.optimizer.lr, self.step)
                if changed and self.is_rank0:
                    logger.warning("%s", changed)
            return loaded

        if not any(ext.defer_resume(resume) for ext in self.job.extensions):
            resume()
        for ext in self.job.extensions:
            ext.attach_run_state(self.checkpointer.parts)
        if self.is_rank0:  # records after the resumed step dropped, config.toml written: runtime/run_folder.py
            self.metrics.open(start_run_folder(cfg, self.step))
            warn_if_nothing_to_train(self.step, cfg.training.steps)
            if self.step < cfg.training.steps and (short := warmup_outlasts_run(self.job.schedule, cfg.optimizer.lr)):
                logger.warning("%s", short)
        self.slow_ranks = SlowRankMeter(self.device)
        self.guard = DivergenceGuard(divergence_advice(cfg.optimizer.lr, cfg.lr_scheduler.warmup_steps,
                                                       cfg.training.max_norm))
        # The first step (compilation, autotuning) leaves the allocator's cache laid out for itself.
        self._empty_cache_pending = self.run.choices.empty_cache_after_first_step

    def _data_layout(self) -> dict[str, Any]:
        """This rank's place in the data: its dp rank and size, the global batch, what its pipeline stages use
        (token ids on the first stage, and wherever document masks are built; labels on the last)."""
        stage_ids = self.job.applied.stage_ids
        n_stages = self.run.plan.pipeline.n_stages if stage_ids else 1
        layout = {
            "dp_rank": self.job.meshes.coordinate("dp"), "dp_size": self.run.dims.dp,
            "global_batch_size": self.run.global_batch_size,
            "feed_inputs": not stage_ids or 0 in stage_ids or self.cfg.data.document_masking,
            "feed_labels": not stage_ids or n_stages - 1 in stage_ids,
        }
        for ext in self.job.extensions:
            layout = ext.data_layout(layout)
        return layout

    def _init_process_group(self) -> bool:
        """Join the job's process group (one more for FSDP's mixed precision on one device);
        True when this trainer made it and must destroy it."""
        if self.world.world_size > 1 or self.world.launched:
            return init_distributed(self.device, self.cfg.parallelism.collective_timeout_s)
        if self.run.choices.precision == "fsdp" and not dist.is_initialized():
            backend = "nccl" if self.device.type == "cuda" else "gloo"
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
            return True
        return False

    @property
    def step(self) -> int:
        return self.train_state.step

    @property
    def tokens_seen(self) -> int:
        return self.train_state.tokens_seen

    def run_step(self, microbatches: list[MicroBatch]) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimizer step (train/step.py's train_step, with the label count checked and the
        checkpoint's staging awaited before the update); returns this rank's loss share and the grad norm."""
        check_label_tokens(self.job, microbatches)
        loss, grad_norm = train_step(self.job, microbatches, before_update=self.checkpointer.wait_for_staging)
        if self._empty_cache_pending:
            self._empty_cache_pending = False
            torch.cuda.empty_cache()
        return loss, grad_norm

    def global_losses(self, local_losses: list[torch.Tensor]) -> torch.Tensor:
        """Per-step mean losses over the whole global batch (one all-reduce for the window)."""
        stacked = torch.stack(local_losses)
        dp_cp = self.job.meshes.get("dp_cp")
        if dp_cp is not None:
            dist.all_reduce(stacked, group=dp_cp.get_group())
        pp = self.job.meshes.get("pp")
        if pp is not None:
            # Only the last stage computed the loss (the others hold 0): every rank logs it.
            dist.all_reduce(stacked, group=pp.get_group())
        return stacked

    # -- the loop -------------------------------------------------------------------------

    def train(self) -> list[dict[str, Any]]:
        cfg, run = self.cfg, self.run
        if self.is_rank0:
            logger.info(
                "kenotron: %s %s (%.1fM params, %.2f GFLOP/token) on %s | %s | global batch %d x %d tokens, "
                "%d micro-step(s) | %d steps%s",
                cfg.model.name, cfg.model.flavor, self.job.n_params / 1e6, self.flops_per_token / 1e9,
                self.metrics.device_name, run.dims, run.global_batch_size, cfg.training.seq_len,
                run.grad_accum_steps, cfg.training.steps, f" | {cfg.job.description}" if cfg.job.description else "",
            )
        records: list[dict[str, Any]] = []
        window: list[torch.Tensor] = []
        window_start = self.step + 1
        self.metrics.reset_clock()
        while self.step < cfg.training.steps:
            self.slow_ranks.start_step()
            self.activity = WAITING_FOR_DATA
            microbatches = self.loader.next_step()
            self.activity = "step"
            loss, grad_norm = self.run_step(microbatches)
            self.slow_ranks.end_step()
            # A data stage may set its own sequence length.
            tokens_per_step = run.global_batch_size * (self.loader.last_seq_len or cfg.training.seq_len)
            self.train_state.step += 1
            self.train_state.tokens_seen += tokens_per_step
            self.metrics.count(tokens_per_step)
            window.append(loss)
            self.guard.observe(self.step, grad_norm)  # no synchronization (runtime/divergence.py)
            for ext in self.job.extensions:
                ext.on_step(self.step)
            if self.metrics.should_log(self.step):
                losses = self.global_losses(window)
                # Every device value of the record in one read, the divergence checks' first (train/metrics.py).
                values = read_on_host({
                    "diverged": Deferred(self.guard.state(losses), partial(self.guard.check_state, first_step=window_start)),
                    "loss": losses[-1], "loss_avg": losses.mean(), "grad_norm": grad_norm,
                    **self._data_metrics(len(window)),  # runtime/slow_ranks.py: one small all-gather
                    "slow_ranks": Deferred(self.slow_ranks.gather(), self.slow_ranks.summarize),
                    **{k: v for ext in self.job.extensions for k, v in ext.metrics().items()},
                })
                rec = self.metrics.record(
                    step=self.step, loss=values.pop("loss"), loss_avg=values.pop("loss_avg"),
                    grad_norm=values.pop("grad_norm"), lr=self._lr_of_step(self.step), tokens_seen=self.tokens_seen,
                    extra=values,
                )
                records.append(rec)
                window, window_start = [], self.step + 1
                self._write_records(final=False)
            if self.validation is not None and (
                self.step % cfg.validation.every == 0 or self.step == cfg.training.steps
            ):
                records.append(self.validate())
            if self.checkpointer.should_save(self.step, last=self.step == cfg.training.steps):
                self.guard.check()  # a diverged state is never saved
            self.checkpointer.maybe_save(self.step, last=self.step == cfg.training.steps)
        for ext in self.job.extensions:
            ext.finish()
        self.checkpointer.close()  # the last save and uploads are complete when train() returns
        self._write_records(final=True)
        self.metrics.close()
        self._finished = True
        return records

    def validate(self) -> dict[str, Any]:
        """The mean token loss over the validation batches (forward only, every rank), recorded."""
        assert self.validation is not None
        start = time.perf_counter()
        losses = [eval_loss(self.job, microbatches) for microbatches in self.validation]
        loss = self.global_losses(losses).mean().item()
        tokens = len(losses) * self.run.global_batch_size * self.cfg.training.seq_len
        return self.metrics.record_validation(step=self.step, loss=loss, tokens=tokens,
                                              seconds=time.perf_counter() - start)

    def _write_records(self, final: bool) -> None:
        """The extensions' files in the run folder (rank 0)."""
        if self.is_rank0:
            for ext in self.job.extensions:
                ext.write_records(self.dump_folder, final)

    def _data_metrics(self, steps: int) -> dict[str, float]:
        """data_wait_s (seconds per step the loop waited for its batch) and the tokens each dataset gave."""
        out = {"data_wait_s": self.loader.take_wait_seconds() / max(steps, 1)}
        out.update({f"tokens_seen/{name}": n for name, n in self.loader.tokens_by_dataset().items()})
        return out

    def _lr_of_step(self, step: int) -> float:
        """The LR that optimizer step `step` (the one just taken) used: optimizer.lr (every group's
        peak since a resume, train/resume_settings.py) at the schedule's own position, which is
        the step unless the schedule started afresh (checkpoint.exclude_from_loading)."""
        schedulers = self.job.lr_schedulers
        return self.cfg.optimizer.lr * self.job.schedule.lr_factor(schedulers[0].last_epoch if schedulers else step)

    def close(self) -> None:
        if self.watchdog is not None:  # first: a loader that hangs in close() must not keep it warning
            self.watchdog.stop()
        self.loader.close()
        if self._finished:
            for ext in self.job.extensions:
                ext.finish()
        self.checkpointer.close()
        if self._owns_process_group:
            destroy_distributed(finished=self._finished)
        for lock in self._locks:
            lock.release()


def setup_logging(rank: int) -> None:
    ensure_console_logging(rank)


def run_training(cfg: JobConfig, *, checked_by_launcher: bool = False,
                 job_extensions: Callable[[TrainingJob], Sequence[JobExtension]] | None = None) -> list[dict[str, Any]]:
    """Build and train; returns the metric records (rank 0's view). `checked_by_launcher`,
    `job_extensions`: as Trainer's."""
    rank = WorldInfo.from_env().rank
    setup_logging(rank)
    if not faulthandler.is_enabled():
        faulthandler.enable(all_threads=True)  # a rank killed by a signal (SIGABRT, SIGSEGV) prints its stacks
    trainer = Trainer(cfg, checked_by_launcher=checked_by_launcher, job_extensions=job_extensions)
    try:
        return trainer.train()
    except NonFiniteLossError:
        trainer._finished = True  # every rank stops at the same step (global norm and losses): end as one
        raise
    except KeyboardInterrupt as stop:
        raise stop_training(trainer, stop) from None
    except BaseException as failure:
        if trainer.watchdog is not None and trainer.watchdog.diagnosis:  # for the rank's last line (rank_process.py)
            failure.add_note(f"before that the watchdog found: {trainer.watchdog.diagnosis}")
        raise
    finally:
        trainer.close()
