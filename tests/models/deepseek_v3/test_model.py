"""deepseek_v3's own pieces: the bad shapes refused naming the key, the sequence-wise balance loss
against its formula, MTP in training only (eval logits unchanged, every MTP parameter trained),
the MTP modules' place in a pipeline split (the last stage, with a copy of the embedding) and a
split that cannot run them refused before any process starts."""

from __future__ import annotations

import pytest
import torch

from kenotron.config import ConfigError
from kenotron.models import get_model_spec
from kenotron.models.common.future_tokens import IGNORE_INDEX, future_tokens
from kenotron.models.common.router import TopKRouter
from kenotron.parallel.pipeline import build_pipeline_split

SPEC = get_model_spec("deepseek_v3")


@pytest.mark.parametrize(("fields", "message"), [
    ({"n_groups": 3}, "model.moe.n_groups=3 must divide model.moe.n_experts=8"),
    ({"topk_groups": 5}, "model.moe.topk_groups=5 must lie in"),
    ({"top_k": 5, "topk_groups": 2}, "model.moe.top_k=5 exceeds the 4 experts"),
])
def test_bad_routing_groups_are_refused_naming_the_key(fields, message):
    moe = {"n_experts": 8, "n_groups": 4, "topk_groups": 2, "top_k": 2, **fields}
    with pytest.raises(ConfigError, match=message):
        SPEC.model_args("debug", {"moe": moe})


def _meta_model(**fields):
    with torch.device("meta"):
        return SPEC.build(SPEC.model_args("debug", **fields))


def test_pipeline_split_puts_the_mtp_modules_on_the_last_stage_with_a_copy_of_the_embedding():
    model = _meta_model(mtp_depth=2)  # blocks 0-3 main, 4-5 MTP
    split = build_pipeline_split(model, pp=2, schedule="ZBVZeroBubble", local_batch_size=4)
    assert split.stages[-1] == ["layers.3", "layers.4", "layers.5", "norm", "output", "mtp"]  # a main block, the tail
    assert split.copies == {3: ["tok_embeddings"]} and split.units_of(3)[-1] == "tok_embeddings"
    assert split.tied_parameters == [["tok_embeddings.weight"]] and split.holders(["tok_embeddings.weight"]) == [0, 3]
    tied = build_pipeline_split(_meta_model(mtp_depth=1, tie_embeddings=True), pp=2, schedule="1F1B",
                                local_batch_size=4)
    assert tied.copies == {1: ["tok_embeddings"]} and tied.tied_parameters == [["tok_embeddings.weight", "output.weight"]]


def test_pipeline_split_without_the_mtp_modules_beside_the_output_head_is_refused_naming_the_fix():
    with pytest.raises(ConfigError, match="MTP module layers.4 on a stage without the output head.*at least 3 blocks"):
        build_pipeline_split(_meta_model(mtp_depth=2), pp=2, schedule="1F1B", local_batch_size=4,
                             layers_per_stage=[5, 1])


def test_future_tokens_hold_the_next_tokens_and_ignore_past_the_window():
    tokens = torch.tensor([[10, 11, 12, 13]])
    assert future_tokens(tokens, 2).tolist() == [[[11, 12, 13], [12, 13, -100], [13, -100, -100],
                                                  [-100, -100, -100]]]
    assert IGNORE_INDEX == -100


def test_sequence_wise_balance_loss_equals_its_formula():
    torch.manual_seed(0)
    router = TopKRouter(16, 8, 2, "sigmoid", per_sequence=True, n_groups=2, topk_groups=1)
    router.gate.weight.data.normal_()
    router.balance.aux = 1.0
    x = torch.randn(3 * 10, 16)
    r = router(x)
    term = router.balance_term(r, sequences=3)
    expected = 0.0
    for s in range(3):
        ids = r.experts[s * 10:(s + 1) * 10]
        f = torch.bincount(ids.flatten(), minlength=8).float() * 8 / (2 * 10)
        scores = r.logits[s * 10:(s + 1) * 10].sigmoid()
        p = (scores / scores.sum(-1, keepdim=True)).mean(0)
        expected += (f * p).sum() / 3
    assert torch.allclose(term, expected, atol=1e-6)
    batch_wise = TopKRouter(16, 8, 2, "sigmoid", n_groups=2, topk_groups=1)
    batch_wise.load_state_dict(router.state_dict())
    batch_wise.balance.aux = 1.0
    assert not torch.allclose(batch_wise.balance_term(batch_wise(x)), term)


def test_mtp_trains_its_modules_and_leaves_the_logits_alone():
    args = SPEC.model_args("debug", max_seq_len=32, mtp_depth=2)
    with torch.device("meta"):
        model = SPEC.build(args)
    model.to_empty(device="cpu")
    model.init_weights(seed=0)
    assert sorted(model.layers, key=int)[-2:] == ["4", "5"] and not hasattr(model.layers["0"], "feed_forward")
    tokens = torch.randint(0, args.vocab_size, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = model.eval()(tokens)
    model.train()
    model.mtp.loss_scale = 1.0
    out = model(tokens)
    assert torch.equal(out.detach(), plain)
    out.sum().backward()
    for name, p in model.named_parameters():
        if name.startswith(("layers.4.", "layers.5.")) and "experts" not in name:
            assert p.grad is not None and p.grad.abs().sum() > 0, name
    # Targets: depth k predicts token t + k + 1, for the 32 - k - 1 positions that have one.
    assert model.mtp.targets.tolist() == [2 * 30, 2 * 29]
    assert 7 < (model.mtp.loss_sum / model.mtp.targets).min() < 10  # about ln(4096) at init

