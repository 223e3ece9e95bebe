"""The planner: candidates fit the budget, are ranked by modelled throughput, and the best
ones are confirmed on fake tensors."""

from __future__ import annotations

import io
import re
import sys

import pytest

from kenotron.config import load_config
from kenotron.planner import format_search, search_layouts

BUDGET_GIB = 0.25


@pytest.fixture(scope="module")
def result():
    cfg = load_config("debug", ["--training.global_batch_size", "16"])
    return search_layouts(cfg, 4, BUDGET_GIB, top=8, confirm=2)


def test_candidates_fit_and_are_ranked_by_throughput(result):
    assert result.ranked and result.considered > len(result.ranked)
    budget = BUDGET_GIB * 0.9 * 2**30
    assert all(c.analytic_peak <= budget for c in result.ranked)
    speeds = [c.step.tokens_per_s_per_gpu for c in result.ranked]
    assert speeds == sorted(speeds, reverse=True)
    assert all(c.local_batch * c.micro_steps * c.degrees["dp_replicate"] * c.degrees["dp_shard"] == 16
               for c in result.ranked)


def test_the_best_candidates_are_confirmed_on_fake_tensors(result):
    confirmed = [c for c in result.ranked if c.confirmed_peak is not None]
    assert len(confirmed) == 2 and result.ranked[0].confirmed_peak is not None
    for c in confirmed:
        assert c.confirmed_peak <= BUDGET_GIB * 0.9 * 2**30
        assert c.analytic_peak == pytest.approx(c.confirmed_peak, rel=0.05)


def test_the_search_prints_a_table_and_the_overrides_of_the_best(result):
    text = format_search(result)
    assert "tok/s/GPU" in text and text.count("\n") > 3
    assert "best: --parallelism.dp_replicate" in text
    assert result.to_dict()["candidates"][0]["overrides"] == " ".join(result.ranked[0].overrides())


def test_pipeline_candidates_follow_the_trainers_rules_and_are_confirmed():
    """Global batch 4 on 8 GPUs caps data parallel at 4 and a 2-GPU node caps tp at 2 (seq_len 258
    rules out cp), so the layouts left are dp 4 x tp 2 and pipelines; the pipelines are listed with
    each schedule the search prices, by the closed form within its tolerance of the fake-tensor
    estimate, and accepted by the trainer's resolve_run with their schedule, stages per rank and
    one sequence per microbatch."""
    from kenotron.planner import Hardware
    from kenotron.train.resolve import resolve_run

    budget = 0.03
    cfg_args = ["--training.global_batch_size", "4", "--training.seq_len", "258"]
    result = search_layouts(load_config("debug", cfg_args), 8, budget, top=20, confirm=2, hw=Hardware(gpus_per_node=2))
    pipelines = [c for c in result.ranked if c.degrees["pp"] > 1]
    assert pipelines and any(c.degrees["pp"] == 1 for c in result.ranked)
    assert any(c.confirmed_peak is not None for c in pipelines)
    deeper = ["--training.global_batch_size", "4", "--training.seq_len", "258", "--model.n_layers", "8"]
    unbounded = search_layouts(load_config("debug", deeper), 8, 80, top=1000, confirm=0, hw=Hardware(gpus_per_node=2))
    every = [c for c in unbounded.ranked if c.degrees["pp"] > 1]
    # DualPipeV needs 2 pp microbatches, more than global batch 4 leaves a pipeline of 2 ranks and more.
    assert {c.pp_schedule for c in every} >= {"1F1B", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble"}
    assert {c.pp_stages_per_rank for c in every if c.pp_schedule == "Interleaved1F1B"} == {2, 4}
    assert all(c.ac_mode == "none" for c in every if c.pp_schedule in ("InterleavedZeroBubble", "ZBVZeroBubble"))
    for c, args in [(c, cfg_args) for c in pipelines] + [(c, deeper) for c in every[::7]]:
        assert f"--parallelism.pp_schedule {c.pp_schedule}" in " ".join(c.overrides())
        run = resolve_run(load_config("debug", args + " ".join(c.overrides()).split()), 8)
        split = run.plan.pipeline
        assert split.schedule == c.pp_schedule and split.n_stages == c.degrees["pp"] * c.pp_stages_per_rank
        assert split.microbatches == c.local_batch >= c.degrees["pp"]
        assert run.grad_accum_steps == c.micro_steps
        if c.confirmed_peak is not None:
            assert c.analytic_peak <= budget * 0.9 * 2**30
            assert c.analytic_peak == pytest.approx(c.confirmed_peak, rel=0.05)
    table = format_search(unbounded)
    assert all(c.schedule() in table for c in every[:20])


def test_moe_models_are_searched_over_expert_parallel_degrees():
    cfg = load_config("qwen3_moe_debug", ["--training.global_batch_size", "8",
                                                             "--training.seq_len", "256"])
    result = search_layouts(cfg, 4, 4.0, top=1000, confirm=1)
    eps = {c.degrees["ep"] for c in result.ranked}
    assert eps >= {1, 2, 4}, eps
    with_ep = next(c for c in result.ranked if c.degrees["ep"] > 1)
    assert f"--parallelism.ep {with_ep.degrees['ep']}" in " ".join(with_ep.overrides())
    assert f"ep{with_ep.degrees['ep']}" in with_ep.label()


def test_the_search_pairs_context_parallel_with_pipelines_and_with_zero1():
    """cp runs inside pipeline stages and ZeRO-1 shares optimizer state over dp x cp: the planner
    prices both kinds, and the trainer's resolve_run accepts their overrides as they are."""
    from kenotron.train.resolve import resolve_run

    args = ["--training.global_batch_size", "8"]
    result = search_layouts(load_config("debug", args), 8, 80, top=1000, confirm=0)
    pp_cp = [c for c in result.ranked if c.degrees["pp"] > 1 and c.degrees["cp"] > 1]
    zero1_cp = [c for c in result.ranked if c.dp_mode == "zero1" and c.degrees["cp"] > 1]
    # Both CP schemes are priced; the all-to-all only where debug's 8 heads and 4 kv heads split (cp <= 8).
    ulysses = [c for c in result.ranked if c.cp_scheme == "ulysses"]
    assert pp_cp and zero1_cp and ulysses and {c.cp_scheme for c in pp_cp} == {"ring", "ulysses"}
    assert all(c.degrees["cp"] > 1 and "-ulysses" in c.label() for c in ulysses)
    # GPUs measured Ulysses at cp 2 and 4 and the ring at cp 2 and 4, not cp 8: the rows say which they price.
    rows = {(c.cp_scheme, c.degrees["cp"]): c.cp_row for c in result.ranked}
    assert rows[("ulysses", 2)] == rows[("ring", 4)] == rows[("ulysses", 4)] == "measured"
    assert rows[("ulysses", 8)] == rows[("ring", 8)] == "modelled"
    assert {c.cp_row for c in result.ranked if c.degrees["cp"] == 1} == {""}
    assert any("CP column 'modelled'" in note for note in result.notes)
    ring = next(c for c in result.ranked if c.cp_scheme == "ring" and c.degrees["cp"] > 1)
    assert "--parallelism.cp_scheme ring" in ring.overrides()  # named: the config's "auto" may settle otherwise
    for c in (pp_cp[0], zero1_cp[0], ulysses[0]):
        run = resolve_run(load_config("debug", args + " ".join(c.overrides()).split()), 8)
        assert {"ep": 1, **run.dims.degrees()} == c.degrees and run.plan.settings.dp_mode == c.dp_mode
        assert (run.plan.pipeline is not None) == (c.degrees["pp"] > 1)
        assert run.plan.settings.cp_scheme == c.cp_scheme


class _Terminal(io.StringIO):
    """stderr as a terminal: tqdm draws its bars only there."""

    def isatty(self) -> bool:
        return True


def test_the_search_shows_the_layouts_priced_out_of_all_on_a_terminal(monkeypatch):
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    result = search_layouts(load_config("debug", ["--training.global_batch_size", "4"]), 2, 80, top=2, confirm=0)
    shown = terminal.getvalue()
    total = re.search(r"pricing layouts:\s+0%\|[^|]*\| 0/(\d+)", shown)
    assert total, shown
    assert int(total.group(1)) >= result.considered > 0


def test_the_search_prints_no_progress_when_stderr_is_a_log(capsys):
    search_layouts(load_config("debug", ["--training.global_batch_size", "4"]), 2, 80, top=2, confirm=0)
    assert capsys.readouterr().err == ""


def test_deepseek_v3_with_mtp_is_searched_with_pipelines_and_context_parallel_and_confirmed():
    # MTP runs on the last pipeline stage and under context parallel: those layouts are offered too.
    cfg = load_config("deepseek_v3_debug", ["--training.global_batch_size", "8", "--training.seq_len", "256"])
    result = search_layouts(cfg, 4, 4.0, top=1000, confirm=1)
    assert {c.degrees["ep"] for c in result.ranked} >= {1, 2, 4}
    assert {c.degrees["pp"] for c in result.ranked} >= {1, 2} and {c.degrees["cp"] for c in result.ranked} >= {1, 2}
    assert result.ranked[0].confirmed_peak is not None  # the fake-tensor build of the MTP model ran


def test_only_layouts_the_closed_form_fits_reach_the_fake_tensor_estimator(monkeypatch):
    """The fake-tensor run is the slow part of a search: a candidate the closed form puts over the
    budget is never confirmed, whatever its modelled speed."""
    from kenotron.planner import search

    budget, confirmed = 0.03, []
    real = search.estimate_run

    def recording(run, gpu_memory_gib):
        confirmed.append(run)
        return real(run, gpu_memory_gib)

    monkeypatch.setattr(search, "estimate_run", recording)
    cfg = load_config("debug", ["--training.global_batch_size", "4", "--training.seq_len", "258"])
    result = search_layouts(cfg, 8, budget, top=3, confirm=1, hw=search.Hardware(gpus_per_node=2))
    model = search.AnalyticModel(confirmed[0])
    assert confirmed and result.considered > len(result.ranked)
    assert all(model.peak(run).total <= budget * 0.9 * 2**30 for run in confirmed)



def test_with_document_masking_the_search_prices_the_rings_busiest_rank_and_says_what_it_assumed():
    args = ["--training.global_batch_size", "4", "--training.seq_len", "4096", "--data.document_masking", "true"]
    result = search_layouts(load_config("debug", args), 4, 80, top=1000, confirm=0, document_tokens=512)
    rows = {(c.label(), c.ac_mode, c.local_batch): c for c in result.ranked if c.degrees["pp"] == 1}
    ring, ulysses = rows[("cp4", "none", 1)], rows[("cp4-ulysses", "none", 1)]
    assert ring.step.documents.ring == 4 and ulysses.step.documents.ring == 1
    # The same documents and kept tiles; the ring waits for its busiest rank, the all-to-all's are even.
    assert ring.step.documents.work.kept == ulysses.step.documents.work.kept
    assert ring.step.compute > ulysses.step.compute
    note = next(n for n in result.notes if n.startswith("document masking:"))
    assert note.startswith("document masking: exponential documents of mean 512 tokens (--document-tokens), "
                           "attention work 0.")
    assert "ring busiest rank 1." in note and "x the mean at 2 ranks" in note and "at 4 ranks" in note
    assert "note: document masking: exponential documents" in format_search(result)
