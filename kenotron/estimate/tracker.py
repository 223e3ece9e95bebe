"""Tensor memory of one training step on fake tensors: who allocated what, when, and for how long.

`StepMemoryTracker` is a TorchDispatchMode that sits above FakeTensorMode. Every op output
(below DTensor, so on local shards) is a storage; its bytes are logged when it appears and
again, negative, when its last reference dies (a weakref on the storage), which is what the
CUDA caching allocator's "allocated" counter sees too. FSDP2 grows and shrinks its gathered
parameters with `UntypedStorage.resize_`, which no dispatch mode sees, so that method is
wrapped while the tracker is active.

Categories are decided after the step, when each storage's fate is known:

- parameters / optimizer_state: registered before the step (the sharded or local weights,
  the buffers, the AdamW moments created by the warm-up step; with the parameters, what else
  the build and the warm-up left alive, FSDP's buffers among it: fake_tensor_recorder.py),
- unsharded_parameters: storages FSDP resizes (its gathered compute copies),
- gradients: storages that some `param.grad` points to after backward or clipping, and
  whatever else a backward creates that outlives it (FSDP keeps gradients accumulated
  without synchronization in buffers of its own, not in `.grad`),
- activations: created by a forward (or its recomputation under activation checkpointing)
  and still alive when that micro-step's backward starts,
- temporaries: everything else (intermediates, gradients of activations, FSDP's all-gather
  and reduce-scatter buffers, the loss's chunks, optimizer-step scratch).

Every allocation is also tagged with the *position* of the step it happened in (phase,
micro-step, and which transformer block was running) so that peaks can be compared
position by position between models of different depth (see depth.py). What it reports in
(Breakdown, Position, TrackedStep, allocated_bytes) is breakdown.py's.
"""

from __future__ import annotations

import os
import sys
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Self

import torch
from torch import nn
from torch._guards import active_fake_mode
from torch._subclasses.fake_tensor import FakeTensor
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

from kenotron.dtensor import local_tensor
from kenotron.estimate.breakdown import CATEGORIES, Breakdown, Position, TrackedStep, allocated_bytes
from kenotron.kernels.workspace import scratch_buffers

_FSDP_COMMUNICATION_NAMESPACE = "fsdp"
"""FSDP2's own ops (all-gather copy-in, reduce-scatter chunk-cat): their outputs are communication buffers."""


_SHARDING_PROPAGATION_FILE = os.path.join("tensor", "_sharding_prop.py")
"""DTensor's sharding propagation makes fake tensors of the *global* shape to infer output
metadata; inside a FakeTensorMode it makes them in that mode, but they are not memory."""


def _inside_sharding_propagation() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.endswith(_SHARDING_PROPAGATION_FILE):
            return True
        frame = frame.f_back
    return False


@dataclass
class _Storage:
    nbytes: int
    origin: str
    """static:<category>, forward, recompute, backward, optimizer, resized, communication."""
    micro_step: int
    module: str
    """FQN of the innermost module whose forward created it ("" outside every module)."""
    freed_at: int | None = None
    """Index of the event that freed it."""


@dataclass
class _Events:
    storages: list[_Storage] = field(default_factory=list)
    log: list[tuple[int, int, int]] = field(default_factory=list)
    """(storage index, byte delta, position index) per allocation, free or resize."""
    positions: list[Position] = field(default_factory=list)
    position_index: dict[Position, int] = field(default_factory=dict)
    live: int = 0
    """Bytes alive now: the sum of the log's deltas so far."""


class StepMemoryTracker(TorchDispatchMode):
    """Track the memory of one training step run under FakeTensorMode (see the module doc).

    Use: build it inside the step's FakeTensorMode, `register_static(...)` the persistent
    tensors and `register_other_live_tensors(...)` the rest, enter it, drive the step calling
    `set_phase` / `end_forward` / `end_backward` / `mark_gradients` (fake_job.StepObserver),
    exit, then `result()`.
    """

    def __init__(self, model: nn.Module, blocks: list[nn.Module]) -> None:
        """`blocks`: the model's transformer blocks in order (positions are named after them)."""
        super().__init__()
        self._model = model
        self._blocks = blocks
        self._events = _Events()
        self._by_storage = WeakIdKeyDictionary()
        self._gradients: set[int] = set()
        self._forward_end: dict[int, int] = {}
        self._backward_end: dict[int, int] = {}
        self._activation_snapshot: dict[str, int] = {}
        self._module_stack: list[str] = []
        self._position = Position("start")
        self._hooks: list[Any] = []
        # Construct inside the FakeTensorMode the step runs in: tensors of other modes are ignored.
        self._fake_mode = active_fake_mode()
        self._original_resize = None
        self._active = True

    # -- the step tells the tracker where it is --------------------------------------------

    def set_phase(self, phase: str, micro_step: int = 0) -> None:
        edge = "before" if phase == "forward" else ("after" if phase == "backward" else "")
        self._position = Position(phase, micro_step, None, edge)

    def end_forward(self) -> None:
        """The current micro-step's forward (and loss) is done: what it keeps are activations."""
        micro = self._position.micro_step
        self._forward_end[micro] = len(self._events.log)
        if micro == 0:
            for s in self._events.storages:
                if s.origin == "forward" and s.freed_at is None and s.micro_step == 0:
                    self._activation_snapshot[s.module] = self._activation_snapshot.get(s.module, 0) + s.nbytes

    def end_backward(self) -> None:
        """The current micro-step's backward is done: what it created and keeps are gradients."""
        self._backward_end[self._position.micro_step] = len(self._events.log)

    def mark_gradients(self, params: Iterable[torch.Tensor]) -> None:
        """Storages the parameters' .grad point to now are gradients."""
        for p in params:
            if p.grad is None:
                continue
            local = local_tensor(p.grad)
            index = self._by_storage.get(local.untyped_storage())
            if index is not None:
                self._gradients.add(index)

    def register_static(self, tensors: Iterable[torch.Tensor], category: str) -> None:
        """Tensors alive before the step that persist across steps (weights, optimizer state)."""
        if category not in CATEGORIES:
            raise ValueError(f"unknown memory category {category!r}; use one of {CATEGORIES}")
        for t in tensors:
            local = local_tensor(t)
            self._add(local.untyped_storage(), f"static:{category}")

    def register_other_live_tensors(self, category: str, made: Iterable[torch.Tensor]) -> None:
        """Every other fake tensor of this step's mode among `made` (FakeTensorRecorder.alive():
        those the job's build and warm-up made and that are still alive), as `category`: state
        that libraries keep besides the parameters and the optimizer's (it is GPU memory too).
        Recorded as they were made, not searched for on the heap (fake_tensor_recorder.py says why)."""
        for t in made:
            # Only this step's fake mode: tensors of earlier estimates in the process are not this rank's.
            if type(t) is FakeTensor and t.fake_mode is self._fake_mode and t.untyped_storage() not in self._by_storage:
                self.register_static([t], category)

    def live_bytes(self) -> int:
        """Bytes of the tracked tensors alive now (the activation offloader's memory probe)."""
        return self._events.live

    # -- bookkeeping ---------------------------------------------------------------------

    def _position_index(self) -> int:
        ev = self._events
        index = ev.position_index.get(self._position)
        if index is None:
            index = ev.position_index[self._position] = len(ev.positions)
            ev.positions.append(self._position)
        return index

    def _add(self, storage: torch.UntypedStorage, origin: str) -> None:
        if storage in self._by_storage:
            return
        ev = self._events
        index = len(ev.storages)
        nbytes = allocated_bytes(storage.nbytes())
        module = self._module_stack[-1] if self._module_stack else ""
        ev.storages.append(_Storage(nbytes, origin, self._position.micro_step, module))
        self._by_storage[storage] = index
        ev.log.append((index, nbytes, self._position_index()))
        ev.live += nbytes
        self._watch_free(storage, index)

    def _watch_free(self, storage: torch.UntypedStorage, index: int) -> None:
        finalizer = weakref.finalize(storage, self._free, index)
        finalizer.atexit = False

    def _free(self, index: int) -> None:
        record = self._events.storages[index]
        if not self._active:
            return
        if record.freed_at is None and record.nbytes:
            self._events.log.append((index, -record.nbytes, self._position_index()))
            self._events.live -= record.nbytes
        record.freed_at = len(self._events.log)

    def _resized(self, storage: torch.UntypedStorage, old_nbytes: int) -> None:
        ev = self._events
        index = self._by_storage.get(storage)
        if index is None:
            index = len(ev.storages)
            ev.storages.append(_Storage(0, "resized", self._position.micro_step, ""))
            self._by_storage[storage] = index
            self._watch_free(storage, index)
        record = ev.storages[index]
        record.origin = "resized"
        new = allocated_bytes(storage.nbytes())
        if new != record.nbytes:
            ev.log.append((index, new - record.nbytes, self._position_index()))
            ev.live += new - record.nbytes
            record.nbytes = new

    def _origin(self, func: Any) -> str:
        if getattr(func, "namespace", "") == _FSDP_COMMUNICATION_NAMESPACE:
            return "communication"
        phase = self._position.phase
        if phase == "backward" and self._module_stack:
            return "recompute"
        return phase if phase in ("forward", "backward", "optimizer") else "forward"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # Let DTensor turn itself into local ops first: those are what occupy memory.
        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented
        if func is torch.ops._c10d_functional.wait_tensor.default:
            # Eagerly, waiting returns its input; the fake kernel would make a new tensor.
            return args[0]
        out = func(*args, **(kwargs or {}))
        # DTensor's sharding propagation runs ops under a fake mode of its own: not memory.
        if active_fake_mode() is not self._fake_mode:
            return out
        new = [
            st for t in tree_leaves(out)
            # Meta tensors hold no memory (the activation offloader's stand-ins for host copies).
            if isinstance(t, torch.Tensor) and t.device.type != "meta"
            and (st := t.untyped_storage()) not in self._by_storage
        ]
        if new and not _inside_sharding_propagation():
            origin = self._origin(func)
            for storage in new:
                self._add(storage, origin)
            # Buffers a kenotron kernel allocates and frees inside its op: all held while it runs.
            device = next(t.device for t in tree_leaves(out) if isinstance(t, torch.Tensor))
            scratch = [torch.empty(n, dtype=torch.uint8, device=device) for n in scratch_buffers(func, args, kwargs)]
            for buffer in scratch:
                self._add(buffer.untyped_storage(), origin)
            del scratch
        return out

    # -- module and block positions ------------------------------------------------------

    def _install_hooks(self) -> None:
        for name, module in self._model.named_modules():
            self._hooks.append(module.register_forward_pre_hook(self._push(name)))
            # always_call: checkpoint's recomputation stops a forward midway with an exception.
            self._hooks.append(module.register_forward_hook(self._pop, always_call=True))
        for index, block in enumerate(self._blocks):
            self._hooks.append(block.register_forward_pre_hook(self._enter_block(index)))
            self._hooks.append(block.register_forward_hook(self._leave_block(index)))

    def _push(self, name: str):
        def hook(_module, _args):
            self._module_stack.append(name)

        return hook

    def _pop(self, _module, _args, _output) -> None:
        if self._module_stack:
            self._module_stack.pop()

    def _enter_block(self, index: int):
        def hook(_module, args):
            if self._position.phase != "forward":
                return
            self._position = Position("forward", self._position.micro_step, index)
            if index == 0:
                # Backward reaches the block inputs last: from then on it is the embedding's.
                self._on_gradient(args, Position("backward", self._position.micro_step, None, "before"))

        return hook

    def _leave_block(self, index: int):
        def hook(_module, _args, output):
            if self._position.phase != "forward":
                return
            micro = self._position.micro_step
            last = index == len(self._blocks) - 1
            self._position = Position("forward", micro, None, "after") if last else self._position
            self._on_gradient(output, Position("backward", micro, index))

        return hook

    def _on_gradient(self, tensors: Any, position: Position) -> None:
        needing = [t for t in tree_leaves(tensors) if isinstance(t, torch.Tensor) and t.requires_grad]
        if not needing:
            return

        def hook(_grads):
            if self._position.phase == "backward":
                self._position = position

        torch.autograd.graph.register_multi_grad_hook(needing, hook, mode="any")

    # -- context -------------------------------------------------------------------------

    def __enter__(self) -> Self:
        if self._fake_mode is None or active_fake_mode() is not self._fake_mode:
            raise RuntimeError("StepMemoryTracker must be built and entered inside the same FakeTensorMode")
        self._install_hooks()
        original = self._original_resize = torch.UntypedStorage.resize_
        tracker = self

        def resize_(storage: torch.UntypedStorage, size: int):
            old = storage.nbytes()
            out = original(storage, size)
            tracker._resized(storage, old)
            return out

        torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign]
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        self._active = False
        torch.UntypedStorage.resize_ = self._original_resize  # type: ignore[method-assign]
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()
        super().__exit__(*exc)

    # -- result --------------------------------------------------------------------------

    def _category(self, index: int, record: _Storage) -> str:
        origin = record.origin
        if origin.startswith("static:"):
            return origin.removeprefix("static:")
        if origin == "resized":
            return "unsharded_parameters"
        if index in self._gradients:
            return "gradients"
        if origin == "recompute":
            return "activations"
        if origin in ("forward", "backward"):
            ends = self._forward_end if origin == "forward" else self._backward_end
            end = ends.get(record.micro_step)
            kept = end is not None and (record.freed_at is None or record.freed_at > end)
            if kept:
                return "activations" if origin == "forward" else "gradients"
        return "temporaries"

    def result(self) -> TrackedStep:
        """Replay the log: the breakdown at each position's highest total."""
        ev = self._events
        category = [self._category(i, s) for i, s in enumerate(ev.storages)]
        current = dict.fromkeys(CATEGORIES, 0)
        total = 0
        best: dict[int, tuple[int, dict[str, int]]] = {}
        for index, delta, where in ev.log:
            current[category[index]] += delta
            total += delta
            if delta > 0 and total > best.get(where, (-1, None))[0]:
                best[where] = (total, dict(current))
        peaks = {ev.positions[w]: Breakdown(**snap) for w, (_, snap) in best.items()}
        return TrackedStep(peaks, dict(self._activation_snapshot))
