"""The joined-up path: a training run -> `kenotron convert to-hf RUN` (weights streamed one file at a
time, the run's tokenizer, generation_config.json) -> transformers and `kenotron generate`."""

from __future__ import annotations

import json

import pytest

from kenotron.cli import main as kenotron
from kenotron.data import build_tokenizer
from tests.checkpoint.test_trainer_resume import train

TEXTS = [
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "The quick brown fox's 123456 jumps   over\t\tthe lazy dog.\r\n\n",
    "Unicode: naïve café — 東京 🙂 and more",
]


@pytest.fixture(scope="module")
def run_and_hf(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("run_to_hf")
    run = tmp / "run"
    train(str(run), ["--checkpoint.enable", "true"])  # 4 steps, checkpoints at 2 and 4
    hf = tmp / "hf"
    # A tiny shard size: the weights are written as several files, one at a time.
    assert kenotron(["convert", "to-hf", str(run), str(hf), "--max-shard-gb", str(64 * 1024 / 2**30)]) == 0
    return run, hf


def test_to_hf_writes_the_runs_tokenizer_and_its_bos_eos(run_and_hf):
    _, hf = run_and_hf
    ours = build_tokenizer("")
    generation = json.loads((hf / "generation_config.json").read_text())
    assert (generation["bos_token_id"], generation["eos_token_id"]) == (ours.bos_id, ours.eos_id)
    config = json.loads((hf / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"]) == (ours.bos_id, ours.eos_id)
    assert (hf / "tokenizer.model").read_bytes() == ours.path.read_bytes()
    assert len(list(hf.glob("model-*-of-*.safetensors"))) > 1


def test_the_written_tokenizer_json_encodes_like_kenotron_in_tokenizers_and_transformers(run_and_hf):
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    _, hf = run_and_hf
    ours = build_tokenizer("")
    theirs = tokenizers.Tokenizer.from_file(str(hf / "tokenizer.json"))
    auto = transformers.AutoTokenizer.from_pretrained(hf)
    for text in TEXTS:
        expected = [ours.bos_id, *ours.encode(text)]
        assert theirs.encode(text).ids == expected
        assert auto(text)["input_ids"] == expected
        assert auto.decode(expected[1:]) == text


def test_generation_from_the_run_and_from_its_hf_folder_agree(run_and_hf, capsys):
    run, hf = run_and_hf
    common = ["--prompt", "def f(x):", "--max-new-tokens", "6", "--device", "cpu", "--ignore-eos"]
    assert kenotron(["generate", "--run", str(run), *common]) == 0
    from_run = capsys.readouterr().out
    assert kenotron(["generate", "--hf", str(hf), *common]) == 0
    assert capsys.readouterr().out == from_run
    assert kenotron(["generate", "--run", str(run / "checkpoints"), *common]) == 0  # the checkpoints/ folder too
    assert capsys.readouterr().out == from_run


def test_to_hf_streams_one_shard_at_a_time(run_and_hf, tmp_path, monkeypatch):
    import torch.distributed.checkpoint as dcp

    run, _ = run_and_hf
    loaded: list[int] = []
    real_load = dcp.load

    def counting_load(state, **kwargs):
        loaded.append(sum(t.numel() for t in state["model"].values()))
        return real_load(state, **kwargs)

    monkeypatch.setattr(dcp, "load", counting_load)
    out = tmp_path / "hf"
    assert kenotron(["convert", "to-hf", str(run), str(out), "--max-shard-gb", str(64 * 1024 / 2**30),
                     "--no-tokenizer"]) == 0
    files = sorted(out.glob("model-*.safetensors"))
    assert len(loaded) == len(files) > 1
    assert max(loaded) < sum(loaded) / 2  # no call holds the whole model


def test_hf_folder_without_a_tokenizer_is_named(run_and_hf, tmp_path, capsys):
    run, _ = run_and_hf
    assert kenotron(["convert", "to-hf", str(run), str(tmp_path / "bare"), "--no-tokenizer"]) == 0
    capsys.readouterr()
    assert kenotron(["generate", "--hf", str(tmp_path / "bare"), "--prompt", "a", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "has no tokenizer.json or tokenizer.model; pass --tokenizer FILE" in err
