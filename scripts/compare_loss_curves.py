"""Compare the loss curves of training runs against a reference run.

    python scripts/compare_loss_curves.py REF_DUMP_FOLDER RUN_DUMP_FOLDER [RUN_DUMP_FOLDER ...]

Reads each run's ``metrics/*.jsonl`` (log every step for a full curve; a resumed run's files are
joined in step order, see ``torchtitan/run_metrics.py``) and prints, per run, the largest
relative loss difference from the reference over the steps both logged, with the step where it
happens, and the first and last losses.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from torchtitan.run_metrics import read_metrics  # noqa: E402


def read_losses(dump_folder: Path) -> dict[int, float]:
    """step -> loss of a run (its launches joined); notes on the joining go to stderr."""
    try:
        run = read_metrics(dump_folder)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    for note in run.notes():
        print(f"note: {note}", file=sys.stderr)
    return dict(zip(*run.series("loss")))


def compare(reference: dict[int, float], run: dict[int, float]) -> tuple[float, int]:
    steps = sorted(reference.keys() & run.keys())
    if not steps:
        raise SystemExit("the runs share no logged step")
    worst = max(steps, key=lambda s: abs(run[s] - reference[s]) / abs(reference[s]))
    return abs(run[worst] - reference[worst]) / abs(reference[worst]), worst


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        raise SystemExit(__doc__)
    reference = read_losses(Path(argv[0]))
    print(f"reference {argv[0]}: {len(reference)} steps")
    for folder in argv[1:]:
        run = read_losses(Path(folder))
        rel, step = compare(reference, run)
        first, last = min(run), max(run)
        print(
            f"{folder}: max rel diff {rel:.1e} at step {step}; "
            f"loss {run[first]:.4f} (step {first}) -> {run[last]:.4f} (step {last}); "
            f"reference {reference[first]:.4f} -> {reference[last]:.4f}"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
