"""Muon against AdamW on CPU: each at its best learning rate from a small sweep, validation loss
against steps (issue 37, docs/optimizers.md).

    python scripts/muon_sweep.py                                   # debug Llama, 100 steps, the default grids
    python scripts/muon_sweep.py --steps 100 --adamw 3e-3 --muon 1e-2 --json out.json
    python scripts/muon_sweep.py --load out.json --plot docs/images/muon_vs_adamw.png
    python scripts/muon_sweep.py --muon '' --json a.json & python scripts/muon_sweep.py --adamw '' --json m.json
    python scripts/muon_sweep.py --documents 'SITE/transformers/models/**/*.py' -- --model.flavor 1B  # a bigger corpus

The built-in corpus (about 400k tokens; `--documents GLOB` reads every matching file as one
document instead, for models that would see it many times over) is split by document, every tenth one held out for validation (written as
two JSON Lines files in a temporary folder), so the validation loss is on text no step trained
on. Every run: the same model, seed, batches and schedule (debug's), only
the optimizer and its lr change. Prints each run's validation losses, each optimizer's best lr
(lowest final validation loss) and how many steps the best Muon run needs to reach the best
AdamW run's final validation loss.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import tempfile
from pathlib import Path

from kenotron.config import load_config
from kenotron.data.corpus import builtin_documents
from kenotron.train.trainer import Trainer


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python scripts/muon_sweep.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--every", type=int, default=20, help="validate every this many steps")
    p.add_argument("--adamw", default="1e-3,3e-3,1e-2", help="AdamW's learning rates")
    p.add_argument("--muon", default="3e-3,1e-2,3e-2,1e-1", help="Muon's learning rates (Moonlight's rule: AdamW's scale)")
    p.add_argument("--documents", help="a glob (** allowed) of text files, one document each, instead of the built-in corpus")
    p.add_argument("--json", type=Path, help="write every run's validation curve here")
    p.add_argument("--load", type=Path, nargs="+",
                   help="train nothing: report (and plot) the curves of earlier --json files, merged (e.g. one run "
                        "with --muon '' and one with --adamw '', in parallel)")
    p.add_argument("--plot", type=Path, help="PNG of the best runs' validation loss against steps (matplotlib)")
    p.add_argument("--title", default="debug Llama on the built-in corpus, CPU", help="the plot's title")
    p.add_argument("overrides", nargs="*", help="more --section.key value pairs for every run (after --)")
    return p


def documents(pattern: str | None) -> list[str]:
    """The built-in corpus, or every file the glob matches (sorted, so every run splits alike)."""
    if not pattern:
        return builtin_documents()
    paths = sorted(glob.glob(pattern, recursive=True))
    if not paths:
        raise SystemExit(f"--documents {pattern!r} matches no file")
    return [Path(p).read_text(errors="replace") for p in paths]


def write_split(folder: Path, docs: list[str]) -> tuple[Path, Path]:
    """train.jsonl and validation.jsonl: every tenth document held out."""
    train, val = folder / "train.jsonl", folder / "validation.jsonl"
    with train.open("w") as t, val.open("w") as v:
        for i, doc in enumerate(docs):
            (v if i % 10 == 9 else t).write(json.dumps({"text": doc}) + "\n")
    return train, val


def run(optimizer: str, lr: float, steps: int, every: int, data: tuple[Path, Path], folder: Path,
        overrides: list[str]) -> list[tuple[int, float]]:
    """(step, validation loss) of one run."""
    train, val = data
    cfg = load_config("debug", [
        "--optimizer.name", optimizer, "--optimizer.lr", str(lr), "--training.steps", str(steps),
        "--data.dataset", "jsonl", "--data.path", str(train),
        "--validation.every", str(every), "--validation.dataset", "jsonl", "--validation.path", str(val),
        "--validation.batches", "4", "--metrics.tensorboard", "false", "--metrics.log_freq", str(every),
        "--job.dump_folder", str(folder / f"{optimizer}_{lr:g}"), *overrides])
    records = Trainer(cfg).train()
    return [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]


def steps_to_reach(curve: list[tuple[int, float]], target: float) -> int | None:
    """First validation step whose loss is at most `target` (None: never)."""
    return next((step for step, loss in curve if loss <= target), None)


def report(curves: dict[str, dict[str, list]]) -> dict[str, str]:
    """Print the table and the comparison; return each optimizer's best lr."""
    best = {}
    for opt, runs in curves.items():
        for lr, curve in runs.items():
            print(f"{opt:<6} lr {lr:<7} " + " ".join(f"{loss:.3f}" for _, loss in curve))
        finite = {lr: c[-1][1] for lr, c in runs.items() if math.isfinite(c[-1][1])}
        best[opt] = min(finite, key=finite.get)
        print(f"{opt}: best lr {best[opt]} (final validation loss {finite[best[opt]]:.4f})")
    if {"adamw", "muon"} <= set(best):
        adamw, muon = curves["adamw"][best["adamw"]], curves["muon"][best["muon"]]
        target = adamw[-1][1]
        print(f"steps to AdamW's final validation loss {target:.4f}: AdamW {steps_to_reach(adamw, target)}, "
              f"Muon {steps_to_reach(muon, target)}")
    return best


def plot(curves: dict[str, dict[str, list]], best: dict[str, str], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for opt, lr in best.items():
        steps, losses = zip(*curves[opt][lr])
        ax.plot(steps, losses, marker="o", label=f"{opt}, lr {lr}")
    ax.set_xlabel("step")
    ax.set_ylabel("validation loss (held-out documents)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.load:
        curves = {}
        for path in args.load:
            for opt, runs in json.loads(path.read_text()).items():
                curves.setdefault(opt, {}).update(runs)
    else:
        curves = {}
        with tempfile.TemporaryDirectory() as tmp:
            data = write_split(Path(tmp), documents(args.documents))
            for opt, grid in (("adamw", args.adamw), ("muon", args.muon)):
                if not grid:
                    continue
                curves[opt] = {}
                for lr in grid.split(","):
                    curves[opt][lr] = run(opt, float(lr), args.steps, args.every, data, Path(tmp), args.overrides)
                    if args.json:  # after each run: a sweep cut short by a time limit keeps what it has
                        args.json.write_text(json.dumps(curves, indent=1))
    best = report(curves)
    if args.plot:
        plot(curves, best, args.plot, args.title)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
