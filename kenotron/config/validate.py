"""Checks between fields of one config that need no model, mesh or process group."""

from __future__ import annotations

from kenotron.config.loader import ConfigError
from kenotron.config.sections import JobConfig


def validate_config(cfg: JobConfig) -> None:
    """Raise ConfigError for values that are valid types but unusable together."""
    t = cfg.training
    positive = {
        "training.steps": t.steps,
        "training.seq_len": t.seq_len,
        "training.local_batch_size": t.local_batch_size,
        "metrics.log_freq": cfg.metrics.log_freq,
        "checkpoint.interval": cfg.checkpoint.interval,
    }
    for key, value in positive.items():
        if value <= 0:
            raise ConfigError(f"{key}={value} must be a positive integer")
    if t.global_batch_size != -1 and t.global_batch_size <= 0:
        raise ConfigError(
            f"training.global_batch_size={t.global_batch_size} must be positive, or -1 for local_batch_size x dp"
        )
    if cfg.parallelism.collective_timeout_s <= 0:
        raise ConfigError(f"parallelism.collective_timeout_s={cfg.parallelism.collective_timeout_s} must be a positive "
                          f"number of seconds")
    if t.max_norm < 0:
        raise ConfigError(f"training.max_norm={t.max_norm} must be >= 0 (0 disables clipping)")
    o = cfg.optimizer
    if cfg.tuning.mixed_precision == "master_weights" and (t.param_dtype != "bfloat16" or o.name != "adamw"):
        raise ConfigError(
            f"tuning.mixed_precision='master_weights' keeps bf16 parameters with fp32 masters in AdamW, but "
            f"training.param_dtype={t.param_dtype!r} and optimizer.name={o.name!r}; set param_dtype='bfloat16' "
            f"and optimizer.name='adamw', or use mixed_precision='auto'"
        )
    if cfg.tuning.loss_chunk_tokens <= 0:
        raise ConfigError(f"tuning.loss_chunk_tokens={cfg.tuning.loss_chunk_tokens} must be a positive integer")
    if o.lr <= 0:
        raise ConfigError(f"optimizer.lr={o.lr} must be positive")
    if not (0 <= o.beta1 < 1 and 0 <= o.beta2 < 1):
        raise ConfigError(f"optimizer.beta1={o.beta1} and beta2={o.beta2} must lie in [0, 1)")
    s = cfg.lr_scheduler
    if s.warmup_steps < 0:
        raise ConfigError(f"lr_scheduler.warmup_steps={s.warmup_steps} must be >= 0")
    if not 0 <= s.min_lr_ratio <= 1:
        raise ConfigError(f"lr_scheduler.min_lr_ratio={s.min_lr_ratio} must lie in [0, 1]")
    if not 0 < s.decay_ratio <= 1:
        raise ConfigError(f"lr_scheduler.decay_ratio={s.decay_ratio} must lie in (0, 1]")
    backend = cfg.model.attention_backend
    if cfg.data.document_masking and backend not in ("auto", "flex"):
        raise ConfigError(
            f"data.document_masking=true needs FlexAttention, but model.attention_backend={backend!r} runs plain "
            f"causal attention over the whole window; set model.attention_backend to 'flex' or 'auto'"
        )
    if cfg.model.vocab_size < 0 or cfg.model.n_layers < 0:
        raise ConfigError("model.vocab_size and model.n_layers must be >= 0 (0 keeps the flavor's)")
