"""PNG plots of one or more runs (`kenotron report`): loss, learning rate, gradient norm,
tokens/s, MFU and memory against the step (and a DoReMi proxy's domain weights and per-domain
losses, one line per domain), the runs overlaid, one file per metric plus one
overview. Needs matplotlib (the `report` extra); drawn off-screen, no display needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kenotron.runs.records import read_records, run_label

PLOTS = {
    "loss": ("loss", "loss (per step)", False),
    "lr": ("lr", "learning rate", False),
    "grad_norm": ("grad_norm", "gradient norm (before clipping)", True),
    "tokens_per_sec": ("tokens_per_sec", "tokens/s per device", False),
    "mfu": ("mfu", "MFU (%)", False),
    "memory": ("memory_gib", "peak memory (GiB)", False),
}
"""file name -> (record key, axis title, log scale)."""
GROUPS = {
    "domain_weights": ("domain_weight/", "DoReMi domain weights α_t"),
    "domain_loss": ("domain_loss/", "loss per domain"),
}
"""file name -> (record key prefix, axis title): one line per key (per domain, per run)."""


def _pyplot():
    try:
        # optional package (the report extra)
        import matplotlib
    except ImportError:
        raise ImportError("kenotron report needs matplotlib: pip install 'kenotron[report]'") from None
    matplotlib.use("Agg")
    # after matplotlib.use('Agg'): no display needed
    import matplotlib.pyplot as plt

    return plt


def plot_runs(runs: Sequence[str | Path], out_dir: str | Path) -> list[Path]:
    """Write `<out_dir>/<metric>.png` for each metric some run recorded, and `report.png` with all
    of them; returns the files written."""
    plt = _pyplot()
    series = [(run_label(run), read_records(run)) for run in runs]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    shown = {name: spec for name, spec in PLOTS.items()
             if any(r.get(spec[0]) is not None for _, records in series for r in records)}
    group_keys = {name: sorted({k for _, records in series for r in records for k in r if k.startswith(prefix)})
                  for name, (prefix, _) in GROUPS.items()}
    shown.update({name: (name, GROUPS[name][1], False) for name, keys in group_keys.items() if keys})
    written = []
    grid_cols = 3
    grid_rows = max(1, -(-len(shown) // grid_cols))
    overview, axes = plt.subplots(grid_rows, grid_cols, figsize=(5 * grid_cols, 3.6 * grid_rows), squeeze=False)
    for ax in axes.flat[len(shown):]:
        ax.set_visible(False)
    for (name, (key, title, log)), grid_ax in zip(shown.items(), axes.flat):
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for target in (ax, grid_ax):
            for label, records in series:
                lines = ([(k, f"{k.split('/', 1)[1]} ({label})" if len(series) > 1 else k.split("/", 1)[1])
                          for k in group_keys[name]] if name in GROUPS else [(key, label)])
                for line_key, line_label in lines:
                    points = [(r["step"], r[line_key]) for r in records if r.get(line_key) is not None]
                    if points:
                        steps, values = zip(*points)
                        target.plot(steps, values, marker="." if len(points) < 40 else None, label=line_label)
            target.set_title(title)
            target.set_xlabel("step")
            target.grid(alpha=0.3)
            if log:
                target.set_yscale("log")
            if len(series) > 1 or name in GROUPS:
                target.legend(fontsize="small")
        fig.tight_layout()
        path = out / f"{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    overview.suptitle(" vs ".join(label for label, _ in series))
    overview.tight_layout()
    overview.savefig(out / "report.png", dpi=90)
    plt.close(overview)
    return [*written, out / "report.png"]
