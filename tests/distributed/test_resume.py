"""Resume under a different parallel layout: model, optimizer and the data stream reshard.

One uninterrupted FSDP4 run saves step 5 (and 10). Copies of its step-5 checkpoint are resumed
under PP2xFSDP2, FSDP2 (a data-parallel degree change, same global batch) and FSDP2xCP2; an
FSDP8 step-5 checkpoint resumes under PP2xFSDP2xTP2 (FSDP4 -> FSDP2xTP2 with the optimizer,
lr and next batch compared in full: test_checkpoint_dist.py). Steps 6-10 must reproduce
the uninterrupted losses within the parity tolerance, and the global data stream must have
handed out exactly 8 samples per step: none skipped, none repeated.
"""

import shutil

import pytest

from tests.distributed.launch import TINY_JOB, read_metrics, run_trainer
from tests.distributed.test_parity import RTOL

JOB = [
    *[a for a in TINY_JOB if not a.startswith("--training.steps")],
    "--training.steps=10",
    "--checkpoint.enable",
    "--checkpoint.interval=5",
]

RESUME_LAYOUTS = {
    "pp2_fsdp2": (
        4,
        [
            "--training.local_batch_size=4",
            "--parallelism.pipeline_parallel_degree=2",
            "--parallelism.pipeline_parallel_schedule=Interleaved1F1B",
        ],
    ),
    "fsdp2": (2, ["--training.local_batch_size=4"]),
    "fsdp2_cp2": (4, ["--training.local_batch_size=4", "--parallelism.context_parallel_degree=2"]),
}


@pytest.fixture(scope="module")
def uninterrupted(seed_checkpoint, tmp_path_factory):
    folder = tmp_path_factory.mktemp("fsdp4")
    run_trainer(
        4,
        [
            *JOB,
            "--training.local_batch_size=2",
            f"--checkpoint.initial_load_path={seed_checkpoint}",
            f"--job.dump_folder={folder}",
        ],
    )
    return folder


def assert_steps_6_to_10_continue(uninterrupted, resumed) -> None:
    """Steps 6-10 match the uninterrupted run, and exactly 8 samples were drawn per step."""
    reference = {r["step"]: r for r in read_metrics(uninterrupted)}
    rows = read_metrics(resumed)
    assert [r["step"] for r in rows] == [6, 7, 8, 9, 10]
    for row in rows:
        ref = reference[row["step"]]
        assert row["loss"] == pytest.approx(ref["loss"], rel=RTOL), (row, ref)
        assert row["grad_norm"] == pytest.approx(ref["grad_norm"], rel=RTOL), (row, ref)
        assert row["data_windows"] == ref["data_windows"] == 8 * row["step"]


@pytest.mark.parametrize("layout", list(RESUME_LAYOUTS))
def test_resume_under_another_layout(layout, uninterrupted, tmp_path):
    shutil.copytree(uninterrupted / "checkpoint" / "step-5", tmp_path / "checkpoint" / "step-5")
    nproc, overrides = RESUME_LAYOUTS[layout]
    out = run_trainer(nproc, [*JOB, *overrides, f"--job.dump_folder={tmp_path}"])
    assert "continuing after step 5" in out

    assert_steps_6_to_10_continue(uninterrupted, tmp_path)


@pytest.mark.slow
def test_fsdp8_checkpoint_resumes_under_pp2_fsdp2_tp2(seed_checkpoint, tmp_path):
    """The CPU form of issue #8's "save under FSDP8, resume under PP2xFSDP2xTP2" (8 ranks)."""
    saved, resumed = tmp_path / "fsdp8", tmp_path / "pp2_fsdp2_tp2"
    run_trainer(
        8,
        [
            *JOB,
            "--training.local_batch_size=1",
            f"--checkpoint.initial_load_path={seed_checkpoint}",
            f"--job.dump_folder={saved}",
        ],
    )
    shutil.copytree(saved / "checkpoint" / "step-5", resumed / "checkpoint" / "step-5")
    layout = [
        "--training.local_batch_size=4",
        "--parallelism.pipeline_parallel_degree=2",
        "--parallelism.tensor_parallel_degree=2",
        "--parallelism.pipeline_parallel_schedule=Interleaved1F1B",
    ]
    out = run_trainer(8, [*JOB, *layout, f"--job.dump_folder={resumed}"])
    assert "continuing after step 5" in out
    assert_steps_6_to_10_continue(saved, resumed)


def train_single_process(folder, env=None, check=True):
    import os
    import subprocess
    import sys

    from tests.distributed.launch import ROOT

    return subprocess.run(
        [
            sys.executable,
            "-m",
            "torchtitan.train",
            *JOB,
            "--training.local_batch_size=8",
            f"--job.dump_folder={folder}",
        ],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
        check=check,
    )


def test_killed_run_resumes_bitwise(tmp_path):
    """10 steps straight == 5 steps, SIGKILL during step 7, resume from step 5, to 10 (fp32 CPU)."""
    train_single_process(tmp_path / "straight")
    killed = train_single_process(
        tmp_path / "killed", env={"TORCHTITAN_FAULT": "kill:step=7"}, check=False
    )
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert (tmp_path / "killed" / "checkpoint" / "step-5").is_dir()
    assert not (tmp_path / "killed" / "checkpoint" / "step-10").exists()
    resumed = train_single_process(tmp_path / "killed")
    assert "continuing after step 5" in resumed.stderr

    straight = {r["step"]: r for r in read_metrics_all(tmp_path / "straight")}
    after = [r for r in read_metrics_all(tmp_path / "killed") if r["step"] > 5]
    after = {r["step"]: r for r in after[-5:]}  # the resumed run's steps 6-10
    assert sorted(after) == [6, 7, 8, 9, 10]
    for step in range(6, 11):
        assert after[step]["loss"] == straight[step]["loss"]  # bitwise
        assert after[step]["grad_norm"] == straight[step]["grad_norm"]
        assert after[step]["data_windows"] == straight[step]["data_windows"] == 8 * step


def read_metrics_all(folder):
    import json

    rows = []
    for path in sorted((folder / "metrics").glob("*.jsonl"), key=lambda p: p.stat().st_mtime):
        rows += [json.loads(line) for line in path.read_text().splitlines()]
    return rows
