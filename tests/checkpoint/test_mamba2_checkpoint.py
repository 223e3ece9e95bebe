"""Mamba-2 through kenotron's HF interop: a transformers folder loads with its logits
(`load_hf_model`), converts to a DCP checkpoint and back with scripts/convert_hf.py into a folder
transformers loads with the same logits; a checkpoint of another family is refused by name."""

from __future__ import annotations

import pytest
import torch

from kenotron.checkpoint import CheckpointManager
from kenotron.checkpoint.errors import CheckpointMismatchError
from kenotron.checkpoint.hf import load_hf_model
from kenotron.checkpoint.model_info import describe_model
from kenotron.config.sections import Checkpoint
from kenotron.models import get_model_spec
from kenotron.models.mamba2 import Mamba2Args
from scripts.convert_hf import main as convert_hf
from tests.checkpoint.tiny import build_model, tiny_args
from tests.models.hf_parity import needs_grouped_mamba2_norm, random_hf_model

transformers = pytest.importorskip("transformers")

SPEC = get_model_spec("mamba2")
SMALL = Mamba2Args(dim=64, n_layers=2, vocab_size=128, ssm_state=16, ssm_head_dim=16, ssm_groups=2, chunk_size=16,
                   max_seq_len=32)
TOKENS = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(0))


def hf_logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=TOKENS).logits


@needs_grouped_mamba2_norm
def test_hf_folder_loads_and_round_trips_through_a_kenotron_checkpoint(tmp_path):
    theirs = random_hf_model(SPEC, SMALL)
    theirs.save_pretrained(tmp_path / "hf")
    ours = load_hf_model(tmp_path / "hf", max_seq_len=32)
    assert ours.args == SMALL
    with torch.no_grad():
        torch.testing.assert_close(ours(TOKENS), hf_logits(theirs), atol=1e-4, rtol=0)

    assert convert_hf(["to-kenotron", str(tmp_path / "hf"), str(tmp_path / "ckpt")]) == 0
    assert convert_hf(["to-hf", str(tmp_path / "ckpt" / "step-000000"), str(tmp_path / "back")]) == 0
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "back").float()
    torch.testing.assert_close(hf_logits(back), hf_logits(theirs), atol=1e-5, rtol=0)


def test_a_checkpoint_of_another_family_is_refused_by_name(tmp_path):
    random_hf_model(SPEC, SMALL).save_pretrained(tmp_path / "hf")
    assert convert_hf(["to-kenotron", str(tmp_path / "hf"), str(tmp_path / "ckpt")]) == 0
    llama, *_ = build_model("single")
    settings = Checkpoint(enable=True, initial_load_path=str(tmp_path / "ckpt" / "step-000000"))
    manager = CheckpointManager(settings, tmp_path / "run", model_parts=[llama],
                                model_info=describe_model(get_model_spec("llama3"), tiny_args(), "debug"))
    with pytest.raises(CheckpointMismatchError, match="holds a mamba2 model but this run builds llama3; set "
                                                      "model.name = 'mamba2'"):
        manager.load()
