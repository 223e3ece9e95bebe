"""Mamba-2's bad inputs, each one clear error from resolve_run, before any process group:
heads or B/C groups that tensor parallel cannot split, a hybrid's attention layer past the
last layer, context parallel, document masking (the scan crosses documents)."""

from __future__ import annotations

import pytest

from kenotron.config import ConfigError, load_config
from kenotron.degrees import ParallelConfigError
from kenotron.train.resolve import resolve_run

MAMBA = ["--model.name", "mamba2"]


def resolve(world: int, *overrides: str):
    return resolve_run(load_config(None, MAMBA + list(overrides)), world)


def test_tp_must_divide_the_scan_heads_and_the_groups():
    # debug: 16 heads in 4 groups; the published sizes have one group, so no tensor parallel.
    with pytest.raises(ParallelConfigError, match=r"tp=3 does not divide ssm heads \(expand x dim / ssm_head_dim\)=16; "
                                                  r"use one of \[1, 2, 4, 8, 16\]"):
        resolve(3, "--parallelism.tp", "3")
    with pytest.raises(ParallelConfigError, match=r"tp=8 does not divide ssm_groups=4; use one of \[1, 2, 4\]"):
        resolve(8, "--parallelism.tp", "8")
    with pytest.raises(ParallelConfigError, match=r"tp=2 does not divide ssm_groups=1; use one of \[1\]"):
        resolve(2, "--parallelism.tp", "2", "--model.flavor", "1.3B")
    assert resolve(4, "--parallelism.tp", "4").dims.tp == 4


def test_a_hybrid_attention_layer_out_of_range_is_named():
    with pytest.raises(ConfigError, match=r"attention_layers=\[2\] names layer 2, but the model has 2 layers "
                                          r"\(model.n_layers\); use indices 0..1"):
        resolve(1, "--model.flavor", "debug-hybrid", "--model.n_layers", "2")


def test_context_parallel_and_document_masking_are_refused_with_the_reason():
    with pytest.raises(ConfigError, match=r"parallelism.cp=2 is not supported by model.name='mamba2': Mamba-2's scan "
                                          r"carries a state .*; use parallelism.cp=1"):
        resolve(2, "--parallelism.cp", "2")
    with pytest.raises(ConfigError, match=r"data.document_masking=true is not supported by model.name='mamba2'"):
        resolve(1, "--data.document_masking", "true")


def test_the_cpu_run_takes_the_pytorch_scan_and_the_gpu_plan_the_triton_one():
    assert resolve(1, "--training.device", "cpu").choices.ssm_kernel == "torch"
    planned = resolve(1, "--training.device", "cuda", "--model.flavor", "1.3B")
    assert planned.choices.ssm_kernel == "triton"
