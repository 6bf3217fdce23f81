"""Pipeline parity: every schedule and PP composition reproduces the single-process curve.

Same seed checkpoint, global batch and tolerance as test_parity.py. Measured on the 2-core CI
machine kind: at most 1.1e-7 relative for the loss and 1e-8 for the grad norm (the grad norm is
the global one: squared norms summed over the pipeline ranks).
"""

import pytest

from tests.distributed.launch import with_slow
from tests.distributed.test_parity import assert_layout_matches

MB1 = ["--parallelism.pipeline_parallel_microbatch_size=1", "--training.local_batch_size=8"]


def pp(degree: int, schedule: str) -> list[str]:
    return [
        f"--parallelism.pipeline_parallel_degree={degree}",
        f"--parallelism.pipeline_parallel_schedule={schedule}",
    ]


def looped_bfs_csv(path, n_microbatches: int = 8) -> str:
    """A custom schedule: 2 ranks x 2 looped stages, all forwards then all backwards."""
    rows = []
    for rank in range(2):
        stages = [rank, rank + 2]
        forwards = [f"{s}F{m}" for s in stages for m in range(n_microbatches)]
        backwards = [f"{s}B{m}" for s in reversed(stages) for m in range(n_microbatches)]
        rows.append(",".join(forwards + backwards))
    path.write_text("\n".join(rows) + "\n")
    return str(path)


LAYOUTS = {
    "pp2_gpipe": (2, pp(2, "GPipe") + MB1),
    "pp2_1f1b": (2, pp(2, "1F1B") + MB1),
    "pp2_interleaved1f1b": (2, pp(2, "Interleaved1F1B") + MB1),
    "pp2_loopedbfs": (2, pp(2, "LoopedBFS") + MB1),
    "pp2_interleavedzerobubble": (2, pp(2, "InterleavedZeroBubble") + MB1),
    "pp2_zbv_fullac": (2, pp(2, "ZBVZeroBubble") + MB1 + ["--activation_checkpoint.mode=full"]),
    "pp2_dualpipev": (2, pp(2, "DualPipeV") + MB1),
    "pp2_csv": (2, pp(2, "CSV") + MB1),
    "pp4_interleaved1f1b": (4, pp(4, "Interleaved1F1B") + MB1),
    "pp4_dualpipev": (4, pp(4, "DualPipeV") + MB1),
    "pp2_fsdp2_interleaved_accum2": (
        4,
        pp(2, "Interleaved1F1B")
        + ["--parallelism.pipeline_parallel_microbatch_size=1", "--training.local_batch_size=2"],
    ),
    "pp2_tp2_1f1b": (4, pp(2, "1F1B") + MB1 + ["--parallelism.tensor_parallel_degree=2"]),
    # The loss that writes the logits' gradient over the logits, on the last stage's microbatches.
    "pp2_1f1b_in_place_loss": (2, pp(2, "1F1B") + MB1 + ["--training.logits_loss=in_place"]),
    # PP x FSDP x TP: the last stage's head under loss parallel.
    "pp2_fsdp2_tp2_interleaved": (
        8,
        pp(2, "Interleaved1F1B")
        + [
            "--parallelism.pipeline_parallel_microbatch_size=1",
            "--training.local_batch_size=4",
            "--parallelism.tensor_parallel_degree=2",
        ],
    ),
}


# In the slow tier: PP x TP is also run by pp2_fsdp2_tp2_interleaved.
@pytest.mark.parametrize("layout", with_slow(LAYOUTS, {"pp2_tp2_1f1b"}))
def test_pipeline_matches_single_process(layout, seed_checkpoint, reference_curves, tmp_path):
    nproc, overrides = LAYOUTS[layout]
    if layout == "pp2_csv":
        csv = looped_bfs_csv(tmp_path / "schedule.csv")
        overrides = [*overrides, f"--parallelism.pipeline_parallel_schedule_csv={csv}"]
    assert_layout_matches(nproc, overrides, seed_checkpoint, reference_curves, tmp_path)
