"""How a rank's end reads when the fault is elsewhere: a collective timeout or a vanished peer is one
line naming the setting and the watchdog's finding (traceback in the run's logs), and a stop
signal that lands while the rank ends on an error names the error, not "start-up"."""

from __future__ import annotations

import json
import signal

from kenotron.runtime.rank_process import run_rank
from kenotron.runtime.worker_guard import StopRequested, report_failure

TIMEOUT = "[gloo/transport/tcp/unbound_buffer.cc:129] Timed out waiting 12000ms for send operation to complete"
FINDING = ("rank 0 (pid 4242 on otherhost) has sent no heartbeat for 9 s or more, its last one at step 3: the process "
           "is stopped, swapped out or deadlocked")


def kenotron_lines(capsys) -> tuple[str, list[str]]:
    err = capsys.readouterr().err
    return err, [line for line in err.splitlines() if line.startswith("kenotron:")]


def test_a_collective_timeout_is_one_line_naming_the_setting_and_the_stopped_rank(tmp_path, capsys):
    def train(cfg):
        error = RuntimeError(TIMEOUT)
        error.add_note(f"before that the watchdog found: {FINDING}")
        raise error

    code = run_rank(["--parallelism.collective_timeout_s", "12", "--job.dump_folder", str(tmp_path)], train)
    err, lines = kenotron_lines(capsys)
    assert code == 1 and err.strip() == lines[0], err
    assert lines[0].startswith("kenotron: a collective timed out after 12 s (parallelism.collective_timeout_s): "
                               f"another rank stopped answering; before that the watchdog found: {FINDING} "
                               f"(traceback: {tmp_path / 'logs' / 'rank0_traceback.log'})"), lines[0]
    assert "Timed out waiting 12000ms" in (tmp_path / "logs" / "rank0_traceback.log").read_text()


def test_gloos_pair_closure_after_a_timeout_reads_as_the_timeout(tmp_path, capsys):
    def train(cfg):
        raise RuntimeError("Application timeout caused pair closure")

    assert run_rank(["--parallelism.collective_timeout_s", "30", "--job.dump_folder", str(tmp_path)], train) == 1
    err, lines = kenotron_lines(capsys)
    assert "Traceback" not in err and len(lines) == 1
    assert lines[0].startswith("kenotron: a collective timed out after 30 s"), lines[0]


def test_a_stop_signal_while_ending_on_an_error_names_the_error_not_start_up(tmp_path, capsys):
    def train(cfg):
        try:
            raise RuntimeError("[gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:4567")
        finally:  # the launcher's SIGTERM, arriving while the trainer closes after rank 1 failed
            raise StopRequested(signal.SIGTERM)

    code = run_rank(["--job.dump_folder", str(tmp_path)], train)
    _, lines = kenotron_lines(capsys)
    assert code == 128 + signal.SIGTERM
    assert lines == [("kenotron: stopped (SIGTERM) while ending on an error: a collective lost its peer: another rank "
                      "ended first (its own line says why)")], lines


def test_a_stop_signal_while_ending_on_any_other_error_names_that_error(tmp_path, capsys):
    def train(cfg):
        try:
            raise ValueError("a broken record\nin shard 7")
        finally:
            raise StopRequested(signal.SIGTERM)

    assert run_rank(["--job.dump_folder", str(tmp_path)], train) == 128 + signal.SIGTERM
    assert kenotron_lines(capsys)[1] == ["kenotron: stopped (SIGTERM) while ending on an error: ValueError: a broken record"]


def test_a_stop_signal_before_training_says_start_up(tmp_path, capsys):
    def train(cfg):
        raise StopRequested(signal.SIGINT)

    assert run_rank(["--job.dump_folder", str(tmp_path)], train) == 130
    assert kenotron_lines(capsys)[1] == ["kenotron: interrupted (SIGINT) during start-up"]


class FullDisk:
    def write(self, text: str) -> int:
        raise OSError(28, "No space left on device")

    def flush(self) -> None:
        raise OSError(28, "No space left on device")


def test_a_line_that_cannot_be_printed_is_recorded_as_not_printed(tmp_path, monkeypatch):
    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    monkeypatch.setattr("sys.stderr", FullDisk())
    report_failure("kenotron: checkpoint error: no space left", kind="error")
    record = json.loads(error_file.read_text())["kenotron"]
    assert (record["line"], record["printed"]) == ("kenotron: checkpoint error: no space left", False)
