"""`kenotron report` and `kenotron compare` (scripts/loss_compare.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kenotron.runs.compare import compare_losses
from kenotron.runs.plots import plot_runs


def report_main(argv: list[str] | None = None, prog: str = "kenotron report") -> int:
    p = argparse.ArgumentParser(prog=prog, description="PNG plots of runs' loss, lr, grad norm, tokens/s, MFU and "
                                "memory, the runs overlaid (needs matplotlib: pip install 'kenotron[report]').")
    p.add_argument("runs", nargs="+", help="run folders (job.dump_folder) or metrics.jsonl files")
    p.add_argument("--out", default="", help="folder for the PNG files (default: <first run>/report)")
    args = p.parse_args(argv)
    out = args.out or str(Path(args.runs[0]) / "report")
    try:
        written = plot_runs(args.runs, out)
    except (FileNotFoundError, ValueError, ImportError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {len(written)} plots to {out}: {', '.join(p.name for p in written)}")
    return 0


def compare_main(argv: list[str] | None = None, prog: str = "kenotron compare") -> int:
    p = argparse.ArgumentParser(prog=prog, description="Compare a run's losses with a reference run's at their "
                                "common steps: |loss - reference| <= atol + rtol x |reference|. Exit 1 with "
                                "--assert when a step is outside the tolerance (for CI).")
    p.add_argument("run", help="run folder or metrics.jsonl")
    p.add_argument("reference", help="reference run folder or metrics.jsonl (e.g. a golden-loss file)")
    p.add_argument("--rtol", type=float, default=0.01, help="relative tolerance (default 0.01)")
    p.add_argument("--atol", type=float, default=0.0, help="absolute tolerance (default 0)")
    p.add_argument("--key", default="loss", help="record key compared (default loss; e.g. loss_avg)")
    p.add_argument("--assert", dest="check", action="store_true", help="exit 1 when the runs differ")
    args = p.parse_args(argv)
    try:
        result = compare_losses(args.run, args.reference, rtol=args.rtol, atol=args.atol, key=args.key)
    except (FileNotFoundError, ValueError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    print(result.format())
    return 1 if args.check and not result.ok else 0
