"""Any model shape from the config: `model.<field>` sets any field of a family's args on top of
its flavor, from TOML or the command line, checked with errors that name the key."""

from __future__ import annotations

import dataclasses

import pytest

from kenotron.config import ConfigError, config_from_dict, config_to_toml, load_config
from kenotron.models import MODEL_SPECS, get_model_spec
from kenotron.models.common.rope_scaling import RopeScaling
from kenotron.train.resolve import resolve_run

LLAMA = get_model_spec("llama3")


def test_every_field_of_every_family_can_be_set_from_the_command_line():
    """Each settable field of each family's args takes a new value through `--model.<field>`."""
    for name, spec in MODEL_SPECS.items():
        base = spec.flavors["debug"]
        for f in dataclasses.fields(base):
            if f.name == "max_seq_len":
                continue
            current = getattr(base, f.name)
            if isinstance(current, bool):
                text, want = str(not current).lower(), not current
            elif isinstance(current, int):
                # Multiples keep the shape valid (dim by n_heads, n_heads by n_kv_heads).
                want = current * 2 if f.name not in ("n_kv_heads",) else 1
                text = str(want)
            elif isinstance(current, float):
                text, want = "123.5", 123.5
            elif current is None or isinstance(current, RopeScaling):
                continue  # covered by the tests below
            elif isinstance(current, tuple):
                continue  # lists: the hybrid test below
            elif dataclasses.is_dataclass(current):  # a nested table (MoE families' moe): its first field
                inner = dataclasses.fields(current)[0].name
                cfg = load_config(None, ["--model.name", name, f"--model.{f.name}.{inner}", str(getattr(current, inner) * 2)])
                args = spec.model_args("debug", cfg.model.args)
                assert getattr(getattr(args, f.name), inner) == getattr(current, inner) * 2, (name, f.name, inner)
                continue
            else:
                raise AssertionError(f"{name}.{f.name}: no case for {type(current).__name__}")
            cfg = load_config(None, ["--model.name", name, f"--model.{f.name}", text])
            args = spec.model_args("debug", cfg.model.args)
            assert getattr(args, f.name) == want, (name, f.name)


def test_toml_and_command_line_set_the_same_shape_on_top_of_the_flavor(tmp_path):
    path = tmp_path / "wide.toml"
    path.write_text('[model]\nflavor = "debug"\ndim = 512\nn_heads = 16\nffn_dim = 1536\n')
    from_toml = load_config(path)
    from_cli = load_config(None, ["--model.dim", "512", "--model.n_heads=16", "--model.ffn_dim", "1536"])
    assert from_toml.model.args == from_cli.model.args == {"dim": 512, "n_heads": 16, "ffn_dim": 1536}
    args = LLAMA.model_args("debug", from_toml.model.args)
    assert (args.dim, args.n_heads, args.ffn_dim, args.n_kv_heads, args.n_layers) == (512, 16, 1536, 4, 4)
    # The command line wins over the file, field by field.
    both = load_config(path, ["--model.dim", "1024"])
    assert both.model.args == {"dim": 1024, "n_heads": 16, "ffn_dim": 1536}


def test_nested_and_optional_fields():
    cfg = load_config(None, ["--model.flavor", "8B", "--model.rope_scaling.factor", "16"])
    args = LLAMA.model_args("8B", cfg.model.args)
    assert args.rope_scaling == dataclasses.replace(LLAMA.flavors["8B"].rope_scaling, factor=16.0)
    cfg = config_from_dict({"model": {"flavor": "8B", "rope_scaling": "none"}})
    assert LLAMA.model_args("8B", cfg.model.args).rope_scaling is None
    # A table builds the dataclass from its defaults where the flavor has none.
    args = LLAMA.model_args("debug", {"rope_scaling": {"factor": 4.0}})
    assert args.rope_scaling == RopeScaling(factor=4.0)
    mistral = get_model_spec("mistral")
    assert mistral.model_args("debug", {"sliding_window": "none"}).sliding_window is None
    assert mistral.model_args("debug", load_config(None, ["--model.sliding_window", "64"]).model.args).sliding_window == 64


def test_the_resolved_config_dump_reads_back_with_the_same_shape(tmp_path):
    cfg = load_config(None, ["--model.dim", "384", "--model.rope_scaling.factor", "2.0", "--model.norm_eps", "1e-6"])
    path = tmp_path / "config.toml"
    path.write_text(config_to_toml(cfg))
    assert load_config(path).model.args == cfg.model.args


@pytest.mark.parametrize(("overrides", "message"), [
    ({"dimm": 512}, r"unknown config key 'model.dimm'; did you mean 'model.dim'\? \(llama3's fields: dim, "),
    ({"dim": "wide"}, r"model.dim expects an integer, got 'wide'"),
    ({"dim": 250}, r"model.dim=250 is not a multiple of model.n_heads=8 .*use a dim that is, or n_heads among 1, 5, 25 or 125"),
    ({"n_kv_heads": 3}, r"model.n_kv_heads=3 does not divide model.n_heads=8 .*use 1, 2, 4 or 8"),
    ({"n_layers": 0}, r"model.n_layers=0 must be positive"),
    ({"norm_eps": -1.0}, r"model.norm_eps=-1.0 must be positive"),
    ({"dim": 264, "n_heads": 24}, r"the head size is 11, odd"),
    ({"rope_scaling": {"fator": 2.0}}, r"'model.rope_scaling.fator'; did you mean 'model.rope_scaling.factor'"),
    ({"rope_scaling": 2}, r"model.rope_scaling expects a table of its fields"),
    ({"sliding_window": 128}, r"unknown config key 'model.sliding_window' \(llama3's fields"),
    ({"max_seq_len": 128}, r"model.max_seq_len follows training.seq_len; set training.seq_len instead"),
    ({"tie_embeddings": "yes"}, r"model.tie_embeddings expects true or false"),
])
def test_bad_fields_and_shapes_name_the_key_and_the_fix(overrides, message):
    with pytest.raises(ConfigError, match=message):
        LLAMA.model_args("debug", overrides)


def test_resolve_run_builds_the_configured_shape_and_checks_it_before_any_process_group():
    run = resolve_run(load_config(None, ["--model.dim", "128", "--model.n_heads", "4", "--model.ffn_dim", "384",
                                         "--model.n_layers", "2"]), 1)
    assert (run.model_args.dim, run.model_args.head_dim, run.model_args.n_layers) == (128, 32, 2)
    with pytest.raises(ConfigError, match=r"tp=4 does not divide n_kv_heads=2"):
        resolve_run(load_config(None, ["--model.n_kv_heads", "2", "--parallelism.tp", "4"]), 4)
    with pytest.raises(ConfigError, match=r"unknown config key 'model.hidden_size'"):
        resolve_run(load_config(None, ["--model.hidden_size", "128"]), 1)


def test_the_estimator_and_the_planner_take_the_configured_shape():
    from kenotron.estimate import estimate_memory
    from kenotron.planner import search_layouts

    shape = ["--model.dim", "512", "--model.n_heads", "16", "--model.ffn_dim", "1536", "--model.n_layers", "2"]
    cfg = load_config("debug", shape + ["--model.parametrization", "spectral_mup"])
    report = estimate_memory(cfg, 2)  # spectral µP's per-matrix groups build on fake tensors too
    assert "llama3 debug dim=512 n_heads=16 ffn_dim=1536 n_layers=2" in report.model
    narrow = estimate_memory(load_config("debug", shape[6:]), 2)
    assert report.ranks[0].peak.total > narrow.ranks[0].peak.total
    result = search_layouts(load_config("debug", shape + ["--training.global_batch_size", "4"]),
                            2, 1.0, top=4, confirm=1)
    assert result.ranked and "dim=512" in result.model
    with pytest.raises(ConfigError, match=r"model.n_kv_heads=3 does not divide"):
        search_layouts(load_config("debug", ["--model.n_kv_heads", "3"]), 2, 1.0)


def test_a_list_field_sets_a_hybrid_layout_and_its_length_and_types_are_checked():
    mamba = MODEL_SPECS["mamba2"]
    cfg = load_config(None, ["--model.name", "mamba2", "--model.attention_layers", "[1]", "--model.ffn_dim", "128",
                             "--model.a_init_range", "[2.0, 8.0]"])
    args = mamba.model_args("debug", cfg.model.args)
    assert args.attention_layers == (1,) and args.a_init_range == (2.0, 8.0)
    with pytest.raises(ConfigError, match=r"model.a_init_range expects a list of 2 values, got \[1.0\]"):
        mamba.model_args("debug", {"a_init_range": [1.0]})
    with pytest.raises(ConfigError, match="model.attention_layers expects an integer"):
        mamba.model_args("debug", {"attention_layers": ["one"]})
    with pytest.raises(ConfigError, match=r"model.ssm_state=0 must be positive"):
        mamba.model_args("debug", {"ssm_state": 0})
