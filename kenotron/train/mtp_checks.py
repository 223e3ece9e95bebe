"""Multi-token prediction's config checks (train/mtp.py is the feature), importable without the trainer."""

from __future__ import annotations

from typing import Any

from kenotron.errors import ConfigError


def check_multi_token_prediction(args: Any, pp: int, cp: int) -> None:
    """The layouts the MTP modules run under: their inputs are the token ids and the main model's
    embedding and output head, all on one stage, and whole sequences (their targets are shifted)."""
    depth = getattr(args, "mtp_depth", 0)
    if depth and pp > 1:
        raise ConfigError(f"model.mtp_depth={depth} with parallelism.pp={pp}: the MTP modules need the token ids "
                          f"and the embedding on the last pipeline stage, which kenotron's pipeline does not carry "
                          f"there; set model.mtp_depth=0 or parallelism.pp=1")
    if depth and cp > 1:
        raise ConfigError(f"model.mtp_depth={depth} with parallelism.cp={cp}: the MTP targets are shifted along the "
                          f"whole sequence, which context parallel splits; set model.mtp_depth=0 or parallelism.cp=1")
