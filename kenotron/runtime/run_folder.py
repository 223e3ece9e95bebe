"""One run, one folder: `job.dump_folder` holds exactly one run's config, records and checkpoints.

    check_run_folder(cfg)              # every rank, before any process group (Trainer(cfg) does): ConfigError on a mix
    purge = start_run_folder(cfg, 40)  # rank 0, once the checkpoint is loaded (step 40 or 0)

What a launch does with the folder it is given:

- empty or new: a new run;
- a checkpoint of it will be resumed (checkpoint.enable, load_step != 0): the run goes on. Its
  records after the resumed step (written after that checkpoint, by the launch that died) are
  dropped from metrics.jsonl, and TensorBoard is told to purge them (`purge_step`), so every
  step appears once (the records of a continuation whose checkpoints were set aside move beside
  them, into its `abandoned-*` folder). The run must be the same model on the same data (IDENTITY_KEYS);
- records but nothing to resume, and the same config: the run starts again from step 0 and its
  earlier records are replaced (a run that died before its first checkpoint, or run twice);
- records or checkpoints of a *different* config, or checkpoints a fresh start
  (load_step = 0) would mix with its own: a ConfigError naming the difference and a free folder.

`config.toml` is the config of the run's latest launch; a resume says which keys changed.
"""

from __future__ import annotations

import json
import logging
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kenotron.checkpoint.folders import list_step_folders, step_folder_name
from kenotron.checkpoint.lineage import newest_set_aside
from kenotron.checkpoint.remote import redact_url
from kenotron.checkpoint.resume_rules import check_fixed_on_resume
from kenotron.config import ConfigError, JobConfig, all_fields, config_to_toml, toml_value

logger = logging.getLogger("kenotron")

CONFIG_NAME = "config.toml"
METRICS_NAME = "metrics.jsonl"
IDENTITY_KEYS = (
    "model.name", "model.flavor", "tokenizer.path", "data.dataset",
    "data.path", "data.text_field", "data.split", "data.add_bos", "data.document_masking", "training.seq_len",
)
"""What makes a run the run it is: a resume must keep these and every model.<field> of the family's
args (everything else may change, and is reported)."""
PER_LAUNCH_KEYS = ("job.dump_folder", "job.description", "checkpoint.load_step")
"""Keys that differ between launches of one run without making it another run."""


def _flat(toml_text: str) -> dict[str, Any]:
    return {f"{section}.{key}": value for section, table in tomllib.loads(toml_text).items()
            if isinstance(table, dict) for key, value in table.items()}


def _shape_keys(*configs: dict[str, Any]) -> list[str]:
    """The model.<field> keys (the family's args set on top of the flavor) in any of `configs`."""
    fixed = all_fields(JobConfig)
    return sorted({k for c in configs for k in c if k.startswith("model.") and k not in fixed})


def _differences(before: dict[str, Any], now: dict[str, Any], keys: Any = None) -> list[str]:
    shape = _shape_keys(before, now)
    keys = dict.fromkeys([*(keys if keys is not None else now), *shape])
    # A model.<field> set in one launch only changes the shape too (unset: the flavor's value).
    return [f"{k} {toml_value(before[k]) if k in before else '(flavor)'} -> {toml_value(now[k]) if k in now else '(flavor)'}"
            for k in keys if k not in PER_LAUNCH_KEYS and (k in before and k in now and before[k] != now[k]
                                                           or k in shape and (k in before) != (k in now))]


def checkpoint_folder(cfg: JobConfig) -> Path:
    folder = Path(cfg.checkpoint.folder)
    return folder if folder.is_absolute() else Path(cfg.job.dump_folder) / folder


def free_folder(folder: Path) -> Path:
    """`folder-2`, `folder-3`, ...: the first that does not exist."""
    n = 2
    while folder.with_name(f"{folder.name}-{n}").exists():
        n += 1
    return folder.with_name(f"{folder.name}-{n}")


def _recorded_steps(folder: Path) -> list[int]:
    path = folder / METRICS_NAME
    if not path.is_file():
        return []
    steps = []
    for line in path.read_text().splitlines():
        try:
            steps.append(int(json.loads(line)["step"]))
        except (ValueError, KeyError, TypeError):
            continue
    return steps


@dataclass(frozen=True)
class FolderState:
    """What a run folder holds before a launch."""

    recorded_steps: list[int]
    complete_steps: list[int]
    previous_config: dict[str, Any] | None

    @property
    def used(self) -> bool:
        return bool(self.recorded_steps or self.complete_steps)

    def describe(self) -> str:
        parts = []
        if self.recorded_steps:
            parts.append(f"records of steps {min(self.recorded_steps)}-{max(self.recorded_steps)}")
        if self.complete_steps:
            parts.append(f"checkpoints {', '.join(step_folder_name(s) for s in self.complete_steps[-3:])}")
        return " and ".join(parts)


def read_folder_state(cfg: JobConfig) -> FolderState:
    folder = Path(cfg.job.dump_folder)
    config_path = folder / CONFIG_NAME
    previous = None
    if config_path.is_file():
        try:
            previous = _flat(config_path.read_text())
        except (OSError, tomllib.TOMLDecodeError):
            previous = None
    complete = [f.step for f in list_step_folders(checkpoint_folder(cfg)) if f.complete]
    return FolderState(_recorded_steps(folder), complete, previous)


def check_run_folder(cfg: JobConfig) -> FolderState:
    """ConfigError when this launch would mix with another run in job.dump_folder (module docstring)."""
    folder = Path(cfg.job.dump_folder)
    state = read_folder_state(cfg)
    if not state.used:
        return state
    now = _flat(config_to_toml(cfg))
    ck = cfg.checkpoint
    # A bucket (checkpoint.remote_folder) may hold the checkpoint that local rotation deleted after its upload.
    resumes = ck.enable and ck.load_step != 0 and (bool(state.complete_steps) or bool(ck.remote_folder))
    fix = f"use a new folder (--job.dump_folder {free_folder(folder)})"
    if resumes:
        # Without a config.toml (a folder of checkpoints only) there is nothing to compare with.
        changed = _differences(state.previous_config, now, IDENTITY_KEYS) if state.previous_config is not None else []
        if changed:
            raise ConfigError(
                f"job.dump_folder={str(folder)!r} holds a run of another model or data ({'; '.join(changed[:3])}): "
                f"resuming it would mix two runs; {fix}, or start from its weights with "
                f"--checkpoint.initial_load_path {checkpoint_folder(cfg) / step_folder_name(state.complete_steps[-1])}"
            )
        if state.previous_config is not None:  # what the restored state depends on (checkpoint/resume_rules.py)
            check_fixed_on_resume(state.previous_config, now, ck.exclude_from_loading)
        return state
    if ck.enable and ck.load_step == 0 and state.complete_steps:
        raise ConfigError(
            f"checkpoint.load_step=0 starts afresh, but job.dump_folder={str(folder)!r} holds {state.describe()} of "
            f"an earlier run, which its own saves would mix with; {fix}, or resume it (checkpoint.load_step -1)"
        )
    changed = _differences(state.previous_config or {}, now) if state.previous_config is not None else ["(no config.toml)"]
    if changed:
        raise ConfigError(
            f"job.dump_folder={str(folder)!r} holds another run ({state.describe()}; config differs: "
            f"{'; '.join(changed[:3])}) and this launch has no checkpoint of it to resume; {fix}, or delete that folder"
        )
    return state



def _truncate_records(path: Path, last_step: int, keep_dropped: Path | None = None) -> int:
    """Keep the records of steps <= last_step; returns how many were dropped. The dropped ones
    are first written to `keep_dropped` when given (an abandoned continuation's records)."""
    if not path.is_file():
        return 0
    kept, dropped = [], []
    for line in path.read_text().splitlines():
        try:
            step = int(json.loads(line)["step"])
        except (ValueError, KeyError, TypeError):
            dropped.append(line)
            continue
        (kept if step <= last_step else dropped).append(line)
    if dropped:
        if keep_dropped is not None:
            keep_dropped.write_text("".join(f"{line}\n" for line in dropped))
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(f"{line}\n" for line in kept))
        os.replace(tmp, path)
    return len(dropped)


def start_run_folder(cfg: JobConfig, step: int) -> int | None:
    """Rank 0, once training knows its first step (`step`: the resumed one, or 0): records after
    `step` dropped, config.toml written. Returns TensorBoard's purge_step (None for a new folder)."""
    folder = Path(cfg.job.dump_folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = read_folder_state(cfg)
    toml = config_to_toml(cfg)
    # A resume that set later checkpoints aside keeps their records beside them (lineage.py).
    aside = newest_set_aside(checkpoint_folder(cfg), step)
    keep = aside / METRICS_NAME if aside is not None and not (aside / METRICS_NAME).exists() else None
    dropped = _truncate_records(folder / METRICS_NAME, step, keep)
    if step > 0:
        changed = _differences(state.previous_config or {}, _flat(toml))
        logger.info("resuming the run in %s at step %d%s%s", folder, step,
                    (f"; {dropped} later record(s) moved to {keep}" if keep else
                     f"; {dropped} later record(s) of the interrupted launch dropped") if dropped else "",
                    f"; changed since its last launch: {', '.join(changed)}" if changed else "")
    elif state.used:
        logger.warning("restarting the run in %s from step 0 (same config, nothing to resume): its %s are replaced",
                       folder, state.describe())
    (folder / CONFIG_NAME).write_text(redact_url(toml))  # no credentials of an S3 endpoint URL
    return step + 1 if state.used or step > 0 else None

