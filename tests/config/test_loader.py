"""Config loading: TOML, overrides, types, every error path, --help and the TOML dump."""

from __future__ import annotations

import tomllib

import pytest

from kenotron.config import (
    ConfigError,
    JobConfig,
    all_fields,
    config_from_dict,
    config_help,
    config_to_toml,
    load_config,
    validate_config,
)
from kenotron.config.presets import PRESETS_DIR

PUBLIC_KEYS = [
    "job.dump_folder", "model.name", "model.flavor", "tokenizer.path", "data.dataset", "data.path",
    "training.steps", "training.seq_len", "training.local_batch_size", "training.global_batch_size",
    "training.seed", "training.param_dtype", "training.max_norm", "optimizer.name", "optimizer.lr",
    "optimizer.weight_decay", "lr_scheduler.warmup_steps", "lr_scheduler.decay", "lr_scheduler.min_lr_ratio",
    "parallelism.dp_replicate", "parallelism.dp_shard", "parallelism.tp", "parallelism.pp", "parallelism.cp",
    "checkpoint.enable", "checkpoint.folder", "checkpoint.interval", "metrics.log_freq",
    "metrics.tensorboard", "compile.enable", "activation_checkpoint.mode",
]


def test_every_public_key_exists_and_has_a_doc():
    fields = all_fields(JobConfig)
    for key in PUBLIC_KEYS:
        assert key in fields, key
    for key, info in fields.items():
        assert info.doc, f"{key} has no docstring"


FEATURES_ADDED_SINCE = {
    "checkpoint.checksums", "parallelism.collective_timeout_s",  # issue 26: integrity, hung ranks
    "metrics.wandb", "metrics.wandb_project",  # issue 28: Weights & Biases
    "data.sources", "data.stages", "data.shuffle", "data.seed", "data.loader",  # issue 24: blends, stages, loaders
    "data.weights_from",  # issue 25: a blend's weights learned by DoReMi
    "parallelism.ep",  # issue 22: expert parallel (with the [moe] section, below)
    "float8.experts",  # issue 36: the routed experts in float8
    "optimizer.muon_momentum", "optimizer.muon_nesterov", "optimizer.muon_ns_steps",  # issue 37: Muon
    "optimizer.muon_lr_rule", "optimizer.muon_include", "optimizer.muon_exclude",
    "parallelism.cp_scheme",  # issue 39: the all-to-all (Ulysses) context parallel beside the ring
}
"""Fields of features added after the config was cut to 70 (each feature brings its own)."""
LATER_SECTIONS = ("validation.", "doremi.", "moe.", "fault_tolerance.")  # issues 24, 25, 22, 38: validation, DoReMi, MoE, fault tolerance


def test_the_public_config_stays_small_with_short_plain_docs():
    """At most 70 public fields outside [tuning] and later features; each doc a sentence or two, no benchmark diary."""
    fields = all_fields(JobConfig)
    public = [k for k in fields if not k.startswith(("tuning.", *LATER_SECTIONS)) and k not in FEATURES_ADDED_SINCE]
    assert len(public) <= 70, len(public)
    for key, info in fields.items():
        assert len(info.doc) <= 240, f"{key}: {len(info.doc)} characters"
        assert info.doc.count(". ") <= 2, f"{key}: more than two sentences"
        for diary in ("measured", "H200", "tok/s", "session "):
            assert diary not in info.doc, f"{key} doc mentions {diary!r}: benchmark history goes in docs/performance.md"


def test_toml_file_then_overrides_take_precedence(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[training]\nsteps = 7\nseq_len = 64\n[optimizer]\nlr = 0.5\n[model]\nflavor = "1B"\n')
    cfg = load_config(path, ["--training.steps", "9", "--optimizer.lr=1e-4"])
    assert cfg.training.steps == 9
    assert cfg.training.seq_len == 64
    assert cfg.optimizer.lr == pytest.approx(1e-4)
    assert cfg.model.flavor == "1B"


def test_overrides_parse_ints_floats_bools_strings():
    cfg = load_config(None, [
        "--training.steps", "1_000", "--training.max_norm", "0.5", "--metrics.tensorboard",
        "--compile.enable", "false", "--data.path", "/some/file.jsonl", "--lr_scheduler.decay", "wsd",
    ])
    assert cfg.training.steps == 1000
    assert cfg.training.max_norm == 0.5
    assert cfg.metrics.tensorboard is True
    assert cfg.compile.enable is False
    assert cfg.data.path == "/some/file.jsonl"
    assert cfg.lr_scheduler.decay == "wsd"


def test_int_in_toml_is_accepted_for_a_float_field():
    cfg = config_from_dict({"optimizer": {"lr": 1}})
    assert cfg.optimizer.lr == 1.0 and isinstance(cfg.optimizer.lr, float)


def test_unknown_key_names_it_and_suggests_the_closest():
    with pytest.raises(ConfigError, match=r"unknown config key 'training.step'.*did you mean 'training.steps'"):
        load_config(None, ["--training.step", "3"])


def test_unknown_section_in_toml_suggests_the_closest(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[trainig]\nsteps = 3\n")
    with pytest.raises(ConfigError, match=r"unknown config section 'trainig'; did you mean 'training'\?"):
        load_config(path)


def test_unknown_key_in_toml_is_an_error():
    with pytest.raises(ConfigError, match=r"unknown config key 'optimizer.learning_rate'"):
        config_from_dict({"optimizer": {"learning_rate": 1e-3}})


@pytest.mark.parametrize(
    "args, message",
    [
        (["--training.steps", "ten"], r"training.steps expects an integer, got 'ten'"),
        (["--optimizer.lr", "fast"], r"optimizer.lr expects a number, got 'fast'"),
        (["--metrics.tensorboard", "maybe"], r"metrics.tensorboard expects true or false, got 'maybe'"),
        (["--lr_scheduler.decay", "cosin"], r"lr_scheduler.decay='cosin' is not one of .*did you mean 'cosine'"),
        (["--training.param_dtype", "fp16"], r"training.param_dtype='fp16' is not one of 'float32', 'bfloat16'"),
        (["--training.steps"], r"--training.steps needs a value"),
        (["steps=3"], r"unexpected argument"),
    ],
)
def test_bad_cli_values_name_the_key_and_the_fix(args, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, args)


def test_wrong_type_in_toml_is_an_error():
    with pytest.raises(ConfigError, match=r"training.steps expects an integer, got '10'"):
        config_from_dict({"training": {"steps": "10"}})
    with pytest.raises(ConfigError, match=r"job.dump_folder expects a string"):
        config_from_dict({"job": {"dump_folder": 3}})


def test_missing_and_invalid_toml_files(tmp_path):
    with pytest.raises(ConfigError, match=r"does not exist"):
        load_config(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[training\nsteps = ")
    with pytest.raises(ConfigError, match=r"is not valid TOML"):
        load_config(bad)


def test_resolved_config_round_trips_through_toml():
    cfg = load_config(None, ["--training.steps", "5", "--job.description", 'a "quoted" run', "--data.path", "x\\y"])
    text = config_to_toml(cfg)
    assert config_from_dict(tomllib.loads(text)) == cfg


def test_help_lists_every_field_with_doc_and_default():
    text = config_help()
    flat = " ".join(text.split())
    for key, info in all_fields(JobConfig).items():
        assert f"--{key} " in text
        assert info.doc in flat


@pytest.mark.parametrize(
    "args, message",
    [
        (["--training.steps", "0"], r"training.steps=0 must be >= 1"),
        (["--training.global_batch_size", "0"], r"global_batch_size=0 must be >= 1, or -1 \(local_batch_size x dp\)"),
        (["--optimizer.lr", "-1"], r"optimizer.lr=-1.0 must be > 0 and finite"),
        (["--lr_scheduler.min_lr_ratio", "2"], r"min_lr_ratio=2.0 must lie in \[0, 1\]"),
        (["--training.max_norm", "-1"], r"max_norm=-1.0 must be > 0 and finite, or 0 \(no clipping\)"),
        (["--tuning.loss_chunk_tokens", "0"], r"tuning.loss_chunk_tokens=0 must be >= 1"),
    ],
)
def test_validation_errors_name_the_value(args, message):
    with pytest.raises(ConfigError, match=message):
        validate_config(load_config(None, args))


@pytest.mark.parametrize(
    "args, message",
    [
        (["--activation_checkpoint.every_n", "0"], r"activation_checkpoint.every_n=0 must be >= 1"),
        (["--tuning.ac_save_matmul_every", "0"], r"tuning.ac_save_matmul_every=0 must be >= 1"),
        (["--activation_checkpoint.offload_blocks", "-1"], r"activation_checkpoint.offload_blocks=-1 must be >= 0"),
        (["--activation_checkpoint.offload_blocks", "9", "--model.n_layers", "8"],
         r"activation_checkpoint.offload_blocks=9 must lie in \[0, 8\] \(the model's blocks\)"),
    ],
)
def test_plan_setting_errors_name_the_config_key_the_user_wrote(args, message):
    from kenotron.train.resolve import resolve_run

    with pytest.raises(ConfigError, match=message):
        resolve_run(load_config(None, args), world_size=1)


def test_a_plan_error_from_the_command_line_is_one_line_with_exit_code_2(capsys):
    from kenotron.train.__main__ import main

    assert main(["--activation_checkpoint.offload_blocks", "100", "--training.device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kenotron: config error: activation_checkpoint.offload_blocks=100")


def test_shipped_configs_load_and_validate():
    configs = sorted(PRESETS_DIR.glob("*.toml"))
    assert configs
    for path in configs:
        validate_config(load_config(path))


def test_docs_config_reference_is_up_to_date():
    from pathlib import Path

    from kenotron.config import config_reference_markdown

    doc = Path(__file__).parents[2] / "docs" / "config_reference.md"
    assert doc.read_text() == config_reference_markdown(), "run python scripts/gen_config_reference.py"


def test_a_command_line_that_changes_the_data_drops_the_files_description(tmp_path):
    preset = tmp_path / "preset.toml"
    preset.write_text('[job]\ndescription = "debug model on the built-in corpus"\n[data]\ndataset = "builtin"\n')
    assert load_config(preset, ["--training.steps", "3"]).job.description == "debug model on the built-in corpus"
    assert load_config(preset, ["--data.dataset", "jsonl", "--data.path", "x.jsonl"]).job.description == ""
    assert load_config(preset, ["--data.path", "x.jsonl", "--job.description", "mine"]).job.description == "mine"
