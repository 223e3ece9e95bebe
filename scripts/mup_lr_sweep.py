"""Learning-rate sweep at several widths, spectral µP against the standard parametrization, on CPU.

    python scripts/mup_lr_sweep.py                       # widths 64,128,256,512; PNG in docs/images
    python scripts/mup_lr_sweep.py --widths 64,256 --lrs 1e-3,3e-3,1e-2 --steps 40 --out sweep.png
    python scripts/mup_lr_sweep.py --widths 512 --json w512.json ...; python scripts/mup_lr_sweep.py --load w*.json

Trains every (width, learning rate) pair on the built-in corpus (kenotron/tools/lr_sweep.py),
prints the final loss table and each width's best learning rate, and plots final loss against
learning rate per width, one panel per parametrization (needs matplotlib: `pip install -e .[report]`).
Under µP the minimum stays at the same learning rate; under the standard parametrization it
moves as the width grows.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from kenotron.tools.lr_sweep import LRSweep, lr_sweep

PARAMETRIZATIONS = ("standard", "spectral_mup")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python scripts/mup_lr_sweep.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--widths", default="64,128,256,512", help="comma-separated model widths (multiples of 64)")
    p.add_argument("--lrs", default="3e-4,1e-3,3e-3,1e-2,3e-2,1e-1", help="comma-separated learning rates")
    p.add_argument("--steps", type=int, default=120, help="training steps per run")
    p.add_argument("--tail", type=int, default=20, help="a run's score: its mean loss over this many last steps")
    p.add_argument("--out", type=Path, default=Path("docs/images/mup_lr_sweep.png"), help="PNG to write")
    p.add_argument("--json", type=Path, default=None, help="also write every loss curve here")
    p.add_argument("--load", type=Path, nargs="+", default=None,
                   help="train nothing: merge the --json files of earlier runs (e.g. one per width, run in parallel)")
    p.add_argument("overrides", nargs="*", help="more --section.key value pairs for every run (after --)")
    return p


def plot(sweeps: dict[str, LRSweep], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(sweeps), figsize=(6 * len(sweeps), 4.5), sharey=True)
    for ax, (p, sweep) in zip(axes, sweeps.items()):
        finite = [sweep.final(w, lr) for w in sweep.widths for lr in sweep.lrs if math.isfinite(sweep.final(w, lr))]
        cap = max(finite) if finite else 10.0
        for w in sweep.widths:
            ax.plot(sweep.lrs, [min(sweep.final(w, lr), cap) for lr in sweep.lrs], marker="o", label=f"width {w}")
            best = sweep.best_lr(w)
            ax.plot([best], [sweep.final(w, best)], marker="*", markersize=14, color=ax.lines[-1].get_color())
        ax.set_xscale("log")
        ax.set_xlabel("optimizer.lr")
        ax.set_title(f"{p} (star: each width's best)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel(f"training loss, mean of the last {next(iter(sweeps.values())).tail} steps")
    axes[0].legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def load_sweeps(paths: list[Path], tail: int) -> dict[str, LRSweep]:
    """The sweeps of several --json files (same learning rates and steps, any widths), merged."""
    sweeps: dict[str, LRSweep] = {}
    for path in paths:
        data = json.loads(path.read_text())
        for p, by_width in data["losses"].items():
            sweep = sweeps.setdefault(p, LRSweep(p, [], [float(x) for x in data["lrs"]], data["steps"], tail))
            for w, by_lr in by_width.items():
                sweep.widths.append(int(w))
                sweep.losses[int(w)] = {float(lr): curve for lr, curve in by_lr.items()}
    for sweep in sweeps.values():
        sweep.widths.sort()
    return sweeps


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    widths = [int(w) for w in args.widths.split(",")]
    lrs = [float(x) for x in args.lrs.split(",")]
    common = ["--model.n_layers", "2", "--training.seq_len", "128", "--training.local_batch_size", "8",
              "--lr_scheduler.warmup_steps", str(max(1, args.steps // 10)), "--lr_scheduler.decay", "cosine",
              *args.overrides]
    def progress(sweep: LRSweep, width: int, lr: float) -> None:
        print(f"{sweep.parametrization} width {width} lr {lr:.0e}: {sweep.final(width, lr):.3f}", flush=True)

    if args.load:
        sweeps = load_sweeps(args.load, args.tail)
        first = next(iter(sweeps.values()))
        widths, lrs, args.steps = first.widths, first.lrs, first.steps
    else:
        sweeps = {p: lr_sweep(widths, lrs, p, args.steps, args.tail, common, progress) for p in PARAMETRIZATIONS}
    for p, sweep in sweeps.items():
        print(f"{p}: final loss (mean of the last {args.tail} of {args.steps} steps)")
        print("  width " + "".join(f"{lr:>10.0e}" for lr in lrs) + "   best lr")
        for w in widths:
            cells = "".join(f"{sweep.final(w, lr):>10.3f}" for lr in lrs)
            print(f"  {w:>5} {cells}   {sweep.best_lr(w):.0e}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {p: {str(w): {repr(lr): s.losses[w][lr] for lr in lrs} for w in widths} for p, s in sweeps.items()}
        args.json.write_text(json.dumps({"widths": widths, "lrs": lrs, "steps": args.steps, "losses": payload}))
    plot(sweeps, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
