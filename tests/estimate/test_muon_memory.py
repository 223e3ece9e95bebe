"""Muon's optimizer state in the memory model: the closed form (estimate/static_memory.py)
equals the simulated step's under ZeRO-1 (the fullest rank of the Muon / AdamW partition), and is AdamW's less one fp32 copy of
the Muon matrices."""

from __future__ import annotations

from kenotron.config import load_config
from kenotron.estimate import estimate_memory
from kenotron.planner import AnalyticModel
from kenotron.train.resolve import resolve_run


def test_muon_state_closed_form_equals_the_simulated_step_under_zero1():
    overrides = ["--parallelism.dp_mode", "zero1"]
    cfg = load_config("debug", ["--optimizer.name", "muon", *overrides])
    run = resolve_run(cfg, 2)
    closed_form = AnalyticModel(run).optimizer_state(run)
    assert estimate_memory(cfg, 2, gpu_memory_gib=80).ranks[0].peak.optimizer_state == closed_form
    adamw = load_config("debug", overrides)
    adamw_run = resolve_run(adamw, 2)
    assert closed_form < 0.75 * AnalyticModel(adamw_run).optimizer_state(adamw_run)  # 3.1M of 5.2M are Muon's
