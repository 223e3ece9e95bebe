"""A small model of any family, built the way the trainer builds one (meta, then CPU, then init)."""

from __future__ import annotations

import dataclasses

import torch

from kenotron.models import get_model_spec


def tiny_model(name: str = "llama3", seq_len: int = 32, n_layers: int = 2, seed: int = 0) -> torch.nn.Module:
    """The family's debug flavor with `n_layers` blocks and RoPE tables for `seq_len`, on the CPU."""
    spec = get_model_spec(name)
    args = dataclasses.replace(spec.model_args("debug", max_seq_len=seq_len), n_layers=n_layers)
    with torch.device("meta"):
        model = spec.build(args)
    model.to_empty(device="cpu")
    model.init_weights(seed=seed)
    return model
