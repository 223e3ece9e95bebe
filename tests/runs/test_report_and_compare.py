"""`kenotron report` (PNG plots of runs, overlaid) and `kenotron compare` (losses within a tolerance)."""

from __future__ import annotations

import json
import math

import pytest

from kenotron.cli import main as kenotron
from kenotron.runs import compare_losses


def _run(folder, losses, *, mfu=None):
    folder.mkdir(parents=True)
    with open(folder / "metrics.jsonl", "w") as f:
        f.writelines(json.dumps({
                "step": step, "loss": loss, "loss_avg": loss, "grad_norm": 1.0 / step, "lr": 1e-3 * min(1, step / 3),
                "tokens_per_sec": 1000.0 + step, "tflops": 0.1, "mfu": mfu, "memory_gib": 0.5, "elapsed_s": step,
                "tokens_seen": 100 * step, "step_time_s": 1.0,
            }) + "\n" for step, loss in losses.items())
    return folder


def test_report_writes_one_png_per_recorded_metric_and_an_overview(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    a = _run(tmp_path / "a", {s: 8 - math.log(s) for s in range(1, 11)})
    b = _run(tmp_path / "b", {s: 8.2 - math.log(s) for s in range(1, 11)}, mfu=30.0)
    assert kenotron(["report", str(a), str(b / "metrics.jsonl"), "--out", str(tmp_path / "plots")]) == 0
    names = sorted(p.name for p in (tmp_path / "plots").glob("*.png"))
    assert names == ["grad_norm.png", "loss.png", "lr.png", "memory.png", "mfu.png", "report.png",
                     "tokens_per_sec.png"]
    assert all((tmp_path / "plots" / n).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for n in names)
    assert "wrote 7 plots" in capsys.readouterr().out


def test_report_of_a_folder_without_records_is_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert kenotron(["report", str(tmp_path / "empty")]) == 2
    assert "has no metrics.jsonl" in capsys.readouterr().err


def test_compare_passes_within_the_tolerance_and_fails_outside_it_in_assert_mode(tmp_path, capsys):
    ref = _run(tmp_path / "ref", {1: 8.0, 5: 6.0, 10: 5.0})
    close = _run(tmp_path / "close", {1: 8.04, 5: 6.02, 10: 5.01, 11: 1.0})
    far = _run(tmp_path / "far", {1: 8.0, 5: 6.5, 10: 5.0})
    assert compare_losses(close, ref, rtol=0.01).ok
    assert [s for s, *_ in compare_losses(close, ref).rows] == [1, 5, 10]  # common steps only
    assert compare_losses(far, ref, rtol=0.01).bad_steps() == [5]
    assert kenotron(["compare", str(close), str(ref), "--assert"]) == 0
    assert kenotron(["compare", str(far), str(ref), "--assert"]) == 1
    out = capsys.readouterr().out
    assert "1 of 3 steps differ by more than atol=0.0 + rtol=0.01" in out and "(first: step 5" in out
    assert kenotron(["compare", str(far), str(ref), "--rtol", "0.1", "--assert"]) == 0


def test_compare_with_no_common_step_fails(tmp_path):
    a = _run(tmp_path / "a", {1: 8.0})
    b = _run(tmp_path / "b", {2: 8.0})
    assert not compare_losses(a, b).ok
