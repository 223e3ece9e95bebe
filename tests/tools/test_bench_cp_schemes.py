"""scripts/bench_cp_schemes.py (ring against Ulysses on GPUs): every case it would start on the
GPUs is a config the trainer accepts for its rank count, checked before any process starts;
the table row puts the two schemes side by side. (The cases themselves ran once by hand on
CPU, `--shapes debug --ngpu 2 --lengths 512 --extra "--training.device cpu"`: 80 s, too slow here.)"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from kenotron.config import load_config
from kenotron.train.resolve import resolve_run

SCRIPT = Path(__file__).parents[2] / "scripts" / "bench_cp_schemes.py"


def _script():
    spec = importlib.util.spec_from_file_location("bench_cp_schemes", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("ngpu", [2, 4])
def test_the_default_cases_resolve_for_the_1b_shape_under_both_schemes(ngpu):
    bench = _script()
    args = bench.main.__globals__["argparse"].Namespace(ac="full", compile=True, extra="--training.device cuda")
    for scheme in bench.SCHEMES:
        flag, preset, *overrides = bench.case_overrides("1B", ngpu, 131072, scheme, args)
        assert flag == "--config"
        run = resolve_run(load_config(preset, overrides), ngpu, check_data=False)
        assert run.dims.cp == ngpu and run.plan.settings.cp_scheme == scheme


def test_a_row_gives_the_ratio_and_names_a_failed_case():
    bench = _script()
    ok = {"tokens_per_sec": 1000.0, "memory_allocated_gib": 10.0}
    row = bench.format_row("1B", 2, 32768, {"ring": ok, "ulysses": {**ok, "tokens_per_sec": 1250.0}})
    assert row == "| 1B | 2 | 32,768 | 1,000 | 1,250 | 1.250 | 10.0 | 10.0 |"
    failed = bench.format_row("1B", 4, 131072, {"ring": ok, "ulysses": {"error": "torch.OutOfMemoryError: CUDA out of memory"}})
    assert failed == "| 1B | 4 | 131,072 | 1,000 | OOM |  | 10.0 | OOM |"
