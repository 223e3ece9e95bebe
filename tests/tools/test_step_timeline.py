"""tools/step_timeline.py: the exposed time of each collective, the head and tail of a step, the
optimizer span and the host synchronizations, read from a Chrome trace."""

from __future__ import annotations

import gzip
import json

import pytest

from kenotron.tools.step_timeline import STEP_RANGE, analyse, collective_kind, main, minus, union


def _kernel(name: str, ts: float, dur: float, stream: int = 7) -> dict:
    return {"cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"stream": stream}}


def _trace() -> dict:
    """One 100 us step: an all-gather alone at the start (10 us exposed), a matmul 10..60 with a
    reduce-scatter 50..70 under it (10 us exposed after it), the optimizer 75..95, idle gaps
    70..75 and 95..99, one stream synchronize and two stream waits on the host."""
    return {"traceEvents": [
        # The device-side step range ends before the optimizer's kernels (a nested range's): the
        # step runs to the trace's last kernel. Host calls count inside the host-side range.
        {"cat": "gpu_user_annotation", "name": STEP_RANGE, "ts": 0.0, "dur": 70.0},
        {"cat": "user_annotation", "name": STEP_RANGE, "ts": -5.0, "dur": 20.0},
        _kernel("ncclDevKernel_AllGather_RING_LL(ncclDevComm*)", 0.0, 10.0, stream=20),
        _kernel("sm90_xmma_gemm_bf16bf16_bf16f32", 10.0, 50.0),
        _kernel("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", 50.0, 20.0, stream=21),
        {"cat": "gpu_user_annotation", "name": "Optimizer.step#AdamW.step", "ts": 75.0, "dur": 20.0},
        _kernel("multi_tensor_apply_kernel<FusedAdamMathFunctor>", 75.0, 20.0),
        _kernel("last_kernel", 99.0, 1.0),
        {"cat": "cuda_runtime", "name": "cudaStreamSynchronize", "ts": 5.0, "dur": 3.0},
        {"cat": "cuda_runtime", "name": "cudaStreamWaitEvent", "ts": 6.0, "dur": 0.1},
        {"cat": "cuda_runtime", "name": "cudaStreamWaitEvent", "ts": 7.0, "dur": 0.1},
        {"cat": "cuda_runtime", "name": "cudaStreamSynchronize", "ts": 30.0, "dur": 50.0},  # outside the host range
    ]}


def test_interval_union_and_difference():
    assert union([(0, 2), (1, 3), (5, 6)]) == [(0, 3), (5, 6)]
    assert minus([(0, 10)], [(2, 3), (5, 20)]) == [(0, 2), (3, 5)]


def test_collective_kinds_are_read_from_nccl_kernel_names():
    assert collective_kind("ncclDevKernel_AllGather_RING_LL") == "all-gather"
    assert collective_kind("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL") == "reduce-scatter"
    assert collective_kind("ncclDevKernel_SendRecv(ncclDevComm*)") == "all-to-all / send-recv"
    assert collective_kind("sm90_xmma_gemm") is None


def test_exposed_time_is_collective_time_without_compute():
    t = analyse(_trace())
    assert t.steps == 1 and t.wall == 100.0
    assert t.collective == {"all-gather": 10.0, "reduce-scatter": 20.0}
    assert t.exposed == {"all-gather": 10.0, "reduce-scatter": 10.0}
    assert t.compute == 71.0  # the matmul, the optimizer kernel and the last kernel
    assert t.idle == 9.0  # 70..75 and 95..99
    assert (t.head, t.head_exposed) == (10.0, 10.0)
    assert (t.tail, t.tail_exposed) == (15.0, 10.0)  # last matmul ends at 60, optimizer starts at 75
    assert t.optimizer == 20.0
    assert (t.host_syncs, t.host_sync_us, t.stream_waits) == (1, 3.0, 2)


def test_a_step_with_kernels_on_two_streams_is_one_step():
    """The profiler gives a step's range on each stream its kernels ran on, with the host range's
    External id (a side stream's copy, say): one step, starting at the first of them."""
    trace = _trace()
    for e in trace["traceEvents"]:
        if e["name"] == STEP_RANGE:
            e["args"] = {"External id": 7}
    side = {"cat": "gpu_user_annotation", "name": STEP_RANGE, "ts": 2.0, "dur": 3.0, "args": {"External id": 7}}
    trace["traceEvents"] += [side, _kernel("copy_on_a_side_stream", 2.0, 3.0, stream=30)]
    t = analyse(trace)
    assert t.steps == 1 and t.wall == 100.0


def test_a_trace_without_step_ranges_is_refused_naming_the_range():
    with pytest.raises(ValueError, match=STEP_RANGE):
        analyse({"traceEvents": [_kernel("x", 0, 1)]})


def test_command_line_reads_a_gzipped_trace(tmp_path, capsys):
    path = tmp_path / "rank0.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(_trace(), f)
    assert main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "| reduce-scatter | 0.02 | 0.01 | 1 |" in out and "rank0.json.gz" in out
