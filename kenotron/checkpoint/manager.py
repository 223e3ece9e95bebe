"""CheckpointManager: saves and restores the stateful parts of a run, handed to it by name.

    manager = CheckpointManager(cfg.checkpoint, folder, model_parts=[model], optimizers=[opt],
                                lr_schedulers=[sched], dataloader=loader, train_state=state)
    manager.load()                         # latest complete checkpoint, if any (or load_step)
    for step in ...:
        ...forward/backward...
        manager.wait_for_staging()         # before the optimizer changes the parameters
        optimizer.step()
        manager.maybe_save(step, last=step == total)
    manager.close()                        # waits for the save and uploads in flight

Every rank calls every method (saves and loads are collective). Rank 0 alone decides what to
load (and downloads it from the remote store when needed), writes completion markers, deletes
old checkpoints and uploads; the folder must be one filesystem that every rank sees.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn

from kenotron.checkpoint.checks import check_same_family, check_state_fits, flatten_state_dict
from kenotron.checkpoint.errors import (
    CheckpointError,
    CheckpointFormatError,
    CheckpointSaveError,
    RemoteStorageError,
)
from kenotron.checkpoint.folders import (
    check_checkpoint,
    list_step_folders,
    parse_step,
    remove_step_folder,
    step_folder_name,
    write_marker,
)
from kenotron.checkpoint.remote import BackgroundUploader, S3Store, is_remote
from kenotron.checkpoint.saver import (
    ASYNC_MODES,
    NO_GROUP_FOR_WRITER_PROCESS,
    DcpSaver,
    SaveInFlight,
)
from kenotron.checkpoint.state import (
    PART_NAMES,
    HasState,
    ModelState,
    OptimizerState,
    PickledState,
    TrainState,
)
from kenotron.config import ConfigError
from kenotron.config.sections import Checkpoint as CheckpointConfig

logger = logging.getLogger("kenotron")

EXPORT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def check_checkpoint_config(config: CheckpointConfig) -> None:
    """ConfigError for checkpoint settings that are wrong on their own (no files looked at)."""
    if config.interval <= 0:
        raise ConfigError(f"checkpoint.interval={config.interval} must be a positive number of steps")
    if config.keep_latest_k < 0:
        raise ConfigError(f"checkpoint.keep_latest_k={config.keep_latest_k} must be >= 0 (0 keeps every checkpoint)")
    if config.load_step < -1:
        raise ConfigError(f"checkpoint.load_step={config.load_step} must be -1 (latest), 0 (fresh start) or a step")
    unknown = [p for p in config.exclude_from_loading if p not in PART_NAMES]
    if unknown:
        raise ConfigError(
            f"checkpoint.exclude_from_loading has {unknown[0]!r}, which is not a part; use some of {', '.join(PART_NAMES)}"
        )
    if config.async_mode not in ASYNC_MODES:
        raise ConfigError(f"checkpoint.async_mode={config.async_mode!r} is not one of {', '.join(ASYNC_MODES)}")
    if config.remote_folder and not is_remote(config.remote_folder):
        raise ConfigError(f"checkpoint.remote_folder={config.remote_folder!r} must look like s3://bucket/prefix")


@dataclass
class _PendingSave:
    step: int
    inflight: SaveInFlight
    marker: dict[str, Any]
    finished: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


class CheckpointManager:
    """Saves the parts of a run with DCP into `folder/step-NNNNNN` and restores them (module docstring)."""

    def __init__(
        self,
        config: CheckpointConfig,
        folder: str | Path,
        *,
        model_parts: Sequence[nn.Module],
        optimizers: Sequence[torch.optim.Optimizer] = (),
        lr_schedulers: Sequence[HasState] = (),
        dataloader: HasState | None = None,
        train_state: TrainState | None = None,
        model_info: dict[str, Any] | None = None,
        process_group: dist.ProcessGroup | None = None,
    ) -> None:
        """`model_info` (e.g. family and args) goes into every completion marker, for tools that
        read a checkpoint without the config (HF export). `process_group` defaults to the world."""
        check_checkpoint_config(config)
        if isinstance(model_parts, nn.Module):
            model_parts = [model_parts]
        self.config = config
        self.folder = Path(folder)
        self.model_info = dict(model_info or {})
        self.process_group = process_group
        self.distributed = dist.is_available() and dist.is_initialized()
        if config.enable and config.async_mode == "async_with_pinned_mem" and not self.distributed:
            # Said now rather than at the first save, checkpoint.interval steps into the run.
            raise CheckpointError(NO_GROUP_FOR_WRITER_PROCESS)
        self.rank = dist.get_rank(process_group) if self.distributed else 0
        self.world_size = dist.get_world_size(process_group) if self.distributed else 1
        # Optimizers holding their own copy of the weights (master weights) take it from newly
        # loaded parameters when their own part is not loaded with them (see load_from).
        self._masters_follow_model = [
            o.masters_from_params for o in optimizers or () if hasattr(o, "masters_from_params")
        ]
        self.parts: dict[str, HasState] = {"model": ModelState(model_parts)}
        if optimizers:
            self.parts["optimizer"] = OptimizerState(model_parts, optimizers)
        if lr_schedulers:
            self.parts["lr_scheduler"] = PickledState(lr_schedulers)
        if dataloader is not None:
            self.parts["dataloader"] = PickledState([dataloader])
        if train_state is not None:
            self.parts["train_state"] = train_state
        self._saver: DcpSaver | None = None  # made on the first save: its gloo group is collective
        self._pending: _PendingSave | None = None
        self.uploader: BackgroundUploader | None = None
        if config.remote_folder and self.rank == 0:
            self.uploader = BackgroundUploader(
                S3Store(config.remote_folder, config.remote_endpoint_url), config.remote_delete_local
            )

    # -- saving ---------------------------------------------------------------------------------

    def should_save(self, step: int, *, last: bool = False) -> bool:
        return self.config.enable and (last or step % self.config.interval == 0)

    def maybe_save(self, step: int, *, last: bool = False) -> Path | None:
        """Save at every checkpoint.interval-th step and at the last one (model only there when
        checkpoint.last_save_model_only); nothing when checkpoint.enable is off."""
        if not self.should_save(step, last=last):
            return None
        if last and self.config.last_save_model_only:
            return self.save_model_only(step, EXPORT_DTYPES[self.config.export_dtype])
        return self.save(step)

    def save(self, step: int) -> Path:
        """Save every part as step `step`; returns the step folder. In the async modes the write
        goes on in the background and the folder becomes loadable when its marker appears."""
        self.wait()
        path = self._prepare_folder(step)
        state = dict(self.parts)
        marker = self._marker(step, parts=list(state), model_only=False, dtype=None)
        if self._saver is None:
            self._saver = DcpSaver(self.config.async_mode, self.process_group)
        try:
            inflight = self._saver.start(state, path)
        except Exception as exc:
            raise CheckpointSaveError(f"saving {path} failed: {exc}{self._previous_hint(step)}") from exc
        self._track(_PendingSave(step, inflight, marker))
        return path

    def save_model_only(self, step: int, dtype: torch.dtype = torch.float32) -> Path:
        """Save the model weights alone, cast to `dtype` (synchronously): an export, which loads
        as a model-only checkpoint (optimizer, schedule and data position start fresh)."""
        self.wait()
        path = self._prepare_folder(step)
        weights = self.parts["model"].state_dict()
        state = {"model": {k: v.to(dtype) if v.is_floating_point() else v for k, v in weights.items()}}
        marker = self._marker(step, parts=["model"], model_only=True, dtype=str(dtype).removeprefix("torch."))
        dcp.save(state, checkpoint_id=str(path), process_group=self.process_group)
        self._track(_PendingSave(step, SaveInFlight(path, None, None), marker))
        return path

    def wait_for_staging(self) -> None:
        """Block until the save in flight has copied the state out of the training tensors.
        Call it before `optimizer.step()`; a no-op unless async_mode is async_with_pinned_mem."""
        pending = self._pending
        if pending is None or pending.inflight.staged is None:
            return
        try:
            pending.inflight.staged.result()
        except Exception as exc:
            raise CheckpointSaveError(
                f"copying the state of {pending.inflight.path} to host memory failed: {exc}"
                f"{self._previous_hint(pending.step)}"
            ) from exc
        finally:
            pending.inflight.staged = None

    def wait(self) -> None:
        """Block until the save in flight is written and marked complete; CheckpointSaveError if it failed."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        if pending.inflight.written is not None:
            # Whatever the save raised (any type) is already in pending.error (the done-callback
            # recorded it); it is re-raised below as CheckpointSaveError, so nothing may escape here first.
            with contextlib.suppress(Exception):
                pending.inflight.written.result()
        pending.finished.wait()
        if pending.error is not None:
            raise CheckpointSaveError(
                f"saving {pending.inflight.path} failed: {type(pending.error).__name__}: {pending.error}"
                f"{self._previous_hint(pending.step)}"
            ) from pending.error

    def close(self) -> None:
        """Wait for the save and the uploads in flight, then free the staging buffers."""
        try:
            self.wait()
        finally:
            if self.uploader is not None:
                self.uploader.close()
            if self._saver is not None:
                self._saver.close()

    def _prepare_folder(self, step: int) -> Path:
        path = self.folder / step_folder_name(step)
        if self.rank == 0:
            # An earlier incomplete save of this step, or a checkpoint of a run that was told to
            # start afresh in this folder: replace it (marker first, see folders.py).
            remove_step_folder(path)
            path.mkdir(parents=True, exist_ok=True)
        self._barrier()
        return path

    def _marker(self, step: int, *, parts: list[str], model_only: bool, dtype: str | None) -> dict[str, Any]:
        return {
            "step": step, "parts": parts, "model_only": model_only, "dtype": dtype, "world_size": self.world_size,
            "model": self.model_info, "torch": torch.__version__,
        }

    def _track(self, pending: _PendingSave) -> None:
        self._pending = pending
        written = pending.inflight.written
        if written is None:
            self._finish(pending, None)
        else:
            written.add_done_callback(lambda future: self._finish(pending, future))

    def _finish(self, pending: _PendingSave, future: Any) -> None:
        """After the write (in DCP's thread for async saves): marker, clean-up, upload (rank 0)."""
        try:
            if future is not None:
                future.result()
            if self.rank == 0:
                write_marker(pending.inflight.path, pending.marker)
                logger.info("checkpoint %s complete", pending.inflight.path)
                self._delete_old(pending.step)
                if self.uploader is not None:
                    self.uploader.submit(pending.step, pending.inflight.path)
        except BaseException as exc:
            pending.error = exc
            logger.error("checkpoint %s failed: %s", pending.inflight.path, exc, exc_info=exc)
        finally:
            pending.finished.set()

    def _delete_old(self, just_saved: int) -> None:
        """keep_latest_k, plus incomplete folders older than the new checkpoint (killed saves)."""
        keep = self.config.keep_latest_k
        folders = list_step_folders(self.folder)
        complete = [f for f in folders if f.complete]
        doomed = complete[:-keep] if keep > 0 else []
        doomed += [f for f in folders if not f.complete and f.step < just_saved]
        busy = self.uploader.uploading() if self.uploader is not None else set()
        for f in doomed:
            if f.step not in busy:
                remove_step_folder(f.path)

    def _previous_hint(self, step: int) -> str:
        previous = [f.step for f in list_step_folders(self.folder) if f.complete and f.step != step]
        if previous:
            return f"; the latest complete checkpoint is still {step_folder_name(previous[-1])}"
        return "; there is no earlier complete checkpoint"

    # -- loading --------------------------------------------------------------------------------

    def load(self, step: int | None = None) -> int | None:
        """Resume: restore every part not in checkpoint.exclude_from_loading from checkpoint
        `step` (default checkpoint.load_step: -1 the latest complete one, local or remote; 0 none).
        Without any checkpoint, starts from checkpoint.initial_load_path when set. Returns the
        step loaded, or None when training starts from scratch. Does nothing when disabled."""
        if not self.config.enable:
            return None
        wanted = self.config.load_step if step is None else step
        choice = self._on_rank0_for_all(self._choose, wanted)
        if choice is None:
            return None
        path, model_only = choice
        exclude = set(self.config.exclude_from_loading)
        if model_only:
            exclude |= set(self.parts) - {"model"}
        return self.load_from(Path(path), exclude=exclude)

    def _whole_model_keys(self, state: dict[str, Any]) -> set[str] | None:
        """The "model." keys held by all ranks together: under pipeline parallel each rank holds
        only its stages' parameters, and the checkpoint has the others' too."""
        if "model" not in state or not self.distributed:
            return None
        mine = sorted(k for k in flatten_state_dict({"model": state["model"]}) if k.startswith("model."))
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, mine, group=self.process_group)
        return {k for keys in gathered for k in keys}

    def load_from(self, path: str | Path, *, exclude: Sequence[str] = ()) -> int:
        """Restore the parts not in `exclude` from the checkpoint folder `path`; returns its step.

        A model-only checkpoint restores only the model. Raises CheckpointFormatError for an
        incomplete, truncated or foreign folder, CheckpointMismatchError naming the first entry
        that does not fit (shape, missing or extra parameter).
        """
        path = Path(path)
        marker, metadata = check_checkpoint(path)
        saved_parts = set(marker.get("parts", []))
        names = [n for n in self.parts if n not in set(exclude)]
        if marker.get("model_only"):
            skipped = [n for n in names if n != "model"]
            if skipped:
                logger.info("%s holds model weights only: %s start fresh", path, ", ".join(skipped))
            names = [n for n in names if n == "model"]
        absent = [n for n in names if n not in saved_parts]
        if absent:
            raise CheckpointFormatError(
                f"{path} holds no {absent[0]!r} part (it has {', '.join(sorted(saved_parts))}); add {absent[0]!r} "
                f"to checkpoint.exclude_from_loading to start that part fresh"
            )
        check_same_family(marker.get("model"), self.model_info, path)
        state = {name: self.parts[name].state_dict() for name in names}
        check_state_fits(state, metadata, path, _describe_model(marker.get("model")), self._whole_model_keys(state))
        dcp.load(state, checkpoint_id=str(path), process_group=self.process_group)
        for name in names:
            self.parts[name].load_state_dict(state[name])
        if "model" in names and "optimizer" not in names:
            # The masters must follow the loaded weights. Not when the optimizer part is loaded
            # too: dcp.load wrote its saved masters into the live state tensors, which a copy
            # from the (bf16) parameters would overwrite.
            for masters_from_params in self._masters_follow_model:
                masters_from_params()
        step = int(marker["step"])
        logger.info("loaded %s (%s) from %s", step_folder_name(step), ", ".join(names), path)
        return step

    def _choose(self, wanted: int) -> tuple[str, bool] | None:
        """(folder, model_only) to load, or None; runs on rank 0 (may download)."""
        if wanted == 0:
            return None
        local = {f.step: f for f in list_step_folders(self.folder)}
        complete = sorted(s for s, f in local.items() if f.complete)
        store = S3Store(self.config.remote_folder, self.config.remote_endpoint_url) if self.config.remote_folder else None
        remote = self._remote_steps(store) if store is not None else []
        if wanted > 0:
            if wanted in complete:
                return str(local[wanted].path), False
            if wanted in remote:
                return str(store.download_step(wanted, self.folder)), False
            if wanted in local:
                check_checkpoint(local[wanted].path)  # raises with the reason it is not loadable
            raise CheckpointError(
                f"checkpoint.load_step={wanted}: no complete checkpoint of step {wanted} in {self.folder}"
                f"{' or ' + str(store.location) if store else ''}; complete steps: {sorted(set(complete) | set(remote))} "
                f"(-1 picks the latest)"
            )
        best = max([*complete, *remote], default=None)
        newer = [s for s, f in local.items() if not f.complete and (best is None or s > best)]
        if newer:
            logger.warning(
                "%s: incomplete step folder(s) %s (interrupted saves) are skipped", self.folder, newer
            )
        if best is not None:
            if best in complete:
                return str(local[best].path), False
            return str(store.download_step(best, self.folder)), False
        initial = self.config.initial_load_path
        if not initial:
            return None
        if is_remote(initial):
            parent, _, name = initial.rstrip("/").rpartition("/")
            step = _step_of(name, initial)
            # Into a subfolder: not a step folder of this run, so never mistaken for one on resume.
            store = S3Store(parent, self.config.remote_endpoint_url)
            initial = str(store.download_step(step, self.folder / "initial"))
        return initial, self.config.initial_load_model_only

    def _remote_steps(self, store: S3Store) -> list[int]:
        """Complete steps in the bucket. When local copies are kept, an unreachable bucket only
        costs its steps (training goes on from local ones); when they are deleted after upload
        the bucket is the only copy, and starting afresh without it would be wrong."""
        try:
            return store.complete_steps()
        except RemoteStorageError as exc:
            if self.config.remote_delete_local:
                raise
            logger.error("%s; resuming from the local checkpoints in %s only", exc, self.folder)
            return []

    def _on_rank0_for_all(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run `fn` on rank 0 and give every rank its result (or raise its error everywhere)."""
        if not self.distributed:
            return fn(*args)
        box: list[Any] = [None]
        if self.rank == 0:
            try:
                box[0] = ("ok", fn(*args))
            # Any error must reach the other ranks (re-raised on all of them below); an escape
            # here would leave them hanging in broadcast_object_list.
            except Exception as exc:  # noqa: BLE001
                box[0] = ("error", exc)
        dist.broadcast_object_list(box, src=dist.get_global_rank(self.process_group, 0) if self.process_group
                                   else 0, group=self.process_group)
        kind, value = box[0]
        if kind == "error":
            raise value
        return value

    def _barrier(self) -> None:
        if self.distributed:
            dist.barrier(group=self.process_group)


def _step_of(name: str, url: str) -> int:
    step = parse_step(name)
    if step is None:
        raise CheckpointError(f"checkpoint.initial_load_path={url!r} must end in a step folder like step-000100")
    return step


def _describe_model(info: Any) -> str:
    """`name=llama3, flavor=debug` from a marker's model info (the dimensions are left out)."""
    if not isinstance(info, dict):
        return str(info or "")
    return ", ".join(f"{k}={v}" for k, v in info.items() if not isinstance(v, (dict, list)) and v != "")
