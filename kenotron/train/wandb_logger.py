"""Weights & Biases as an optional sink of the training records (`metrics.wandb`, extra `wandb`).

It gets the scalars TensorBoard gets (`train/<key>` of metrics.SCALAR_KEYS, at the record's step)
and the resolved config. The W&B run id is kept in the run folder (`wandb_id`), so a resumed run
goes on in the same W&B run. Files go under `<job.dump_folder>/wandb`; `WANDB_MODE=offline`
(W&B's own setting) keeps everything local.
"""

from __future__ import annotations

import secrets
import tomllib
from pathlib import Path
from typing import Any

from kenotron.config import ConfigError, JobConfig, config_to_toml
from kenotron.train.metrics import SCALAR_KEYS

ID_FILE = "wandb_id"


def _import_wandb() -> Any:
    try:
        import wandb
    except ImportError:
        raise ConfigError("metrics.wandb=true needs the wandb package: pip install 'kenotron[wandb]'") from None
    return wandb


def check_wandb(cfg: JobConfig) -> None:
    """ConfigError now (before any process starts) when metrics.wandb is on and wandb is missing."""
    if cfg.metrics.wandb:
        _import_wandb()


class WandbSink:
    """One W&B run fed with the training records."""

    def __init__(self, cfg: JobConfig) -> None:
        wandb = _import_wandb()
        folder = Path(cfg.job.dump_folder)
        folder.mkdir(parents=True, exist_ok=True)
        id_file = folder / ID_FILE
        run_id = id_file.read_text().strip() if id_file.is_file() else secrets.token_hex(6)
        id_file.write_text(run_id + "\n")
        self.run = wandb.init(
            project=cfg.metrics.wandb_project, name=folder.resolve().name, id=run_id, resume="allow",
            dir=str(folder), config=tomllib.loads(config_to_toml(cfg)), notes=cfg.job.description or None,
        )

    def log(self, record: dict[str, Any]) -> None:
        scalars = {f"train/{k}": record[k] for k in SCALAR_KEYS if record.get(k) is not None}
        # The data's keys (data_wait_s, tokens_seen/<dataset>) and a validation record's.
        scalars.update({f"train/{k}": v for k, v in record.items() if k == "data_wait_s" or k.startswith("tokens_seen/")})
        scalars.update({f"val/{k[4:]}": record[k] for k in ("val_loss", "val_ppl") if k in record})
        self.run.log(scalars, step=int(record["step"]))

    def close(self) -> None:
        self.run.finish()


def wandb_sink(cfg: JobConfig, rank: int) -> WandbSink | None:
    """The sink for rank 0 when metrics.wandb is on, else None."""
    return WandbSink(cfg) if cfg.metrics.wandb and rank == 0 else None
