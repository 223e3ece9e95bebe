"""Multi-token prediction through the trainer (train/mtp.py): one rank, deepseek_v3's debug model
with a dense first block, an MoE block and one MTP module: the MTP loss reaches metrics.jsonl and
falls, the MoE metrics name the MoE block by its index, and the MTP loss trains the shared weights
(the same first loss as without MTP, other losses after); the MTP heads' fused chunked loss equals
plain cross-entropy over their logits."""

from __future__ import annotations

import functools

import torch

from kenotron.models import get_model_spec
from kenotron.train.fused_loss import linear_cross_entropy_sum
from tests.train.short_run import read_records, train_short_run

# No balancing terms: the MTP block's router would otherwise change the main routers' loss weights.
MODEL = ["--model.name", "deepseek_v3", "--training.local_batch_size", "8", "--moe.aux_loss_coef", "0"]


def test_mtp_loss_and_moe_loads_reach_the_records_and_the_mtp_loss_trains_the_model(tmp_path):
    train_short_run(2, MODEL + ["--model.mtp_depth", "1"], str(tmp_path / "mtp"))
    train_short_run(2, MODEL, str(tmp_path / "none"))
    records, without = read_records(tmp_path / "mtp"), read_records(tmp_path / "none")
    assert records[-1]["mtp_loss/1"] < records[0]["mtp_loss/1"]
    assert "moe_load_max/1" in records[-1] and "moe_load_max/0" not in records[-1]  # block 0 is dense
    assert records[0]["moe_load_mean/1"] == 8 * 32 * 2 / 8  # token copies per expert
    assert "mtp_loss/1" not in without[0]
    assert records[0]["loss"] == without[0]["loss"] and records[-1]["loss"] != without[-1]["loss"]


def _mtp_losses_and_gradients(head_loss):
    """One forward and backward of deepseek_v3's debug model with 2 MTP modules in fp32, only their loss
    (mean over targets) flowing back: the modules' summed losses, every gradient and the output
    layer's calls (each makes [tokens, vocab] logits)."""
    spec = get_model_spec("deepseek_v3")
    args = spec.model_args("debug", n_layers=2, mtp_depth=2)
    torch.manual_seed(0)
    model = spec.build(args)
    model.init_weights(seed=0)
    model.train()
    model.mtp.loss_scale, model.mtp.head_loss = 1 / 28, head_loss  # about the targets per module
    calls = []
    model.output.register_forward_hook(lambda *_: calls.append(1))
    tokens = torch.randint(0, args.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
    model(tokens).sum().mul(0).backward()
    return model.mtp.loss_sum.clone(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}, len(calls)


def test_mtp_heads_fused_chunked_loss_equals_plain_cross_entropy_in_losses_and_gradients():
    # 7-token chunks: several per module, the last one partial.
    fused = functools.partial(linear_cross_entropy_sum, chunk_tokens=7)
    plain_losses, plain_grads, plain_calls = _mtp_losses_and_gradients(None)
    fused_losses, fused_grads, fused_calls = _mtp_losses_and_gradients(fused)
    assert (plain_calls, fused_calls) == (3, 1)  # the fused heads never call the output layer: the main head only
    torch.testing.assert_close(fused_losses, plain_losses, rtol=1e-6, atol=1e-6)
    assert fused_grads.keys() == plain_grads.keys() and "output.weight" in fused_grads
    for name, grad in plain_grads.items():
        torch.testing.assert_close(fused_grads[name], grad, rtol=1e-6, atol=1e-6, msg=name)
