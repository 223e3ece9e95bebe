"""The fake tensors one FakeTensorMode makes, remembered by weak reference as they are made.

Before the tracked step, the tracker (tracker.py) counts as memory every fake tensor of the
step's mode still alive that it was not handed: state that libraries keep besides the
parameters and the optimizer's (FSDP's padded unsharded parameters and all-gather outputs, the
early all-gather's buffers, the MoE balancing's counters). Finding them by walking
`gc.get_objects()` after a `gc.collect()` cost time in proportion to the whole Python heap:
seconds per tracked step in a long-lived process (a notebook, the test session). Recording
every op output of the mode while the job is built and warmed up costs one dict entry per
output instead, whatever else the process holds; the entries go when their tensors die.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class FakeTensorRecorder(TorchDispatchMode):
    """While entered: every FakeTensor of `fake_mode` that an op returns, kept weakly.

    Enter it around everything that makes the job's tensors (the build and the warm-up step);
    the fake mode is an infrastructure mode, always below user modes, so this sees each op
    before the fake mode runs it, whichever of the two was entered first.
    """

    def __init__(self, fake_mode: FakeTensorMode) -> None:
        super().__init__()
        self._fake_mode = fake_mode
        # Keyed by creation number: iteration follows creation, so registration order is
        # reproducible from run to run (a WeakSet's would follow addresses).
        self._made: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()
        self._numbers = itertools.count()

    def alive(self) -> list[torch.Tensor]:
        """The recorded tensors still alive, oldest first."""
        return list(self._made.values())

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        # Let DTensor turn itself into local ops first: those come back through this mode and
        # make the FakeTensors (the local shards) that hold the memory.
        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            # Only this mode's: DTensor's sharding propagation makes tensors in a fake mode of its own.
            if type(t) is FakeTensor and t.fake_mode is self._fake_mode:
                self._made[next(self._numbers)] = t
        return out
