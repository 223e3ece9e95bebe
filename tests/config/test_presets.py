"""`--config` takes a shipped preset's bare name or a TOML file's path (kenotron/config/presets.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kenotron.config import ConfigError, config_to_toml, load_config, presets
from kenotron.config.presets import PRESETS_DIR, preset_names, resolve_config_path

ROOT = Path(__file__).resolve().parents[2]


def test_a_bare_preset_name_loads_the_same_config_as_its_file():
    from_file = config_to_toml(load_config(PRESETS_DIR / "llama3_8b.toml"))
    assert config_to_toml(load_config("llama3_8b")) == from_file
    assert config_to_toml(load_config("llama3_8b.toml")) == from_file
    assert load_config("llama3_8b").model.flavor == "8B"


def test_a_bare_name_is_found_from_any_working_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_config_path("debug") == PRESETS_DIR / "debug.toml"


def test_a_file_path_still_works_and_wins_over_a_preset_of_the_same_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("debug").write_text('[training]\nsteps = 7\n')
    assert resolve_config_path("debug") == Path("debug")
    assert load_config("debug").training.steps == 7
    own = tmp_path / "own.toml"
    own.write_text('[training]\nsteps = 9\n')
    assert load_config(str(own)).training.steps == 9


def test_a_wrong_name_lists_every_preset_in_one_line_with_the_closest():
    with pytest.raises(ConfigError) as caught:
        load_config("llama3_8")
    message = str(caught.value)
    assert "\n" not in message
    assert "did you mean 'llama3_8b'?" in message
    assert all(name in message for name in preset_names())


def test_an_old_train_configs_path_names_the_preset_to_use_instead():
    with pytest.raises(ConfigError, match=r"'train_configs/debug.toml' does not exist; the preset of that name "
                                          r"is --config debug"):
        load_config("train_configs/debug.toml")


def test_a_folder_given_as_config_says_it_is_a_folder(tmp_path):
    with pytest.raises(ConfigError, match="is a folder, not a TOML file"):
        load_config(str(tmp_path))


def test_a_toml_file_dropped_into_the_presets_folder_is_a_preset_with_no_other_change(tmp_path, monkeypatch):
    folder = tmp_path / "presets"
    shutil.copytree(PRESETS_DIR, folder)
    (folder / "deepseek_v3_debug.toml").write_text('[training]\nsteps = 3\n')
    monkeypatch.setattr(presets, "PRESETS_DIR", folder)
    assert "deepseek_v3_debug" in preset_names()
    assert load_config("deepseek_v3_debug").training.steps == 3


def test_the_presets_have_one_home_in_the_package():
    """No second folder of presets beside the package (train_configs/ moved into kenotron/presets/):
    a preset added there by an older branch would be missed by the wheel and by `--config NAME`."""
    assert not (ROOT / "train_configs").exists(), "move train_configs/*.toml into kenotron/presets/"
    assert PRESETS_DIR == ROOT / "kenotron" / "presets"
    assert {"debug", "llama3_8b", "llama3_1b", "qwen3_moe_30b_a3b"} <= set(preset_names())


def test_a_wrong_preset_on_the_command_line_is_one_line_and_exit_code_2(capsys):
    from kenotron.cli import main

    assert main(["train", "--config", "lama3_8b"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kenotron: config error: --config 'lama3_8b' is neither"), err
