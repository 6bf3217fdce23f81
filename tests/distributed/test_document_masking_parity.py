"""Document masking under every parallelism, from one seed checkpoint: FSDP2 x TP2 (compiled,
full AC), PP2 (the mask built per microbatch on every stage) and FSDP2 x CP2 (keys and values
gathered over the CP ranks, the queries' rows of the mask; per-document RoPE) reproduce the
single-process curve with document masking, which differs from the causal one. A resume mid-run
continues bitwise with documents joined in pairs (the loader state then carries the document
count)."""

import shutil
import subprocess
import sys

import pytest

from tests.distributed.conftest import ROOT
from tests.distributed.launch import (
    TINY_JOB,
    assert_curves_match,
    curves,
    from_seed,
    read_metrics,
    run_trainer,
)
from tests.distributed.test_parity import RTOL

DOCUMENT = ["--model.mask=document"]

LAYOUTS = {
    # The dense mask through compiled blocks, under full AC.
    "fsdp2_tp2_compile_full_ac": (
        4,
        [
            "--training.local_batch_size=4",
            "--parallelism.tensor_parallel_degree=2",
            "--compile.enable",
            "--activation_checkpoint.mode=full",
        ],
    ),
    "pp2": (
        2,
        [
            "--training.local_batch_size=8",
            "--parallelism.pipeline_parallel_degree=2",
            "--parallelism.pipeline_parallel_microbatch_size=2",
            "--parallelism.pipeline_parallel_schedule=1F1B",
        ],
    ),
    "fsdp2_cp2_selective_op_reset_positions": (
        4,
        [
            "--training.local_batch_size=4",
            "--parallelism.context_parallel_degree=2",
            "--activation_checkpoint.mode=selective",
            # RoPE is relative: with document masking, restarting positions changes rounding only.
            "--model.reset_positions",
        ],
    ),
}


def _single_process(folder, seed_checkpoint, extra: list[str]) -> None:
    args = [*TINY_JOB, "--training.local_batch_size=8", *extra]
    subprocess.run(
        [sys.executable, "-m", "torchtitan.train", *args, *from_seed(seed_checkpoint, folder)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def document_curves(seed_checkpoint, tmp_path_factory):
    folder = tmp_path_factory.mktemp("document_reference")
    _single_process(folder, seed_checkpoint, DOCUMENT)
    return curves(folder)


def test_document_masking_changes_the_curve(document_curves, reference_curves):
    # Far beyond the parity tolerance: the rows below would fail under causal masking.
    pairs = zip(sum(document_curves, []), sum(reference_curves, []), strict=True)
    assert max(abs(ours - causal) / abs(causal) for ours, causal in pairs) > 100 * RTOL


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layout_matches_single_process(layout, seed_checkpoint, document_curves, tmp_path):
    nproc, overrides = LAYOUTS[layout]
    run_trainer(nproc, [*TINY_JOB, *DOCUMENT, *overrides, *from_seed(seed_checkpoint, tmp_path)])
    assert_curves_match(curves(tmp_path), document_curves, points=6, rtol=RTOL)


def test_resume_mid_run_is_bitwise(seed_checkpoint, tmp_path):
    job = [
        *DOCUMENT,
        "--training.join_documents=2",
        "--checkpoint.enable",
        "--checkpoint.interval=3",
    ]
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    _single_process(whole, seed_checkpoint, job)
    shutil.copytree(whole / "checkpoint" / "step-3", resumed / "checkpoint" / "step-3")
    args = [*TINY_JOB, "--training.local_batch_size=8", *job, f"--job.dump_folder={resumed}"]
    subprocess.run(
        [sys.executable, "-m", "torchtitan.train", *args],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=300,
    )
    expected = {r["step"]: r for r in read_metrics(whole) if "loss" in r}
    rows = [r for r in read_metrics(resumed) if "loss" in r]
    assert [r["step"] for r in rows] == [4, 5, 6]
    for row in rows:
        for key in ("loss", "grad_norm", "document_length", "data_windows"):
            assert row[key] == expected[row["step"]][key], key
