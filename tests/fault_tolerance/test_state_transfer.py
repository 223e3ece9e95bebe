"""A recovering replica group's rank takes a live rank's local shards (model, optimizer state,
schedule, step) through a pickled copy, as torchft's HTTP transport sends them, and ends with
exactly the sender's state in its own FSDP layout, optimizer state created on the way."""

from __future__ import annotations

import io

import torch

from kenotron.dtensor import local_tensor
from kenotron.fault_tolerance.state_transfer import load_local_state, local_state
from tests.checkpoint.tiny import make_run, train_step
from tests.distributed.pool import run_on_ranks


def _flat_local(parts) -> dict[str, object]:
    out = {}
    for name, part in parts.items():
        for key, value in part.state_dict().items():
            out[f"{name}.{key}"] = local_tensor(value).clone() if isinstance(value, torch.Tensor) else value
    return out


def _send_and_recover(sender_folder: str, receiver_folder: str) -> list[str]:
    model, optimizer, scheduler, state, manager, dp_rank, dp_size = make_run("fsdp", sender_folder)
    for step in (1, 2):
        train_step(model, optimizer, step, dp_rank, dp_size)
        scheduler.step()
        state.step = step
    wire = io.BytesIO()
    torch.save(local_state(manager.parts), wire)  # what the transport pickles
    sent = _flat_local(manager.parts)

    fresh = make_run("fsdp", receiver_folder)  # a restarted group: same init, no optimizer state yet
    receiver = fresh[4]
    assert not fresh[1].state, "the receiver starts without optimizer state"
    wire.seek(0)
    load_local_state(receiver.parts, torch.load(wire, weights_only=False))
    got = _flat_local(receiver.parts)
    differ = [k for k in sent if not (torch.equal(sent[k], got[k]) if isinstance(sent[k], torch.Tensor)
                                      else sent[k] == got[k])]
    assert set(got) == set(sent), sorted(set(got) ^ set(sent))
    assert fresh[3].step == 2 and fresh[2].last_epoch == scheduler.last_epoch
    manager.close()
    receiver.close()
    return differ


def test_a_recovering_rank_ends_with_the_senders_fsdp_shards_and_optimizer_state(tmp_path):
    differ = run_on_ranks(2, _send_and_recover, str(tmp_path / "a"), str(tmp_path / "b"))
    assert differ == [[], []]
