"""Validation parity: under every layout the validation loss is the single-process one.

From the seed checkpoint, 2 training steps with a validation after each (2 batches of the held-out
sample documents): FSDP2, TP2 (loss parallel), PP2 (the forward-only
stage walk of ``parallel/pipeline_eval.py`` for a single-stage, a looped and a V-shaped schedule)
and FSDP2 x CP2 must reproduce the single-process fp32 validation
losses and, since validating must not disturb training, its training losses.
Every layout validates the same global windows: validation batch x data-parallel degree = 8.
"""

import sys

import pytest

from tests.distributed.launch import (
    TINY_JOB,
    assert_curves_match,
    from_seed,
    read_metrics,
    run_checked,
    run_trainer,
)

RTOL = 1e-5
VALIDATED_JOB = [
    *TINY_JOB,
    "--training.steps=2",
    "--validation.enable",
    "--validation.freq=1",
    "--validation.steps=2",
]

LAYOUTS = {
    "fsdp2": (2, ["--training.local_batch_size=4"]),
    "tp2_loss_parallel": (
        2,
        ["--training.local_batch_size=8", "--parallelism.tensor_parallel_degree=2"],
    ),
    "pp2_1f1b": (
        2,
        [
            "--training.local_batch_size=8",
            "--parallelism.pipeline_parallel_degree=2",
            "--parallelism.pipeline_parallel_schedule=1F1B",
            "--parallelism.pipeline_parallel_microbatch_size=2",
        ],
    ),
    # Validation batches of another size than training's: 4 batches of 4 = the reference's 2 of 8.
    "pp2_interleaved1f1b_val_batch4": (
        2,
        [
            "--training.local_batch_size=8",
            "--parallelism.pipeline_parallel_degree=2",
            "--parallelism.pipeline_parallel_schedule=Interleaved1F1B",
            "--parallelism.pipeline_parallel_microbatch_size=2",
            "--validation.local_batch_size=4",
            "--validation.steps=4",
        ],
    ),
    "pp2_zbv_fsdp2": (
        4,
        [
            "--training.local_batch_size=4",
            "--parallelism.pipeline_parallel_degree=2",
            "--parallelism.pipeline_parallel_schedule=ZBVZeroBubble",
            "--parallelism.pipeline_parallel_microbatch_size=1",
        ],
    ),
    # Data- and context-parallel ranks both in the loss reduction.
    "fsdp2_cp2": (
        4,
        ["--training.local_batch_size=4", "--parallelism.context_parallel_degree=2"],
    ),
}


def validated_curves(dump_folder) -> tuple[list[float], list[float]]:
    """-> (validation loss per validation, training loss per step)."""
    rows = read_metrics(dump_folder)
    return [r["val_loss"] for r in rows if "val_loss" in r], [
        r["loss"] for r in rows if "loss" in r
    ]


@pytest.fixture(scope="module")
def reference(seed_checkpoint, tmp_path_factory):
    folder = tmp_path_factory.mktemp("validation_reference")
    args = [*VALIDATED_JOB, "--training.local_batch_size=8", *from_seed(seed_checkpoint, folder)]
    run_checked([sys.executable, "-m", "torchtitan.train", *args], timeout=300)
    return validated_curves(folder)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_validation_loss_matches_single_process(layout, seed_checkpoint, reference, tmp_path):
    """Validation losses and training losses both match the single-process run's."""
    nproc, overrides = LAYOUTS[layout]
    run_trainer(nproc, [*VALIDATED_JOB, *overrides, *from_seed(seed_checkpoint, tmp_path)])
    assert_curves_match(validated_curves(tmp_path), reference, points=2, rtol=RTOL)
