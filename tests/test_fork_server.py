"""tests/fork_server.py and tests/triton_interpreter.py over it: each script, or `-c` code, runs
in a fresh process of its own (forked by one server; TRITON_INTERPRET=1 for the interpreter's),
its failure or hang fails the test with its output, and the server goes on serving after either."""

from __future__ import annotations

import importlib.util

import pytest

from tests.fork_server import fork_server
from tests.triton_interpreter import run_in_triton_interpreter

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs the triton package")

MARKS_ITS_PROCESS = """
import os, sys, torch
assert os.environ["TRITON_INTERPRET"] == "1" and sys.argv == [__file__]
assert not hasattr(torch, "_left_by_another_script"), "a script saw another script's state"
torch._left_by_another_script = True
torch.set_default_dtype(torch.float64)
print("ok")
"""


def test_scripts_run_one_after_another_each_in_a_fresh_process(tmp_path):
    script = tmp_path / "marks.py"
    script.write_text(MARKS_ITS_PROCESS)
    run_in_triton_interpreter(script)
    run_in_triton_interpreter(script)  # fails if the first run's module state had survived


def test_a_failing_script_fails_the_test_with_its_output(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text("print('checked 3 cases')\nraise ValueError('kernel differs by 0.5')\n")
    with pytest.raises(AssertionError, match=r"(?s)checked 3 cases.*ValueError: kernel differs by 0\.5"):
        run_in_triton_interpreter(script)
    script.write_text("print('checked but did not finish')\n")
    with pytest.raises(AssertionError, match="checked but did not finish"):  # no "ok" last
        run_in_triton_interpreter(script)


def test_a_hanging_script_is_killed_at_its_timeout_and_the_next_one_runs(tmp_path):
    hangs, fine = tmp_path / "hangs.py", tmp_path / "fine.py"
    hangs.write_text("import time\nprint('started', flush=True)\ntime.sleep(600)\n")
    fine.write_text("print('ok')\n")
    with pytest.raises(AssertionError, match=r"(?s)ran longer than 1 s.*started"):
        run_in_triton_interpreter(hangs, timeout=1)
    run_in_triton_interpreter(fine)


def test_code_runs_as_python_dash_c_with_its_arguments_and_exit_code():
    code, out, err = fork_server(("torch",)).run(["-c", "import sys; print(sys.argv[1:]); sys.exit(3)", "a"], 60)
    assert (code, out, err) == (3, "['a']\n", "")
    code, _, err = fork_server(("torch",)).run(["-c", "raise KeyError('missing')"], 60)
    assert code == 1 and "KeyError: 'missing'" in err
