"""Bad MoE input is refused before any process group, with the fix named; the routing biases
move toward balance after a step; a collapsed router is reported by layer."""

from __future__ import annotations

import logging

import pytest
import torch

from kenotron.config import ConfigError, load_config
from kenotron.train.metrics import read_on_host
from kenotron.train.resolve import resolve_run

MOE = ["--model.name", "qwen3_moe", "--training.device", "cpu"]  # debug flavor: 8 experts, top 2


def resolve(world: int, *overrides: str):
    return resolve_run(load_config(None, list(overrides)), world)


def test_ep_must_divide_the_expert_count():
    with pytest.raises(ConfigError, match=r"parallelism.ep=3 does not divide the 8 experts .* use one of \[1, 2\]"):
        resolve(6, *MOE, "--parallelism.ep", "3")


def test_ep_must_fit_the_data_parallel_ranks_it_borrows():
    with pytest.raises(ConfigError, match=r"parallelism.ep=4 cannot be taken from dp_shard x cp = 2 x 1.*\[1, 2\]"):
        resolve(4, *MOE, "--parallelism.ep", "4", "--parallelism.tp", "2")
    with pytest.raises(ConfigError, match=r"use one of \[1, 2, 4\]"):
        resolve(4, *MOE, "--parallelism.ep", "8", "--model.moe.n_experts", "16")


def test_top_k_larger_than_the_expert_count():
    with pytest.raises(ConfigError, match=r"model.moe.top_k=9 must lie in \[1, n_experts=8\]"):
        resolve(1, *MOE, "--model.moe.top_k", "9")


def test_the_expert_shape_set_under_model_changes_the_built_model(tmp_path):
    path = tmp_path / "moe.toml"
    path.write_text('[model]\nname = "qwen3_moe"\nmoe.n_experts = 16\n')
    from_toml = resolve_run(load_config(path, ["--training.device", "cpu"]), 1)
    from_cli = resolve(1, *MOE, "--model.moe.n_experts", "16", "--model.moe.top_k", "4")
    assert (from_toml.model_args.moe.n_experts, from_toml.model_args.moe.top_k) == (16, 2)  # top_k: the flavor's
    assert (from_cli.model_args.moe.n_experts, from_cli.model_args.moe.top_k) == (16, 4)
    with torch.device("meta"):
        model = from_cli.spec.build(from_cli.model_args)
    router = model.layers["0"].feed_forward.router
    assert (router.n_experts, router.top_k, router.gate.weight.shape[0]) == (16, 4, 16)


@pytest.mark.parametrize("key", ["n_experts", "top_k"])
def test_the_expert_shape_under_moe_names_its_new_key(key, tmp_path):
    moved = rf"^moe.{key} moved to model.moe.{key} \(.*\): use --model.moe.{key} N, or moe.{key} = N under \[model\]$"
    with pytest.raises(ConfigError, match=moved):
        load_config(None, [*MOE, f"--moe.{key}", "4"])
    path = tmp_path / "old.toml"
    path.write_text(f'[model]\nname = "qwen3_moe"\n\n[moe]\n{key} = 4\n')
    with pytest.raises(ConfigError, match=moved):
        load_config(path)


@pytest.mark.parametrize("field", [["--moe.bias_update_rate", "0.01"], ["--moe.aux_loss_coef", "0.01"],
                                   ["--parallelism.ep", "2"]])
def test_moe_fields_on_a_dense_family(field):
    with pytest.raises(ConfigError, match=r"set, but model.name='llama3' has no experts; .*qwen3_moe"):
        resolve(2, "--model.name", "llama3", *field)


def test_an_expert_shape_on_a_dense_family_names_its_fields():
    with pytest.raises(ConfigError, match=r"unknown config key 'model.moe' \(llama3's fields: dim, "):
        resolve(2, "--model.name", "llama3", "--model.moe.n_experts", "8")


def test_ep_needs_fsdp():
    with pytest.raises(ConfigError, match="use parallelism.dp_mode='fsdp'"):
        resolve(2, *MOE, "--parallelism.ep", "2", "--parallelism.dp_mode", "zero1")


def test_a_valid_expert_parallel_layout_resolves_with_its_mesh():
    run = resolve(8, *MOE, "--parallelism.ep", "2", "--parallelism.tp", "2")
    assert run.dims.ep == 2 and run.dims.efsdp == 2
    assert run.dims.mesh_shape() == (("efsdp", "dp_shard_in_ep", "tp"), (2, 2, 2))
    assert "experts: layers.*.feed_forward.experts" in str(run.plan)


def warnings(caplog) -> list[str]:
    # Building the trainer logs at INFO when an earlier test has set the logger's level so.
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    from kenotron.train.trainer import Trainer

    cfg = load_config(None, [*MOE, "--model.n_layers", "2", "--training.seq_len", "16", "--training.local_batch_size",
                             "1", "--moe.bias_update_rate", "0.01", "--job.dump_folder",
                             str(tmp_path_factory.mktemp("run")), "--metrics.tensorboard", "false"])
    trainer = Trainer(cfg)
    yield trainer
    trainer.close()


def test_expert_biases_move_toward_balance_by_the_rate_and_stay_centered(trainer):
    balance = trainer.job.experts
    router = balance.routers["0"]
    before = router.expert_bias.clone()
    router.load.copy_(torch.tensor([10.0, 2, 2, 2, 0, 0, 0, 0]))  # mean 2: one expert over, three even, four under
    balance.after_step()
    # sign(mean - load) = [-1, 0, 0, 0, 1, 1, 1, 1], minus its mean 0.375, times the rate
    expected = 0.01 * torch.tensor([-1.375, -0.375, -0.375, -0.375, 0.625, 0.625, 0.625, 0.625])
    torch.testing.assert_close(router.expert_bias - before, expected)
    assert float(router.load.sum()) == 0.0  # the next step's statistics start empty


def test_a_router_sending_most_tokens_to_one_expert_for_100_steps_is_reported(trainer, caplog):
    balance = trainer.job.experts
    collapsed, healthy = balance.routers["1"], balance.routers["0"]
    with caplog.at_level(logging.WARNING, logger="kenotron"):
        for step in range(100):
            collapsed.load.copy_(torch.tensor([30.0, 1, 1, 0, 0, 0, 0, 0]))  # 30 of 32 copies: 94% of 16 tokens x 2
            healthy.load.fill_(4.0)
            balance.after_step()
            if step == 98:  # the trainer's log step: the streaks come in its record's one read
                read_on_host(balance.metrics())
                assert not warnings(caplog)
        read_on_host(balance.metrics())
    assert warnings(caplog) == [
        ("MoE router of layer 1 has collapsed: one expert took over 90% of the tokens for 100 steps; raise "
        "moe.aux_loss_coef or moe.bias_update_rate, or lower optimizer.lr")
    ]


def test_list_models_names_the_fields_of_an_moe_familys_expert_shape(capsys):
    from kenotron.runtime.info_flags import answer_info_flags

    assert answer_info_flags(["--list-models"])
    listing = capsys.readouterr().out
    assert "moe (n_experts, top_k, ffn_dim," in listing.split("qwen3_moe:")[1].split("\n")[1]


@pytest.mark.parametrize("override, message", [
    (("--model.moe.ffn_dim", "0"), r"model.moe.ffn_dim=0 must be positive"),
    (("--model.moe.n_experts", "0"), r"model.moe.n_experts=0 must be positive"),
    (("--model.moe.score_func", "bogus"), r"model.moe.score_func='bogus' is not one of softmax, sigmoid"),
    (("--model.moe.route_scale", "nan"), r"model.moe.route_scale=nan must be > 0 and finite"),
    (("--model.moe.route_scale", "-1"), r"model.moe.route_scale=-1.0 must be > 0 and finite"),
])
def test_an_impossible_expert_shape_or_routing_stops_in_one_line(override, message):
    # Each of these used to train (ffn_dim 0, a NaN route scale) or end in a traceback (score_func).
    with pytest.raises(ConfigError, match=message):
        resolve(1, *MOE, *override)
