"""tools/collectives.py: every collective runs and is timed on the ranks, bus bandwidth follows
NCCL's factors, and the table prints one row per collective, dtype and size."""

from __future__ import annotations

import pytest
import torch

from kenotron.tools.collectives import COLLECTIVES, CollectiveTiming, bus_factor, measure, table
from tests.distributed.pool import run_on_ranks


def test_bus_factor_is_nccls():
    assert bus_factor("all-reduce", 4) == pytest.approx(1.5)
    assert bus_factor("all-gather", 4) == pytest.approx(0.75)
    assert bus_factor("all-to-all", 2) == pytest.approx(0.5)


def test_bus_bandwidth_of_a_timing():
    # 1 GiB all-reduced over 2 ranks in 10 ms: the links carry 1 GiB each way, 107 GB/s.
    row = CollectiveTiming("all-reduce", "float32", 1024.0, 10.0, 2)
    assert row.bus_gb_s == pytest.approx(2**30 / 0.01 / 1e9)


def _measure_on_rank() -> str:
    return table(measure([0.25], [torch.float32], torch.device("cpu"), reps=2))


def test_every_collective_is_timed_on_two_gloo_ranks():
    text = run_on_ranks(2, _measure_on_rank)[0]
    rows = [line for line in text.splitlines() if line.startswith("| ") and "collective" not in line]
    assert [line.split(" | ")[0].removeprefix("| ") for line in rows] == list(COLLECTIVES)
    assert all(float(line.split(" | ")[3]) > 0 for line in rows)  # the ms column
