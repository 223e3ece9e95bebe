"""Re-fit the throughput model's four fitted constants to the measured rows, and print the table.

    PYTHONPATH=. python scripts/fit_throughput.py            # fit, then the table with the fitted values
    PYTHONPATH=. python scripts/fit_throughput.py --no-fit   # the table with Hardware's defaults

The rows are tests/planner/test_throughput_rows.py's (each with where it is recorded). The fit
minimizes the sum of squared log(modelled / measured) over the rows whose tolerance is the
common one (TOLERANCE; the TP row, which the model does not capture, is left out) by a pattern
search in log space over matmul_efficiency, attention_efficiency, scan_efficiency and
elementwise_passes; every other constant of `Hardware` is measured or counted (docs/estimation.md,
Throughput model). Copy the values into `Hardware` and the table into docs/estimation.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import math
from pathlib import Path

from kenotron.config import load_config
from kenotron.planner import AnalyticModel, Hardware, step_time
from kenotron.train.resolve import resolve_run

FITTED = ("matmul_efficiency", "attention_efficiency", "scan_efficiency", "elementwise_passes")


def _rows_module():
    path = Path(__file__).resolve().parent.parent / "tests" / "planner" / "test_throughput_rows.py"
    spec = importlib.util.spec_from_file_location("throughput_rows", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-fit", action="store_true", help="print the table with Hardware's defaults")
    args = parser.parse_args()
    rows = _rows_module()
    priced = []
    for name, ngpu, config, overrides, measured, source, tolerance in rows.ROWS:
        run = resolve_run(load_config(config, overrides.split()), ngpu, check_data=False)
        priced.append((name, run, AnalyticModel(run), measured, source, tolerance == rows.TOLERANCE))

    def ratios(hw: Hardware) -> list[float]:
        return [step_time(run, model, hw).tokens_per_s_per_gpu / measured for _, run, model, measured, _, _ in priced]

    def loss(values: list[float]) -> float:
        hw = dataclasses.replace(Hardware(), **dict(zip(FITTED, values)))
        return sum(math.log(r) ** 2 for r, row in zip(ratios(hw), priced) if row[5])

    values = [getattr(Hardware(), name) for name in FITTED]
    if not args.no_fit:
        best, step = loss(values), 0.2
        while step > 1e-4:  # pattern search: try each constant up and down by a factor e^step
            moved = False
            for i in range(len(values)):
                for sign in (1, -1):
                    trial = values[:i] + [values[i] * math.exp(sign * step)] + values[i + 1:]
                    value = loss(trial)
                    if value < best:
                        values, best, moved = trial, value, True
            step = step if moved else step / 2
        print("fitted: " + ", ".join(f"{n} = {v:.4g}" for n, v in zip(FITTED, values)))
    hw = dataclasses.replace(Hardware(), **dict(zip(FITTED, values)))
    fitted = [r for r, row in zip(ratios(hw), priced) if row[5]]
    print(f"root-mean-square log ratio over the {len(fitted)} fitted rows: "
          f"{math.sqrt(sum(math.log(r) ** 2 for r in fitted) / len(fitted)):.4f}")
    print("| row | GPUs | measured | modelled | ratio | recorded in |\n|---|---|---|---|---|---|")
    for (name, run, _, measured, source, _), ratio in zip(priced, ratios(hw)):
        print(f"| {name} | {run.dims.world_size} | {measured:,} | {measured * ratio:,.0f} | {ratio:.2f} | {source} |")


if __name__ == "__main__":
    main()
