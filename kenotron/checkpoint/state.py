"""The parts of a training run that a checkpoint holds, each behind DCP's `Stateful` protocol.

DCP calls `state_dict()` when saving and `load_state_dict()` after loading in place. The
wrappers here decide how each part is stored:

- model and optimizer go through `torch.distributed.checkpoint.state_dict`, which gives
  parameter-name (FQN) keyed tensors for plain modules and for FSDP2 / tensor-parallel DTensor
  ones alike, so a checkpoint saved under one layout loads under another;
- small Python state (LR schedulers, the data loader) is stored as JSON in one uint8 tensor per
  part, and the train state (step, tokens, RNG states) as tensors: DCP stores them once, every
  rank reads them, and the key set does not change between torch versions (LambdaLR's
  state_dict keys did). Nothing of kenotron's own is pickled, so loading a checkpoint never
  unpickles kenotron state (checkpoint/trust.py covers what DCP itself reads).

A part whose tensors' sizes depend on the saved values (the JSON ones) has `load_template`:
given the sizes stored in the checkpoint, it returns the state dict that DCP loads into.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from kenotron.config.sections import CHECKPOINT_PARTS
from kenotron.errors import DataError

PART_NAMES = CHECKPOINT_PARTS
"""Names of the parts, in save order (config/sections.py: the launcher checks them without torch)."""

# Per-parameter param-group entries ("param_groups.<fqn>.lr") instead of index-based groups:
# the same keys whatever the pipeline split, so optimizer state reshards like the model does.
_OPTIM_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


class HasState(Protocol):
    """Anything with PyTorch-style `state_dict()` / `load_state_dict()`."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> Any: ...


class ModelState:
    """The parameters of one or more model parts (pipeline stages hold disjoint names).

    A parameter whose fp32 master an optimizer keeps for the model part (`checkpointed_master`:
    bf16 routed experts outside FSDP, train/master_weights.py) is saved as that master under the
    parameter's name, and loaded into it in place: the checkpoint holds fp32 weights whatever the
    layout trains them in. Loading then copies the master into the parameter."""

    def __init__(self, model_parts: Sequence[nn.Module], optimizers: Sequence[torch.optim.Optimizer] = ()) -> None:
        self.model_parts = list(model_parts)
        self.optimizers = list(optimizers)

    def state_dict(self) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        for part in self.model_parts:
            merged.update(get_model_state_dict(part))
        masters = self._masters()
        if unknown := sorted(set(masters) - set(merged)):
            raise KeyError(f"parameters {unknown} have fp32 masters but are not in the model's state dict")
        merged.update(masters)
        return merged

    def _masters(self) -> dict[str, torch.Tensor]:
        """{parameter name: the fp32 master saved in its place}, over every optimizer that keeps some."""
        holders = [o for o in self.optimizers if hasattr(o, "checkpointed_master")]
        masters = {}
        for part in self.model_parts if holders else ():
            for name, p in part.named_parameters():
                for optimizer in holders:
                    if p in optimizer.state and (master := optimizer.checkpointed_master(p)) is not None:
                        masters[name] = master
        return masters

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # Each part takes its own names from the merged dict; the manager has already checked
        # that every name a part needs is present, so strict=False only skips the other parts'.
        for part in self.model_parts:
            set_model_state_dict(part, state, options=StateDictOptions(strict=False))


class OptimizerState:
    """Optimizer state of the model parts, keyed by parameter name (one optimizer per part)."""

    def __init__(self, model_parts: Sequence[nn.Module], optimizers: Sequence[torch.optim.Optimizer]) -> None:
        if len(model_parts) != len(optimizers):
            raise ValueError(
                f"got {len(model_parts)} model parts but {len(optimizers)} optimizers; pass one optimizer per part"
            )
        self.pairs = list(zip(model_parts, optimizers))

    def state_dict(self) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        for part, optimizer in self.pairs:
            merged.update(get_optimizer_state_dict(part, optimizer, options=_OPTIM_OPTIONS))
        return merged

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for part, optimizer in self.pairs:
            set_optimizer_state_dict(part, optimizer, state, options=_OPTIM_OPTIONS)


JSON_VALUES = "dicts with string keys, lists, strings, numbers, booleans and None (numpy numbers and arrays too)"
"""What a JSON part's state may hold (said in the errors and in the docs of data.loader)."""


def json_tensor(value: Any) -> torch.Tensor:
    """`value` (JSON_VALUES) as uint8 bytes."""
    text = json.dumps(value, default=_plain, sort_keys=True)
    return torch.frombuffer(bytearray(text.encode()), dtype=torch.uint8)


def unstorable_field(value: Any, where: str = "state") -> str | None:
    """The first field of `value` that a JSON part cannot store as it is (`state['seen'] is a set`,
    `state has key 3 (int): JSON turns it into '3'`), or None when all of it round-trips."""
    if value is None or isinstance(value, (bool, int, float, str, np.generic)):
        return None
    if isinstance(value, np.ndarray):
        return None if value.dtype.kind in "biuf" else f"{where} is a numpy array of {value.dtype}"
    if isinstance(value, (list, tuple)):
        return next((p for i, v in enumerate(value) if (p := unstorable_field(v, f"{where}[{i}]"))), None)
    if isinstance(value, dict):
        for key, v in value.items():
            if not isinstance(key, str):
                return f"{where} has key {key!r} ({type(key).__name__}): JSON turns it into {json.dumps(str(key))}"
            if problem := unstorable_field(v, f"{where}[{key!r}]"):
                return problem
        return None
    kind = type(value).__name__
    return f"{where} is {'an' if kind[0].lower() in 'aeiou' else 'a'} {kind}"


def tensor_json(tensor: torch.Tensor) -> Any:
    """The value that json_tensor stored."""
    return json.loads(bytes(tensor.cpu().numpy()).decode())


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} cannot be stored in a checkpoint as JSON: {value!r}")


def _templates(saved: dict[str, torch.Size], dtypes: dict[str, torch.dtype]) -> dict[str, torch.Tensor]:
    return {key: torch.empty(size, dtype=dtypes.get(key, torch.uint8)) for key, size in saved.items()}


class JsonState:
    """Small Python state (plain values) stored as JSON in one uint8 tensor.

    Several targets share it (e.g. one LR scheduler per pipeline stage, all on one schedule):
    the first one's state is saved and every one of them gets it back. The state must be the
    same on every rank, as it is for `GlobalBatchLoader` and kenotron's LR schedulers.
    """

    def __init__(self, targets: Sequence[HasState]) -> None:
        if not targets:
            raise ValueError("JsonState needs at least one object with state_dict()/load_state_dict()")
        self.targets = list(targets)

    def state_dict(self) -> dict[str, Any]:
        return {"json": json_tensor(self.targets[0].state_dict())}

    def check_storable(self, part: str) -> None:
        """DataError naming the first field of the state that JSON cannot store: said when the
        run starts rather than at its first save, checkpoint.interval steps in."""
        problem = unstorable_field(self.targets[0].state_dict())
        if problem is not None:
            custom = "; a custom data.loader's state_dict() must hold only these" if part == "dataloader" else ""
            raise DataError(f"the {part} state cannot be stored in a checkpoint: {problem}; a checkpoint stores it as "
                            f"JSON: {JSON_VALUES} (a set as a sorted list, bytes as a string){custom}")

    def load_template(self, saved: dict[str, torch.Size]) -> dict[str, Any]:
        return _templates({"json": saved.get("json", torch.Size([0]))}, {})

    def load_state_dict(self, state: dict[str, Any]) -> None:
        value = tensor_json(state["json"])
        for target in self.targets:
            target.load_state_dict(copy.deepcopy(value))


def capture_rng_state() -> dict[str, Any]:
    """Every RNG a training step may draw from: torch (CPU and current CUDA device), Python, numpy."""
    cuda = torch.cuda.get_rng_state() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return {"torch": torch.get_rng_state(), "cuda": cuda, "python": random.getstate(), "numpy": np.random.get_state()}


def rng_state_tensors(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """capture_rng_state()'s value as tensors: torch's own states as they are, Python's and numpy's as JSON."""
    kind, key, pos, has_gauss, cached = state["numpy"]
    out = {
        "rng_torch": state["torch"],
        "rng_python": json_tensor(state["python"]),
        "rng_numpy": json_tensor([kind, key, pos, has_gauss, cached]),
    }
    if state.get("cuda") is not None:
        out["rng_cuda"] = state["cuda"]
    return out


def rng_state_from_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    version, internal, gauss = tensor_json(tensors["rng_python"])
    kind, key, pos, has_gauss, cached = tensor_json(tensors["rng_numpy"])
    return {
        "torch": tensors["rng_torch"],
        "cuda": tensors.get("rng_cuda"),
        "python": (version, tuple(internal), gauss),
        "numpy": (kind, np.asarray(key, dtype=np.uint32), pos, has_gauss, cached),
    }


def restore_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])


@dataclass
class TrainState:
    """Where training stands: the optimizer steps done, tokens consumed, and the RNG states.

    The RNG states are the saving process's; every rank gets them back on load. kenotron
    seeds every rank alike and draws no per-rank randomness, so that is exact for its runs.
    """

    step: int = 0
    """Optimizer steps completed."""
    tokens_seen: int = 0
    """Training tokens consumed over all ranks."""

    def state_dict(self) -> dict[str, Any]:
        return {
            "step": torch.tensor(self.step, dtype=torch.int64),
            "tokens_seen": torch.tensor(self.tokens_seen, dtype=torch.int64),
            **rng_state_tensors(capture_rng_state()),
        }

    def load_template(self, saved: dict[str, torch.Size]) -> dict[str, Any]:
        """The saved keys (a CUDA RNG state only when the saving run had one)."""
        dtypes = {"step": torch.int64, "tokens_seen": torch.int64}
        return _templates(saved, dtypes)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.tokens_seen = int(state["tokens_seen"])
        restore_rng_state(rng_state_from_tensors(state))
