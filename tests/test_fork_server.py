"""tests/fork_server.py and tests/triton_interpreter.py over it: each script, or `-c` code, runs
in a fresh process of its own (forked by one server; TRITON_INTERPRET=1 for the interpreter's),
its failure or hang fails the test with its output, and the server goes on serving after either.
Children started without waiting (`start`, the fault-tolerance tests' ranks) run side by side,
each with its own environment, and report their exit codes, a SIGKILL's included."""

from __future__ import annotations

import importlib.util
import os
import signal
import threading
import time

import pytest

from tests.fork_server import fork_server
from tests.triton_interpreter import run_in_triton_interpreter

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs the triton package")

MARKS_ITS_PROCESS = """
import os, sys, torch
assert os.environ["TRITON_INTERPRET"] == "1" and sys.argv == [__file__]
assert not hasattr(torch, "_left_by_another_script"), "a script saw another script's state"
torch._left_by_another_script = True
torch.set_default_dtype(torch.float64)
print("ok")
"""


@needs_triton
def test_scripts_run_one_after_another_each_in_a_fresh_process(tmp_path):
    script = tmp_path / "marks.py"
    script.write_text(MARKS_ITS_PROCESS)
    run_in_triton_interpreter(script)
    run_in_triton_interpreter(script)  # fails if the first run's module state had survived


@needs_triton
def test_a_failing_script_fails_the_test_with_its_output(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text("print('checked 3 cases')\nraise ValueError('kernel differs by 0.5')\n")
    with pytest.raises(AssertionError, match=r"(?s)checked 3 cases.*ValueError: kernel differs by 0\.5"):
        run_in_triton_interpreter(script)
    script.write_text("print('checked but did not finish')\n")
    with pytest.raises(AssertionError, match="checked but did not finish"):  # no "ok" last
        run_in_triton_interpreter(script)


@needs_triton
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


WAITS_FOR_ITS_PEER = """
import os, sys, time
me, peer = sys.argv[1], sys.argv[2]
open(me, "w").close()
deadline = time.monotonic() + 60
while not os.path.exists(peer):  # both run at once, or neither gets past here
    assert time.monotonic() < deadline, "the other child never ran beside this one"
    time.sleep(0.01)
print(__name__, os.environ["CHILD_CODE"], flush=True)
print("to stderr", file=sys.stderr, flush=True)
sys.exit(int(os.environ["CHILD_CODE"]))
"""


def test_started_children_run_side_by_side_with_their_own_environment_and_exit_codes(tmp_path):
    server = fork_server(("torch",))
    script = tmp_path / "peer.py"
    script.write_text(WAITS_FOR_ITS_PEER)
    marks = [str(tmp_path / "a"), str(tmp_path / "b")]
    children = [server.start([str(script), marks[i], marks[1 - i]], tmp_path / f"{i}.txt", tmp_path / f"{i}.txt",
                             env={"CHILD_CODE": str(3 + i)}) for i in range(2)]
    assert [c.wait(60) for c in children] == [3, 4]
    for i in range(2):  # stdout and stderr in one file, neither overwriting the other
        assert (tmp_path / f"{i}.txt").read_text() == f"__main__ {3 + i}\nto stderr\n"
    module = server.start(["-m", "json.tool", "--help"], tmp_path / "m.out", tmp_path / "m.err")
    assert module.wait(60) == 0 and "json.tool" in (tmp_path / "m.out").read_text()  # python -m's argv[0]
    sleeper = server.start(["-c", "import time; print('up', flush=True); time.sleep(600)"], tmp_path / "s.out",
                           tmp_path / "s.err", new_session=True)
    deadline = time.monotonic() + 60
    while (tmp_path / "s.out").read_text() != "up\n":  # the child runs (its session made first)
        assert time.monotonic() < deadline and sleeper.poll() is None, (tmp_path / "s.err").read_text()
        time.sleep(0.01)
    assert os.getsid(sleeper.pid) == sleeper.pid
    started = time.monotonic()
    os.kill(sleeper.pid, signal.SIGKILL)
    assert sleeper.wait(30) == -signal.SIGKILL and time.monotonic() - started < 5
    assert server.run(["-c", "print('still serving')"], 60)[:2] == (0, "still serving\n")


def test_two_threads_run_children_through_one_server_at_once_each_getting_its_own_output(tmp_path):
    # The background lane (tests/ahead.py) runs scripts from its thread while the tests run theirs.
    server = fork_server(("torch",))
    marks = [str(tmp_path / "a"), str(tmp_path / "b")]
    results: dict[int, tuple] = {}

    def run(i: int) -> None:
        script = tmp_path / f"peer{i}.py"
        script.write_text(f"import os\nos.environ['CHILD_CODE'] = '{3 + i}'\n" + WAITS_FOR_ITS_PEER)
        results[i] = server.run([str(script), marks[i], marks[1 - i]], 60)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
    assert results == {i: (3 + i, f"__main__ {3 + i}\n", "to stderr\n") for i in range(2)}
