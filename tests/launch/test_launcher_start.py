"""What ends the launcher before torchrun starts any rank, in one line: Ctrl-C while the config is
checked (exit 130), and a job.dump_folder that cannot hold the run's logs (exit 2)."""

from __future__ import annotations

import pytest

from kenotron.launch import launcher
from tests.faults.small_fs import make_read_only, small_tmpfs

RANKS = "tests.launch.rank_program"  # never started here: each case ends before torchrun


def test_ctrl_c_during_the_config_check_is_one_line_and_exit_code_130(tmp_path, monkeypatch, capsys):
    def interrupted(cfg, world_size):
        raise KeyboardInterrupt

    monkeypatch.setattr(launcher, "check_config", interrupted)
    code = launcher.launch(["--job.dump_folder", str(tmp_path / "run")], nproc=2)
    err = capsys.readouterr().err
    assert code == 130
    assert err == "kenotron: interrupted (SIGINT) while checking the config; no rank was started\n"


def test_a_dump_folder_that_is_a_file_is_one_line_before_torchrun(tmp_path, capsys):
    (tmp_path / "run").write_text("not a folder")
    code = launcher.launch(["ok", str(tmp_path)], nproc=2, module=RANKS, log_dir=str(tmp_path / "run" / "logs"))
    err = capsys.readouterr().err
    assert code == 2 and "torchrun" not in err and len(err.splitlines()) == 1, err
    assert err.startswith(f"kenotron: config error: the run's log folder {tmp_path / 'run' / 'logs'} cannot be "
                          f"written (not a directory"), err
    assert err.endswith("; point job.dump_folder at a writable folder\n"), err


def test_a_read_only_dump_folder_is_one_line_before_torchrun(tmp_path, capsys):
    with small_tmpfs(tmp_path / "ro", 1024) as mount:
        make_read_only(mount)
        code = launcher.launch(["ok", str(tmp_path)], nproc=2, module=RANKS, log_dir=str(mount / "run" / "logs"))
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "cannot be written (read-only file system" in err, err


@pytest.mark.parametrize("exists", [False, True])
def test_a_writable_log_folder_passes_and_is_left_empty(tmp_path, exists):
    if exists:
        (tmp_path / "logs").mkdir()
    launcher.make_log_dir(str(tmp_path / "logs"))
    assert list((tmp_path / "logs").iterdir()) == []


def test_a_line_the_rank_could_not_record_on_a_full_disk_is_read_from_its_log_and_shown(tmp_path):
    from types import SimpleNamespace

    log = tmp_path / "logs" / "job-id" / "attempt_0" / "0" / "stderr.log"
    log.parent.mkdir(parents=True)
    log.write_text("step 5\nkenotron: checkpoint error: saving step-000006 failed on ranks 0, 1: no space left\n")
    full = SimpleNamespace(local_rank=0, exitcode=1, error_file=str(log.parent / "error.json"), timestamp=100,
                           signal_name=lambda: "<N/A>")  # error.json beside the log: never written, the disk is full
    failures = launcher.failures_of(SimpleNamespace(failures={0: full}), str(tmp_path / "logs"))
    line = launcher.report(failures, shown_local_ranks={0}, log_dir=str(tmp_path / "logs"))
    assert line.splitlines()[0] == "kenotron: rank 0: checkpoint error: saving step-000006 failed on ranks 0, 1: no space left"


def test_the_checkpoint_writer_process_spawned_from_a_rank_logs_nothing():
    import logging
    import runpy

    try:  # multiprocessing's spawn runs the rank's module under this name in the child first
        runpy.run_module("kenotron.launch.rank", run_name="__mp_main__")
        assert logging.root.manager.disable == logging.CRITICAL
    finally:
        logging.disable(logging.NOTSET)
