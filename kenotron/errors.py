"""Errors every room may raise; this module imports nothing else of kenotron.

`ConfigError` lives here, not in `kenotron.config`, so that rooms below the config (the kernel
choices in `kenotron.kernels`) can refuse a value with the same error the config loader raises.
`kenotron.config` exports it as before.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A bad configuration value; the message says which key and how to fix it."""
