"""Custom data loaders: the protocol, and loading the builder that `data.loader` names.

`data.loader = "my_package.my_module:build"` (or `"path/to/file.py:build"`) names a callable
that takes a `LoaderContext` and returns a loader; importing it runs that code (a trust boundary,
like any import). A loader is any object with:

    next_step() -> list[MicroBatch]
        This dp rank's micro-batches of the next optimizer step, in order: exactly
        ctx.micro_batches_per_step of them, each `MicroBatch(inputs, labels)` with int64 CPU
        tensors of shape [ctx.local_batch_size, seq_len] (labels: the inputs shifted by one).
        Where ctx.feed_inputs (ctx.feed_labels) is False, this rank is a pipeline stage that does
        not use them: give None there and skip the work.
    state_dict() -> dict
        Its position after the last step returned: small, the same on every rank (a checkpoint
        stores one copy, as JSON, and hands it to every rank on resume), and JSON-storable
        (checkpoint/state.py's JSON_VALUES; checked when the run starts).
    load_state_dict(state: dict) -> None
        Continue from `state`, possibly under another number of ranks.

The dp rank and size come in the context: rank r of D reads its own share of each step's
global batch of ctx.global_batch_size sequences. kenotron calls `next_step()` from a background
thread, one or two steps ahead of training (kenotron.data.prefetch), and checks the shape of
what it returns. examples/custom-dataloader/ has a complete example.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kenotron.config import ConfigError, JobConfig
from kenotron.data.loader import MicroBatch
from kenotron.data.tokenizer import Tokenizer
from kenotron.errors import DataError


@dataclass(frozen=True)
class LoaderContext:
    """What a custom loader's builder is given."""

    cfg: JobConfig
    """The whole job config (its own options can go in data.path, data.dataset, ...)."""
    tokenizer: Tokenizer
    seq_len: int
    global_batch_size: int
    """Sequences per optimizer step over all dp ranks."""
    local_batch_size: int
    """Sequences per micro-batch on this rank."""
    dp_rank: int
    dp_size: int
    feed_inputs: bool
    """False on pipeline stages that take no token ids (all but the first)."""
    feed_labels: bool
    """False on pipeline stages that compute no loss (all but the last)."""
    vocab_size: int
    """The model's vocabulary: every token id must be below it."""

    @property
    def micro_batches_per_step(self) -> int:
        return self.global_batch_size // (self.dp_size * self.local_batch_size)


def load_loader_factory(spec: str) -> Callable[[LoaderContext], Any]:
    """The callable `data.loader` names ("module:function" or "file.py:function")."""
    module_name, colon, attribute = spec.rpartition(":")
    if not colon or not module_name or not attribute:
        raise ConfigError(
            f"data.loader={spec!r} is not 'module:function'; name the function that builds the loader, e.g. "
            "'my_data.loader:build' or 'path/to/loader.py:build'"
        )
    try:
        if module_name.endswith(".py"):
            path = Path(module_name).expanduser()
            if not path.is_file():
                raise FileNotFoundError(f"no such file {str(path)!r}")
            name = f"kenotron_custom_loader_{abs(hash(str(path.resolve())))}"
            module_spec = importlib.util.spec_from_file_location(name, path)
            assert module_spec is not None and module_spec.loader is not None
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[name] = module
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except Exception as err:
        raise ConfigError(
            f"data.loader={spec!r}: cannot import {module_name!r} ({type(err).__name__}: {err}); check the module "
            "path (it must be importable from the working directory or PYTHONPATH) or give a .py file path"
        ) from err
    factory = getattr(module, attribute, None)
    if not callable(factory):
        raise ConfigError(
            f"data.loader={spec!r}: {module_name!r} has no callable {attribute!r}"
            + (f" (it is a {type(factory).__name__})" if factory is not None else "")
        )
    return factory


class CheckedLoader:
    """A custom loader whose steps are checked against the protocol (one clear error, not a shape mismatch later)."""

    def __init__(self, loader: Any, ctx: LoaderContext, spec: str) -> None:
        missing = [m for m in ("next_step", "state_dict", "load_state_dict") if not callable(getattr(loader, m, None))]
        if missing:
            raise ConfigError(
                f"data.loader={spec!r} returned a {type(loader).__name__} without {', '.join(missing)}; a loader has "
                "next_step(), state_dict() and load_state_dict() (see kenotron/data/custom.py)"
            )
        self.loader, self.ctx, self.spec = loader, ctx, spec

    def _check(self, name: str, value: Any, wanted: bool, shape: tuple[int, int]) -> None:
        if not wanted:
            return
        if (not isinstance(value, torch.Tensor) or value.dtype != torch.int64 or tuple(value.shape) != shape
                or value.device.type != "cpu"):
            got = f"{tuple(value.shape)} {value.dtype} on {value.device}" if isinstance(value, torch.Tensor) else value
            raise DataError(
                f"data.loader={self.spec!r} gave {name} {got}; expected an int64 CPU tensor of shape "
                f"[local_batch_size, seq_len] = {list(shape)}"
            )
        if int(value.max()) >= self.ctx.vocab_size or int(value.min()) < 0:
            raise DataError(
                f"data.loader={self.spec!r} gave token id {int(value.max())} in {name}, outside the model's vocabulary "
                f"of {self.ctx.vocab_size}"
            )

    def next_step(self) -> list[MicroBatch]:
        batches = self.loader.next_step()
        count = self.ctx.micro_batches_per_step
        if not isinstance(batches, list) or len(batches) != count:
            got = f"{len(batches)} items" if isinstance(batches, list) else type(batches).__name__
            raise DataError(
                f"data.loader={self.spec!r}: next_step() gave {got}; expected a list of {count} MicroBatch "
                f"(global batch {self.ctx.global_batch_size} / (dp {self.ctx.dp_size} x local batch "
                f"{self.ctx.local_batch_size}))"
            )
        shape = (self.ctx.local_batch_size, self.ctx.seq_len)
        for mb in batches:
            self._check("inputs", getattr(mb, "inputs", None), self.ctx.feed_inputs, shape)
            self._check("labels", getattr(mb, "labels", None), self.ctx.feed_labels, shape)
        return batches

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state)
