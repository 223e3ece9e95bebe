"""Models to generate from: Hugging Face folders (single and sharded safetensors) and kenotron
checkpoint step folders, and `kenotron generate` (kenotron/generate/cli.py) end to end on each source."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from kenotron.checkpoint import CheckpointFormatError
from kenotron.generate import generate, load_checkpoint_model, load_hf_model
from kenotron.models import get_model_spec
from kenotron.models.qwen3 import Qwen3Args
from tests.models.hf_parity import random_kenotron_model

ARGS = Qwen3Args(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, ffn_dim=96, vocab_size=128,
                 tie_embeddings=True, max_seq_len=64)


def write_hf_folder(folder: Path, model: torch.nn.Module, args, shards: int = 1) -> None:
    """config.json + safetensors (one file, or `shards` files with an index) from a kenotron model."""
    from safetensors.torch import save_file

    adapter = get_model_spec("qwen3").hf_adapter
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(adapter.hf_config_from_args(args)))
    hf_state = {k: v.contiguous() for k, v in adapter.to_hf(model.state_dict(), args).items()}
    if shards == 1:
        save_file(hf_state, str(folder / "model.safetensors"))
        return
    keys = sorted(hf_state)
    weight_map = {}
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = keys[i::shards]
        save_file({k: hf_state[k] for k in part}, str(folder / name))
        weight_map.update(dict.fromkeys(part, name))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


@pytest.mark.parametrize("shards", [1, 3], ids=["single_file", "sharded"])
def test_hf_folder_loads_into_the_same_model(tmp_path, shards):
    pytest.importorskip("safetensors")
    model = random_kenotron_model(get_model_spec("qwen3"), ARGS)
    write_hf_folder(tmp_path, model, ARGS, shards)
    loaded = load_hf_model(tmp_path, max_seq_len=32)
    assert loaded.output.weight is loaded.tok_embeddings.weight
    tokens = torch.randint(0, 128, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens), model(tokens), rtol=0, atol=1e-5)


def test_a_folder_saved_by_transformers_generates_like_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    from tests.models.hf_parity import random_hf_model

    theirs = random_hf_model(get_model_spec("qwen3"), ARGS, seed=2)
    theirs.save_pretrained(tmp_path)
    ours = load_hf_model(tmp_path, max_seq_len=64)
    prompt = torch.tensor([[3, 14, 15, 92, 65]])
    expected = theirs.generate(prompt, max_new_tokens=10, do_sample=False, pad_token_id=0, eos_token_id=None)
    assert generate(ours, prompt.tolist(), max_new_tokens=10) == [expected[0, 5:].tolist()]
    assert transformers is not None


def test_a_kenotron_checkpoint_loads_the_model_it_records(tmp_path):
    pytest.importorskip("safetensors")
    from kenotron.checkpoint.hf import hf_to_checkpoint

    model = random_kenotron_model(get_model_spec("qwen3"), ARGS)
    write_hf_folder(tmp_path / "hf", model, ARGS)
    step_folder = hf_to_checkpoint(tmp_path / "hf", tmp_path / "ckpt")
    loaded = load_checkpoint_model(step_folder, max_seq_len=32)
    assert loaded.args == dataclasses.replace(ARGS, max_seq_len=32)
    assert loaded.output.weight is loaded.tok_embeddings.weight
    tokens = torch.randint(0, 128, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens), model(tokens), rtol=0, atol=1e-5)


def test_a_folder_of_an_unknown_family_is_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(CheckpointFormatError, match="model_type='gpt2'"):
        load_hf_model(tmp_path)


def load_script():
    from kenotron.generate import cli

    return cli


def test_script_generates_from_an_hf_folder_a_checkpoint_and_a_flavor(tmp_path, capsys):
    pytest.importorskip("safetensors")
    script = load_script()
    model = random_kenotron_model(get_model_spec("qwen3"), ARGS)
    write_hf_folder(tmp_path, model, ARGS)
    argv = ["--hf", str(tmp_path), "--prompt-ids", "1 2 3", "--prompt-ids", "9", "--max-new-tokens", "6",
            "--device", "cpu"]
    outputs = script.main(argv)
    assert outputs == generate(load_hf_model(tmp_path, max_seq_len=9), [[1, 2, 3], [9]], max_new_tokens=6)
    assert script.main([*argv, "--no-cache"]) == outputs
    from kenotron.checkpoint.hf import hf_to_checkpoint

    step_folder = hf_to_checkpoint(tmp_path, tmp_path / "ckpt")
    assert script.main(["--checkpoint", str(step_folder), *argv[2:]]) == outputs
    text = script.main(["--model", "llama3", "--flavor", "debug", "--prompt", "def f(x):", "--max-new-tokens", "4",
                        "--temperature", "0.8", "--top-p", "0.9", "--device", "cpu"])
    assert len(text) == 1 and len(text[0]) <= 4
    assert "def f(x):" in capsys.readouterr().out


def test_script_refuses_ambiguous_sources():
    script = load_script()
    with pytest.raises(SystemExit):
        script.parse_args(["--hf", "x", "--model", "llama3", "--prompt", "a"])
    with pytest.raises(SystemExit):
        script.parse_args(["--checkpoint", "x", "--model", "llama3", "--prompt", "a"])
    with pytest.raises(SystemExit):
        script.parse_args(["--model", "llama3"])


def test_script_reads_text_prompts_with_the_folders_tokenizer_json(tmp_path, capsys):
    pytest.importorskip("safetensors")
    tokenizers = pytest.importorskip("tokenizers")
    script = load_script()
    write_hf_folder(tmp_path, random_kenotron_model(get_model_spec("qwen3"), ARGS), ARGS)
    vocab = {f"w{i}": i for i in range(128)}
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="w0"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    outputs = script.main(["--hf", str(tmp_path), "--prompt", "w5 w6 w7", "--max-new-tokens", "5", "--device", "cpu"])
    assert outputs == generate(load_hf_model(tmp_path, max_seq_len=8), [[5, 6, 7]], max_new_tokens=5)
    assert "--- [0] 'w5 w6 w7'" in capsys.readouterr().out
