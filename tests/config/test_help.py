"""--help: grouped by section, wrapped to the width, the loaded config's values beside the defaults."""

from __future__ import annotations

import pytest

from kenotron.config import ConfigError
from kenotron.config.help import config_help, help_for_argv


def test_help_shows_the_loaded_configs_values_and_the_defaults_they_replace():
    text = help_for_argv(["--config", "debug", "--training.seq_len", "64", "training"])
    assert "  --training.steps 250   (default 200)" in text  # from the TOML file
    assert "  --training.seq_len 64   (default 256)" in text  # from the command line
    assert "  --training.seed 42\n" in text  # unchanged: no default repeated
    assert "[training]" in text and "[model]" not in text  # one section asked for


@pytest.mark.parametrize("width", [60, 100])
def test_help_is_wrapped_to_the_width(width):
    lines = config_help(width=width).splitlines()
    assert max(len(line) for line in lines if not line.startswith("  --")) <= width


def test_help_of_a_bad_config_is_the_config_error():
    with pytest.raises(ConfigError, match="training.stepz"):
        help_for_argv(["--training.stepz", "3"])
