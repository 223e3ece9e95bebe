"""Activation offloading (`activation_checkpoint.offload_blocks`): the tensors the first N blocks
save for backward wait in pinned host memory between their forward and their backward.

Why: it trades PCIe traffic for memory where recomputing (activation checkpointing) would cost
compute. The first blocks are the ones to move: their activations are made first and used last,
so the copies out run under the rest of the forward and the copies back under the backward of
the blocks after them, on two copy streams of their own (the copy engines, not the SMs).

- pack (a `saved_tensors_hooks` installed around each offloaded block's forward, outside
  torch.compile's graph): a plain device tensor of at least `MIN_BYTES`, not a parameter, is
  copied into a pinned host buffer kept from step to step (`HostBufferPool`).
- release: the device tensor is held until block j + R (R = blocks - N - 1, at least 1) starts
  its forward; there the compute stream waits for the copy and lets it go, so its memory is
  freed in stream order (not with `record_stream`, which keeps it out of reach while the host
  runs ahead of the GPU).
- prefetch (a hook on each block's output gradient, after FSDP's pre-backward): the next
  offloaded block is admitted while the device memory in use stays under the forward's peak
  (block j - 1 at the latest), and admitted tensors are copied back at a pace, so FSDP's small
  host-to-device copy is never queued behind a whole block's.
- unpack: the compute stream waits for the tensor's copy back (copied then and there if its
  prefetch never started).

On a CPU (tests) the copies are plain copies; fake tensors (the memory estimator) leave meta
stand-ins. The measurements behind these choices are in docs/performance.md.
"""

from __future__ import annotations

import functools
import weakref
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, is_fake

MIN_BYTES = 1 << 20
"""Smaller saved tensors (norm statistics, log-sum-exps, RoPE tables) stay where they are: each
copy costs a launch and an event, and they add little memory."""


@dataclass(eq=False)
class HostSlot:
    """A host buffer and the last copy that uses it (it is free for the next once that is done)."""

    buffer: torch.Tensor
    last_copy: torch.cuda.Event | None = None


class HostBufferPool:
    """Host buffers kept from step to step, by size (a step's activations have the same sizes
    every step). Pinning memory is slow and blocks the host, so allocating each step's pinned
    copies anew (as torch's caching host allocator did) costs host time every step."""

    def __init__(self) -> None:
        self._free: dict[int, list[HostSlot]] = defaultdict(list)
        self.allocated_bytes = 0
        """Bytes of host buffers made so far: they stop growing after the first step."""

    def take(self, nbytes: int, pin: bool) -> HostSlot:
        free = self._free[nbytes]
        if free:
            return free.pop()
        self.allocated_bytes += nbytes
        return HostSlot(torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin))

    def give(self, slot: HostSlot) -> None:
        self._free[slot.buffer.numel()].append(slot)


def storage_extent(t: torch.Tensor) -> int:
    """Elements from a tensor's first to its last element (its strides may leave gaps)."""
    return 0 if t.numel() == 0 else 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))


@dataclass(eq=False)
class DeviceCopy:
    """A prefetched tensor on its way back: it is the compute stream's once `stream` has waited
    for `copied_in` (at unpack, or when autograd drops it unused)."""

    tensor: torch.Tensor | None = None
    copied_in: torch.cuda.Event | None = None
    stream: torch.cuda.Stream | None = None

    def release(self) -> None:
        if self.tensor is not None and self.copied_in is not None:
            self.stream.wait_event(self.copied_in)
        self.tensor = self.copied_in = self.stream = None


def _drop_saved(pool: HostBufferPool, slot: HostSlot | None, back: DeviceCopy) -> None:
    """A saved tensor's record is gone (after its backward, or with its graph)."""
    back.release()
    if slot is not None:
        pool.give(slot)


@dataclass(eq=False)
class SavedActivation:
    """One offloaded tensor: its host copy, and its device copy once prefetched."""

    host: torch.Tensor
    device: torch.device
    copied_out: torch.cuda.Event | None
    slot: HostSlot | None
    """The pool buffer under `host` (None for the estimator's meta stand-ins)."""
    uses: int = 1
    """Pack calls that returned this record (one tensor saved by several ops); the device copy
    is dropped after as many unpacks."""
    back: DeviceCopy = field(default_factory=DeviceCopy)
    block: int = 0
    """The index of the block that saved it."""
    nbytes: int = 0
    """Device bytes its copy back allocates."""
    started: bool = False
    """Its copy back has been issued (by the pace, or by an unpack that got there first)."""


@dataclass(eq=False)
class BlockRecord:
    """What one forward of one offloaded block packed (one per micro-batch and block)."""

    saved: list[SavedActivation] = field(default_factory=list)
    by_key: dict[tuple, tuple[weakref.ref, SavedActivation]] = field(default_factory=dict)
    """A tensor saved twice is copied once. Keyed by address and layout, and checked against the
    tensor itself: once it is freed, a new tensor may get its address in the same block."""
    index: int = 0
    """The block's index among the model part's blocks."""
    copying_out: list[tuple[torch.Tensor, torch.cuda.Event]] = field(default_factory=list)
    """Device tensors held until their copy out is done (the module doc's release)."""

    @property
    def nbytes(self) -> int:
        """Device bytes copied out (what its prefetch will allocate)."""
        return sum(saved.nbytes for saved in self.saved)

    def release(self) -> None:
        for tensor, copied_out in self.copying_out:
            torch.cuda.current_stream(tensor.device).wait_event(copied_out)
        self.copying_out.clear()


@dataclass(eq=False)
class ForwardRecords:
    """The offloaded blocks of one forward (one micro-batch), in block order; each leaves the
    list when its prefetch starts."""

    records: list[BlockRecord] = field(default_factory=list)
    memory_in_use: Callable[[], int] | None = None
    """The probe of device bytes in use (None: prefetch at the fixed distance)."""
    budget: int = 0
    """Bytes in use at the end of this forward: prefetches stay under it (module doc)."""
    pace: int | None = None
    """Bytes of copies back to start per block of backward (None: all admitted ones at once)."""
    queue: deque[SavedActivation] = field(default_factory=deque)
    """Admitted tensors whose copies back are not issued yet, in the order the backward needs them."""
    queued_bytes: int = 0


class ActivationOffloader:
    """Offloads the saved tensors of `blocks[:count]` (one model part's blocks, in order)."""

    def __init__(self, blocks: list[nn.Module], count: int, min_bytes: int = MIN_BYTES) -> None:
        if not 0 <= count <= len(blocks):
            raise ValueError(f"offload_blocks={count} is not between 0 and the {len(blocks)} blocks of this model part")
        self.count = count
        self.min_bytes = min_bytes
        self.last = len(blocks) - 1
        self.distance = max(1, len(blocks) - count - 2)
        """Without a memory probe: blocks of backward between a block's prefetch and its own backward."""
        self.release_distance = max(1, len(blocks) - count - 1)
        """Blocks of forward between a block's copies out and the release of its device tensors."""
        self._copying_out: list[BlockRecord] = []
        self.copy_out: torch.cuda.Stream | None = None
        self.copy_in: torch.cuda.Stream | None = None
        self.pool = HostBufferPool()
        self.memory_in_use: Callable[[], int] | None = None
        """Device bytes in use now, for the prefetch budget. None: the CUDA allocator's count on a
        GPU, the fixed distance elsewhere; the memory estimator sets its tracker's count."""
        # The forward under way; each block's backward hook captures its forward's records, so
        # several micro-batches in flight stay apart.
        self._forward: ForwardRecords | None = None
        self._hooks: list[torch.autograd.graph.saved_tensors_hooks] = []
        self.packed_bytes = 0
        """Bytes copied out so far (tests and logs)."""
        self.late_copies = 0
        """Tensors copied back at unpack because no prefetch had started."""
        for index, block in enumerate(blocks):
            if index < count:
                block.register_forward_pre_hook(self._pre_forward_hook(index))
            block.register_forward_hook(self._post_forward_hook(index))

    # -- hooks around each block's forward ----------------------------------------------------------

    def _pre_forward_hook(self, index: int):
        @torch._dynamo.disable
        def pre_forward(_module, _args) -> None:
            while self._hooks:  # left by a forward that raised
                self._hooks.pop().__exit__(None, None, None)
            if index == 0:  # a new forward: nothing of the last one is held (one that raised)
                self._release_through(self.last)
            if not torch.is_grad_enabled():
                return
            if index == 0 or self._forward is None:
                self._forward = ForwardRecords()
            record = BlockRecord(index=index)
            self._forward.records.append(record)
            self._copying_out.append(record)
            hooks = torch.autograd.graph.saved_tensors_hooks(lambda t: self._pack(record, t), self._unpack)
            hooks.__enter__()
            self._hooks.append(hooks)

        return pre_forward

    def _post_forward_hook(self, index: int):
        @torch._dynamo.disable
        def post_forward(_module, _args, output) -> None:
            if index < self.count and self._hooks:
                self._hooks.pop().__exit__(None, None, None)
            # Before block index + 1 allocates: the copies of block index + 1 - R are let go.
            self._release_through(self.last if index == self.last else index + 1 - self.release_distance)
            forward = self._forward
            if forward is None or not (isinstance(output, torch.Tensor) and output.requires_grad):
                return
            if index == self.last:
                forward.memory_in_use = self._probe(output)
                if forward.memory_in_use is not None:
                    forward.budget = forward.memory_in_use()
                    total = sum(record.nbytes for record in forward.records)
                    forward.pace = -(-total // max(1, self.last - self.count))
                self._forward = None
            output.register_hook(lambda _grad: self._prefetch_at(forward, index))

        return post_forward

    def _probe(self, output: torch.Tensor) -> Callable[[], int] | None:
        if self.memory_in_use is not None:
            return self.memory_in_use
        if output.is_cuda and not is_fake(output):
            return functools.partial(torch.cuda.memory_allocated, output.device)
        return None

    def _release_through(self, index: int) -> None:
        """Let go of the device tensors of the offloaded blocks up to `index` (module doc)."""
        while self._copying_out and self._copying_out[0].index <= index:
            self._copying_out.pop(0).release()

    def _prefetch_at(self, forward: ForwardRecords, index: int) -> None:
        """The backward of block `index` begins: admit the blocks whose turn it is, then issue
        their copies back at the pace (module doc)."""
        records = forward.records
        while records:
            record = records[-1]
            if record.index < index - 1:  # not due yet: only if it fits
                if forward.memory_in_use is None:
                    if record.index < index - self.distance:
                        break
                elif forward.memory_in_use() + forward.queued_bytes + record.nbytes > forward.budget:
                    break
            self._admit(forward, records.pop())
        allowance = forward.pace
        queue = forward.queue
        while queue:
            saved = queue[0]
            due = saved.block >= index - 1
            if not due and allowance is not None and allowance <= 0:
                break
            queue.popleft()
            forward.queued_bytes -= saved.nbytes
            if not saved.started:
                self._copy_in(saved)
                if allowance is not None:
                    allowance -= saved.nbytes

    def _admit(self, forward: ForwardRecords, record: BlockRecord) -> None:
        """Queue a block's tensors for the copy back, newest first (its backward needs them so)."""
        for saved in reversed(record.saved):
            forward.queue.append(saved)
            forward.queued_bytes += saved.nbytes

    # -- pack / prefetch / unpack ---------------------------------------------------------------------

    def _pack(self, record: BlockRecord, t: torch.Tensor):
        # Plain tensors (fake ones in the estimator); parameters, other subclasses (DTensor,
        # float8) and small tensors are kept.
        if type(t) not in (torch.Tensor, FakeTensor) or t.numel() * t.element_size() < self.min_bytes:
            return t
        fake = is_fake(t)
        key = None if fake else (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
        if key in record.by_key:
            original, saved = record.by_key[key]
            if original() is t:
                saved.uses += 1
                return saved
        cuda = t.is_cuda and not fake
        nbytes = storage_extent(t) * t.element_size()
        event = slot = None
        if fake:
            # The estimator's fake tensors get a meta stand-in: host memory is not the device's.
            host = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
        else:
            slot = self.pool.take(nbytes, pin=cuda)
            host = slot.buffer.view(t.dtype).as_strided(t.shape, t.stride())
        if cuda:
            if self.copy_out is None:
                self.copy_out, self.copy_in = torch.cuda.Stream(t.device), torch.cuda.Stream(t.device)
            self.copy_out.wait_stream(torch.cuda.current_stream(t.device))
            if slot.last_copy is not None:  # the buffer's previous tensor has gone back
                self.copy_out.wait_event(slot.last_copy)
            with torch.cuda.stream(self.copy_out):
                host.copy_(t, non_blocking=True)
                event = torch.cuda.Event()
                event.record()
            record.copying_out.append((t, event))
            slot.last_copy = event
        elif not fake:
            host.copy_(t)
        saved = SavedActivation(host, t.device, event, slot, block=record.index, nbytes=nbytes)
        # Back to the pool when autograd lets go of the tensor (after its backward).
        weakref.finalize(saved, _drop_saved, self.pool, slot, saved.back)
        record.saved.append(saved)
        if key is not None:
            record.by_key[key] = (weakref.ref(t), saved)
        self.packed_bytes += t.numel() * t.element_size()
        return saved

    def _copy_in(self, saved: SavedActivation) -> None:
        saved.started = True
        host, back = saved.host, saved.back
        # Allocated on the compute stream, which uses and frees it.
        on_device = torch.empty_strided(host.shape, host.stride(), dtype=host.dtype, device=saved.device)
        if host.device.type == "meta":
            pass  # a fake tensor's stand-in: no values to copy
        elif saved.copied_out is None:
            on_device.copy_(host)
        else:
            back.stream = torch.cuda.current_stream(saved.device)
            self.copy_in.wait_stream(back.stream)  # the memory is free for the copy from here on
            self.copy_in.wait_event(saved.copied_out)
            with torch.cuda.stream(self.copy_in):
                on_device.copy_(host, non_blocking=True)
                back.copied_in = torch.cuda.Event()
                back.copied_in.record()
            saved.slot.last_copy = back.copied_in
        back.tensor = on_device

    def _unpack(self, saved):
        if isinstance(saved, torch.Tensor):
            return saved
        back = saved.back
        if back.tensor is None:
            self.late_copies += 1
            self._copy_in(saved)
        if back.copied_in is not None:
            torch.cuda.current_stream(saved.device).wait_event(back.copied_in)
            back.copied_in = None  # the compute stream's from here on
        t = back.tensor
        saved.uses -= 1
        if saved.uses <= 0:
            # Drop it so its memory goes with the backward's last use; a second backward over
            # the same graph (retain_graph) copies it in again.
            back.tensor, saved.uses = None, 1
        return t


def apply_activation_offloading(blocks: list[nn.Module], count: int) -> ActivationOffloader | None:
    """Offload the saved tensors of the first `count` of `blocks` (None when count is 0)."""
    return ActivationOffloader(blocks, count) if count > 0 else None
