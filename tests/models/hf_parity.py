"""Helpers for parity tests against transformers: random models on both sides, converted through
a family's HF adapter, compared by logits. Tests that use them call
`pytest.importorskip("transformers")` first."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kenotron.models.spec import ModelSpec


def random_kenotron_model(spec: ModelSpec, args: Any, seed: int = 0) -> torch.nn.Module:
    """A kenotron model with every parameter random, norms included (so a swapped norm shows)."""
    with torch.device("meta"):
        model = spec.build(args)
    model.to_empty(device="cpu")
    torch.manual_seed(seed)
    model.init_weights()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


def hf_model(spec: ModelSpec, args: Any) -> torch.nn.Module:
    """An untrained transformers model of the adapter's architecture built from `args`."""
    import transformers

    config_dict = spec.hf_adapter.hf_config_from_args(args)
    config = transformers.AutoConfig.for_model(**config_dict, attn_implementation="eager")
    model_cls = getattr(transformers, spec.hf_adapter.architecture)
    return model_cls(config).float().eval()


def random_hf_model(spec: ModelSpec, args: Any, seed: int = 0) -> torch.nn.Module:
    model = hf_model(spec, args)
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            # Norm scales around 1, everything else around 0, all of it random.
            p.copy_(torch.randn_like(p) * 0.1 + (1.0 if "norm" in name and name.endswith("weight") else 0.0))
    return model


def max_logit_diff(ours: torch.nn.Module, theirs: torch.nn.Module, tokens: torch.Tensor) -> float:
    with torch.no_grad():
        a = ours(tokens)
        b = theirs(input_ids=tokens).logits
    return (a - b).abs().max().item()


def _transformers_version() -> tuple[int, ...]:
    import transformers

    return tuple(int(part) for part in transformers.__version__.split(".")[:2] if part.isdigit())


needs_grouped_mamba2_norm = pytest.mark.skipif(
    _transformers_version() < (5, 23),
    reason="transformers < 5.23 normalizes Mamba2's gated norm over all B/C groups at once (fixed in 5.23); "
           "kenotron and mamba_ssm normalize each group, which these multi-group configs test",
)
"""For the tests that compare a Mamba-2 model of several groups with transformers' (the GPU image has 5.17)."""
