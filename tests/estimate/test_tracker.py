"""The step tracker's count of the state libraries keep besides parameters and optimizer state
(register_other_live_tensors): the fake tensors the job's build and warm-up made, recorded as
they were made (estimate/fake_tensor_recorder.py), not searched for on the heap."""

from __future__ import annotations

import gc

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from kenotron.config import load_config
from kenotron.estimate import estimate_memory
from kenotron.estimate.breakdown import Position, allocated_bytes
from kenotron.estimate.fake_tensor_recorder import FakeTensorRecorder
from kenotron.estimate.tracker import StepMemoryTracker


def test_tracker_counts_state_a_library_made_before_it_started():
    mode, library_state = FakeTensorMode(), {}
    with FakeTensorRecorder(mode) as made, mode:
        model = nn.Linear(16, 8)
        library_state["buffer"] = torch.empty(1000)  # kept by a library, not a parameter
        library_state["view"] = model.weight[0]  # a view of a parameter: its storage is counted once
        torch.empty(5000)  # a temporary: dead before the tracker starts
    with FakeTensorMode():
        other_estimate = torch.empty(3000)  # another fake mode's tensor: not this step's memory
    alive = made.alive()
    assert any(t is library_state["buffer"] for t in alive)
    assert all(t.numel() != 5000 for t in alive)
    with mode:
        tracker = StepMemoryTracker(model, [])
        tracker.register_static(model.parameters(), "parameters")
        params = tracker.live_bytes()
        tracker.register_other_live_tensors("parameters", [*alive, other_estimate])
        assert tracker.live_bytes() - params == allocated_bytes(1000 * 4)
        with tracker:
            pass
    assert tracker.result().peaks[Position("start")].parameters == params + allocated_bytes(1000 * 4)


@pytest.mark.parametrize(
    "ngpu,overrides",
    [(4, ["--training.global_batch_size", "32"]), (4, ["--parallelism.pp", "2", "--parallelism.dp_shard", "2"])],
    ids=["fsdp4", "pp2xfsdp2"],
)
def test_estimate_counts_library_state_without_walking_the_heap(monkeypatch, ngpu, overrides):
    """One estimate each through track_step and track_pipeline_step (1-2 s): the heap scan the
    tracker used to make (seconds in a process holding many objects) now fails the test, and the
    other live tensors it registers are the ones that scan finds."""
    collect, get_objects = gc.collect, gc.get_objects
    registered = []
    register = StepMemoryTracker.register_other_live_tensors

    def checked(self: StepMemoryTracker, category: str, made) -> None:
        # What the heap scan finds (the fake tensors of this step's mode alive, not yet tracked).
        collect()
        found = {t.untyped_storage() for t in get_objects() if type(t) is FakeTensor
                 and t.fake_mode is self._fake_mode and t.untyped_storage() not in self._by_storage}
        expected = (len(found), sum(allocated_bytes(s.nbytes()) for s in found))
        del found
        before = (len(self._events.storages), self.live_bytes())
        register(self, category, made)
        registered.append((expected, (len(self._events.storages) - before[0], self.live_bytes() - before[1])))

    def heap_walk(*_args, **_kwargs):
        raise AssertionError("the estimator walked the garbage collector's heap")

    monkeypatch.setattr(StepMemoryTracker, "register_other_live_tensors", checked)
    monkeypatch.setattr(gc, "collect", heap_walk)
    monkeypatch.setattr(gc, "get_objects", heap_walk)
    estimate_memory(load_config("debug", overrides), ngpu, gpu_memory_gib=80)
    assert registered and all(expected == got for expected, got in registered), registered
    assert all(count for (count, _), _ in registered)  # FSDP's buffers, at least
