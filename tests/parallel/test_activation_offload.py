"""Activation offloading moves memory, never results: the offloaded model gives the loss and the
gradients of the plain one bit for bit, eager and compiled, over steps that reuse the host
buffers, with several micro-batches in flight, and every offloaded tensor is back on its device
before its backward asks for it (no late copies). That the device memory goes is checked on fake tensors by the estimator's tests
(tests/estimate/test_memory.py) and on a GPU below."""

from __future__ import annotations

import copy

import pytest
import torch

from kenotron.models.llama3.args import Llama3Args
from kenotron.models.llama3.model import Llama3
from kenotron.parallel.activation_offload import ActivationOffloader
from tests.compile_alone import compiled_alone

ARGS = Llama3Args(dim=64, n_layers=4, n_heads=4, n_kv_heads=2, ffn_dim=160, vocab_size=256)


def _model(device: str = "cpu", args: Llama3Args = ARGS) -> Llama3:
    with torch.device(device):
        model = Llama3(args)
    model.init_weights(seed=0)
    return model


def _tokens(seed: int, device: str = "cpu", seq: int = 33) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, ARGS.vocab_size, (2, seq), generator=g).to(device)


def _loss(model: Llama3, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1])
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())


def _grads(model: Llama3) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name, value in a.items():
        assert torch.equal(value, b[name]), name


@pytest.mark.parametrize("count", [1, 2, 3, 4])
def test_offloaded_blocks_give_the_loss_and_gradients_of_the_plain_model_with_no_late_copy(count):
    reference = _model()
    offloaded = copy.deepcopy(reference)
    offloader = ActivationOffloader(list(offloaded.layers.values()), count, min_bytes=0)
    tokens = _tokens(1)
    loss = _loss(reference, tokens)
    loss.backward()
    offloaded_loss = _loss(offloaded, tokens)
    assert offloader.packed_bytes > 0
    offloaded_loss.backward()
    assert torch.equal(offloaded_loss, loss)
    _assert_same(_grads(offloaded), _grads(reference))
    assert offloader.late_copies == 0  # every block's tensors were prefetched by a later block's backward


class RecordingOffloader(ActivationOffloader):
    """Notes which saved tensors it moved and which it kept."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.moved: list[torch.Tensor] = []
        self.kept: list[torch.Tensor] = []

    def _pack(self, record, t):
        packed = super()._pack(record, t)
        (self.kept if packed is t else self.moved).append(t)
        return packed


def test_activations_are_moved_and_parameters_kept_and_more_blocks_move_more():
    packed = []
    for count in (1, 2, 4):
        model = _model()
        offloader = RecordingOffloader(list(model.layers.values()), count, min_bytes=0)
        _loss(model, _tokens(2)).backward()
        packed.append(offloader.packed_bytes)
        params = list(model.parameters())
        assert offloader.moved and not any(isinstance(t, torch.nn.Parameter) for t in offloader.moved)
        assert any(t is p for t in offloader.kept for p in params)  # the matmuls saved their weights
    assert packed[0] < packed[1] < packed[2]


def test_micro_batches_in_flight_keep_their_own_tensors():
    # Two forwards before either backward (as a pipeline stage runs them), the second's first.
    reference = _model()
    offloaded = copy.deepcopy(reference)
    offloader = ActivationOffloader(list(offloaded.layers.values()), 2, min_bytes=0)
    for model in (reference, offloaded):
        first, second = _loss(model, _tokens(3)), _loss(model, _tokens(4))
        second.backward()
        first.backward()
    _assert_same(_grads(offloaded), _grads(reference))
    assert offloader.late_copies == 0


def test_host_buffers_are_made_in_the_first_step_and_reused_after():
    # Also what caught a tensor taking a freed one's address within a block: the copy-once
    # check compares the tensor itself, not only its address.
    reference = _model()
    offloaded = copy.deepcopy(reference)
    offloader = ActivationOffloader(list(offloaded.layers.values()), 2, min_bytes=0)
    allocated = []
    for step in range(3):
        for model in (reference, offloaded):
            model.zero_grad(set_to_none=True)
            _loss(model, _tokens(10 + step)).backward()
        _assert_same(_grads(offloaded), _grads(reference))
        allocated.append(offloader.pool.allocated_bytes)
    assert allocated[0] > 0 and allocated[1] == allocated[2] == allocated[0]


def test_small_tensors_and_no_grad_forwards_are_left_alone():
    model = _model()
    offloader = ActivationOffloader(list(model.layers.values()), 4)  # 1 MiB: larger than anything here
    _loss(model, _tokens(5)).backward()
    assert offloader.packed_bytes == 0
    model = _model()
    offloader = ActivationOffloader(list(model.layers.values()), 4, min_bytes=0)
    with torch.no_grad():
        _loss(model, _tokens(5))
    assert offloader.packed_bytes == 0
    _loss(model, _tokens(5))
    assert offloader.packed_bytes > 0  # the same offloader moves them when grad is on


@pytest.mark.parametrize("count", [1, 2, 3, 4])
def test_copied_out_tensors_are_held_until_block_plus_release_distance_and_none_past_the_forward(count):
    # Held: block k's device tensors until block k + R starts, R = blocks - N - 1 (at least 1):
    # as late as keeps the end of the forward, the peak, free of them (module doc).
    model = _model(args=Llama3Args(dim=64, n_layers=6, n_heads=4, n_kv_heads=2, ffn_dim=160, vocab_size=256))
    blocks = list(model.layers.values())
    offloader = ActivationOffloader(blocks, count, min_bytes=0)
    held_at: dict[int, list[int]] = {}  # at the start of each block, its own record just made
    for index, block in enumerate(blocks):
        block.register_forward_pre_hook(
            lambda _m, _a, index=index: held_at.__setitem__(index, [r.index for r in offloader._copying_out])
        )
    loss = _loss(model, _tokens(6))
    distance = max(1, len(blocks) - count - 1)
    assert offloader.release_distance == distance
    for index, held in held_at.items():
        assert held == [k for k in range(count) if index - distance < k <= index], (index, held)
    assert offloader._copying_out == []  # the forward's end: every copy out has been let go
    loss.backward()


def test_count_outside_the_blocks_is_refused():
    with pytest.raises(ValueError, match=r"offload_blocks=5 is not between 0 and the 4 blocks"):
        ActivationOffloader(list(_model().layers.values()), 5)


def _compiled_losses_and_gradients_without_and_with_the_offloader() -> dict:
    model = _model()
    for block in model.layers.values():
        block.compile(fullgraph=True)
    tokens = _tokens(6)
    loss = _loss(model, tokens)
    loss.backward()
    reference = _grads(model)
    model.zero_grad(set_to_none=True)
    # The same compiled blocks, hooks added: nothing recompiles, the runtime packs.
    offloader = ActivationOffloader(list(model.layers.values()), 2, min_bytes=0)
    offloaded_loss = _loss(model, tokens)
    packed_bytes = offloader.packed_bytes  # before the backward, which brings them back
    offloaded_loss.backward()
    return {"loss": loss.detach(), "grads": reference, "packed_bytes": packed_bytes,
            "offloaded_loss": offloaded_loss.detach(), "offloaded_grads": _grads(model),
            "late_copies": offloader.late_copies}


def test_compiled_blocks_hand_their_saved_tensors_to_the_offloader():
    # Inductor's scalar C++ kernels in a process of their own (tests/compile_alone.py): the same
    # graphs, half the g++ time on a cold cache.
    run = compiled_alone(_compiled_losses_and_gradients_without_and_with_the_offloader)
    assert run["packed_bytes"] > 0
    assert torch.equal(run["offloaded_loss"], run["loss"])
    _assert_same(run["offloaded_grads"], run["grads"])
    assert run["late_copies"] == 0


class SchedulingOffloader(ActivationOffloader):
    """Notes, per offloaded block, the block whose backward was beginning when it was admitted
    for the copy back and when each of its tensors' copies was issued."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.admitted_at: dict[int, int] = {}
        self.issued_at: dict[int, list[int]] = {}
        self._beginning = -1

    def _prefetch_at(self, forward, index):
        self._beginning = index
        super()._prefetch_at(forward, index)

    def _admit(self, forward, record):
        self.admitted_at[record.index] = self._beginning
        super()._admit(forward, record)

    def _copy_in(self, saved):
        self.issued_at.setdefault(saved.block, []).append(self._beginning)
        super()._copy_in(saved)


def _scheduled(count: int, probe=None) -> SchedulingOffloader:
    args = Llama3Args(dim=64, n_layers=6, n_heads=4, n_kv_heads=2, ffn_dim=160, vocab_size=256)
    reference = _model(args=args)
    model = copy.deepcopy(reference)
    offloader = SchedulingOffloader(list(model.layers.values()), count, min_bytes=0)
    offloader.memory_in_use = probe
    for m in (reference, model):
        _loss(m, _tokens(8)).backward()
    _assert_same(_grads(model), _grads(reference))
    assert offloader.late_copies == 0
    # Every tensor of block k is on its way back by the time block k + 1's backward begins.
    assert all(min(blocks) >= k + 1 for k, blocks in offloader.issued_at.items())
    return offloader


def test_without_a_memory_probe_block_k_goes_back_when_block_k_plus_distance_begins_its_backward():
    offloader = _scheduled(2)  # 6 blocks: D = 6 - 2 - 2 = 2; all of a block's copies at once
    assert offloader.admitted_at == {1: 3, 0: 2}
    assert {k: set(blocks) for k, blocks in offloader.issued_at.items()} == {1: {3}, 0: {2}}


def test_with_no_room_under_the_forward_peak_each_block_goes_back_one_block_ahead():
    offloader = _scheduled(3, probe=lambda: 100)  # the end of the forward's level: no room
    assert offloader.admitted_at == {2: 3, 1: 2, 0: 1}
    assert {k: set(blocks) for k, blocks in offloader.issued_at.items()} == {2: {3}, 1: {2}, 0: {1}}


def test_with_room_every_block_is_admitted_at_once_and_its_copies_are_spread_at_the_pace():
    level = [1 << 40]

    def probe() -> int:  # the end of the forward's level first, then all that back in free room
        in_use, level[0] = level[0], 0
        return in_use

    offloader = _scheduled(3, probe=probe)
    assert offloader.admitted_at == {2: 5, 1: 5, 0: 5}
    # The pace is the offloaded bytes over blocks - N - 1 = 2 blocks of backward: a block and a
    # half's copies per block, newest block first, so block 0's start one block later.
    issued = offloader.issued_at
    assert set(issued[2]) == {5} and min(issued[0]) == 4 and max(issued[1]) <= 5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_offload_lowers_peak_memory_and_keeps_gradients():
    args = Llama3Args(dim=512, n_layers=6, n_heads=8, n_kv_heads=4, ffn_dim=1536, vocab_size=256, max_seq_len=2048)
    tokens = _tokens(7, "cuda", seq=2049)
    peaks, reserved, grads = [], [], []
    for count in (0, 3):
        model = _model("cuda", args)
        offloader = ActivationOffloader(list(model.layers.values()), count) if count else None
        for _step in range(2):  # the second step reuses the host buffers and the cached memory
            model.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            base, base_reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
            _loss(model, tokens).backward()
            torch.cuda.synchronize()
        peaks.append(torch.cuda.max_memory_allocated() - base)
        reserved.append(torch.cuda.max_memory_reserved() - base_reserved)
        grads.append(_grads(model))
        if offloader is not None:
            assert offloader.packed_bytes > 0 and offloader.late_copies == 0
        del model, offloader
    _assert_same(grads[1], grads[0])
    assert peaks[1] < 0.8 * peaks[0], peaks
    # Reserved memory falls too: freed device tensors are reusable at once (no record_stream).
    assert reserved[1] < 0.9 * reserved[0], reserved
