import sys

import pytest


@pytest.fixture(scope="session", autouse=True)
def _shutdown_multirank_pools():
    """Stop the multi-rank worker pools (tests/distributed/pool.py) when the session ends, also
    after -x, a failure or Ctrl-C. Importing nothing here keeps torch out of unrelated runs."""
    yield
    pool = sys.modules.get("tests.distributed.pool")
    if pool is not None:
        pool.shutdown_pools()
