"""scripts/bench.py's engine on CPU: a case runs the real trainer in its own process and gives
one row; a failing case gives a row whose last line says why."""

from __future__ import annotations

import math

from kenotron.train.bench import format_row, run_case

TINY = ["--training.device", "cpu", "--training.seq_len", "32", "--training.local_batch_size", "2"]


def test_a_case_trains_in_its_own_process_and_reports_speed_and_loss():
    row = run_case("tiny", TINY, ngpu=1, warmup=1, steps=2, timeout=300)
    assert "error" not in row, row.get("error")
    assert row["tokens_per_sec"] > 0 and row["step_time_s"] > 0
    assert math.isfinite(row["loss_last"]) and row["world_size"] == 1
    assert format_row(row).startswith("| tiny | ")


def test_a_failing_case_reports_the_cause_on_its_last_line():
    row = run_case("bad", TINY + ["--parallelism.tp", "3"], ngpu=1, warmup=1, steps=1, timeout=300)
    assert "does not divide the world size 1" in row["error"].splitlines()[-1]
    assert "failed:" in format_row(row)
