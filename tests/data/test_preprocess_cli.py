"""`kenotron preprocess` (kenotron/data/preprocess_cli.py): the installed command writes the same
folder as the library, and a bad input ends in one line with exit code 2."""

from __future__ import annotations

from kenotron.cli import main as kenotron
from kenotron.data.preprocess import preprocess
from kenotron.data.token_files import TOKEN_SUFFIX
from tests.data.test_preprocess import write_jsonl


def _files(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob(f"*{TOKEN_SUFFIX}"))}


def test_the_command_writes_the_folder_the_library_writes(tmp_path, capsys):
    path = write_jsonl(tmp_path / "raw.jsonl")
    code = kenotron(["preprocess", "--dataset", "jsonl", "--path", str(path), "--output", str(tmp_path / "cli"),
                     "--workers", "1"])
    assert code == 0, capsys.readouterr().err
    assert "token files" in capsys.readouterr().out
    preprocess("jsonl", str(path), tmp_path / "lib", "", workers=1, progress=False)
    assert _files(tmp_path / "cli") and _files(tmp_path / "cli") == _files(tmp_path / "lib")


def test_a_missing_input_is_one_line_and_exit_code_2(tmp_path, capsys):
    code = kenotron(["preprocess", "--dataset", "jsonl", "--path", str(tmp_path / "absent.jsonl"),
                     "--output", str(tmp_path / "out"), "--workers", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("preprocess: "), err
