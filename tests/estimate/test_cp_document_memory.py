"""The estimator under document masking and context parallel: a CUDA job runs FlexAttention
against the all-gathered keys/values (kenotron/parallel/context/flex_gather.py), which keeps the
gathered keys/values for backward in every layer; the fake step counts them and the report says
which attention it simulated."""

from __future__ import annotations

from kenotron.config import load_config
from kenotron.estimate.breakdown import allocated_bytes
from kenotron.planner import estimate_with_closed_form
from kenotron.train.resolve import resolve_run

LONG = ["--training.param_dtype", "bfloat16", "--training.local_batch_size", "1", "--training.seq_len", "2048",
        "--parallelism.cp", "4"]
DOCS = ["--data.document_masking", "true"]


def _activations(*overrides: str) -> tuple[int, list[str]]:
    report = estimate_with_closed_form(load_config("debug", [*LONG, *overrides]), 4, gpu_memory_gib=80)
    return report.ranks[0].phase_peaks["forward"].activations, report.notes


def test_flex_cp_keeps_the_gathered_keys_and_values_where_torchs_ring_keeps_an_output_copy():
    causal, _ = _activations()
    masked, notes = _activations(*DOCS)
    run = resolve_run(load_config("debug", [*LONG, *DOCS]), 4)
    assert run.plan.settings.cp_attention == "flex"
    a, local = run.model_args, 2048 // 4
    gathered = allocated_bytes((4 - 1) * local * 2 * a.n_kv_heads * a.head_dim * 2)  # keys and values of 3 ranks
    copy = allocated_bytes(local * a.n_heads * a.head_dim * 2)  # torch's balanced ring's output copy (rank 0)
    assert masked - causal == a.n_layers * (gathered - copy)
    assert any("FlexAttention against the all-gathered keys/values" in n and "document-masked" in n for n in notes)
