"""`kenotron generate`'s output: one prompt's tokens appear as they are sampled, an interrupt
(Ctrl-C or SIGTERM) keeps what was made, and a request past the model's trained length is
warned about."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from kenotron.data import build_tokenizer
from kenotron.generate import cli
from kenotron.models import get_model_spec
from tests.ahead import Lane
from tests.generate.test_loading import ARGS, write_hf_folder
from tests.models.hf_parity import random_kenotron_model

ROOT = Path(__file__).resolve().parents[2]


def test_one_prompt_streams_its_text_token_by_token(capsys):
    codec = build_tokenizer("")
    tokens = codec.encode("def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)  # héllo")
    printer = cli.TokenPrinter(codec, batch=1, stream=True, eos_id=None)
    shown = ""
    for i, token in enumerate(tokens):
        printer([token])
        shown += capsys.readouterr().out
        # What is on the screen is the text of the tokens so far, but for a character still incomplete.
        assert codec.decode(tokens[: i + 1]).startswith(shown)
    assert shown == codec.decode(tokens)


def test_ids_stream_as_they_come_and_stop_at_eos(capsys):
    printer = cli.TokenPrinter(None, batch=2, stream=True, eos_id=7)
    printer([3, 4])
    assert capsys.readouterr().out == "3 "
    printer([7, 5])
    printer([9, 7])  # the first prompt has finished: nothing more is shown for it
    assert capsys.readouterr().out == ""
    assert printer.tokens == [[3], [4, 5]]


def test_an_interrupt_keeps_the_tokens_made_and_exits_130(monkeypatch, capsys):
    def interrupted(*args, on_tokens, **kwargs):
        for token in (11, 12, 13):
            on_tokens([token])
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "generate", interrupted)
    code = cli.run(["--model", "llama3", "--flavor", "debug", "--prompt-ids", "1 2", "--max-new-tokens", "100",
                    "--device", "cpu"])
    captured = capsys.readouterr()
    assert code == 130
    assert "11 12 13" in captured.out
    assert captured.err.strip().splitlines()[-1] == ("kenotron generate: interrupted after 3 new tokens; the text "
                                                     "above is what was made")


def sigterm_mid_generation(folder: Path, lane: Lane) -> tuple[str, str, str, str, int]:
    """The `run_ahead` job (tests/ahead.py): `kenotron generate` of 100000 tokens in a process of
    its own (seconds of imports), read as it prints until 5 ids have come, then sent SIGTERM. Gives
    its first line, the ids read, the rest of its output, its stderr and its exit code."""
    proc = lane.start(
        [sys.executable, "-m", "kenotron.cli", "generate", "--model", "llama3", "--flavor", "debug", "--prompt-ids",
         "1", "--max-new-tokens", "100000", "--ignore-eos", "--device", "cpu"],
        cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)},
    )
    first = proc.stdout.readline()  # the prompt's header, then ids as they come
    seen = ""
    if first.startswith("--- [0] '1'"):
        deadline = time.monotonic() + 120
        while len(seen.split()) < 5 and time.monotonic() < deadline:
            seen += proc.stdout.read(1)
    proc.send_signal(signal.SIGTERM)
    out, err = lane.wait(proc, 60)
    return first, seen, out, err, proc.returncode


@pytest.mark.run_ahead(job=sigterm_mid_generation)
def test_sigterm_ends_a_long_generation_with_what_it_printed(ran_ahead):
    first, seen, out, err, returncode = ran_ahead
    assert first.startswith("--- [0] '1'"), first
    assert returncode == 128 + signal.SIGTERM, err
    assert len((seen + out).split()) >= 5
    assert "interrupted after" in err.strip().splitlines()[-1]


def test_a_request_past_the_trained_length_is_warned_about(tmp_path, capsys):
    pytest.importorskip("safetensors")
    write_hf_folder(tmp_path, random_kenotron_model(get_model_spec("qwen3"), ARGS), ARGS)
    config = json.loads((tmp_path / "config.json").read_text())
    config["max_position_embeddings"] = 8
    (tmp_path / "config.json").write_text(json.dumps(config))
    cli.main(["--hf", str(tmp_path), "--prompt-ids", "1 2 3 4 5 6", "--max-new-tokens", "4", "--device", "cpu"])
    err = capsys.readouterr().err
    assert ("warning: the longest prompt (6 tokens) and 4 new tokens make 10, past the 8-token sequences this model "
            "trained on") in err
    cli.main(["--hf", str(tmp_path), "--prompt-ids", "1 2", "--max-new-tokens", "4", "--device", "cpu"])
    assert "warning" not in capsys.readouterr().err
