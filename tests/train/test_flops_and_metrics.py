"""The MFU formula against a hand computation, the peak table, and the metrics record schema."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from kenotron.models import get_model_spec
from kenotron.models.spec import attention_mixing_flops
from kenotron.train.flops import flops_per_token, matmul_params, peak_flops
from kenotron.train.metrics import RECORD_KEYS, MetricsLogger, format_record


def meta_model(flavor: str, **kw):
    spec = get_model_spec("llama3")
    with torch.device("meta"):
        return spec.build(spec.model_args(flavor, max_seq_len=16, **kw))


def test_matmul_params_excludes_the_input_embedding_only():
    # 8B is untied: N = all parameters minus the 128256 x 4096 input table.
    assert matmul_params(meta_model("8B")) == 8_030_261_248 - 128256 * 4096
    # 1B is tied: the shared table is the output projection, counted once.
    assert matmul_params(meta_model("1B")) == 1_235_814_400


def test_reference_mfu_figures_are_reproduced_by_the_formula():
    # The project's reference rows (1xH200): 1B shape b4 x 4096 at 59.4k tok/s is 54.3% MFU,
    # and the 8B width with 8 layers, b2 x 8192 at 35.7k tok/s is 60.8% MFU.
    f1b = flops_per_token(matmul_params(meta_model("1B")), 12.0 * 16 * 32 * 64 * 4096)
    assert 100 * f1b * 59.4e3 / 989e12 == pytest.approx(54.3, abs=0.1)
    f8 = flops_per_token(matmul_params(meta_model("8B", n_layers=8)), 12.0 * 8 * 32 * 128 * 8192)
    assert 100 * f8 * 35.7e3 / 989e12 == pytest.approx(60.8, abs=0.1)


def test_flops_formula_by_hand():
    # 6 N + 12 L H d T with N=1000, L=2, H=4, d=8, T=16
    args = get_model_spec("llama3").model_args("debug", n_layers=2)
    args = dataclasses.replace(args, dim=32, n_heads=4)  # head_dim 8
    assert flops_per_token(1000, attention_mixing_flops(args, 16)) == 6 * 1000 + 12 * 2 * 4 * 8 * 16


def test_mamba2_scan_flops_by_hand_and_hybrid_layers_counted_as_attention():
    spec = get_model_spec("mamba2")
    args = spec.model_args("1.3B")  # Q 256, 64 heads of 64, 1 group, state 128
    per_layer = 3 * (2 * 256 * 128 * 1 + 2 * 256 * 64 * 64 + 4 * 128 * 64 * 64)
    assert spec.mixing_flops(args, 2048) == 48 * per_layer == 48 * 12_779_520
    # The scan is linear in the sequence: its FLOPs per token do not grow with it.
    assert spec.mixing_flops(args, 8192) == spec.mixing_flops(args, 2048)
    hybrid = spec.model_args("hybrid-1.3B")  # 4 attention layers of 16 heads of 128
    assert spec.mixing_flops(hybrid, 2048) == 44 * per_layer + 12 * 4 * 16 * 128 * 2048
    with torch.device("meta"):
        n = matmul_params(spec.build(args))
    assert n == 1_343_757_312  # tied: the embedding counted once, as the output projection


def test_peak_table_matches_specific_names_first_and_never_guesses():
    assert peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_flops("NVIDIA H100 PCIe") == 756e12
    assert peak_flops("NVIDIA H200") == 989e12
    assert peak_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert peak_flops("cpu (2 threads)") is None
    assert peak_flops("Some Future GPU") is None


def test_record_schema_jsonl_and_unknown_peak(tmp_path, caplog):
    log = MetricsLogger(tmp_path, flops_per_token=1e6, world_size=2, device=torch.device("cpu"))
    log.reset_clock()
    log.count(4000)
    with caplog.at_level("INFO", logger="kenotron"):
        rec = log.record(step=1, loss=2.5, grad_norm=0.5, lr=1e-3, tokens_seen=4000)
    log.close()
    assert set(RECORD_KEYS) <= set(rec)
    assert rec["mfu"] is None and "MFU is not reported" in caplog.text
    assert not [r for r in caplog.records if r.levelname == "WARNING"]  # a CPU has no peak by design
    assert rec["tokens_per_sec"] > 0
    assert rec["tflops"] == pytest.approx(rec["tokens_per_sec"] * 1e6 / 1e12)
    assert rec["memory_gib"] > 0
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[0]) == rec
    assert "loss 2.5000" in format_record(rec) and "MFU n/a" in format_record(rec)


def test_tokens_per_sec_is_per_device(tmp_path):
    log = MetricsLogger(tmp_path, flops_per_token=1.0, world_size=4, device=torch.device("cpu"), write=False)
    log.reset_clock()
    log.count(1_000_000)
    rec = log.record(step=1, loss=1.0, grad_norm=1.0, lr=1.0, tokens_seen=1_000_000)
    total_rate = 1_000_000 / rec["step_time_s"]
    assert rec["tokens_per_sec"] == pytest.approx(total_rate / 4, rel=1e-6)


def test_moe_flops_count_active_parameters_as_the_reference_does():
    """Qwen3-30B-A3B's width with 4 layers: the 8 routed experts of 128 count, router and the rest
    whole: torchtitan 0.2.2's FLOPs per token for this shape (4,037,658,624), so its 76,514 tok/s
    on an H200 are its 31.2% MFU."""
    import torch

    from kenotron.models import get_model_spec
    from kenotron.train.flops import active_matmul_params, flops_per_token, matmul_params

    spec = get_model_spec("qwen3_moe")
    args = spec.model_args("30B-A3B", n_layers=4, max_seq_len=4096)
    with torch.device("meta"):
        model = spec.build(args)
    assert sum(p.numel() for p in model.parameters()) == 3_114_814_464
    active = active_matmul_params(model)
    experts = 4 * 128 * 3 * 768 * 2048
    assert matmul_params(model) - active == experts - experts * 8 // 128
    per_token = flops_per_token(active, 12.0 * 4 * 32 * 128 * 4096)
    assert per_token == 4_037_658_624
    assert round(100 * 76_514 * per_token / 989e12, 1) == 31.2
