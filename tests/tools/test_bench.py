"""scripts/bench.py's engine on CPU: a case runs the real trainer in its own process and gives
one row; a failing case gives a row whose last line says why."""

from __future__ import annotations

import math
import types
from pathlib import Path

import pytest

from kenotron.tools.bench import format_row, run_case
from tests.ahead import Lane
from tests.models.fake_flash_attn4 import fake_flash_attn4

TINY = ["--training.device", "cpu", "--training.seq_len", "32", "--training.local_batch_size", "2"]


def stream_and_sync_rows(folder: Path, lane: Lane) -> tuple[dict, dict]:
    """One case with the default (stream) timing, then with sync timing: a process of its own each
    (seconds), run ahead of the two tests that share them (tests/ahead.py)."""
    return (run_case("tiny", TINY, ngpu=1, warmup=1, steps=2, timeout=300),
            run_case("sync", TINY, ngpu=1, warmup=1, steps=2, timeout=300, timing="sync"))


def failing_row(folder: Path, lane: Lane) -> dict:
    """A case whose config fails in its process, run ahead (tests/ahead.py)."""
    return run_case("bad", TINY + ["--parallelism.tp", "3"], ngpu=1, warmup=1, steps=1, timeout=300)


@pytest.mark.run_ahead(job=stream_and_sync_rows)
def test_a_case_trains_in_its_own_process_and_reports_speed_and_loss(ran_ahead):
    row, _ = ran_ahead
    assert "error" not in row, row.get("error")
    assert row["tokens_per_sec"] > 0 and row["step_time_s"] > 0
    assert math.isfinite(row["loss_last"]) and row["world_size"] == 1
    assert row["timing"] == "stream"
    assert format_row(row).startswith("| tiny | ")


@pytest.mark.run_ahead(job=stream_and_sync_rows)
def test_sync_timing_gives_the_same_losses_as_stream_timing(ran_ahead):
    # Timing must not change what trains: the same seed gives the same losses either way.
    stream, synced = ran_ahead
    assert synced["timing"] == "sync" and synced["step_time_s"] > 0
    assert (synced["loss_first"], synced["loss_last"]) == (stream["loss_first"], stream["loss_last"])


@pytest.mark.run_ahead(job=failing_row)
def test_a_failing_case_reports_the_cause_on_its_last_line(ran_ahead):
    row = ran_ahead
    assert "does not divide the world size 1" in row["error"].splitlines()[-1]
    assert "failed:" in format_row(row)


def test_a_compile_failure_shows_the_compilers_error_not_dynamos_hint_last():
    from kenotron.tools.bench import failure_tail

    lines = ["step 1", "torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised:",
             "RuntimeError: Triton compilation failed", "",
             "Set TORCHDYNAMO_VERBOSE=1 for the internal stack trace (please do this especially if you're reporting a bug"]
    assert failure_tail(lines)[-1] == "RuntimeError: Triton compilation failed"
    assert failure_tail(["ValueError: bad"]) == ["ValueError: bad"]


def test_a_rank_failure_shows_the_ranks_exception_not_torchruns_summary_last():
    from kenotron.tools.bench import failure_tail

    # The shape of the 2026-11-27 GPU failure: a graph-break refusal on each rank, then torchrun.
    lines = ["[rank0]: Traceback (most recent call last):",
             "[rank0]: torch._dynamo.exc.Unsupported: Attempted to call function marked as skipped",
             "[rank1]: torch._dynamo.exc.Unsupported: Attempted to call function marked as skipped",
             "Traceback (most recent call last):",
             "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
             "  error_file: <N/A>"]
    assert failure_tail(lines)[-1] == (
        "[rank0]: torch._dynamo.exc.Unsupported: Attempted to call function marked as skipped")


def test_profile_summary_groups_kernels_by_kind_and_reports_idle_time():
    from kenotron.tools.kernel_profile import summarize_kernels

    kernels = [
        ("nvjet_tst_256x128_64x4_1x2_h_bz_coopA_NTN", 300.0),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_3_64x64x64", 120.0),
        ("triton_red_fused__to_copy_mul_rsqrt_0", 40.0),
        ("void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor<float, 4>>", 20.0),
        ("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", 10.0),
    ]
    summary = summarize_kernels(kernels, steps=2, wall_us=1000.0)
    assert summary.by_kind == {
        "matmul": 300.0, "attention": 120.0, "compiled (triton)": 40.0, "optimizer": 20.0, "communication": 10.0,
    }
    table = summary.table()
    assert "| matmul | 0.15 | 30.0% |" in table
    assert "| (no kernel running) | 0.26 | 51.0% |" in table


def test_every_gpu_preset_is_a_valid_config_for_its_gpu_count(monkeypatch):
    import sys

    import torch

    from kenotron.config import load_config, split_config_arg
    from kenotron.kernel_choice import attention_backend
    from kenotron.tools.bench import PRESETS, SYNTHETIC
    from kenotron.train.resolve import resolve_run

    # The flash_attn presets are checked as on an H200 with flash-attn-4 installed, whose cuDNN
    # takes MLA's narrower values (asked of the GPU itself otherwise).
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *device: (9, 0))
    monkeypatch.setattr(attention_backend, "cudnn_takes", lambda *shape: True)
    monkeypatch.setitem(sys.modules, "flash_attn_interface", None)
    monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))  # found installed, not imported
    monkeypatch.setitem(sys.modules, "flash_attn.cute.interface", fake_flash_attn4())
    for preset, cases in PRESETS.items():
        if preset == "cpu-smoke":
            continue
        world = 4 if "4gpu" in preset else 2 if "2gpu" in preset else 1
        for name, overrides in cases.items():
            path, rest = split_config_arg(overrides)
            # The data presets' folders ({sample_data}) are written when the benchmark runs.
            run = resolve_run(load_config(path, SYNTHETIC + rest), world, check_data=False)
            assert run.dims.world_size == world, name


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the refusal on a machine without GPUs")
def test_a_gpu_preset_is_refused_at_once_on_a_cpu(capsys):
    from kenotron.tools.bench import main

    assert main(["--preset", "h200-1gpu"]) == 2
    assert "--preset h200-1gpu measures GPU shapes and no CUDA device is visible here" in capsys.readouterr().err


def test_a_case_past_its_timeout_is_a_failed_row_and_the_table_goes_on():
    # A case killed by its --timeout used to raise TimeoutExpired and end the whole benchmark.
    row = run_case("slow", TINY, ngpu=1, warmup=1, steps=1, timeout=1)
    assert row["error"].splitlines()[-1] == "timed out after 1 s (the case's --timeout)"
    assert "failed:" in format_row(row)


def test_the_slow_link_is_refused_on_one_device():
    from kenotron.tools.bench import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--case", "tiny=" + " ".join(TINY), "--slow-link"])
    assert exit_info.value.code == 2


def test_the_slow_link_reaches_the_link_measurement_and_every_case(monkeypatch, capsys):
    """Every process `--slow-link` starts (the collectives' timing, then each case's torchrun) gets
    NCCL_P2P_DISABLE=1; without it, none does. The processes are recorded, not run."""
    from kenotron.tools import bench

    started: list[tuple[list[str], dict | None]] = []

    def record(cmd, timeout, env=None):
        started.append((cmd, env))
        return 1, "RuntimeError: recorded, not run"

    monkeypatch.setattr(bench, "_run_bounded", record)
    cases = ["--case", "a=" + " ".join(TINY), "--case", "b=" + " ".join(TINY), "--ngpu", "2"]
    assert bench.main([*cases, "--slow-link"]) == 1  # the recorded cases "fail"
    assert [cmd[cmd.index("-m") + 1] for cmd, _ in started] == ["kenotron.tools.collectives"] + ["kenotron.tools.bench_worker"] * 2
    assert all(env == {"NCCL_P2P_DISABLE": "1"} for _, env in started)
    out = capsys.readouterr().out
    assert "Slow link: NCCL_P2P_DISABLE=1" in out and "link not measured: RuntimeError: recorded, not run" in out
    started.clear()
    bench.main(cases)
    assert len(started) == 2 and all(env is None for _, env in started)


def test_the_link_measurement_prints_the_collectives_table_of_its_ranks():
    from kenotron.tools.bench import link_bandwidth

    table = link_bandwidth(2, {"NCCL_P2P_DISABLE": "1"}, timeout=300, mib=1).splitlines()
    assert table[0].startswith("Collectives over 2 ranks")
    assert [row.split("|")[1].strip() for row in table[3:]] == ["all-gather", "reduce-scatter", "all-reduce", "all-to-all"]
