"""Every numeric config field has its valid range, checked as the config is read and again for a
config built in Python; a bad number stops the job in one line before any process starts
(kenotron/config/ranges.py; issue 35, item 6)."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import replace

import pytest

from kenotron.config import ConfigError, DataSource, JobConfig, all_fields, load_config, validate_config
from kenotron.config.ranges import RANGE_KEY

NUMERIC = (int, float, list[int], dict[str, float])


@pytest.mark.parametrize("args, message", [
    (["--optimizer.lr", "nan"], "optimizer.lr=nan must be > 0 and finite; the default is 0.003"),
    (["--optimizer.lr", "inf"], "optimizer.lr=inf must be > 0 and finite; the default is 0.003"),
    (["--optimizer.eps", "-1"], "optimizer.eps=-1.0 must be > 0 and finite; the default is 1e-08"),
    (["--optimizer.eps", "0"], "optimizer.eps=0.0 must be > 0 and finite; the default is 1e-08"),
    (["--optimizer.weight_decay", "-1"], "optimizer.weight_decay=-1.0 must be >= 0 and finite; the default is 0.1"),
    (["--training.max_norm", "nan"],
     "training.max_norm=nan must be > 0 and finite, or 0 (no clipping); the default is 1.0"),
    (["--parallelism.collective_timeout_s", "nan"],
     "parallelism.collective_timeout_s=nan must be > 0 and finite; the default is 600.0"),
    (["--optimizer.beta2", "1"], "optimizer.beta2=1.0 must lie in [0, 1); the default is 0.95"),
    (["--checkpoint.load_step", "-2"], "checkpoint.load_step=-2 must be >= 0, or -1 (the latest); the default is -1"),
    (["--parallelism.pp_layers_per_stage", "3,0"], "parallelism.pp_layers_per_stage=0 must be >= 1"),
    (["--data.sources", "[{path = 'a', weight = -1.0}]"], "data.sources[0].weight=-1.0 must be >= 0 and finite"),
    (["--data.stages", "[{start_step = 0, weights = {a = nan}}]"], "data.stages[0].weights.a=nan must be >= 0 and finite"),
])
def test_a_number_out_of_its_range_is_refused_while_reading_naming_key_value_and_range(args, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, args)
    assert str(err.value) == message


def test_a_config_built_in_python_is_checked_too():
    cfg = JobConfig()
    validate_config(cfg)  # every default lies in its range
    with pytest.raises(ConfigError, match=r"^optimizer.eps=0.0 must be > 0 and finite"):
        validate_config(replace(cfg, optimizer=replace(cfg.optimizer, eps=0.0)))
    sources = [DataSource(path="a", weight=-2.0)]
    with pytest.raises(ConfigError, match=r"^data.sources\[0\].weight=-2.0 must be >= 0"):
        validate_config(replace(cfg, data=replace(cfg.data, sources=sources)))


def test_every_numeric_field_declares_its_range():
    missing = [key for key, info in all_fields(JobConfig).items() if info.type in NUMERIC and info.range is None]
    for info in all_fields(JobConfig).values():
        inner = typing.get_args(info.type)
        if typing.get_origin(info.type) is list and inner and dataclasses.is_dataclass(inner[0]):
            hints = typing.get_type_hints(inner[0])
            missing += [f"{info.key}[].{f.name}" for f in dataclasses.fields(inner[0])
                        if hints[f.name] in NUMERIC and RANGE_KEY not in f.metadata]
    assert missing == []


def test_the_launcher_refuses_a_bad_number_in_one_line_before_starting_any_process(tmp_path, capsys):
    from kenotron.launch.launcher import launch

    run = tmp_path / "run"
    assert launch(["--optimizer.lr", "nan", "--job.dump_folder", str(run)], nproc=2) == 2
    err = capsys.readouterr().err
    assert err.strip() == "kenotron: config error: optimizer.lr=nan must be > 0 and finite; the default is 0.003"
    assert not run.exists()  # no rank started, nothing written
