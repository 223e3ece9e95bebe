"""Parameter counts from the args alone (models/common/param_count.py) against a meta-device
build of the same args, and `--list-models`, which prints them without building anything."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from kenotron.models import MODEL_SPECS
from kenotron.models.spec import ModelSpec
from kenotron.runtime.info_flags import parameters_text, print_model_families


def _built_count(spec: ModelSpec, args: Any) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in spec.build(args).parameters())


def _shallow(args: Any) -> Any:
    """The flavor with few layers (every kind of block kept: a hybrid's attention layers too), so
    that building it is quick while every width stays the flavor's own."""
    attention_layers = getattr(args, "attention_layers", ())
    keep = max(attention_layers) + 2 if attention_layers else 2
    return dataclasses.replace(args, n_layers=min(args.n_layers, keep))


FLAVORS = [(family, flavor) for family in MODEL_SPECS for flavor in MODEL_SPECS[family].flavors]


@pytest.mark.parametrize(("family", "flavor"), FLAVORS, ids=[f"{f}-{v}" for f, v in FLAVORS])
def test_the_count_from_args_equals_the_built_models_for_every_flavor(family, flavor):
    spec = MODEL_SPECS[family]
    args = _shallow(spec.flavors[flavor])
    assert spec.count_parameters(args) == _built_count(spec, args)


VARIANTS = [
    ("llama3", {"tie_embeddings": True}),
    ("qwen2", {"tie_embeddings": False}),
    ("starcoder2", {"bias": False, "tie_embeddings": False}),
    ("qwen3_moe", {"moe": {"shared_ffn_dim": 96, "shared_gate": True, "n_experts": 6}}),
    ("qwen2_moe", {"moe": {"shared_ffn_dim": 0, "shared_gate": False}}),
    ("mamba2", {"proj_bias": True, "conv_bias": False, "ssm_groups": 2, "attention_layers": [1, 3], "ffn_dim": 64}),
]


@pytest.mark.parametrize(("family", "overrides"), VARIANTS, ids=[f for f, _ in VARIANTS])
def test_the_count_follows_the_switches_that_add_or_remove_parameters(family, overrides):
    spec = MODEL_SPECS[family]
    args = spec.model_args("debug", overrides)
    assert spec.count_parameters(args) == _built_count(spec, args)


def test_a_family_without_a_count_is_counted_on_a_meta_build():
    spec = dataclasses.replace(MODEL_SPECS["qwen3_moe"], parameter_count=None)
    args = spec.flavors["debug"]
    assert spec.count_parameters(args) == MODEL_SPECS["qwen3_moe"].count_parameters(args) == _built_count(spec, args)


def test_every_family_counts_from_its_args():
    missing = [name for name in MODEL_SPECS if MODEL_SPECS[name].parameter_count is None]
    assert not missing, f"give {missing} a parameter_count (models/common/param_count.py): --list-models builds them"


def test_list_models_prints_each_flavors_count_without_building_a_model(monkeypatch, capsys):
    expected = {name: {flavor: parameters_text(_built_count(spec, args)) for flavor, args in spec.flavors.items()
                       if flavor.startswith("debug")} for name, spec in MODEL_SPECS.items()}

    def refuse(self: ModelSpec, args: Any) -> None:
        raise AssertionError(f"--list-models built a {self.name} model")

    monkeypatch.setattr(ModelSpec, "build", refuse)
    print_model_families()
    lines = {line.split(":", 1)[0]: line for line in capsys.readouterr().out.splitlines() if not line.startswith(" ")}
    assert set(lines) == set(MODEL_SPECS)
    for name, counts in expected.items():
        for flavor, text in counts.items():
            assert f" {flavor} ({text})" in lines[name], (lines[name], flavor, text)
        assert all(f"{flavor} (" in lines[name] for flavor in MODEL_SPECS[name].flavors), lines[name]
