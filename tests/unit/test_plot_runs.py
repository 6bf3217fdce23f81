"""Reading a run's metrics files (``torchtitan.run_metrics``), scripts/plot_runs.py, and
scripts/compare_loss_curves.py on a resumed run (several metrics files in one folder)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from torchtitan.run_metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]


def write_launch(folder: Path, run_id: str, rows: list[dict]) -> Path:
    (folder / "metrics").mkdir(parents=True, exist_ok=True)
    path = folder / "metrics" / f"{run_id}.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def row(step: int, loss: float, **extra) -> dict:
    return {"step": step, "loss": loss, "tokens_per_second": 1000.0 + step, **extra}


@pytest.fixture
def resumed_run(tmp_path) -> Path:
    """Launch 1 logged steps 1-6 and died; launch 2 resumed from step 4 and logged 5-8 (with a
    validation line at step 8); the ids sort by launch time."""
    folder = tmp_path / "resumed"
    write_launch(folder, "20250101-100000-11", [row(s, 10.0 - s) for s in range(1, 7)])
    second = [row(s, 20.0 - s) for s in range(5, 9)] + [{"step": 8, "val_loss": 11.5}]
    write_launch(folder, "20250101-120000-7", second)
    return folder


def test_launches_are_joined_in_step_order_later_wins(resumed_run):
    run = read_metrics(resumed_run)
    assert list(run.rows) == list(range(1, 9))
    assert [run.rows[s]["loss"] for s in run.rows] == [9, 8, 7, 6, 15, 14, 13, 12]
    assert run.rows[8]["val_loss"] == 11.5 and run.rows[8]["loss"] == 12  # lines merged
    assert run.repeated == [5, 6]
    assert run.notes() == [
        f"{resumed_run}: joined 2 metrics files (a resumed run); steps 5-6 were logged again by "
        "a later launch, whose values are used"
    ]
    assert run.series("val_loss") == ([8], [11.5])
    assert read_metrics(resumed_run / "metrics").rows == run.rows  # the metrics folder itself


def test_one_launch_has_no_notes_and_bad_lines_are_counted(tmp_path):
    path = write_launch(tmp_path, "run", [row(1, 3.0), row(2, 2.0)])
    with open(path, "a") as f:
        f.write('{"step": 3, "lo')  # killed mid-write
    run = read_metrics(path)
    assert list(run.rows) == [1, 2] and run.bad_lines == 1
    assert run.notes() == [f"{path}: skipped 1 unreadable line(s)"]
    with pytest.raises(ValueError, match="no metrics/\\*.jsonl in"):
        read_metrics(tmp_path / "nothing")


def run_script(name: str, *args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / name), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_compare_loss_curves_accepts_a_resumed_run(resumed_run, tmp_path):
    reference = tmp_path / "ref"
    write_launch(reference, "run", [row(s, 10.0 - s if s < 5 else 20.0 - s) for s in range(1, 9)])
    out = run_script("compare_loss_curves.py", reference, resumed_run)
    assert out.returncode == 0, out.stderr
    assert f"{resumed_run}: max rel diff 0.0e+00" in out.stdout
    assert "note: " in out.stderr and "steps 5-6 were logged again" in out.stderr


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="needs matplotlib")
def test_plot_runs_writes_a_png(resumed_run, tmp_path):
    other = tmp_path / "other"
    rows = [row(s, 9.0 - s, memory_peak_gib=1.5, val_loss=9.5 - s) for s in range(1, 9)]
    write_launch(other, "run", rows)
    png = tmp_path / "runs.png"
    out = run_script("plot_runs.py", resumed_run, other, "-o", png, "--title", "two runs")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"wrote {png} (2 run(s))"
    assert "steps 5-6 were logged again" in out.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_plot_runs_errors_are_one_line(tmp_path, monkeypatch, capsys):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import plot_runs
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    assert plot_runs.main([str(tmp_path / "nowhere")]) == 1
    assert capsys.readouterr().err == (
        f"error: no metrics/*.jsonl in {tmp_path / 'nowhere'}; pass a run's job.dump_folder\n"
    )
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib: ImportError
    assert plot_runs.main([str(tmp_path)]) == 1
    assert capsys.readouterr().err == (
        'error: plot_runs.py needs matplotlib: pip install -e ".[plot]"\n'
    )


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="needs matplotlib")
def test_plot_runs_refuses_a_run_with_no_readable_line(tmp_path, capsys):
    """An empty plot with exit 0 would hide that nothing was read."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import plot_runs
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    good, garbled, empty = tmp_path / "good", tmp_path / "garbled", tmp_path / "empty"
    write_launch(good, "run", [row(1, 3.0)])
    (write_launch(garbled, "run", [])).write_text('{"step": 1, "lo\nnot json\n[1, 2]\n')
    write_launch(empty, "run", [])
    png = tmp_path / "runs.png"
    assert plot_runs.main([str(good), str(garbled), "-o", str(png)]) == 1
    assert capsys.readouterr().err == (
        f"error: {garbled}: none of the 3 line(s) of its 1 metrics file(s) is a JSON object with "
        "a step; nothing to plot\n"
    )
    assert plot_runs.main([str(empty), "-o", str(png)]) == 1
    assert capsys.readouterr().err == (
        f"error: {empty}: its 1 metrics file(s) hold no logged step yet (the run stopped before "
        "its first log); nothing to plot\n"
    )
    assert not png.exists()


def test_moe_runs_get_an_imbalance_panel(tmp_path):
    spec = importlib.util.spec_from_file_location("plot_runs", ROOT / "scripts" / "plot_runs.py")
    plot_runs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plot_runs)
    dense, moe = tmp_path / "dense", tmp_path / "moe"
    write_launch(dense, "run", [row(s, 9.0 - s) for s in range(1, 4)])
    rows = [row(s, 9.0 - s, moe_load_imbalance=2.0 - s / 10) for s in range(1, 4)]
    write_launch(moe, "run", rows)
    assert len(plot_runs.panels_for([read_metrics(dense)])) == 3
    panels = plot_runs.panels_for([read_metrics(dense), read_metrics(moe)])
    assert panels[-1][2][0][0] == "moe_load_imbalance"
