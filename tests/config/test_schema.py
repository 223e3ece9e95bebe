"""config/schema.py: the fields' docstrings are read from source only when asked for."""

from __future__ import annotations

import pytest

from kenotron.config import load_config, schema


def test_loading_a_config_reads_no_docstring_source(monkeypatch):
    # Parsing every section's source was ~95% of load_config's time, paid by every rank at start.
    schema.field_docs.cache_clear()
    schema.all_fields.cache_clear()

    def no_source(obj):
        raise AssertionError(f"load_config read the source of {obj!r}")

    monkeypatch.setattr(schema.inspect, "getsource", no_source)
    try:
        cfg = load_config("debug", ["--training.steps", "3"])
        assert cfg.training.steps == 3
        with pytest.raises(AssertionError, match="read the source"):  # the docs are still there on demand
            _ = schema.all_fields(type(cfg))["training.steps"].doc
    finally:
        schema.field_docs.cache_clear()
        schema.all_fields.cache_clear()


def test_a_fields_docstring_is_its_string_under_it():
    cfg = load_config("debug", [])
    assert schema.all_fields(type(cfg))["training.steps"].doc == "Number of optimizer steps to run."
