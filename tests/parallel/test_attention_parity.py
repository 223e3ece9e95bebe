"""The new attention backends under data and tensor parallel, against one rank (CPU/gloo, fp32).

- Document masking (FlexAttention block masks): the mask is built once per micro-batch from
  the full token ids and passed through FSDP's and TP's hooks into every layer, where tensor
  parallel gives each rank half the heads; loss and gradients must match the 1-rank run.
- flash_attn (a fake flash_attn module, the real one needs CUDA): the kernel receives the
  head-sharded local tensors of each tp rank.
"""

from __future__ import annotations

import pytest
import torch

from kenotron.config import load_config
from kenotron.kernel_choice.attention_backend import use_attention_kernel
from kenotron.parallel.dims import build_device_meshes
from kenotron.train.resolve import resolve_run
from tests.distributed.pool import run_on_ranks
from tests.models.fake_flash_attn import fake_flash_attn, install, uninstall
from tests.parallel.parity import assert_parity, run_steps

DOCS = ["--data.document_masking", "true"]
LAYOUTS = {
    "fsdp2": [],
    "tp2": ["--parallelism.tp", "2", "--training.local_batch_size", "8"],
    "tp2_no_sp": ["--parallelism.tp", "2", "--training.local_batch_size", "8", "--parallelism.sequence_parallel", "false"],
}


@pytest.fixture(scope="module")
def reference_documents(tmp_path_factory):
    return run_steps(DOCS, str(tmp_path_factory.mktemp("ref")))


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_document_masking_matches_one_rank(layout, reference_documents, tmp_path):
    results = run_on_ranks(2, run_steps, DOCS + LAYOUTS[layout], str(tmp_path))
    assert_parity(reference_documents, results, loss_tol=1e-6, grad_tol=1e-6)


MODEL = ["--model.n_layers", "2", "--training.seq_len", "32", "--parallelism.tp", "2"]


def _build(world_size: int, flash: bool) -> torch.nn.Module:
    """The debug model, as the trainer builds it, without its data and optimizer. The trainer's
    own path to flash_attn is closed on CPU (its config check wants CUDA), so the kernel is
    installed here by the same function the trainer calls, on the meta model."""
    run = resolve_run(load_config(None, MODEL if world_size > 1 else MODEL[:4]), world_size)
    with torch.device("meta"):
        model = run.spec.build(run.model_args)
    if flash:
        use_attention_kernel(model, "flash_attn", torch.device("cpu"))
    if world_size > 1:
        run.plan.apply(model, build_device_meshes(run.dims, "cpu"))
    model.to_empty(device="cpu")
    model.init_weights(seed=0)
    return model


def _logits_and_grad(model: torch.nn.Module, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logits = model(tokens)
    logits = logits.full_tensor() if hasattr(logits, "full_tensor") else logits
    logits.square().mean().backward()
    grad = model.layers["1"].attention.wq.weight.grad
    grad = grad.full_tensor() if hasattr(grad, "full_tensor") else grad
    return logits.detach(), grad


def _flash_attn_under_tp(tokens: torch.Tensor) -> dict:
    fake = fake_flash_attn(dtypes=(torch.float32,))  # fp32 here, to compare at fp32 precision
    install(fake)
    try:
        logits, grad = _logits_and_grad(_build(2, flash=True), tokens)
    finally:
        uninstall()
    return {"logits": logits, "grad": grad, "calls": fake.calls}


def test_flash_attn_under_tensor_parallel_matches_sdpa_on_one_rank():
    tokens = torch.randint(0, 4096, (2, 32), generator=torch.Generator().manual_seed(0))
    model = _build(1, flash=False)
    want_logits, want_grad = _logits_and_grad(model, tokens)
    args = model.args
    for res in run_on_ranks(2, _flash_attn_under_tp, tokens):
        # Each tp rank attends over its half of the query and key/value heads.
        local = ((2, 32, args.n_heads // 2, args.head_dim), (2, 32, args.n_kv_heads // 2, args.head_dim))
        assert res["calls"] == [local] * 2
        torch.testing.assert_close(res["logits"], want_logits, atol=2e-6, rtol=1e-5)
        torch.testing.assert_close(res["grad"], want_grad, atol=1e-7, rtol=1e-4)
