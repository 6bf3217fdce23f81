"""Compare the loss curves of training runs against a reference run.

    python scripts/compare_loss_curves.py REF_DUMP_FOLDER RUN_DUMP_FOLDER [RUN_DUMP_FOLDER ...]

Reads each run's ``metrics/*.jsonl`` (one file per run; log every step for a full curve) and
prints, per run, the largest relative loss difference from the reference over the steps both
logged, with the step where it happens, and the first and last losses.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def read_losses(dump_folder: Path) -> dict[int, float]:
    files = sorted((dump_folder / "metrics").glob("*.jsonl"))
    if len(files) != 1:
        raise SystemExit(f"expected one metrics/*.jsonl in {dump_folder}, found {len(files)}")
    rows = [json.loads(line) for line in files[0].read_text().splitlines() if line.strip()]
    return {row["step"]: row["loss"] for row in rows if "loss" in row}  # not validation rows


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
