"""Corrupted and crafted checkpoints: refused with a clear error, and loading never runs code from them."""

from __future__ import annotations

import json
import pathlib
import pickle

import pytest
import torch
import torch.distributed.checkpoint as dcp

from kenotron.checkpoint import MARKER_NAME, CheckpointFormatError
from kenotron.checkpoint.integrity import describe_files
from tests.checkpoint.tiny import make_run, run_layout


class _TouchOnLoad:
    """Unpickling this calls Path.touch(flag): what an attacker would replace with any command."""

    def __init__(self, flag: pathlib.Path) -> None:
        self.flag = flag

    def __reduce__(self):
        return (pathlib.Path.touch, (self.flag,))


def test_a_metadata_file_crafted_to_run_code_is_refused_without_running_it(tmp_path):
    run_layout("single", tmp_path, until=1, save_at=(1,))
    flag = tmp_path / "pwned"
    (tmp_path / "step-000001" / ".metadata").write_bytes(pickle.dumps(_TouchOnLoad(flag)))
    *_, manager, _, _ = make_run("single", tmp_path)
    with pytest.raises(CheckpointFormatError, match=r"\.metadata is not plain DCP metadata \(refusing to load "
                                                    r"pathlib.Path.touch.*crafted to run code"):
        manager.load()
    assert not flag.exists()


def test_a_value_crafted_to_run_code_is_refused_without_running_it(tmp_path):
    run_layout("single", tmp_path, until=1, save_at=(1,))
    *_, manager, _, _ = make_run("single", tmp_path / "x")
    state = {name: part.state_dict() for name, part in manager.parts.items()}
    flag = tmp_path / "pwned"
    key = next(k for k in state["optimizer"] if k.startswith("param_groups.") and k.endswith(".lr"))
    state["optimizer"][key] = _TouchOnLoad(flag)  # a plain value DCP would unpickle with weights_only=False
    dcp.save(state, checkpoint_id=str(tmp_path / "step-000001"), no_dist=True)
    marker_file = tmp_path / "step-000001" / MARKER_NAME  # the attacker fixes the recorded sizes too
    marker = json.loads(marker_file.read_text())
    marker_file.write_text(json.dumps({**marker, "files": describe_files(marker_file.parent, checksums=False)}))
    assert not flag.exists()
    *_, manager, _, _ = make_run("single", tmp_path)
    with pytest.raises(CheckpointFormatError, match=rf"entry 'optimizer.{key}' holds more than plain values .*crafted"):
        manager.load()
    assert not flag.exists()


def test_a_checkpoint_of_the_pickle_format_loads_its_model_and_optimizer_only_when_asked(tmp_path):
    run_layout("single", tmp_path, until=1, save_at=(1,))
    marker_file = tmp_path / "step-000001" / MARKER_NAME
    marker = json.loads(marker_file.read_text())
    marker_file.write_text(json.dumps({**marker, "format": "kenotron-dcp/1"}))
    *_, manager, _, _ = make_run("single", tmp_path)
    with pytest.raises(CheckpointFormatError, match=r"written by an earlier kenotron \(format kenotron-dcp/1\), which "
                                                    r"stored lr_scheduler, train_state as Python pickles.*add "
                                                    r"lr_scheduler,train_state to checkpoint.exclude_from_loading"):
        manager.load()
    *_, manager, _, _ = make_run("single", tmp_path, exclude_from_loading=["lr_scheduler", "train_state"])
    assert manager.load() == 1


def _overwrite_middle(file: pathlib.Path, payload: bytes) -> None:
    data = bytearray(file.read_bytes())
    middle = len(data) // 2
    data[middle:middle + len(payload)] = payload
    file.write_bytes(bytes(data))


def test_same_size_damage_is_caught_by_checksums(tmp_path):
    run_layout("single", tmp_path, until=1, save_at=(1,), checksums=True)
    data = next((tmp_path / "step-000001").glob("*.distcp"))
    _overwrite_middle(data, torch.full((64,), float("inf")).numpy().tobytes())
    *_, manager, _, _ = make_run("single", tmp_path, checksums=True)
    with pytest.raises(CheckpointFormatError, match=rf"is damaged: the content of {data.name} changed since it was "
                                                    rf"saved \(SHA-256 differs, same size\)"):
        manager.load()


def test_a_file_grown_after_the_save_is_named_even_without_checksums(tmp_path):
    run_layout("single", tmp_path, until=1, save_at=(1,))
    data = next((tmp_path / "step-000001").glob("*.distcp"))
    size = data.stat().st_size
    with open(data, "ab") as f:
        f.write(b"\0" * 100)
    *_, manager, _, _ = make_run("single", tmp_path)
    with pytest.raises(CheckpointFormatError, match=rf"file {data.name} has {size + 100} bytes but the save wrote "
                                                    rf"{size}"):
        manager.load()
