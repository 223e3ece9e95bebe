"""Spectral µP: the init scale and AdamW rates of every parameter, from its global fans; the
checks before any process group; the LR schedule of per-matrix rates across model parts."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from kenotron.config import ConfigError, load_config
from kenotron.models import get_model_spec
from kenotron.models.common.parametrization import (
    MUP_BASE_WIDTH,
    Fans,
    matrix_fans,
    spectral_lr_scale,
    spectral_std,
)
from kenotron.train.lr_schedule import LRSchedule, build_lr_scheduler
from kenotron.train.optim import param_groups
from kenotron.train.resolve import resolve_run

LLAMA = get_model_spec("llama3")


def _model(parametrization: str, **shape) -> nn.Module:
    args = LLAMA.model_args("debug", max_seq_len=16, n_layers=1, **shape)
    with torch.device("meta"):
        model = LLAMA.build(args)
    model.to_empty(device="cpu")
    model.init_weights(seed=3, parametrization=parametrization)
    return model


def test_fans_of_a_decoder_count_the_vocabulary_as_one():
    with torch.device("meta"):
        model = LLAMA.build(LLAMA.model_args("debug", n_layers=1, dim=512, n_heads=16, ffn_dim=1536))
    fans = matrix_fans(model)
    assert fans["tok_embeddings.weight"] == Fans(1, 512)  # one-hot tokens in
    assert fans["output.weight"] == Fans(512, 1)  # classes out
    assert fans["layers.0.attention.wq.weight"] == Fans(512, 512)
    assert fans["layers.0.attention.wk.weight"] == Fans(512, 128)  # 4 kv heads of 32
    assert fans["layers.0.feed_forward.w1.weight"] == Fans(512, 1536)
    assert fans["layers.0.feed_forward.w2.weight"] == Fans(1536, 512)
    assert not any("norm" in name for name in fans)


def test_init_follows_the_papers_formula_for_each_matrix():
    """std = (1/sqrt(fan_in)) min(1, sqrt(fan_out/fan_in)); the sample std of each matrix matches."""
    model = _model("spectral_mup", dim=512, n_heads=16, ffn_dim=1536)
    expected = {
        "tok_embeddings.weight": 1.0,
        "layers.0.attention.wq.weight": 1 / math.sqrt(512),
        "layers.0.attention.wk.weight": math.sqrt(128 / 512) / math.sqrt(512),
        "layers.0.feed_forward.w1.weight": 1 / math.sqrt(512),
        "layers.0.feed_forward.w2.weight": math.sqrt(512 / 1536) / math.sqrt(1536),
        "output.weight": 1 / 512,
    }
    params = dict(model.named_parameters())
    for name, std in expected.items():
        # Truncated at 3 std, a normal's sample std is 0.986 of its scale.
        factor = 1.0 if name == "tok_embeddings.weight" else 0.986
        assert params[name].std().item() == pytest.approx(std * factor, rel=0.03), name
    assert torch.equal(params["norm.weight"], torch.ones(512))
    standard = dict(_model("standard", dim=512, n_heads=16, ffn_dim=1536).named_parameters())
    assert standard["layers.0.attention.wq.weight"].std().item() == pytest.approx(0.02 * 0.986, rel=0.03)


def test_adamw_rates_scale_as_one_over_fan_in_with_embeddings_and_vectors_at_the_base_rate():
    assert spectral_std(Fans(1024, 256)) == pytest.approx(0.5 / 32)
    assert spectral_lr_scale(None) == 1.0
    assert spectral_lr_scale(Fans(1, 4096)) == 1.0
    assert spectral_lr_scale(Fans(MUP_BASE_WIDTH, 768)) == 1.0
    assert spectral_lr_scale(Fans(1024, 1024)) == MUP_BASE_WIDTH / 1024
    model = _model("spectral_mup", dim=512, n_heads=16, ffn_dim=1536)
    from kenotron.models.common.parametrization import spectral_lr_scales

    groups = param_groups(model, 0.1, 1e-2, spectral_lr_scales(model))
    rate = {name: g["lr"] for g in groups for p in g["params"] for name, q in model.named_parameters() if p is q}
    assert rate["tok_embeddings.weight"] == rate["norm.weight"] == rate["layers.0.ffn_norm.weight"] == 1e-2
    assert rate["layers.0.attention.wq.weight"] == pytest.approx(1e-2 * 256 / 512)
    assert rate["layers.0.feed_forward.w2.weight"] == pytest.approx(1e-2 * 256 / 1536)
    assert rate["output.weight"] == pytest.approx(1e-2 * 256 / 512)
    decay = {name: g["weight_decay"] for g in groups for p in g["params"] for name, q in model.named_parameters()
             if p is q}
    assert decay["norm.weight"] == 0.0 and decay["output.weight"] == decay["tok_embeddings.weight"] == 0.1


def test_a_saved_schedule_loads_into_a_part_with_other_groups():
    """Pipeline stages hold different groups under µP; the checkpoint keeps one scheduler state
    (the first stage's) for all of them. Each part must keep its own per-group rates."""
    schedule = LRSchedule(total_steps=10, warmup_steps=2, decay="linear", min_lr_ratio=0.0)
    w = [nn.Parameter(torch.zeros(2)) for _ in range(3)]
    first = torch.optim.AdamW([{"params": [w[0]], "lr": 1.0}, {"params": [w[1]], "lr": 0.5}], lr=1.0)
    second = torch.optim.AdamW([{"params": [w[2]], "lr": 0.25}], lr=1.0)
    s1, s2 = build_lr_scheduler(first, schedule), build_lr_scheduler(second, schedule)
    for _ in range(3):
        first.step()  # no gradients: a no-op that keeps torch's step-order check quiet
        s1.step()
    s2.load_state_dict(s1.state_dict())
    second.step()
    s2.step()
    factor = schedule.lr_factor(5)
    assert second.param_groups[0]["lr"] == pytest.approx(0.25 * factor)
    first.step()
    s1.step()
    assert [g["lr"] for g in first.param_groups] == pytest.approx([factor, 0.5 * factor])


@pytest.mark.parametrize(("overrides", "message"), [
    (["--optimizer.name", "sgd"], r"spectral_mup' sets AdamW's per-matrix learning rates .* use optimizer.name='adamw'"),
    (["--model.name", "qwen2"], r"qwen2 debug ties them; set model.tie_embeddings=false"),
])
def test_spectral_mup_refuses_what_it_cannot_scale_before_any_process_group(overrides, message):
    with pytest.raises(ConfigError, match=message):
        resolve_run(load_config(None, ["--model.parametrization", "spectral_mup"] + overrides), 1)
    resolve_run(load_config(None, ["--model.parametrization", "spectral_mup", "--model.name", "qwen2",
                                   "--model.tie_embeddings", "false"]), 1)


def test_a_matrix_without_known_fans_is_refused_by_name():
    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.kernel = nn.Parameter(torch.zeros(4, 1, 3))

    with pytest.raises(ConfigError, match=r"fan-in and fan-out of kernel \(shape \(4, 1, 3\)\).*param_fans\(\)"):
        matrix_fans(Odd())
