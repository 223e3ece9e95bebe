"""The suite's time budget (CONTRIBUTING.md, "Tests"), held by structure rather than by a clock:
a per-test time limit would fail at random on a loaded two-core machine, so what is checked
instead is where the seconds go. A new Python interpreter that imports torch costs ~2-4 s before
it does anything, so every place a test starts one through `subprocess` is listed here with the
reason it needs its own (a user's command run as written, a process killed on purpose, a fresh
import checked). A test that only needs ranks or a process uses the worker pool
(tests/distributed/pool.py) or the fork server (tests/fork_server.py), which start one in a
fraction of a second; a new entry here is a decision the review sees."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).parent

STARTS_A_PROCESS = re.compile(r"(?:subprocess\.(?:run|Popen|check_output|check_call|call)|\blane\.(?:run|start))\(")
"""A call that starts a process: subprocess's, or a command of the background lane (tests/ahead.py)."""

PROCESS_STARTS = {
    "ahead.py": (1, "the background lane's commands (tests marked run_ahead), one at a time"),
    "data/test_corpus.py": (1, "the corpus module alone in a clean interpreter: what it imports"),
    "distributed/test_pool.py": (1, "a pytest process killed outright, its pool workers must follow"),
    "docs/test_quickstart.py": (1, "README's ./run_train.sh as a user runs it, 250 steps"),
    "examples/test_examples.py": (1, "each example's run.sh, as its README gives it"),
    "examples/test_nanosets_readme.py": (2, "the README's two commands, as written, in a scratch folder"),
    "faults/launch.py": (1, "torchrun jobs whose ranks are stopped or killed (test_hung_rank.py)"),
    "faults/small_fs.py": (2, "mount and umount of a small tmpfs (no Python)"),
    "fork_server.py": (1, "the fork server itself, one per preload list"),
    "generate/test_cli_output.py": (1, "`kenotron generate` ended by SIGTERM, its output read as it comes"),
    "launch/test_config_checks.py": (1, "`kenotron train` refusing a config before torch is imported"),
    "launch/test_interrupt.py": (2, "Ctrl-C to a launcher and its ranks"),
    "launch/test_launcher.py": (5, "the launcher's torchrun, its ranks failing, hanging or interrupted"),
    "launch/test_two_nodes.py": (1, "two ./run_train.sh 'nodes' meeting through torchrun's rendezvous"),
    "planner/test_cli.py": (1, "the planner's time and peak memory as a process of its own"),
    "runtime/test_preflight.py": (3, "checks that must run before torch is imported"),
    "runtime/test_run_lock.py": (1, "a second process holding the run folder's lock"),
    "test_ahead.py": (6, "the background lane's own checks, on `sh` commands (no Python)"),
    "test_cli.py": (1, "`kenotron --help` into a closed pipe"),
    "test_package.py": (1, "the wheel built, installed in a venv and run outside the clone"),
}
"""Files of tests/ that start processes through `subprocess`: (call sites, why a new interpreter)."""


def _process_starts() -> dict[str, int]:
    found = {}
    for path in sorted(TESTS.rglob("*.py")):
        count = len(STARTS_A_PROCESS.findall(path.read_text()))
        if count and path != Path(__file__):
            found[path.relative_to(TESTS).as_posix()] = count
    return found


def test_every_place_a_test_starts_a_new_interpreter_is_listed_with_its_reason():
    found = _process_starts()
    listed = {name: count for name, (count, _) in PROCESS_STARTS.items()}
    new = {name: count for name, count in found.items() if listed.get(name, 0) < count}
    assert not new, (f"tests start new processes in {new}: each costs seconds of imports; run ranks on the pool "
                     "(tests/distributed/pool.py) or a process through tests/fork_server.py, or list the file in "
                     "PROCESS_STARTS with the reason it needs a new interpreter")
    gone = {name: count for name, count in listed.items() if found.get(name, 0) < count}
    assert not gone, f"PROCESS_STARTS lists more than tests/ holds now: {gone} (found {found}); lower it"


def test_the_structural_guard_counts_each_call_site_once():
    source = ("subprocess.run([...])\nproc = subprocess.Popen(cmd)\nsubprocess.PIPE\nsubprocess.check_output(x)\n"
              "lane.run([...])\nlane.start(cmd)\nlane.runs\nplane.run(x)\n")
    assert len(STARTS_A_PROCESS.findall(source)) == 5


def test_the_pytest_process_runs_torch_on_the_one_thread_count_its_processes_get():
    """tests/conftest.py sets OMP_NUM_THREADS (1 unless the developer set it) before torch loads:
    on CI's two cores torch's default two threads spin beside the lane and the ranks (measured:
    4 test files run as CI runs them, 156 -> 86 s and 188 -> 139 CPU-s). Fails where the suite runs
    without it."""
    import os

    import torch

    assert "OMP_NUM_THREADS" in os.environ, "tests/conftest.py no longer sets OMP_NUM_THREADS before torch loads"
    assert torch.get_num_threads() == int(os.environ["OMP_NUM_THREADS"]), torch.get_num_threads()
