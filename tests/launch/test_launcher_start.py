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
