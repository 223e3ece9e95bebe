"""Hugging Face interop: logits of kenotron and of transformers' own LlamaForCausalLM agree (fp32,
random weights) after an import, an export, and the trip through a DCP checkpoint under FSDP x TP."""

from __future__ import annotations

import dataclasses
import json

import pytest
import safetensors.torch
import torch

from kenotron.checkpoint import CheckpointFormatError, CheckpointMismatchError
from kenotron.checkpoint.hf import (
    checkpoint_to_hf,
    hf_to_checkpoint,
    load_hf_model,
    load_hf_weights,
    save_hf,
)
from kenotron.models import get_model_spec
from kenotron.models.common.rope_scaling import RopeScaling
from kenotron.models.llama3 import Llama3Args
from tests.checkpoint.tiny import build_llama, make_run
from tests.distributed.pool import run_on_ranks

transformers = pytest.importorskip("transformers")
from tests.models.hf_parity import random_hf_model, random_kenotron_model

SPEC = get_model_spec("llama3")
SMALL = Llama3Args(
    dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96, vocab_size=128, rope_theta=500000.0,
    rope_scaling=RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_len=64),
    max_seq_len=32,
)
TOKENS = torch.randint(0, 128, (2, 32), generator=torch.Generator().manual_seed(0))
TOL = 1e-4


def hf_logits(model, tokens: torch.Tensor = TOKENS) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=tokens).logits


def our_logits(model, tokens: torch.Tensor = TOKENS) -> torch.Tensor:
    with torch.no_grad():
        return model(tokens)


@pytest.fixture(params=[False, True], ids=["untied", "tied"])
def hf_folder(request, tmp_path):
    """A random-weight transformers Llama saved with save_pretrained, and its logits."""
    args = dataclasses.replace(SMALL, tie_embeddings=request.param)
    model = random_hf_model(SPEC, args)
    model.save_pretrained(tmp_path / "hf")
    return tmp_path / "hf", hf_logits(model), args


def test_load_hf_model_gives_the_logits_of_transformers(hf_folder):
    folder, expected, args = hf_folder
    model = load_hf_model(folder, max_seq_len=32)
    assert model.args == args
    torch.testing.assert_close(our_logits(model), expected, atol=TOL, rtol=0)


@pytest.mark.parametrize("shard_bytes", [2**40, 20_000], ids=["one-file", "sharded"])
def test_exported_folder_loads_in_transformers_with_the_same_logits(tmp_path, shard_bytes):
    model = random_kenotron_model(SPEC, SMALL)
    save_hf(model, tmp_path / "out", max_shard_bytes=shard_bytes)
    assert (tmp_path / "out" / "model.safetensors.index.json").is_file() == (shard_bytes < 2**40)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out", attn_implementation="eager").float()
    torch.testing.assert_close(hf_logits(theirs), our_logits(model), atol=TOL, rtol=0)
    torch.testing.assert_close(our_logits(load_hf_model(tmp_path / "out")), our_logits(model), atol=0, rtol=0)


def _logits_under_fsdp_tp(hf_dir: str, args: Llama3Args, via_checkpoint: str) -> torch.Tensor:
    """Build the model under FSDP 2 x TP 2, fill it from the HF folder (directly, or from its DCP
    conversion through the manager), return the full logits."""
    model, *_ = build_llama(args, "fsdp_tp")
    if via_checkpoint:
        from kenotron.checkpoint import CheckpointManager
        from kenotron.config.sections import Checkpoint

        settings = Checkpoint(enable=True, initial_load_path=via_checkpoint)
        assert CheckpointManager(settings, hf_dir + "-run", model_parts=[model]).load() == 0
    else:
        load_hf_weights([model], hf_dir)
    with torch.no_grad():
        return model(TOKENS)


@pytest.mark.parametrize("route", ["load_hf_weights", "dcp_checkpoint"])
def test_hf_folder_imports_under_fsdp_x_tp_with_the_logits_of_transformers(tmp_path, route):
    args = SMALL
    model = random_hf_model(SPEC, args)
    model.save_pretrained(tmp_path / "hf")
    ckpt = str(hf_to_checkpoint(tmp_path / "hf", tmp_path / "ckpt", max_seq_len=32)) if route == "dcp_checkpoint" else ""
    logits = run_on_ranks(4, _logits_under_fsdp_tp, str(tmp_path / "hf"), args, ckpt)
    for rank_logits in logits:
        torch.testing.assert_close(rank_logits, hf_logits(model), atol=TOL, rtol=0)


def _save_hf_under_fsdp_tp(out_dir: str, args: Llama3Args) -> None:
    model, *_ = build_llama(args, "fsdp_tp")
    save_hf(model, out_dir)


def test_model_under_fsdp_x_tp_exports_to_transformers_with_the_same_logits(tmp_path):
    run_on_ranks(4, _save_hf_under_fsdp_tp, str(tmp_path / "out"), SMALL)
    reference, *_ = build_llama(SMALL, "single")  # init is layout-invariant: the same weights
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out", attn_implementation="eager").float()
    torch.testing.assert_close(hf_logits(theirs), our_logits(reference), atol=TOL, rtol=0)


def test_trainer_checkpoint_exports_to_transformers_in_bfloat16(tmp_path):
    model, *_, manager, _, _ = make_run("single", tmp_path / "run")
    checkpoint_to_hf(manager.save(5), tmp_path / "hf", dtype=torch.bfloat16)
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", attn_implementation="eager").float()
    with torch.no_grad():
        for p in model.parameters():  # the weights as exported
            p.copy_(p.to(torch.bfloat16).float())
    tokens = TOKENS[:, : model.args.max_seq_len]
    torch.testing.assert_close(hf_logits(theirs, tokens), our_logits(model, tokens), atol=TOL, rtol=0)


def test_weights_that_do_not_match_config_json_name_the_first_missing_parameter(hf_folder):
    folder, _, _ = hf_folder
    weights = safetensors.torch.load_file(folder / "model.safetensors")
    del weights["model.layers.1.input_layernorm.weight"]  # an incomplete file of the right layer count
    safetensors.torch.save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointMismatchError, match=r"has no weight for parameter 'layers.1.attention_norm.weight' "
                                                      r"\('model.layers.1.input_layernorm.weight'\)"):
        load_hf_model(folder)


def test_a_config_json_with_more_layers_than_its_weights_is_refused_before_building(hf_folder):
    folder, _, _ = hf_folder
    config = json.loads((folder / "config.json").read_text())
    config["num_hidden_layers"] = 3
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointMismatchError, match=r"config.json describes 3 layers but the weights hold 2"):
        load_hf_model(folder)


def test_unknown_model_type_lists_the_supported_ones(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(CheckpointFormatError, match=r"model_type='gpt2', which kenotron cannot convert; supported: .*llama \(llama3\)"):
        load_hf_model(tmp_path)


def test_folder_with_pytorch_bin_weights_asks_for_safetensors(hf_folder):
    folder, _, _ = hf_folder
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    with pytest.raises(CheckpointFormatError, match=r"found: pytorch_model.bin\); kenotron reads safetensors only"):
        load_hf_model(folder)


def _convert_hf_main():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "convert_hf.py"
    spec = importlib.util.spec_from_file_location("convert_hf", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def test_convert_hf_script_goes_both_ways_and_keeps_the_logits(hf_folder, tmp_path, capsys):
    folder, expected, _ = hf_folder
    main = _convert_hf_main()
    assert main(["to-kenotron", str(folder), str(tmp_path / "ckpt"), "--step", "7", "--max-seq-len", "32"]) == 0
    assert main(["to-hf", str(tmp_path / "ckpt" / "step-000007"), str(tmp_path / "back")]) == 0
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "back", attn_implementation="eager").float()
    torch.testing.assert_close(hf_logits(theirs), expected, atol=TOL, rtol=0)
    capsys.readouterr()
    assert main(["to-hf", str(tmp_path / "nowhere"), str(tmp_path / "x")]) == 2
    assert "kenotron convert: " in (err := capsys.readouterr().err) and "nowhere does not exist" in err


def test_exported_weights_are_readable_like_the_config_beside_them(tmp_path):
    # safetensors creates its files 0600: an export shared with another user could not be read.
    pytest.importorskip("safetensors")
    import stat

    from kenotron.checkpoint.hf_files import write_hf_folder

    out = write_hf_folder(tmp_path / "hf", {"model_type": "llama"}, {"w": torch.zeros(4), "v": torch.ones(3)},
                          max_shard_bytes=16)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()}
    assert len(set(modes.values())) == 1, modes
