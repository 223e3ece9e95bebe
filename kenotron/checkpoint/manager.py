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
old checkpoints and uploads; the folder must be one filesystem that every rank sees. What one
folder's restore reads and checks: restore.py.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn

from kenotron.checkpoint import integrity
from kenotron.checkpoint.diagnose import describe_save_failure, is_checkpoint_exception
from kenotron.checkpoint.errors import (
    CheckpointError,
    CheckpointSaveError,
    NonFiniteCheckpointError,
)
from kenotron.checkpoint.finite import first_nonfinite
from kenotron.checkpoint.folders import (
    list_step_folders,
    remove_step_folder,
    step_folder_name,
    write_marker,
    write_stamp,
)
from kenotron.checkpoint.lineage import check_no_foreign_above, rotation_victims
from kenotron.checkpoint.preflight import (
    check_folder_writable,
    estimate_checkpoint_bytes,
    optimizer_states_per_param,
)
from kenotron.checkpoint.rank0 import on_rank0_for_all
from kenotron.checkpoint.remote import BackgroundUploader, S3Store
from kenotron.checkpoint.restore import restore_parts, verify_files
from kenotron.checkpoint.resume import LoadChoice, abandon_later, choose
from kenotron.checkpoint.saver import (
    NO_GROUP_FOR_WRITER_PROCESS,
    DcpSaver,
    SaveInFlight,
)
from kenotron.checkpoint.state import (
    HasState,
    JsonState,
    ModelState,
    OptimizerState,
    TrainState,
)
from kenotron.config.sections import Checkpoint as CheckpointConfig
from kenotron.config.validate import check_checkpoint_config

logger = logging.getLogger("kenotron")

EXPORT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


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
        json_states: dict[str, HasState] | None = None,
    ) -> None:
        """`model_info` (e.g. family and args) goes into every completion marker, for tools that
        read a checkpoint without the config (HF export). `process_group` defaults to the world.
        `json_states`: more small states, equal on every rank, saved as JSON under their names
        (a DoReMi proxy's domain weights)."""
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
        self.parts: dict[str, HasState] = {"model": ModelState(model_parts, optimizers or ())}
        if optimizers:
            self.parts["optimizer"] = OptimizerState(model_parts, optimizers)
        if lr_schedulers:
            self.parts["lr_scheduler"] = JsonState(lr_schedulers)
        if dataloader is not None:
            self.parts["dataloader"] = JsonState([dataloader])
        if train_state is not None:
            self.parts["train_state"] = train_state
        for name, target in (json_states or {}).items():
            self.parts[name] = JsonState([target])
        if config.enable:
            for name, part in self.parts.items():
                if isinstance(part, JsonState):
                    part.check_storable(name)
        self.model_parts = list(model_parts)
        self.optimizers = list(optimizers or ())
        self._optimizer_states = optimizer_states_per_param(list(optimizers or ()))
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
        self._refuse_nonfinite(step)
        path = self._prepare_folder(step)
        state = dict(self.parts)
        marker = self._marker(step, parts=list(state), model_only=False, dtype=None)
        if self._saver is None:
            self._saver = DcpSaver(self.config.async_mode, self.process_group)
        try:
            inflight = self._saver.start(state, path)
        # DCP's CheckpointException is a BaseException: caught by name, with Exception; a
        # KeyboardInterrupt or SystemExit passes through.
        except BaseException as exc:
            if not (isinstance(exc, Exception) or is_checkpoint_exception(exc)):
                raise
            raise self._save_failed(step, path, exc) from exc
        self._track(_PendingSave(step, inflight, marker))
        return path

    def save_model_only(self, step: int, dtype: torch.dtype = torch.float32) -> Path:
        """Save the model weights alone, cast to `dtype` (synchronously): an export, which loads
        as a model-only checkpoint (optimizer, schedule and data position start fresh)."""
        self.wait()
        self._refuse_nonfinite(step, model_only=True)
        path = self._prepare_folder(step)
        weights = self.parts["model"].state_dict()
        state = {"model": {k: v.to(dtype) if v.is_floating_point() else v for k, v in weights.items()}}
        marker = self._marker(step, parts=["model"], model_only=True, dtype=str(dtype).removeprefix("torch."))
        try:
            dcp.save(state, checkpoint_id=str(path), process_group=self.process_group)
        except BaseException as exc:
            if not (isinstance(exc, Exception) or is_checkpoint_exception(exc)):
                raise
            raise self._save_failed(step, path, exc) from exc
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
        """Block until the save in flight is written and marked complete; CheckpointSaveError if it failed.
        A wait cut by an interrupt (Ctrl-C) leaves the save in flight: the next wait (the stop's,
        runtime/interrupt.py) finishes it, where forgetting it would call a save abandoned that
        then completes in the background."""
        pending = self._pending
        if pending is None:
            return
        if pending.inflight.written is not None:
            try:
                pending.inflight.written.result()
            # Whatever the save raised is already in pending.error (DCP's CheckpointException is a
            # BaseException); it is re-raised below as CheckpointSaveError. Only an interrupt passes.
            except BaseException as exc:
                if not (isinstance(exc, Exception) or is_checkpoint_exception(exc)):
                    raise
        pending.finished.wait()
        self._pending = None
        if pending.error is not None:
            raise self._save_failed(pending.step, pending.inflight.path, pending.error) from pending.error

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
        """A new, stamped step folder (rank 0 makes it; every rank gets its error, if any)."""
        return Path(on_rank0_for_all(self._new_step_folder, step, group=self.process_group))

    def _new_step_folder(self, step: int) -> str:
        path = self.folder / step_folder_name(step)
        # An earlier incomplete save of this step: replaced (marker first, see folders.py). A
        # folder that kenotron did not write raises instead.
        remove_step_folder(path)
        path.mkdir(parents=True, exist_ok=True)
        write_stamp(path, step)
        return str(path)

    def _refuse_nonfinite(self, step: int, *, model_only: bool = False) -> None:
        bad = first_nonfinite(self.model_parts, [] if model_only else self.optimizers, self.process_group)
        if bad is not None:
            raise NonFiniteCheckpointError(
                f"not saving {step_folder_name(step)}: the run's state holds NaN or Inf ({bad}), training diverged"
                f"{self._previous_hint(step)}"
            )

    def _save_failed(self, step: int, path: Path, exc: BaseException) -> CheckpointSaveError:
        """The error to raise for a failed save; rank 0 removes the partial folder (its space
        matters most when the disk is full)."""
        if self.rank == 0:
            try:
                remove_step_folder(path)
            except (OSError, CheckpointError) as cleanup:
                logger.warning("could not remove the failed save %s: %s", path, cleanup)
        return CheckpointSaveError(
            f"saving {path.name} {describe_save_failure(exc, self.folder)}{self._previous_hint(step)}"
        )

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
                files = integrity.describe_files(pending.inflight.path, checksums=self.config.checksums)
                write_marker(pending.inflight.path, {**pending.marker, "files": files})
                logger.info("checkpoint %s complete", pending.inflight.path)
                self._delete_old(pending.step)
                if self.uploader is not None:
                    self.uploader.submit(pending.step, pending.inflight.path)
        except BaseException as exc:
            pending.error = exc
            # Raised as one CheckpointSaveError line by the next wait or save; DCP's message holds every rank's traceback.
            logger.debug("checkpoint %s failed: %s", pending.inflight.path, exc, exc_info=exc)
        finally:
            pending.finished.set()

    def _delete_old(self, just_saved: int) -> None:
        """keep_latest_k of this run's full checkpoints, plus kenotron's interrupted saves older
        than the new checkpoint (lineage.rotation_victims)."""
        busy = self.uploader.uploading() if self.uploader is not None else set()
        for f in rotation_victims(list_step_folders(self.folder), self.config.keep_latest_k, just_saved):
            if f.step not in busy:
                remove_step_folder(f.path)

    def _previous_hint(self, step: int) -> str:
        previous = [f.step for f in list_step_folders(self.folder)
                    if f.complete and f.step != step and not f.model_only]
        if previous:
            return f"; the latest complete checkpoint is still {step_folder_name(previous[-1])}"
        return "; there is no earlier complete checkpoint"

    # -- loading --------------------------------------------------------------------------------

    def load(self, step: int | None = None) -> int | None:
        """Resume: restore every part not in checkpoint.exclude_from_loading from checkpoint
        `step` (default checkpoint.load_step: -1 the latest complete full checkpoint, local or
        remote; 0 none). Without any checkpoint, starts from checkpoint.initial_load_path when
        set. Returns the step loaded, or None when training starts from scratch. Does nothing
        when disabled.

        Before anything is loaded the folder must take a checkpoint (writable, room for one);
        after the load, checkpoints above the step the run continues from are set aside
        (resume.abandon_later), so that rotation and the next restart see only this run's."""
        if not self.config.enable:
            return None
        wanted = self.config.load_step if step is None else step
        needed = estimate_checkpoint_bytes(self.model_parts, self._optimizer_states)
        choice: LoadChoice | None = on_rank0_for_all(self._plan_load, wanted, needed, group=self.process_group)
        loaded = None
        if choice is not None:
            exclude = set(self.config.exclude_from_loading)
            if choice.model_only:
                exclude |= set(self.parts) - {"model"}
            loaded = self.load_from(Path(choice.path), exclude=exclude)
        on_rank0_for_all(self._continue_from, self._resume_step(choice, loaded), group=self.process_group)
        return loaded

    def _plan_load(self, wanted: int, needed_bytes: int) -> LoadChoice | None:
        """Rank 0: check the folder, choose what to load, refuse foreign folders in the way."""
        check_folder_writable(self.folder, needed_bytes)
        choice = choose(self.config, self.folder, wanted, self._store())
        predicted = 0 if choice is None or choice.initial else choice.step
        check_no_foreign_above(self.folder, predicted if self._loads_train_state(choice) else 0)
        return choice

    def _loads_train_state(self, choice: LoadChoice | None) -> bool:
        return (choice is not None and not choice.model_only and "train_state" in self.parts
                and "train_state" not in self.config.exclude_from_loading)

    def _resume_step(self, choice: LoadChoice | None, loaded: int | None) -> int:
        """The step this run continues from: the loaded one when its step counter was restored
        (or the caller keeps its own), else 0."""
        if choice is None or loaded is None:
            return 0
        if "train_state" not in self.parts:
            return loaded
        return loaded if self._loads_train_state(choice) else 0

    def _continue_from(self, resume_step: int) -> None:
        abandon_later(self.folder, resume_step, self._store())

    def _store(self) -> S3Store | None:
        if not self.config.remote_folder:
            return None
        return S3Store(self.config.remote_folder, self.config.remote_endpoint_url)

    def load_from(self, path: str | Path, *, exclude: Sequence[str] = ()) -> int:
        """Restore the parts not in `exclude` from the checkpoint folder `path`; returns its step.

        A model-only checkpoint restores only the model. Raises CheckpointFormatError for an
        incomplete, truncated or foreign folder, CheckpointMismatchError naming the first entry
        that does not fit (shape, missing or extra parameter). The restore itself: restore.py.
        """
        path = Path(path)
        on_rank0_for_all(verify_files, str(path), group=self.process_group)  # checksums: read once, by rank 0
        return restore_parts(path, self.parts, exclude=exclude, model_info=self.model_info,
                             model_parts=self.model_parts, optimizers=self.optimizers,
                             masters_follow_model=self._masters_follow_model, run_folder=self.folder,
                             process_group=self.process_group)
