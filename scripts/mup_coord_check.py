"""Coordinate check of spectral µP against the standard parametrization, on CPU.

    python scripts/mup_coord_check.py                        # widths 128..1024, 4 steps, PNG in docs/images
    python scripts/mup_coord_check.py --widths 64,128,256 --steps 2 --out coord.png --json coord.json

Trains each width for a few steps under both parametrizations (kenotron/tools/coord_check.py),
prints the width exponent of every probed activation (the slope of log2 RMS against log2 width:
0 is flat, 1 doubles with the width) and plots RMS against width per activation (needs
matplotlib: `pip install -e .[report]`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kenotron.tools.coord_check import coord_check, width_exponents

PARAMETRIZATIONS = ("standard", "spectral_mup")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python scripts/mup_coord_check.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--widths", default="128,256,512,1024", help="comma-separated model widths (multiples of 64)")
    p.add_argument("--steps", type=int, default=4, help="training steps before the last measurement")
    p.add_argument("--lr", type=float, default=3e-3, help="optimizer.lr of every run (constant, no warmup)")
    p.add_argument("--out", type=Path, default=Path("docs/images/mup_coord_check.png"), help="PNG to write")
    p.add_argument("--json", type=Path, default=None, help="also write the measurements here")
    p.add_argument("overrides", nargs="*", help="more --section.key value pairs for every run (after --)")
    return p


def run(widths: list[int], steps: int, lr: float, overrides: list[str]) -> dict:
    common = ["--model.n_layers", "2", "--training.seq_len", "64", "--training.local_batch_size", "8",
              "--optimizer.lr", repr(lr), "--optimizer.weight_decay", "0", "--lr_scheduler.warmup_steps", "0",
              "--lr_scheduler.decay", "constant", *overrides]
    out = {}
    for p in PARAMETRIZATIONS:
        check = coord_check(widths, p, steps, common)
        out[p] = {"rms": {str(w): v for w, v in check.rms.items()},
                  "exponents": {s: width_exponents(widths, check.at_step(s)) for s in (0, steps)}}
    return out


def plot(result: dict, widths: list[int], steps: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 8), sharex=True)
    for row, p in enumerate(PARAMETRIZATIONS):
        rms = result[p]["rms"]
        names = list(rms[str(widths[0])])
        for col, step in enumerate((0, steps)):
            ax = axes[row][col]
            for name in names:
                ax.plot(widths, [rms[str(w)][name][step] for w in widths], marker="o", label=name)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{p}: {'at init' if step == 0 else f'after {step} steps'}")
            ax.set_xlabel("width (model.dim)")
            ax.set_ylabel("activation RMS")
            ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Coordinate check: activation size against width (flat = width-independent)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    widths = [int(w) for w in args.widths.split(",")]
    result = run(widths, args.steps, args.lr, list(args.overrides))
    for p in PARAMETRIZATIONS:
        for step, exps in result[p]["exponents"].items():
            cells = "  ".join(f"{name} {value:+.2f}" for name, value in exps.items())
            print(f"{p:>13} step {step}: {cells}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"widths": widths, "steps": args.steps, "lr": args.lr, **result}, indent=1))
    plot(result, widths, args.steps, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
