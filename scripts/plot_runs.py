"""Plot the loss, throughput and memory of one or more training runs into one image.

    python scripts/plot_runs.py RUN_DUMP_FOLDER [RUN_DUMP_FOLDER ...] [-o runs.png]

Reads each run's ``metrics/*.jsonl`` (``torchtitan/run_metrics.py``: a resumed run's files are
joined in step order, a later launch winning for steps logged twice) and draws three panels
against the step: the training loss (and the validation loss, dashed, where the run logged
``val_loss``), tokens per second per device, and peak memory (CUDA runs; ``memory_peak_gib``
reserved, solid, and ``memory_peak_active_gib`` allocated, dotted). Runs of MoE models add a
fourth panel: the expert load imbalance (max / mean tokens per expert of the worst layer).
Needs matplotlib:
``pip install -e ".[plot]"``. See docs/plots.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from torchtitan.run_metrics import RunMetrics, read_metrics  # noqa: E402

# (panel title, y label, [(metrics key, line style, legend suffix)], text where nothing logged)
PANELS = [
    ("loss", "loss", [("loss", "-", ""), ("val_loss", "--o", " (validation)")], "no loss logged"),
    (
        "throughput",
        "tokens/s per device",
        [("tokens_per_second", "-", "")],
        "no tokens_per_second logged",
    ),
    (
        "peak memory",
        "GiB",
        [("memory_peak_gib", "-", " (reserved)"), ("memory_peak_active_gib", ":", " (allocated)")],
        "no memory logged (CUDA runs only)",
    ),
]


# Drawn only when a run logged it.
MOE_PANEL = (
    "expert load imbalance (worst layer)",
    "max / mean tokens per expert",
    [("moe_load_imbalance", "-", "")],
    "",
)


def panels_for(runs: list[RunMetrics]) -> list[tuple]:
    moe = any(run.series("moe_load_imbalance")[0] for run in runs)
    return [*PANELS, MOE_PANEL] if moe else list(PANELS)


def run_labels(folders: list[Path]) -> list[str]:
    """Each folder's name, or its whole path where names repeat."""
    names = [f.resolve().name for f in folders]
    return [n if names.count(n) == 1 else str(f) for n, f in zip(names, folders)]


def draw(runs: list[RunMetrics], labels: list[str], out: Path, title: str | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = panels_for(runs)
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 3.2 * len(panels)), sharex=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (name, ylabel, keys, empty) in zip(axes, panels):
        drawn = False
        for i, (run, label) in enumerate(zip(runs, labels)):
            for key, style, suffix in keys:
                steps, values = run.series(key)
                if steps:
                    color = colors[i % len(colors)]
                    ax.plot(steps, values, style, color=color, label=label + suffix, ms=3)
                    drawn = True
        ax.set_title(name)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize="small")
        else:
            ax.text(0.5, 0.5, empty, ha="center", va="center", transform=ax.transAxes)
    axes[-1].set_xlabel("step")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def nothing_to_plot(run: RunMetrics) -> str:
    """Why ``run`` (which has no logged step) cannot be plotted."""
    files = f"{len(run.files)} metrics file(s)"
    if run.bad_lines:
        what = f"none of the {run.bad_lines} line(s) of its {files} is a JSON object with a step"
    else:
        what = f"its {files} hold no logged step yet (the run stopped before its first log)"
    return f"{run.folder}: {what}; nothing to plot"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path, help="job.dump_folder of each run")
    p.add_argument("-o", "--out", type=Path, default=Path("runs.png"), help="image to write")
    p.add_argument("--title", help="figure title")
    a = p.parse_args(argv)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print('error: plot_runs.py needs matplotlib: pip install -e ".[plot]"', file=sys.stderr)
        return 1
    try:
        runs = [read_metrics(folder) for folder in a.runs]
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if empty := [run for run in runs if not run.rows]:
        print(f"error: {nothing_to_plot(empty[0])}", file=sys.stderr)
        return 1
    for run in runs:
        for note in run.notes():
            print(f"note: {note}", file=sys.stderr)
    draw(runs, run_labels(a.runs), a.out, a.title)
    print(f"wrote {a.out} ({len(runs)} run(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
