"""Activation checkpointing changes memory, never results: every mode gives the loss and the
gradients of no checkpointing and keeps parameter names. (That each mode saves less than the
one before it is checked on the real step by the estimator's tests, tests/estimate/test_memory.py.)"""

from __future__ import annotations

import copy

import pytest
import torch

from kenotron.models.llama3.args import Llama3Args
from kenotron.models.llama3.model import Llama3
from kenotron.parallel.activation_checkpoint import apply_activation_checkpointing

ARGS = Llama3Args(dim=64, n_layers=4, n_heads=4, n_kv_heads=2, ffn_dim=160, vocab_size=256)


def _model() -> Llama3:
    model = Llama3(ARGS)
    model.init_weights(seed=0)
    return model


def _blocks(model: Llama3) -> list[torch.nn.Module]:
    return list(model.layers.values()) if isinstance(model.layers, torch.nn.ModuleDict) else list(model.layers)


def _loss_and_grads(model: Llama3, tokens: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    logits = model(tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


CASES = [
    ("full", {}),
    ("selective-op", {}),
    ("selective-op", {"save_matmul_every": 2}),
    ("selective-op", {"save_matmul_every": 3}),
    ("every-n-layers", {"every_n": 2}),
    ("every-n-layers", {"every_n": 1}),
]


@pytest.mark.parametrize("mode,options", CASES, ids=[f"{m}-{o}" for m, o in CASES])
def test_checkpointed_model_has_the_loss_and_gradients_of_the_plain_one(mode, options):
    tokens = torch.randint(0, ARGS.vocab_size, (2, 33), generator=torch.Generator().manual_seed(1))
    reference = _model()
    checkpointed = copy.deepcopy(reference)
    apply_activation_checkpointing(_blocks(checkpointed), mode, **options)
    names = [n for n, _ in reference.named_parameters()]
    assert [n for n, _ in checkpointed.named_parameters()] == names  # state-dict keys unchanged
    loss, grads = _loss_and_grads(reference, tokens)
    ckpt_loss, ckpt_grads = _loss_and_grads(checkpointed, tokens)
    assert torch.equal(ckpt_loss, loss)
    for name in names:
        torch.testing.assert_close(ckpt_grads[name], grads[name], rtol=0, atol=1e-7, msg=name)


def test_bad_modes_are_refused_with_the_valid_choices():
    with pytest.raises(ValueError, match="is not one of none, full, selective-op, every-n-layers"):
        apply_activation_checkpointing(_blocks(_model()), "partial")
    with pytest.raises(ValueError, match="every_n=0 must be >= 1"):
        apply_activation_checkpointing(_blocks(_model()), "every-n-layers", every_n=0)
