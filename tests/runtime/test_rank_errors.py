"""Every user-caused failure ends a training process with one line naming the file or key and the fix,
never a traceback (runtime/rank_process.py)."""

from __future__ import annotations

import json
import re

import pytest

from kenotron.train.__main__ import main

TINY = ["--model.n_layers", "1", "--training.seq_len", "32", "--training.local_batch_size", "2", "--training.steps", "1",
        "--metrics.tensorboard", "false"]


def error_lines(capsys) -> list[str]:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return [line for line in err.splitlines() if line.startswith("kenotron:")]


@pytest.mark.parametrize("content, message", [
    ("", r"the file '.*data.jsonl' is empty; give data holding at least one document"),
    ('{"text": "a"}\n{"text": "b"}\n{"text": broken\n', (r"file '.*data.jsonl' line 3 is not valid JSON \(Expecting "
                                                        r"value, column 10\): .*; fix or remove that line")),
])
def test_a_bad_data_file_is_one_line_naming_the_file_and_line(tmp_path, capsys, content, message):
    data = tmp_path / "data.jsonl"
    data.write_text(content)
    code = main([*TINY, "--data.dataset", "jsonl", "--data.path", str(data), "--job.dump_folder", str(tmp_path / "r")])
    lines = error_lines(capsys)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("kenotron: config error: data.path=") and re.search(message, lines[0]), lines[0]


def test_a_file_that_is_not_a_tokenizer_is_one_line(tmp_path, capsys):
    bad = tmp_path / "tokenizer.model"
    bad.write_text("not a tokenizer\n")
    assert main([*TINY, "--tokenizer.path", str(bad), "--job.dump_folder", str(tmp_path / "r")]) == 2
    lines = error_lines(capsys)
    assert len(lines) == 1 and "tokenizer file" in lines[0] and "line 1 is b'not a tokenizer" in lines[0], lines


def test_a_damaged_checkpoint_is_one_line(tmp_path, capsys):
    step = tmp_path / "r" / "checkpoints" / "step-000005"
    step.mkdir(parents=True)
    (step / "COMPLETE.json").write_text(json.dumps({"format": "someone-else/9"}))
    code = main([*TINY, "--checkpoint.enable", "true", "--job.dump_folder", str(tmp_path / "r")])
    lines = error_lines(capsys)
    assert code == 1 and len(lines) == 1, lines
    assert lines[0].startswith("kenotron: checkpoint error:") and "has format 'someone-else/9'" in lines[0]


def test_a_dump_folder_that_cannot_be_created_is_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("a file where a folder should go")
    assert main([*TINY, "--job.dump_folder", str(tmp_path / "file" / "run")]) == 1
    lines = error_lines(capsys)
    assert len(lines) == 1 and lines[0].startswith("kenotron: error: ") and "file/run" in lines[0], lines
