"""The JSON parts of a checkpoint (kenotron/checkpoint/state.py): a state JSON cannot store is
refused when the run starts, naming the field, not at the first save (issue 35, item 8b)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kenotron.checkpoint import CheckpointManager
from kenotron.checkpoint.state import unstorable_field
from kenotron.config.sections import Checkpoint
from kenotron.errors import DataError
from tests.checkpoint.tiny import build_model


class LoaderWithState:
    """A custom loader's state protocol, holding whatever state it is given."""

    def __init__(self, state):
        self.state = state

    def state_dict(self):
        return self.state

    def load_state_dict(self, state):
        self.state = state


def manager_with_loader(folder, state, enable=True):
    model, _, _ = build_model("single")
    return CheckpointManager(Checkpoint(enable=enable), folder, model_parts=[model],
                             optimizers=[torch.optim.AdamW(model.parameters())], dataloader=LoaderWithState(state))


@pytest.mark.parametrize("state, field", [
    ({"position": 3, "seen": {1, 2}}, r"state\['seen'\] is a set"),
    ({"files": [{"name": b"shard-0"}]}, r"state\['files'\]\[0\]\['name'\] is a bytes"),
    ({"by_rank": {0: 5}}, r"state\['by_rank'\] has key 0 \(int\): JSON turns it into \"0\""),
])
def test_a_loader_state_json_cannot_store_is_refused_at_start_naming_the_field(tmp_path, state, field):
    with pytest.raises(DataError, match=rf"^the dataloader state cannot be stored in a checkpoint: {field}; .*"
                                        r"a custom data.loader's state_dict\(\) must hold only these$") as err:
        manager_with_loader(tmp_path, state)
    assert "\n" not in str(err.value)


def test_a_storable_loader_state_saves_and_comes_back(tmp_path):
    state = {"position": 3, "files": ["a", "b"], "weights": np.array([0.5, 0.25]), "done": None, "pair": (1, 2.5)}
    manager = manager_with_loader(tmp_path, state)
    manager.save(1)
    manager.close()
    loader = LoaderWithState({})
    model, _, _ = build_model("single")
    CheckpointManager(Checkpoint(enable=True), tmp_path, model_parts=[model], dataloader=loader).load()
    assert loader.state == {"position": 3, "files": ["a", "b"], "weights": [0.5, 0.25], "done": None, "pair": [1, 2.5]}


def test_without_checkpoints_any_loader_state_is_accepted(tmp_path):
    manager_with_loader(tmp_path, {"seen": {1, 2}}, enable=False)


def test_unstorable_field_accepts_what_json_keeps_and_names_the_rest():
    assert unstorable_field({"a": [1, 2.0, "x", None, True, np.int64(3)]}) is None
    assert unstorable_field([{"a": object()}]) == "state[0]['a'] is an object"
