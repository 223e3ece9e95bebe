"""Console output of a training process: kenotron's own logger, never the root logger.

Library code does not call `logging.basicConfig`: an application (or notebook) that configured
logging keeps its configuration. Only where nothing is configured does kenotron attach one
handler to its own "kenotron" logger, so progress lines appear by default.
"""

from __future__ import annotations

import logging
import sys

LOGGER_NAME = "kenotron"
FORMAT = "[kenotron %(asctime)s] %(message)s"


def ensure_console_logging(rank: int) -> logging.Logger:
    """INFO lines on rank 0 and warnings on the others, unless logging is configured already."""
    logger = logging.getLogger(LOGGER_NAME)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    if logger.handlers or logging.getLogger().handlers:
        return logger
    handler = logging.StreamHandler(sys.stderr if rank else sys.stdout)
    handler.setFormatter(logging.Formatter(FORMAT, datefmt="%H:%M:%S"))
    logger.addHandler(handler)
    return logger
