"""Reading finished or running training runs: their records, plots of them, loss comparisons.

    kenotron report outputs/a outputs/b --out plots/     # PNG plots, the runs overlaid
    kenotron compare outputs/a outputs/b --rtol 0.01     # losses step by step, within a tolerance
"""

from kenotron.runs.compare import LossComparison, compare_losses
from kenotron.runs.records import read_records, run_label

__all__ = ["LossComparison", "compare_losses", "read_records", "run_label"]
