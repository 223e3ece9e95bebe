"""tools/host_reads.py: the ops that would read a GPU on the host, recorded with where they were
called; and the regression it guards: a DeepSeek-V3 training step (MTP, the auxiliary and z
losses, the bias update) reads nothing on the host, at one rank, at expert parallel 2 (the even
split) and under pipeline parallel 2, except its log record's one read (train/metrics.py's
read_on_host)."""

from __future__ import annotations

import pytest
import torch

from kenotron.models.common.moe import MoE
from kenotron.models.common.moe_args import MoEArgs
from kenotron.tools.host_reads import BLOCKING, PAGEABLE, TO_HOST, HostReads, _copy_kind, blocking_calls
from kenotron.tools.step_timeline import STEP_RANGE
from kenotron.train.metrics import Deferred, read_on_host
from tests.distributed.pool import run_on_ranks
from tests.tools.host_read_steps import reads_per_step

DEEPSEEK = ["--model.name", "deepseek_v3", "--model.mtp_depth", "1", "--moe.aux_loss_coef", "0.01",
            "--moe.z_loss_coef", "0.001", "--moe.bias_update_rate", "0.01"]
STEPS, LOG_FREQ = 3, 10  # steps 1 and 3 log (the first and the last), step 2 does not
ONE_READ = "Tensor.tolist <- kenotron/train/metrics.py"


def test_host_reads_records_each_reading_op_with_the_line_that_called_it():
    x = torch.arange(-3.0, 3.0)
    with HostReads() as reads:
        x.sum().item()
        bool(x.max() > 0)
        x[x > 0]
        torch.nonzero(x)
        x.tolist()
        torch.repeat_interleave(torch.tensor([1, 2]))
        torch.repeat_interleave(torch.tensor([1, 2]), output_size=3)  # its size is given: no read
        x.masked_fill(x > 0, 0.0)  # a mask that keeps the shape: no read
    assert [r.op for r in reads.reads] == [
        "aten._local_scalar_dense.default", "aten._local_scalar_dense.default", "aten.index.Tensor",
        "aten.nonzero.default", "Tensor.tolist", "aten.repeat_interleave.Tensor"]
    assert all(r.stack[0].startswith("tests/tools/test_host_reads.py:") and
               r.stack[0].endswith("test_host_reads_records_each_reading_op_with_the_line_that_called_it")
               for r in reads.reads)
    assert "nonzero" in reads.table()


def test_reads_of_host_tensors_and_of_what_is_computed_from_them_alone_do_not_count():
    labels, device_value = torch.ones(4, dtype=torch.int64), torch.ones(4)
    with HostReads(host_tensors=lambda: [labels]) as reads:
        int((labels != -100).sum())  # host memory on a GPU run: reading it waits for nothing
        int((labels * device_value).sum())  # a device value mixed in: a read
    assert [r.op for r in reads.reads] == ["aten._local_scalar_dense.default"]


def test_copies_between_host_and_gpu_count_when_the_host_waits_for_them():
    host, aten, gpu = torch.ones(4), torch.ops.aten, torch.device("cuda")
    assert _copy_kind(aten._to_copy, (host,), {"device": gpu}) == BLOCKING
    assert _copy_kind(aten._to_copy, (host,), {"device": gpu, "non_blocking": True}) == PAGEABLE
    assert _copy_kind(aten.copy_, (torch.empty(4, device="meta"), host, True), {}) is None  # not to a GPU
    assert _copy_kind(aten._to_copy, (torch.empty(4, device="meta"),), {"device": torch.device("cpu")}) == TO_HOST
    assert _copy_kind(aten._to_copy, (host,), {"dtype": torch.float64}) is None


def test_read_on_host_reads_every_value_in_one_copy_and_finishes_the_deferred_ones_in_order():
    seen = []
    values = {"loss": torch.tensor(2.5), "loads": torch.tensor([1.0, 3.0]), "lr": 0.1,
              "check": Deferred(torch.tensor([7], dtype=torch.int64), lambda v: seen.append(v) or {"step": v[0]}),
              "after": torch.tensor(4.0)}
    with HostReads() as reads:
        out = read_on_host(values)
    assert len(reads.reads) == 1
    assert out == {"loss": 2.5, "loads": [1.0, 3.0], "lr": 0.1, "step": 7.0, "after": 4.0}
    assert seen == [[7.0]]

    def diverged(v: list[float]) -> dict:
        raise RuntimeError(f"diverged at {v[0]:g}")

    with pytest.raises(RuntimeError, match="diverged at 3"):
        read_on_host({"guard": Deferred(torch.tensor([3.0]), diverged), "late": Deferred(torch.ones(1), seen.append)})
    assert seen == [[7.0]]  # the finish after a raising one does not run


def test_grouped_sigmoid_routing_and_the_sequence_wise_loss_read_nothing_forward_and_backward():
    args = MoEArgs(n_experts=8, top_k=2, ffn_dim=16, score_func="sigmoid", route_scale=2.5, shared_ffn_dim=16,
                   n_groups=4, topk_groups=2, aux_per_sequence=True)
    moe = MoE(32, args)
    for p in moe.parameters():
        torch.nn.init.normal_(p, std=0.1)
    moe.experts.kernel = "grouped_mm"
    moe.router.balance.aux, moe.router.balance.z = 0.01, 0.001
    x = torch.randn(2, 16, 32, requires_grad=True)
    with HostReads() as reads:
        moe(x).sum().backward()
    assert not reads.reads, reads.table()


def test_blocking_calls_names_each_host_synchronization_of_a_trace_with_the_op_around_it():
    def event(cat: str, name: str, ts: float, dur: float, tid: int = 1) -> dict:
        return {"cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid}

    trace = {"traceEvents": [
        event("user_annotation", STEP_RANGE, 0.0, 5000.0), event("user_annotation", STEP_RANGE, 5000.0, 5000.0),
        event("cpu_op", "aten::_local_scalar_dense", 100.0, 900.0),
        event("cuda_runtime", "cudaMemcpyAsync", 150.0, 800.0),  # a read: blocked 0.8 ms
        event("cpu_op", "aten::mm", 2000.0, 700.0), event("cpu_op", "aten::mm", 1900.0, 900.0, tid=2),
        event("cuda_runtime", "cudaLaunchKernel", 2010.0, 600.0),  # a launch into a full queue
        event("cuda_runtime", "cudaLaunchKernel", 2700.0, 5.0),  # a launch: not a synchronization
        event("cuda_runtime", "cudaStreamSynchronize", 6000.0, 40.0),  # a synchronization by its name
        event("cuda_runtime", "cudaStreamSynchronize", 20000.0, 40.0),  # outside the steps
    ]}
    assert blocking_calls(trace) == [("cudaMemcpyAsync", "aten::_local_scalar_dense", 0.5, 0.4),
                                     ("cudaLaunchKernel", "aten::mm", 0.5, 0.3),
                                     ("cudaStreamSynchronize", "?", 0.5, 0.02)]


def _by_step(reads: dict[int, list[str]]) -> dict[int, list[str]]:
    return {step: [r for r in got if not r.startswith(ONE_READ)] or len(got) for step, got in reads.items()}


def test_a_deepseek_v3_step_reads_nothing_on_one_rank_but_its_log_records_one_read(tmp_path):
    reads = reads_per_step(DEEPSEEK + ["--training.local_batch_size", "4"], str(tmp_path), STEPS, LOG_FREQ)
    assert _by_step(reads) == {1: 1, 2: 0, 3: 1}, reads


def test_a_deepseek_v3_step_at_expert_parallel_2_reads_nothing_but_its_log_records_one_read(tmp_path):
    results = run_on_ranks(2, reads_per_step, DEEPSEEK + ["--parallelism.ep", "2", "--training.local_batch_size", "2"],
                           str(tmp_path), STEPS, LOG_FREQ)
    for reads in results:
        assert _by_step(reads) == {1: 1, 2: 0, 3: 1}, reads


def test_a_pipeline_stage_of_dense_blocks_joins_the_log_records_collectives_and_reads_once(tmp_path):
    # Stage 0 holds DeepSeek-V3's dense first block only: its balance metrics must still join the
    # pipeline's all-reduce of the loads (they returned nothing and the ranks' collectives crossed).
    pipelined = ["--parallelism.pp", "2", "--training.local_batch_size", "4", "--parallelism.pp_microbatches", "2"]
    results = run_on_ranks(2, reads_per_step, DEEPSEEK + pipelined, str(tmp_path), STEPS, LOG_FREQ)
    for reads in results:  # step 1 of the last stage also reads its shapes (torch's pipeline schedule)
        assert {step: n for step, n in _by_step(reads).items() if step > 1} == {2: 0, 3: 1}, reads
