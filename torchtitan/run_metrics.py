"""Reading back the metrics runs wrote: ``<job.dump_folder>/metrics/<run id>.jsonl``.

Every launch writes its own file (``MetricsLogger``), one JSON object per logged step (``step``,
``loss``, ``lr``, ``tokens_per_second``, ``memory_peak_gib`` on CUDA, ``val_loss`` where
validation ran, ...). A resumed run has several files in one folder: ``read_metrics`` joins them
in step order. Where launches logged the same step (steps redone after a crash, or after resuming
from an earlier checkpoint), the later launch wins; run ids start with the launch time, so the
files' names order them. No torch import: the plotting and comparison scripts use it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class RunMetrics:
    """The logged steps of one run (all its launches), in step order."""

    folder: Path
    files: list[Path]  # in launch order
    rows: dict[int, dict] = field(default_factory=dict)  # step -> the logged metrics
    repeated: list[int] = field(default_factory=list)  # steps a later launch logged again
    bad_lines: int = 0  # lines that are not JSON objects with a step (a launch killed mid-write)

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of the steps that logged ``key``."""
        steps = [s for s, row in self.rows.items() if row.get(key) is not None]
        return steps, [float(self.rows[s][key]) for s in steps]

    def notes(self) -> list[str]:
        """One line each for what the reader of a plot or comparison should know."""
        notes = []
        if len(self.files) > 1:
            line = f"{self.folder}: joined {len(self.files)} metrics files (a resumed run)"
            if self.repeated:
                line += (
                    f"; steps {_ranges(self.repeated)} were logged again by a later launch, "
                    "whose values are used"
                )
            notes.append(line)
        if self.bad_lines:
            notes.append(f"{self.folder}: skipped {self.bad_lines} unreadable line(s)")
        return notes


def metrics_files(path: str | Path) -> list[Path]:
    """The metrics files of a dump folder, of its ``metrics/`` folder, or one ``.jsonl`` file;
    in launch order. One-line ValueError when there are none."""
    path = Path(path)
    if path.is_file():
        return [path]
    folder = path / "metrics" if (path / "metrics").is_dir() else path
    files = sorted(folder.glob("*.jsonl")) if folder.is_dir() else []
    if not files:
        raise ValueError(f"no metrics/*.jsonl in {path}; pass a run's job.dump_folder")
    return files


def read_metrics(path: str | Path) -> RunMetrics:
    """Every logged step of the run at ``path`` (see ``metrics_files``), launches joined."""
    run = RunMetrics(Path(path), metrics_files(path))
    for file in run.files:
        for step, row in _read_steps(file, run).items():
            if step in run.rows:
                run.repeated.append(step)
            run.rows[step] = row
    run.rows = dict(sorted(run.rows.items()))
    run.repeated = sorted(run.repeated)
    return run


def _read_steps(file: Path, run: RunMetrics) -> dict[int, dict]:
    """step -> metrics of one launch; lines of the same step (e.g. training, then validation
    metrics) are merged."""
    steps: dict[int, dict] = {}
    for line in file.read_text().splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            steps.setdefault(row["step"], {}).update(row)
        else:
            run.bad_lines += 1
    return steps


def _ranges(steps: list[int]) -> str:
    """[6, 7, 8, 12] -> '6-8, 12'."""
    spans: list[list[int]] = []
    for step in steps:
        if spans and step == spans[-1][1] + 1:
            spans[-1][1] = step
        else:
            spans.append([step, step])
    return ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in spans)
