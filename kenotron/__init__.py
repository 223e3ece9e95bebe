"""kenotron: pretrain transformer LLMs on PyTorch's own distributed stack."""

__version__ = "0.1.0"
"""The release: pyproject.toml reads it (dynamic version), `kenotron --version` prints it."""
