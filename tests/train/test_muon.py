"""Muon on one process: equal to torch.optim.Muon where the rules coincide, its AdamW groups
equal to torch.optim.AdamW, Newton–Schulz's result, which parameters get which optimizer, the
learning-rate rules, the refusals before any process group, and a bitwise resume."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from kenotron.config import ConfigError, load_config
from kenotron.models import get_model_spec
from kenotron.models.common.parametrization import MUP_BASE_WIDTH
from kenotron.train.muon import Muon
from kenotron.train.muon_groups import group_table, muon_names, muon_param_groups, update_scale
from kenotron.train.newton_schulz import newton_schulz
from kenotron.train.resolve import resolve_run


def _matrices(seed: int = 0) -> list[nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [nn.Parameter(torch.randn(shape, generator=g)) for shape in ((32, 48), (64, 16), (24, 24))]


def _grads(params: list[nn.Parameter], step: int) -> None:
    g = torch.Generator().manual_seed(100 + step)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)


def _meta_model(name: str) -> nn.Module:
    spec = get_model_spec(name)
    with torch.device("meta"):
        return spec.build(spec.model_args("debug", max_seq_len=16, n_layers=1))


def test_muon_group_equals_torch_muon_with_moonlight_scaling():
    ours_params, torch_params = _matrices(), _matrices()
    groups = [{"params": [p], "muon": True, "update_scale": update_scale(tuple(p.shape), "match_rms_adamw"),
               "weight_decay": 0.1} for p in ours_params]
    ours = Muon(groups, lr=0.02, betas=(0.9, 0.95), eps=1e-8, ns_dtype=torch.bfloat16)
    ref = torch.optim.Muon(torch_params, lr=0.02, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    for step in range(3):
        _grads(ours_params, step)
        _grads(torch_params, step)
        ours.step()
        ref.step()
    for a, b in zip(ours_params, torch_params):
        # the same bf16 operations (fused multiply-adds), batched
        torch.testing.assert_close(a.detach(), b.detach(), rtol=0, atol=1e-6)
    moved = max((a - b).abs().max().item() for a, b in zip(ours_params, _matrices()))
    assert moved > 0.02  # the steps moved the weights far beyond the tolerance


def test_adamw_groups_equal_torch_adamw_bitwise():
    ours_params, torch_params = _matrices(), _matrices()
    ours = Muon([{"params": ours_params, "muon": False, "weight_decay": 0.1}], lr=1e-2, betas=(0.9, 0.95), eps=1e-8)
    ref = torch.optim.AdamW(torch_params, lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, foreach=False)
    for step in range(3):
        _grads(ours_params, step)
        _grads(torch_params, step)
        ours.step()
        ref.step()
    for a, b in zip(ours_params, torch_params):
        assert torch.equal(a, b)


def test_newton_schulz_moves_every_singular_value_near_one_and_batches_independently():
    x = torch.randn(3, 40, 24, generator=torch.Generator().manual_seed(1))
    x[1] *= 1e3  # the scale of a matrix does not matter
    out = newton_schulz(x, 5, torch.float32)
    s = torch.linalg.svdvals(out)
    assert s.min() > 0.6 and s.max() < 1.25, s
    one = newton_schulz(x[2], 5, torch.float32)
    torch.testing.assert_close(out[2], one, rtol=1e-5, atol=1e-6)
    assert newton_schulz(torch.zeros(4, 4), 5, torch.float32).abs().max() == 0


def test_expert_weights_are_a_batch_of_matrices_each_stepped_alone():
    experts = nn.Parameter(torch.randn(3, 16, 8, generator=torch.Generator().manual_seed(2)))
    singles = [nn.Parameter(experts.detach()[e].clone()) for e in range(3)]
    group = {"muon": True, "update_scale": 1.0, "weight_decay": 0.0}
    batched = Muon([{**group, "params": [experts]}], lr=0.1, betas=(0.9, 0.95), eps=1e-8, ns_dtype=torch.float32)
    alone = Muon([{**group, "params": singles}], lr=0.1, betas=(0.9, 0.95), eps=1e-8, ns_dtype=torch.float32)
    for step in range(2):
        g = torch.randn(3, 16, 8, generator=torch.Generator().manual_seed(step))
        experts.grad = g.clone()
        for e, p in enumerate(singles):
            p.grad = g[e].clone()
        batched.step()
        alone.step()
    for e, p in enumerate(singles):
        torch.testing.assert_close(experts.detach()[e], p.detach(), rtol=1e-5, atol=1e-6)


def test_hidden_matrices_and_experts_get_muon_and_the_rest_adamw():
    dense = _meta_model("llama3")
    assert muon_names(dense, [], []) == {
        f"layers.0.{n}.weight" for n in ("attention.wq", "attention.wk", "attention.wv", "attention.wo",
                                          "feed_forward.w1", "feed_forward.w2", "feed_forward.w3")}
    moe = muon_names(_meta_model("qwen3_moe"), [], [])
    assert {"layers.0.feed_forward.experts.w13", "layers.0.feed_forward.experts.w2"} <= moe
    assert not any("embeddings" in n or n.startswith("output") or "norm" in n for n in moe)
    assert "layers.0.attention.wq.weight" not in muon_names(dense, [], ["*.wq.weight"])
    assert "output.weight" in muon_names(dense, ["output.weight"], [])


def test_group_table_names_each_group_once():
    model = _meta_model("llama3")
    cfg = load_config(None, ["--optimizer.name", "muon"]).optimizer
    groups = muon_param_groups(model, cfg, "standard")
    table = group_table(model, groups)
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))
    assert [line.split()[0] for line in table.splitlines()[1:]] == ["muon", "muon", "adamw", "adamw"]
    assert "tok_embeddings.weight, output.weight" in table


def test_lr_rules_moonlight_and_spectral_agree_at_the_base_width_and_spectral_follows_the_fans():
    base = (MUP_BASE_WIDTH, MUP_BASE_WIDTH)
    assert update_scale(base, "spectral") == pytest.approx(update_scale(base, "match_rms_adamw")) == pytest.approx(3.2)
    assert update_scale((1024, 4096), "match_rms_adamw") == pytest.approx(0.2 * 64)
    # spectral µP: update spectral norm ∝ sqrt(fan_out / fan_in), whatever the width
    assert update_scale((4096, 1024), "spectral") == pytest.approx(3.2 * 2)
    assert update_scale((4096, 4096), "spectral") == pytest.approx(3.2)
    assert update_scale((8, 1024, 4096), "spectral") == pytest.approx(3.2 * math.sqrt(0.25))


def test_spectral_mup_runs_give_muon_the_spectral_rule_and_adamw_its_rates():
    model = _meta_model("llama3")
    cfg = load_config(None, ["--optimizer.name", "muon", "--model.parametrization", "spectral_mup"]).optimizer
    groups = muon_param_groups(model, cfg, "spectral_mup")
    names = {id(p): n for n, p in model.named_parameters()}
    by_name = {names[id(p)]: g for g in groups for p in g["params"]}
    assert by_name["layers.0.feed_forward.w2.weight"]["update_scale"] == pytest.approx(3.2 * math.sqrt(256 / 768))
    assert by_name["output.weight"]["lr"] == pytest.approx(cfg.lr * MUP_BASE_WIDTH / 256)  # AdamW's µP rate


@pytest.mark.parametrize(("overrides", "message"), [
    (["--optimizer.muon_include", "*norm.weight"],
     r"muon_include pattern '\*norm.weight' puts layers.0.attention_norm.weight \(shape \(256,\)\) in Muon"),
    (["--optimizer.muon_lr_rule", "keller"], r"muon_lr_rule"),
])
def test_muon_refuses_bad_input_before_any_process_group(overrides, message):
    with pytest.raises(ConfigError, match=message):
        resolve_run(load_config(None, ["--optimizer.name", "muon", "--model.n_layers", "1"] + overrides), 1)


def test_state_dict_resumes_bitwise():
    def build(params):
        groups = [{"params": params[:2], "muon": True, "update_scale": 2.0, "weight_decay": 0.1},
                  {"params": params[2:], "muon": False, "weight_decay": 0.1}]
        return Muon(groups, lr=0.02, betas=(0.9, 0.95), eps=1e-8, ns_dtype=torch.float32)

    straight = _matrices()
    opt = build(straight)
    for step in range(4):
        _grads(straight, step)
        opt.step()
    first = _matrices()
    opt = build(first)
    for step in range(2):
        _grads(first, step)
        opt.step()
    saved, weights = copy.deepcopy(opt.state_dict()), [p.detach().clone() for p in first]
    resumed = [nn.Parameter(w) for w in weights]
    opt = build(resumed)
    opt.load_state_dict(saved)
    for step in range(2, 4):
        _grads(resumed, step)
        opt.step()
    for a, b in zip(straight, resumed):
        assert torch.equal(a, b)
