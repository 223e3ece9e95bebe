"""Regenerate docs/config_reference.md from the config dataclasses.

    python scripts/gen_config_reference.py
"""

from __future__ import annotations

from pathlib import Path

from kenotron.config import config_reference_markdown

if __name__ == "__main__":
    out = Path(__file__).resolve().parents[1] / "docs" / "config_reference.md"
    out.write_text(config_reference_markdown())
    print(f"wrote {out}")
