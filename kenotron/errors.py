"""Errors every room may raise; this module imports nothing else of kenotron.

`ConfigError` lives here, not in `kenotron.config`, so that rooms below the config (the kernel
choices in `kenotron.kernels`) can refuse a value with the same error the config loader raises.
`kenotron.config` exports it as before.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A bad configuration value; the message says which key and how to fix it."""


class DataError(ConfigError):
    """A data set or tokenizer file that cannot be used as configured: the message names the
    file (and line) and the fix. A ConfigError, so the command line prints it as one line."""
